/* lltm_cuda_seq_stack_bf16.cu - the stacked-layer kernels for __nv_bfloat16
 * (lltm_cuda_sequence_stack.cuh), one translation unit a dtype. */
#include "lltm_cuda_sequence_stack_launch.cuh"

LLTM_SEQ_STACK_INSTANCES(, __nv_bfloat16)
