/*
 * torch_stable_abi_table.h - the pointers through which the binding calls
 * torch's stable C ABI, one per function of torch_stable_abi.h (which
 * includes this file), filled at load time by lltm_resolve_torch()
 * (torch_abi_loader.h). The macros make a call by the function's own name a
 * call through its pointer; an optional function that torch lacks is NULL.
 *
 * Generated from torch_stable_abi.h by lltm/_torch_abi.py (run
 * `python lltm/_torch_abi.py` after changing the header); do not edit.
 */
#ifndef LLTM_BINDING_TORCH_STABLE_ABI_TABLE_H
#define LLTM_BINDING_TORCH_STABLE_ABI_TABLE_H

#ifdef __cplusplus
#include <type_traits>
extern "C" {
#endif

struct lltm_torch_abi {
    int32_t (*aoti_torch_dtype_float32)(void);
    int32_t (*aoti_torch_dtype_float64)(void);
    int32_t (*aoti_torch_dtype_float16)(void);
    int32_t (*aoti_torch_dtype_bfloat16)(void);
    int32_t (*aoti_torch_dtype_uint8)(void);
    int32_t (*aoti_torch_dtype_int64)(void);
    int32_t (*aoti_torch_device_type_cpu)(void);
    int32_t (*aoti_torch_device_type_cuda)(void);
    AOTITorchError (*aoti_torch_delete_tensor_object)(AtenTensorHandle tensor);
    AOTITorchError (*aoti_torch_new_tensor_handle)(AtenTensorHandle orig_handle, AtenTensorHandle *new_handle);
    AOTITorchError (*aoti_torch_new_uninitialized_tensor)(AtenTensorHandle *ret);
    AOTITorchError (*aoti_torch_get_data_ptr)(AtenTensorHandle tensor, void **ret_data_ptr);
    AOTITorchError (*aoti_torch_get_dim)(AtenTensorHandle tensor, int64_t *ret_dim);
    AOTITorchError (*aoti_torch_get_numel)(AtenTensorHandle tensor, int64_t *ret_numel);
    AOTITorchError (*aoti_torch_get_sizes)(AtenTensorHandle tensor, int64_t **ret_sizes);
    AOTITorchError (*aoti_torch_get_strides)(AtenTensorHandle tensor, int64_t **ret_strides);
    AOTITorchError (*aoti_torch_get_dtype)(AtenTensorHandle tensor, int32_t *ret_dtype);
    AOTITorchError (*aoti_torch_get_device_type)(AtenTensorHandle tensor, int32_t *ret_device_type);
    AOTITorchError (*aoti_torch_get_device_index)(AtenTensorHandle tensor, int32_t *ret_device_index);
    AOTITorchError (*aoti_torch_is_contiguous)(AtenTensorHandle tensor, bool *ret_is_contiguous);
    AOTITorchError (*aoti_torch_is_defined)(AtenTensorHandle tensor, bool *ret_is_defined);
    AOTITorchError (*aoti_torch_empty_strided)(int64_t ndim, const int64_t *sizes_ptr, const int64_t *strides_ptr, int32_t dtype, int32_t device_type, int32_t device_index, AtenTensorHandle *ret_new_tensor);
    AOTITorchError (*aoti_torch__reinterpret_tensor)(AtenTensorHandle self, int64_t ndim, const int64_t *sizes_ptr, const int64_t *strides_ptr, int64_t storage_offset, AtenTensorHandle *ret_new_tensor);
    AOTITorchError (*aoti_torch_copy_)(AtenTensorHandle self, AtenTensorHandle src, int32_t non_blocking);
    AOTITorchError (*aoti_torch_create_tensor_from_blob)(void *data, int64_t ndim, const int64_t *sizes_ptr, const int64_t *strides_ptr, int64_t storage_offset, int32_t dtype, int32_t device_type, int32_t device_index, AtenTensorHandle *ret);
    AOTITorchError (*torch_list_size)(StableListHandle list_handle, size_t *size);
    AOTITorchError (*torch_list_get_item)(StableListHandle list_handle, size_t index, StableIValue *element);
    AOTITorchError (*torch_delete_list)(StableListHandle list_handle);
    AOTITorchError (*aoti_torch_library_init_fragment)(const char *ns, const char *file, uint32_t line, TorchLibraryHandle *ret_new_torch_lib);
    AOTITorchError (*aoti_torch_library_init_impl)(const char *ns, const char *k, const char *file, uint32_t line, TorchLibraryHandle *ret_new_torch_lib);
    AOTITorchError (*aoti_torch_library_def)(TorchLibraryHandle self, const char *schema);
    AOTITorchError (*aoti_torch_delete_library_object)(TorchLibraryHandle tlh);
    AOTITorchError (*torch_library_impl)(TorchLibraryHandle self, const char *name, void (*fn)(StableIValue *, uint64_t, uint64_t), uint64_t extension_build_version);
    AOTITorchError (*torch_call_dispatcher)(const char *opName, const char *overloadName, StableIValue *stack, uint64_t extension_build_version);
    AOTITorchError (*torch_parallel_for)(int64_t begin, int64_t end, int64_t grain_size, ParallelFunc func, void *ctx);
    void (*aoti_torch_check)(bool cond, const char *func, const char *file, uint32_t line, const char *msg);
    const char *(*torch_exception_get_what_without_backtrace)(void);
    AOTITorchError (*aoti_torch_cpu_mm_out)(AtenTensorHandle out, AtenTensorHandle self, AtenTensorHandle mat2);
#ifdef LLTM_WITH_CUDA
    AOTITorchError (*aoti_torch_create_cuda_guard)(int32_t device_index, CUDAGuardHandle *ret_guard);
    AOTITorchError (*aoti_torch_delete_cuda_guard)(CUDAGuardHandle guard);
    AOTITorchError (*aoti_torch_get_current_cuda_stream)(int32_t device_index, void **ret_stream);
    AOTITorchError (*aoti_torch_cuda_mm_out)(AtenTensorHandle out, AtenTensorHandle self, AtenTensorHandle mat2);
#endif
};

/* one per library, hidden: the CPU and CUDA libraries each have their own */
extern struct lltm_torch_abi lltm_torch_abi __attribute__((visibility("hidden")));

#ifdef __cplusplus
}
/* tests/abi/abi_drift_check.cpp: each pointer has its function's type */
static_assert(std::is_same<decltype(&aoti_torch_dtype_float32), decltype(lltm_torch_abi.aoti_torch_dtype_float32)>::value, "aoti_torch_dtype_float32");
static_assert(std::is_same<decltype(&aoti_torch_dtype_float64), decltype(lltm_torch_abi.aoti_torch_dtype_float64)>::value, "aoti_torch_dtype_float64");
static_assert(std::is_same<decltype(&aoti_torch_dtype_float16), decltype(lltm_torch_abi.aoti_torch_dtype_float16)>::value, "aoti_torch_dtype_float16");
static_assert(std::is_same<decltype(&aoti_torch_dtype_bfloat16), decltype(lltm_torch_abi.aoti_torch_dtype_bfloat16)>::value, "aoti_torch_dtype_bfloat16");
static_assert(std::is_same<decltype(&aoti_torch_dtype_uint8), decltype(lltm_torch_abi.aoti_torch_dtype_uint8)>::value, "aoti_torch_dtype_uint8");
static_assert(std::is_same<decltype(&aoti_torch_dtype_int64), decltype(lltm_torch_abi.aoti_torch_dtype_int64)>::value, "aoti_torch_dtype_int64");
static_assert(std::is_same<decltype(&aoti_torch_device_type_cpu), decltype(lltm_torch_abi.aoti_torch_device_type_cpu)>::value, "aoti_torch_device_type_cpu");
static_assert(std::is_same<decltype(&aoti_torch_device_type_cuda), decltype(lltm_torch_abi.aoti_torch_device_type_cuda)>::value, "aoti_torch_device_type_cuda");
static_assert(std::is_same<decltype(&aoti_torch_delete_tensor_object), decltype(lltm_torch_abi.aoti_torch_delete_tensor_object)>::value, "aoti_torch_delete_tensor_object");
static_assert(std::is_same<decltype(&aoti_torch_new_tensor_handle), decltype(lltm_torch_abi.aoti_torch_new_tensor_handle)>::value, "aoti_torch_new_tensor_handle");
static_assert(std::is_same<decltype(&aoti_torch_new_uninitialized_tensor), decltype(lltm_torch_abi.aoti_torch_new_uninitialized_tensor)>::value, "aoti_torch_new_uninitialized_tensor");
static_assert(std::is_same<decltype(&aoti_torch_get_data_ptr), decltype(lltm_torch_abi.aoti_torch_get_data_ptr)>::value, "aoti_torch_get_data_ptr");
static_assert(std::is_same<decltype(&aoti_torch_get_dim), decltype(lltm_torch_abi.aoti_torch_get_dim)>::value, "aoti_torch_get_dim");
static_assert(std::is_same<decltype(&aoti_torch_get_numel), decltype(lltm_torch_abi.aoti_torch_get_numel)>::value, "aoti_torch_get_numel");
static_assert(std::is_same<decltype(&aoti_torch_get_sizes), decltype(lltm_torch_abi.aoti_torch_get_sizes)>::value, "aoti_torch_get_sizes");
static_assert(std::is_same<decltype(&aoti_torch_get_strides), decltype(lltm_torch_abi.aoti_torch_get_strides)>::value, "aoti_torch_get_strides");
static_assert(std::is_same<decltype(&aoti_torch_get_dtype), decltype(lltm_torch_abi.aoti_torch_get_dtype)>::value, "aoti_torch_get_dtype");
static_assert(std::is_same<decltype(&aoti_torch_get_device_type), decltype(lltm_torch_abi.aoti_torch_get_device_type)>::value, "aoti_torch_get_device_type");
static_assert(std::is_same<decltype(&aoti_torch_get_device_index), decltype(lltm_torch_abi.aoti_torch_get_device_index)>::value, "aoti_torch_get_device_index");
static_assert(std::is_same<decltype(&aoti_torch_is_contiguous), decltype(lltm_torch_abi.aoti_torch_is_contiguous)>::value, "aoti_torch_is_contiguous");
static_assert(std::is_same<decltype(&aoti_torch_is_defined), decltype(lltm_torch_abi.aoti_torch_is_defined)>::value, "aoti_torch_is_defined");
static_assert(std::is_same<decltype(&aoti_torch_empty_strided), decltype(lltm_torch_abi.aoti_torch_empty_strided)>::value, "aoti_torch_empty_strided");
static_assert(std::is_same<decltype(&aoti_torch__reinterpret_tensor), decltype(lltm_torch_abi.aoti_torch__reinterpret_tensor)>::value, "aoti_torch__reinterpret_tensor");
static_assert(std::is_same<decltype(&aoti_torch_copy_), decltype(lltm_torch_abi.aoti_torch_copy_)>::value, "aoti_torch_copy_");
static_assert(std::is_same<decltype(&aoti_torch_create_tensor_from_blob), decltype(lltm_torch_abi.aoti_torch_create_tensor_from_blob)>::value, "aoti_torch_create_tensor_from_blob");
static_assert(std::is_same<decltype(&torch_list_size), decltype(lltm_torch_abi.torch_list_size)>::value, "torch_list_size");
static_assert(std::is_same<decltype(&torch_list_get_item), decltype(lltm_torch_abi.torch_list_get_item)>::value, "torch_list_get_item");
static_assert(std::is_same<decltype(&torch_delete_list), decltype(lltm_torch_abi.torch_delete_list)>::value, "torch_delete_list");
static_assert(std::is_same<decltype(&aoti_torch_library_init_fragment), decltype(lltm_torch_abi.aoti_torch_library_init_fragment)>::value, "aoti_torch_library_init_fragment");
static_assert(std::is_same<decltype(&aoti_torch_library_init_impl), decltype(lltm_torch_abi.aoti_torch_library_init_impl)>::value, "aoti_torch_library_init_impl");
static_assert(std::is_same<decltype(&aoti_torch_library_def), decltype(lltm_torch_abi.aoti_torch_library_def)>::value, "aoti_torch_library_def");
static_assert(std::is_same<decltype(&aoti_torch_delete_library_object), decltype(lltm_torch_abi.aoti_torch_delete_library_object)>::value, "aoti_torch_delete_library_object");
static_assert(std::is_same<decltype(&torch_library_impl), decltype(lltm_torch_abi.torch_library_impl)>::value, "torch_library_impl");
static_assert(std::is_same<decltype(&torch_call_dispatcher), decltype(lltm_torch_abi.torch_call_dispatcher)>::value, "torch_call_dispatcher");
static_assert(std::is_same<decltype(&torch_parallel_for), decltype(lltm_torch_abi.torch_parallel_for)>::value, "torch_parallel_for");
static_assert(std::is_same<decltype(&aoti_torch_check), decltype(lltm_torch_abi.aoti_torch_check)>::value, "aoti_torch_check");
static_assert(std::is_same<decltype(&torch_exception_get_what_without_backtrace), decltype(lltm_torch_abi.torch_exception_get_what_without_backtrace)>::value, "torch_exception_get_what_without_backtrace");
static_assert(std::is_same<decltype(&aoti_torch_cpu_mm_out), decltype(lltm_torch_abi.aoti_torch_cpu_mm_out)>::value, "aoti_torch_cpu_mm_out");
#ifdef LLTM_WITH_CUDA
static_assert(std::is_same<decltype(&aoti_torch_create_cuda_guard), decltype(lltm_torch_abi.aoti_torch_create_cuda_guard)>::value, "aoti_torch_create_cuda_guard");
static_assert(std::is_same<decltype(&aoti_torch_delete_cuda_guard), decltype(lltm_torch_abi.aoti_torch_delete_cuda_guard)>::value, "aoti_torch_delete_cuda_guard");
static_assert(std::is_same<decltype(&aoti_torch_get_current_cuda_stream), decltype(lltm_torch_abi.aoti_torch_get_current_cuda_stream)>::value, "aoti_torch_get_current_cuda_stream");
static_assert(std::is_same<decltype(&aoti_torch_cuda_mm_out), decltype(lltm_torch_abi.aoti_torch_cuda_mm_out)>::value, "aoti_torch_cuda_mm_out");
#endif
#endif

#ifndef LLTM_TORCH_ABI_NO_REDIRECT /* (defined by the table's definition) */
#define aoti_torch_dtype_float32 (lltm_torch_abi.aoti_torch_dtype_float32)
#define aoti_torch_dtype_float64 (lltm_torch_abi.aoti_torch_dtype_float64)
#define aoti_torch_dtype_float16 (lltm_torch_abi.aoti_torch_dtype_float16)
#define aoti_torch_dtype_bfloat16 (lltm_torch_abi.aoti_torch_dtype_bfloat16)
#define aoti_torch_dtype_uint8 (lltm_torch_abi.aoti_torch_dtype_uint8)
#define aoti_torch_dtype_int64 (lltm_torch_abi.aoti_torch_dtype_int64)
#define aoti_torch_device_type_cpu (lltm_torch_abi.aoti_torch_device_type_cpu)
#define aoti_torch_device_type_cuda (lltm_torch_abi.aoti_torch_device_type_cuda)
#define aoti_torch_delete_tensor_object (lltm_torch_abi.aoti_torch_delete_tensor_object)
#define aoti_torch_new_tensor_handle (lltm_torch_abi.aoti_torch_new_tensor_handle)
#define aoti_torch_new_uninitialized_tensor (lltm_torch_abi.aoti_torch_new_uninitialized_tensor)
#define aoti_torch_get_data_ptr (lltm_torch_abi.aoti_torch_get_data_ptr)
#define aoti_torch_get_dim (lltm_torch_abi.aoti_torch_get_dim)
#define aoti_torch_get_numel (lltm_torch_abi.aoti_torch_get_numel)
#define aoti_torch_get_sizes (lltm_torch_abi.aoti_torch_get_sizes)
#define aoti_torch_get_strides (lltm_torch_abi.aoti_torch_get_strides)
#define aoti_torch_get_dtype (lltm_torch_abi.aoti_torch_get_dtype)
#define aoti_torch_get_device_type (lltm_torch_abi.aoti_torch_get_device_type)
#define aoti_torch_get_device_index (lltm_torch_abi.aoti_torch_get_device_index)
#define aoti_torch_is_contiguous (lltm_torch_abi.aoti_torch_is_contiguous)
#define aoti_torch_is_defined (lltm_torch_abi.aoti_torch_is_defined)
#define aoti_torch_empty_strided (lltm_torch_abi.aoti_torch_empty_strided)
#define aoti_torch__reinterpret_tensor (lltm_torch_abi.aoti_torch__reinterpret_tensor)
#define aoti_torch_copy_ (lltm_torch_abi.aoti_torch_copy_)
#define aoti_torch_create_tensor_from_blob (lltm_torch_abi.aoti_torch_create_tensor_from_blob)
#define torch_list_size (lltm_torch_abi.torch_list_size)
#define torch_list_get_item (lltm_torch_abi.torch_list_get_item)
#define torch_delete_list (lltm_torch_abi.torch_delete_list)
#define aoti_torch_library_init_fragment (lltm_torch_abi.aoti_torch_library_init_fragment)
#define aoti_torch_library_init_impl (lltm_torch_abi.aoti_torch_library_init_impl)
#define aoti_torch_library_def (lltm_torch_abi.aoti_torch_library_def)
#define aoti_torch_delete_library_object (lltm_torch_abi.aoti_torch_delete_library_object)
#define torch_library_impl (lltm_torch_abi.torch_library_impl)
#define torch_call_dispatcher (lltm_torch_abi.torch_call_dispatcher)
#define torch_parallel_for (lltm_torch_abi.torch_parallel_for)
#define aoti_torch_check (lltm_torch_abi.aoti_torch_check)
#define torch_exception_get_what_without_backtrace (lltm_torch_abi.torch_exception_get_what_without_backtrace)
#define aoti_torch_cpu_mm_out (lltm_torch_abi.aoti_torch_cpu_mm_out)
#ifdef LLTM_WITH_CUDA
#define aoti_torch_create_cuda_guard (lltm_torch_abi.aoti_torch_create_cuda_guard)
#define aoti_torch_delete_cuda_guard (lltm_torch_abi.aoti_torch_delete_cuda_guard)
#define aoti_torch_get_current_cuda_stream (lltm_torch_abi.aoti_torch_get_current_cuda_stream)
#define aoti_torch_cuda_mm_out (lltm_torch_abi.aoti_torch_cuda_mm_out)
#endif
#endif

#endif /* LLTM_BINDING_TORCH_STABLE_ABI_TABLE_H */
