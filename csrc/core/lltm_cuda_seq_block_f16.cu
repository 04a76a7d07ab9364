/* lltm_cuda_seq_block_f16.cu - the block kernels of the sequence for
 * __half (lltm_cuda_sequence_block.cuh), one translation unit a dtype. */
#include "lltm_cuda_sequence_block.cuh"

LLTM_SEQ_BLOCK_UNIT(__half)
