/* lltm_cuda_seq_block_f32.cu - the block kernels of the sequence for
 * float (lltm_cuda_sequence_block.cuh), one translation unit a dtype. */
#include "lltm_cuda_sequence_block.cuh"

LLTM_SEQ_BLOCK_UNIT(float)
