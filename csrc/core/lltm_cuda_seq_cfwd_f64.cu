/* lltm_cuda_seq_cfwd_f64.cu - the cluster forward kernels of the sequence for
 * double (lltm_cuda_sequence_cluster_forward.cuh), one translation unit a dtype. */
#include "lltm_cuda_sequence_cluster_forward.cuh"

LLTM_SEQ_CLUSTER_FORWARD_UNIT(double)
