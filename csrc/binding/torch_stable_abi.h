/*
 * torch_stable_abi.h - the subset of PyTorch's stable C ABI ("C shim") that
 * the lltm binding calls, listed once in plain C.
 *
 * Why pointers: the libraries are not linked against torch's (no DT_NEEDED
 * entry names a torch library, so a wheel passes the manylinux policy and no
 * torch file is needed to build). In the libraries each function of the list
 * is a hidden pointer of its name and type, which the binding calls by that
 * name; lltm_resolve_torch() (torch_abi_loader.c) fills them from the torch
 * libraries already loaded when Python loads the library, before any operator
 * is registered.
 *
 * The list copies the prototypes of torch's headers (aoti_torch/c/shim.h,
 * stable/c/shim.h), which C cannot include (C++ `using` aliases and types).
 * tests/abi/abi_drift_check.cpp declares the list as prototypes beside them in
 * one C++ unit, so an entry that drifts from the installed torch fails to
 * compile in CI.
 *
 * Every function exists in torch 2.11, the oldest torch we load on, except
 * OPTIONAL ones (newer: NULL on an older torch; test before calling). CUDA
 * functions live in libtorch_cuda.so and are listed only when LLTM_WITH_CUDA
 * is defined (the CUDA library).
 */
#ifndef LLTM_BINDING_TORCH_STABLE_ABI_H
#define LLTM_BINDING_TORCH_STABLE_ABI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The stable-ABI version we target; passed to calls that adapt to schema
 * changes between versions. 2.11.0 = (2 << 56) | (11 << 48). */
#define LLTM_TORCH_TARGET_VERSION ((2ULL << 56) | (11ULL << 48))

typedef int32_t AOTITorchError; /* 0 on success */
typedef struct AtenTensorOpaque *AtenTensorHandle;
typedef uint64_t StableIValue;
typedef struct TorchLibraryOpaque *TorchLibraryHandle;
typedef void (*ParallelFunc)(int64_t begin, int64_t end, void *ctx);
typedef struct StableListOpaque *StableListHandle;

/* X(library, REQUIRED or OPTIONAL, return type, name, (parameters)) */
#define LLTM_TORCH_FUNCTIONS(X)                                                                    \
    /* dtype and device codes */                                                                   \
    X(CPU, REQUIRED, int32_t, aoti_torch_dtype_float32, (void))                                    \
    X(CPU, REQUIRED, int32_t, aoti_torch_dtype_float64, (void))                                    \
    X(CPU, REQUIRED, int32_t, aoti_torch_dtype_float16, (void))                                    \
    X(CPU, REQUIRED, int32_t, aoti_torch_dtype_bfloat16, (void))                                   \
    X(CPU, REQUIRED, int32_t, aoti_torch_dtype_uint8, (void))                                      \
    X(CPU, REQUIRED, int32_t, aoti_torch_dtype_int64, (void))                                      \
    X(CPU, REQUIRED, int32_t, aoti_torch_device_type_cpu, (void))                                  \
    X(CPU, REQUIRED, int32_t, aoti_torch_device_type_cuda, (void))                                 \
    /* tensor handles: owned handles must be deleted exactly once */                               \
    X(CPU, REQUIRED, AOTITorchError, aoti_torch_delete_tensor_object, (AtenTensorHandle tensor))   \
    X(CPU, REQUIRED, AOTITorchError, aoti_torch_new_tensor_handle,                                 \
      (AtenTensorHandle orig_handle, AtenTensorHandle *new_handle))                                \
    /* an undefined tensor: returned for a Tensor result, None in Python */                        \
    X(CPU, REQUIRED, AOTITorchError, aoti_torch_new_uninitialized_tensor, (AtenTensorHandle *ret)) \
    /* tensor metadata; sizes, strides and data are borrowed from the handle */                    \
    X(CPU, REQUIRED, AOTITorchError, aoti_torch_get_data_ptr,                                      \
      (AtenTensorHandle tensor, void **ret_data_ptr))                                              \
    X(CPU, REQUIRED, AOTITorchError, aoti_torch_get_dim,                                           \
      (AtenTensorHandle tensor, int64_t *ret_dim))                                                 \
    X(CPU, REQUIRED, AOTITorchError, aoti_torch_get_sizes,                                         \
      (AtenTensorHandle tensor, int64_t **ret_sizes))                                              \
    X(CPU, REQUIRED, AOTITorchError, aoti_torch_get_dtype,                                         \
      (AtenTensorHandle tensor, int32_t *ret_dtype))                                               \
    X(CPU, REQUIRED, AOTITorchError, aoti_torch_get_device_type,                                   \
      (AtenTensorHandle tensor, int32_t *ret_device_type))                                         \
    X(CPU, REQUIRED, AOTITorchError, aoti_torch_get_device_index,                                  \
      (AtenTensorHandle tensor, int32_t *ret_device_index))                                        \
    X(CPU, REQUIRED, AOTITorchError, aoti_torch_is_contiguous,                                     \
      (AtenTensorHandle tensor, bool *ret_is_contiguous))                                          \
    /* false for an undefined tensor (None passed for a Tensor argument),                          \
     * whose other getters fail */                                                                 \
    X(CPU, REQUIRED, AOTITorchError, aoti_torch_is_defined,                                        \
      (AtenTensorHandle tensor, bool *ret_is_defined))                                             \
    /* allocation, views and copies */                                                             \
    X(CPU, REQUIRED, AOTITorchError, aoti_torch_empty_strided,                                     \
      (int64_t ndim, const int64_t *sizes_ptr, const int64_t *strides_ptr, int32_t dtype,          \
       int32_t device_type, int32_t device_index, AtenTensorHandle *ret_new_tensor))               \
    X(CPU, REQUIRED, AOTITorchError, aoti_torch__reinterpret_tensor,                               \
      (AtenTensorHandle self, int64_t ndim, const int64_t *sizes_ptr,                              \
       const int64_t *strides_ptr, int64_t storage_offset, AtenTensorHandle *ret_new_tensor))      \
    X(CPU, REQUIRED, AOTITorchError, aoti_torch_copy_,                                             \
      (AtenTensorHandle self, AtenTensorHandle src, int32_t non_blocking))                         \
    /* a tensor over memory it does not own (nothing is freed with it) */                          \
    X(CPU, REQUIRED, AOTITorchError, aoti_torch_create_tensor_from_blob,                           \
      (void *data, int64_t ndim, const int64_t *sizes_ptr, const int64_t *strides_ptr,             \
       int64_t storage_offset, int32_t dtype, int32_t device_type, int32_t device_index,           \
       AtenTensorHandle *ret))                                                                     \
    /* list arguments (e.g. bool[]): the kernel owns the list and deletes it */                    \
    X(CPU, REQUIRED, AOTITorchError, torch_list_size,                                              \
      (StableListHandle list_handle, size_t *size))                                                \
    X(CPU, REQUIRED, AOTITorchError, torch_list_get_item,                                          \
      (StableListHandle list_handle, size_t index, StableIValue *element))                         \
    X(CPU, REQUIRED, AOTITorchError, torch_delete_list, (StableListHandle list_handle))            \
    /* operator registration */                                                                    \
    X(CPU, REQUIRED, AOTITorchError, aoti_torch_library_init_fragment,                             \
      (const char *ns, const char *file, uint32_t line, TorchLibraryHandle *ret_new_torch_lib))    \
    X(CPU, REQUIRED, AOTITorchError, aoti_torch_library_init_impl,                                 \
      (const char *ns, const char *k, const char *file, uint32_t line,                             \
       TorchLibraryHandle *ret_new_torch_lib))                                                     \
    X(CPU, REQUIRED, AOTITorchError, aoti_torch_library_def,                                       \
      (TorchLibraryHandle self, const char *schema))                                               \
    X(CPU, REQUIRED, AOTITorchError, torch_library_impl,                                           \
      (TorchLibraryHandle self, const char *name,                                                  \
       void (*fn)(StableIValue *, uint64_t, uint64_t), uint64_t extension_build_version))          \
    /* calling ATen operators; tensor arguments are consumed, returns are owned */                 \
    X(CPU, REQUIRED, AOTITorchError, torch_call_dispatcher,                                        \
      (const char *opName, const char *overloadName, StableIValue *stack,                          \
       uint64_t extension_build_version))                                                          \
    /* torch's intra-op thread pool (honours torch.set_num_threads) */                             \
    X(CPU, REQUIRED, AOTITorchError, torch_parallel_for,                                           \
      (int64_t begin, int64_t end, int64_t grain_size, ParallelFunc func, void *ctx))              \
    /* errors: throws a C++ exception that reaches Python as RuntimeError(msg) */                  \
    X(CPU, REQUIRED, void, aoti_torch_check,                                                       \
      (bool cond, const char *func, const char *file, uint32_t line, const char *msg))             \
    /* 2.13+: the message of the last exception a shim call swallowed */                           \
    X(CPU, OPTIONAL, const char *, torch_exception_get_what_without_backtrace, (void))             \
    /* out = self @ mat2 straight into ATen's CPU kernel (AOTInductor's                            \
     * generated fallback shim, c_shim_cpu.h): no dispatcher lookup or boxing.                     \
     * Optional: when a torch lacks it, aten::mm.out goes through                                  \
     * torch_call_dispatcher. */                                                                   \
    X(CPU, OPTIONAL, AOTITorchError, aoti_torch_cpu_mm_out,                                        \
      (AtenTensorHandle out, AtenTensorHandle self, AtenTensorHandle mat2))                        \
    LLTM_TORCH_CUDA_FUNCTIONS(X)

#ifdef LLTM_WITH_CUDA
typedef struct CUDAGuardOpaque *CUDAGuardHandle;
#define LLTM_TORCH_CUDA_FUNCTIONS(X)                                                               \
    X(CUDA, REQUIRED, AOTITorchError, aoti_torch_create_cuda_guard,                                \
      (int32_t device_index, CUDAGuardHandle *ret_guard))                                          \
    X(CUDA, REQUIRED, AOTITorchError, aoti_torch_delete_cuda_guard, (CUDAGuardHandle guard))       \
    X(CUDA, REQUIRED, AOTITorchError, aoti_torch_get_current_cuda_stream,                          \
      (int32_t device_index, void **ret_stream))                                                   \
    /* the CUDA twin of aoti_torch_cpu_mm_out (c_shim_cuda.h) */                                   \
    X(CUDA, OPTIONAL, AOTITorchError, aoti_torch_cuda_mm_out,                                      \
      (AtenTensorHandle out, AtenTensorHandle self, AtenTensorHandle mat2))
#else
#define LLTM_TORCH_CUDA_FUNCTIONS(X)
#endif

#ifdef LLTM_TORCH_PROTOTYPES /* (the drift check) */
#define LLTM_TORCH_DECLARE(lib, need, ret, name, params) ret name params;
#else
#define LLTM_TORCH_DECLARE(lib, need, ret, name, params)                                           \
    extern __attribute__((visibility("hidden"))) ret (*name) params;
#endif
LLTM_TORCH_FUNCTIONS(LLTM_TORCH_DECLARE)
#undef LLTM_TORCH_DECLARE

/* Fills the pointers; 0 on success (then again: nothing to do). Else -1, the
 * pointers unusable, and in err a message naming the library or function that
 * is missing. Exported: Python calls it right after loading the library, and
 * the registration entry points (lltm_register, lltm_cuda_register) first. */
__attribute__((visibility("default"))) int lltm_resolve_torch(char *err, size_t err_len);

#ifdef __cplusplus
}
#endif

#endif /* LLTM_BINDING_TORCH_STABLE_ABI_H */
