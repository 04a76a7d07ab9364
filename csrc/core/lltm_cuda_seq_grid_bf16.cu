/* lltm_cuda_seq_grid_bf16.cu - the grid kernels of the sequence for __nv_bfloat16
 * (lltm_cuda_sequence_grid*.cuh), one translation unit a dtype. */
#include "lltm_cuda_sequence_grid_launch.cuh"

LLTM_SEQ_GRID_UNIT(__nv_bfloat16)
