/* lltm_cuda_seq_cbwd_f16.cu - the cluster backward kernels of the sequence for
 * __half (lltm_cuda_sequence_cluster_backward.cuh), one translation unit a dtype. */
#include "lltm_cuda_sequence_cluster_backward.cuh"

LLTM_SEQ_CLUSTER_BACKWARD_UNIT(__half)
