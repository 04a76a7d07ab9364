/*
 * torch_stable_abi_table.c - the table of torch_stable_abi_table.h and the
 * list of its entries that lltm_resolve_torch() (torch_abi_loader.c) fills.
 *
 * Generated from torch_stable_abi.h by lltm/_torch_abi.py (run
 * `python lltm/_torch_abi.py` after changing the header); do not edit.
 */
#define LLTM_TORCH_ABI_NO_REDIRECT
#include "torch_abi_loader.h"

struct lltm_torch_abi lltm_torch_abi;

const lltm_torch_symbol lltm_torch_symbols[] = {
    {"aoti_torch_dtype_float32", LLTM_TORCH_CPU_LIBRARY, false, &lltm_torch_abi.aoti_torch_dtype_float32},
    {"aoti_torch_dtype_float64", LLTM_TORCH_CPU_LIBRARY, false, &lltm_torch_abi.aoti_torch_dtype_float64},
    {"aoti_torch_dtype_float16", LLTM_TORCH_CPU_LIBRARY, false, &lltm_torch_abi.aoti_torch_dtype_float16},
    {"aoti_torch_dtype_bfloat16", LLTM_TORCH_CPU_LIBRARY, false, &lltm_torch_abi.aoti_torch_dtype_bfloat16},
    {"aoti_torch_dtype_uint8", LLTM_TORCH_CPU_LIBRARY, false, &lltm_torch_abi.aoti_torch_dtype_uint8},
    {"aoti_torch_dtype_int64", LLTM_TORCH_CPU_LIBRARY, false, &lltm_torch_abi.aoti_torch_dtype_int64},
    {"aoti_torch_device_type_cpu", LLTM_TORCH_CPU_LIBRARY, false, &lltm_torch_abi.aoti_torch_device_type_cpu},
    {"aoti_torch_device_type_cuda", LLTM_TORCH_CPU_LIBRARY, false, &lltm_torch_abi.aoti_torch_device_type_cuda},
    {"aoti_torch_delete_tensor_object", LLTM_TORCH_CPU_LIBRARY, false, &lltm_torch_abi.aoti_torch_delete_tensor_object},
    {"aoti_torch_new_tensor_handle", LLTM_TORCH_CPU_LIBRARY, false, &lltm_torch_abi.aoti_torch_new_tensor_handle},
    {"aoti_torch_new_uninitialized_tensor", LLTM_TORCH_CPU_LIBRARY, false, &lltm_torch_abi.aoti_torch_new_uninitialized_tensor},
    {"aoti_torch_get_data_ptr", LLTM_TORCH_CPU_LIBRARY, false, &lltm_torch_abi.aoti_torch_get_data_ptr},
    {"aoti_torch_get_dim", LLTM_TORCH_CPU_LIBRARY, false, &lltm_torch_abi.aoti_torch_get_dim},
    {"aoti_torch_get_numel", LLTM_TORCH_CPU_LIBRARY, false, &lltm_torch_abi.aoti_torch_get_numel},
    {"aoti_torch_get_sizes", LLTM_TORCH_CPU_LIBRARY, false, &lltm_torch_abi.aoti_torch_get_sizes},
    {"aoti_torch_get_strides", LLTM_TORCH_CPU_LIBRARY, false, &lltm_torch_abi.aoti_torch_get_strides},
    {"aoti_torch_get_dtype", LLTM_TORCH_CPU_LIBRARY, false, &lltm_torch_abi.aoti_torch_get_dtype},
    {"aoti_torch_get_device_type", LLTM_TORCH_CPU_LIBRARY, false, &lltm_torch_abi.aoti_torch_get_device_type},
    {"aoti_torch_get_device_index", LLTM_TORCH_CPU_LIBRARY, false, &lltm_torch_abi.aoti_torch_get_device_index},
    {"aoti_torch_is_contiguous", LLTM_TORCH_CPU_LIBRARY, false, &lltm_torch_abi.aoti_torch_is_contiguous},
    {"aoti_torch_is_defined", LLTM_TORCH_CPU_LIBRARY, false, &lltm_torch_abi.aoti_torch_is_defined},
    {"aoti_torch_empty_strided", LLTM_TORCH_CPU_LIBRARY, false, &lltm_torch_abi.aoti_torch_empty_strided},
    {"aoti_torch__reinterpret_tensor", LLTM_TORCH_CPU_LIBRARY, false, &lltm_torch_abi.aoti_torch__reinterpret_tensor},
    {"aoti_torch_copy_", LLTM_TORCH_CPU_LIBRARY, false, &lltm_torch_abi.aoti_torch_copy_},
    {"aoti_torch_create_tensor_from_blob", LLTM_TORCH_CPU_LIBRARY, false, &lltm_torch_abi.aoti_torch_create_tensor_from_blob},
    {"torch_list_size", LLTM_TORCH_CPU_LIBRARY, false, &lltm_torch_abi.torch_list_size},
    {"torch_list_get_item", LLTM_TORCH_CPU_LIBRARY, false, &lltm_torch_abi.torch_list_get_item},
    {"torch_delete_list", LLTM_TORCH_CPU_LIBRARY, false, &lltm_torch_abi.torch_delete_list},
    {"aoti_torch_library_init_fragment", LLTM_TORCH_CPU_LIBRARY, false, &lltm_torch_abi.aoti_torch_library_init_fragment},
    {"aoti_torch_library_init_impl", LLTM_TORCH_CPU_LIBRARY, false, &lltm_torch_abi.aoti_torch_library_init_impl},
    {"aoti_torch_library_def", LLTM_TORCH_CPU_LIBRARY, false, &lltm_torch_abi.aoti_torch_library_def},
    {"aoti_torch_delete_library_object", LLTM_TORCH_CPU_LIBRARY, false, &lltm_torch_abi.aoti_torch_delete_library_object},
    {"torch_library_impl", LLTM_TORCH_CPU_LIBRARY, false, &lltm_torch_abi.torch_library_impl},
    {"torch_call_dispatcher", LLTM_TORCH_CPU_LIBRARY, false, &lltm_torch_abi.torch_call_dispatcher},
    {"torch_parallel_for", LLTM_TORCH_CPU_LIBRARY, false, &lltm_torch_abi.torch_parallel_for},
    {"aoti_torch_check", LLTM_TORCH_CPU_LIBRARY, false, &lltm_torch_abi.aoti_torch_check},
    {"torch_exception_get_what_without_backtrace", LLTM_TORCH_CPU_LIBRARY, true, &lltm_torch_abi.torch_exception_get_what_without_backtrace},
    {"aoti_torch_cpu_mm_out", LLTM_TORCH_CPU_LIBRARY, true, &lltm_torch_abi.aoti_torch_cpu_mm_out},
#ifdef LLTM_WITH_CUDA
    {"aoti_torch_create_cuda_guard", LLTM_TORCH_CUDA_LIBRARY, false, &lltm_torch_abi.aoti_torch_create_cuda_guard},
    {"aoti_torch_delete_cuda_guard", LLTM_TORCH_CUDA_LIBRARY, false, &lltm_torch_abi.aoti_torch_delete_cuda_guard},
    {"aoti_torch_get_current_cuda_stream", LLTM_TORCH_CUDA_LIBRARY, false, &lltm_torch_abi.aoti_torch_get_current_cuda_stream},
    {"aoti_torch_cuda_mm_out", LLTM_TORCH_CUDA_LIBRARY, true, &lltm_torch_abi.aoti_torch_cuda_mm_out},
#endif
};

const size_t lltm_torch_symbol_count = sizeof lltm_torch_symbols / sizeof lltm_torch_symbols[0];
