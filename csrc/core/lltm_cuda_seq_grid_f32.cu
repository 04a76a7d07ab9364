/* lltm_cuda_seq_grid_f32.cu - the grid kernels of the sequence for float
 * (lltm_cuda_sequence_grid*.cuh), one translation unit a dtype. */
#include "lltm_cuda_sequence_grid_launch.cuh"

LLTM_SEQ_GRID_UNIT(float)
