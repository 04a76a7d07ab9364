/* lltm_cuda_seq_stack_f32.cu - the stacked-layer kernels for float
 * (lltm_cuda_sequence_stack.cuh), one translation unit a dtype. */
#include "lltm_cuda_sequence_stack_launch.cuh"

LLTM_SEQ_STACK_INSTANCES(, float)
