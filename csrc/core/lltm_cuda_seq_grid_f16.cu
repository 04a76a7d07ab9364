/* lltm_cuda_seq_grid_f16.cu - the grid kernels of the sequence for __half
 * (lltm_cuda_sequence_grid*.cuh), one translation unit a dtype. */
#include "lltm_cuda_sequence_grid_launch.cuh"

LLTM_SEQ_GRID_UNIT(__half)
