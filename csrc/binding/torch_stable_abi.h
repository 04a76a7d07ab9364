/*
 * torch_stable_abi.h - the subset of PyTorch's stable C ABI ("C shim") that
 * the lltm binding calls, declared in plain C.
 *
 * The official headers (torch/csrc/inductor/aoti_torch/c/shim.h and
 * torch/csrc/stable/c/shim.h) cannot be included from C: they use C++ `using`
 * aliases and C++ types. These prototypes copy theirs; tests/abi/
 * abi_drift_check.cpp includes both in one C++ translation unit, so any
 * prototype that drifts from the installed torch fails to compile in CI.
 *
 * Every function here exists in torch 2.11, the oldest torch we load on,
 * except those marked LLTM_OPTIONAL (newer; test for NULL before calling).
 * CUDA-only functions live in libtorch_cuda.so and are declared only when
 * LLTM_WITH_CUDA is defined (the CUDA library).
 *
 * The libraries are not linked against torch's (no DT_NEEDED entry names a
 * torch library, so a wheel passes the manylinux policy): each calls these
 * functions through a table of pointers, torch_stable_abi_table.h, generated
 * from this file by lltm/_torch_abi.py and included at the end. Its macros
 * keep the calls written by the functions' names. The table is filled from
 * the torch libraries already loaded in the process when Python loads the
 * library (lltm_resolve_torch(), torch_abi_loader.h), before any operator is
 * registered. After editing this file run `python lltm/_torch_abi.py`.
 */
#ifndef LLTM_BINDING_TORCH_STABLE_ABI_H
#define LLTM_BINDING_TORCH_STABLE_ABI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* marks a function an older torch lacks: its pointer is NULL there */
#define LLTM_OPTIONAL

/* The stable-ABI version we target; passed to calls that adapt to schema
 * changes between versions. 2.11.0 = (2 << 56) | (11 << 48). */
#define LLTM_TORCH_TARGET_VERSION ((2ULL << 56) | (11ULL << 48))

typedef int32_t AOTITorchError; /* 0 on success */
typedef struct AtenTensorOpaque *AtenTensorHandle;
typedef uint64_t StableIValue;
typedef struct TorchLibraryOpaque *TorchLibraryHandle;
typedef void (*ParallelFunc)(int64_t begin, int64_t end, void *ctx);
typedef struct StableListOpaque *StableListHandle;

/* dtype and device codes */
int32_t aoti_torch_dtype_float32(void);
int32_t aoti_torch_dtype_float64(void);
int32_t aoti_torch_dtype_float16(void);
int32_t aoti_torch_dtype_bfloat16(void);
int32_t aoti_torch_dtype_uint8(void);
int32_t aoti_torch_dtype_int64(void);
int32_t aoti_torch_device_type_cpu(void);
int32_t aoti_torch_device_type_cuda(void);

/* tensor handles: owned handles must be deleted exactly once */
AOTITorchError aoti_torch_delete_tensor_object(AtenTensorHandle tensor);
AOTITorchError aoti_torch_new_tensor_handle(AtenTensorHandle orig_handle,
                                            AtenTensorHandle *new_handle);
/* an undefined tensor: returned for a Tensor result, None in Python */
AOTITorchError aoti_torch_new_uninitialized_tensor(AtenTensorHandle *ret);

/* tensor metadata; sizes, strides and data are borrowed from the handle */
AOTITorchError aoti_torch_get_data_ptr(AtenTensorHandle tensor, void **ret_data_ptr);
AOTITorchError aoti_torch_get_dim(AtenTensorHandle tensor, int64_t *ret_dim);
AOTITorchError aoti_torch_get_numel(AtenTensorHandle tensor, int64_t *ret_numel);
AOTITorchError aoti_torch_get_sizes(AtenTensorHandle tensor, int64_t **ret_sizes);
AOTITorchError aoti_torch_get_strides(AtenTensorHandle tensor, int64_t **ret_strides);
AOTITorchError aoti_torch_get_dtype(AtenTensorHandle tensor, int32_t *ret_dtype);
AOTITorchError aoti_torch_get_device_type(AtenTensorHandle tensor,
                                          int32_t *ret_device_type);
AOTITorchError aoti_torch_get_device_index(AtenTensorHandle tensor,
                                           int32_t *ret_device_index);
AOTITorchError aoti_torch_is_contiguous(AtenTensorHandle tensor,
                                        bool *ret_is_contiguous);
/* false for an undefined tensor (None passed for a Tensor argument), whose
 * other getters fail */
AOTITorchError aoti_torch_is_defined(AtenTensorHandle tensor, bool *ret_is_defined);

/* allocation, views and copies */
AOTITorchError aoti_torch_empty_strided(int64_t ndim, const int64_t *sizes_ptr,
                                        const int64_t *strides_ptr, int32_t dtype,
                                        int32_t device_type, int32_t device_index,
                                        AtenTensorHandle *ret_new_tensor);
AOTITorchError aoti_torch__reinterpret_tensor(AtenTensorHandle self, int64_t ndim,
                                              const int64_t *sizes_ptr,
                                              const int64_t *strides_ptr,
                                              int64_t storage_offset,
                                              AtenTensorHandle *ret_new_tensor);
AOTITorchError aoti_torch_copy_(AtenTensorHandle self, AtenTensorHandle src,
                                int32_t non_blocking);
/* a tensor over memory it does not own (nothing is freed with it) */
AOTITorchError aoti_torch_create_tensor_from_blob(void *data, int64_t ndim,
                                                  const int64_t *sizes_ptr,
                                                  const int64_t *strides_ptr,
                                                  int64_t storage_offset, int32_t dtype,
                                                  int32_t device_type, int32_t device_index,
                                                  AtenTensorHandle *ret);

/* list arguments (e.g. bool[]): the kernel owns the list and deletes it */
AOTITorchError torch_list_size(StableListHandle list_handle, size_t *size);
AOTITorchError torch_list_get_item(StableListHandle list_handle, size_t index,
                                   StableIValue *element);
AOTITorchError torch_delete_list(StableListHandle list_handle);

/* operator registration */
AOTITorchError aoti_torch_library_init_fragment(const char *ns, const char *file,
                                                uint32_t line,
                                                TorchLibraryHandle *ret_new_torch_lib);
AOTITorchError aoti_torch_library_init_impl(const char *ns, const char *k,
                                            const char *file, uint32_t line,
                                            TorchLibraryHandle *ret_new_torch_lib);
AOTITorchError aoti_torch_library_def(TorchLibraryHandle self, const char *schema);
AOTITorchError aoti_torch_delete_library_object(TorchLibraryHandle tlh);
AOTITorchError torch_library_impl(TorchLibraryHandle self, const char *name,
                                  void (*fn)(StableIValue *, uint64_t, uint64_t),
                                  uint64_t extension_build_version);

/* calling ATen operators; tensor arguments are consumed, returns are owned */
AOTITorchError torch_call_dispatcher(const char *opName, const char *overloadName,
                                     StableIValue *stack,
                                     uint64_t extension_build_version);

/* torch's intra-op thread pool (honours torch.set_num_threads) */
AOTITorchError torch_parallel_for(int64_t begin, int64_t end, int64_t grain_size,
                                  ParallelFunc func, void *ctx);

/* errors: throws a C++ exception that reaches Python as RuntimeError(msg) */
void aoti_torch_check(bool cond, const char *func, const char *file,
                      uint32_t line, const char *msg);

/* 2.13+: the message of the last exception a shim call swallowed */
LLTM_OPTIONAL const char *torch_exception_get_what_without_backtrace(void);

/* out = self @ mat2 straight into ATen's CPU kernel (AOTInductor's generated
 * fallback shim, c_shim_cpu.h): no dispatcher lookup or boxing. Optional: when
 * a torch lacks it, aten::mm.out goes through torch_call_dispatcher. */
LLTM_OPTIONAL AOTITorchError aoti_torch_cpu_mm_out(AtenTensorHandle out, AtenTensorHandle self,
                                                   AtenTensorHandle mat2);

#ifdef LLTM_WITH_CUDA
typedef struct CUDAGuardOpaque *CUDAGuardHandle;
AOTITorchError aoti_torch_create_cuda_guard(int32_t device_index,
                                            CUDAGuardHandle *ret_guard);
AOTITorchError aoti_torch_delete_cuda_guard(CUDAGuardHandle guard);
AOTITorchError aoti_torch_get_current_cuda_stream(int32_t device_index,
                                                  void **ret_stream);
/* the CUDA twin of aoti_torch_cpu_mm_out (c_shim_cuda.h), in libtorch_cuda */
LLTM_OPTIONAL AOTITorchError aoti_torch_cuda_mm_out(AtenTensorHandle out, AtenTensorHandle self,
                                                    AtenTensorHandle mat2);
#endif

#ifdef __cplusplus
}
#endif

#include "torch_stable_abi_table.h"

#endif /* LLTM_BINDING_TORCH_STABLE_ABI_H */
