/* lltm_cuda_seq_block_bf16.cu - the block kernels of the sequence for
 * __nv_bfloat16 (lltm_cuda_sequence_block.cuh), one translation unit a dtype. */
#include "lltm_cuda_sequence_block.cuh"

LLTM_SEQ_BLOCK_UNIT(__nv_bfloat16)
