/*
 * lltm_cuda_sequence.cu - the C entry points of the persistent CUDA
 * sequence kernels (lltm.h, section "CUDA, sequence"): check the plan
 * against the call, then hand it to the unit of its kernel family and dtype
 * (lltm_cuda_sequence.cuh lists the parts).
 *
 * Every launch is checked; all work goes to the caller's stream on the
 * current device.
 */
#include "lltm.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "lltm_cuda_math.cuh"
#include "lltm_cuda_sequence.cuh"

namespace {

/* the plan was made for these arguments and runs a persistent family */
bool plan_matches(const lltm_sequence_plan *plan, int64_t B, int64_t H)
{
    return plan && (plan->family == LLTM_SEQ_GRID || plan->family == LLTM_SEQ_CLUSTER) &&
           plan->B == B && plan->H == H;
}

template <typename T>
int forward_dispatch(const lltm_sequence_plan &plan, const lltm_seq::forward_args &a,
                     cudaStream_t stream)
{
    return plan.family == LLTM_SEQ_CLUSTER
               ? lltm_seq::cluster_forward<T>(plan.forward, a, stream)
               : lltm_seq::grid_forward<T>(plan.forward, a, stream);
}

template <typename T>
int backward_dispatch(const lltm_sequence_plan &plan, const lltm_seq::backward_args &a,
                      cudaStream_t stream)
{
    return plan.family == LLTM_SEQ_CLUSTER
               ? lltm_seq::cluster_backward<T>(plan.backward, a, stream)
               : lltm_seq::grid_backward<T>(plan.backward, a, stream);
}

} // namespace

extern "C" {

int lltm_sequence_forward_persistent_cuda(const lltm_sequence_plan *plan, int64_t steps,
                                          int64_t B, int64_t I, int64_t H, const void *h0,
                                          const void *c0, const void *weights,
                                          const void *bias, void *gates, void *output,
                                          void *cells, void *workspace, void *stream)
{
    if (lltm_seq::bad_sizes(steps, B, I, H) || !plan_matches(plan, B, H))
        return LLTM_ERR_ARGUMENT;
    if (steps == 0 || B == 0 || H == 0)
        return LLTM_OK;
    const lltm_seq::forward_args a = {steps, B, I, H, h0, c0, weights, bias,
                                      gates, output, cells, workspace};
    LLTM_DISPATCH(plan->dtype, forward_dispatch<T>(*plan, a, (cudaStream_t)stream));
}

int lltm_sequence_backward_persistent_cuda(const lltm_sequence_plan *plan, int64_t steps,
                                           int64_t B, int64_t I, int64_t H,
                                           const void *grad_output, const void *grad_h_n,
                                           const void *grad_c_n, const void *weights,
                                           const void *cells, const void *gates,
                                           void *grad_gates, void *grad_bias, void *grad_h0,
                                           void *grad_c0, void *workspace, void *stream)
{
    if (lltm_seq::bad_sizes(steps, B, I, H) || steps == 0 || B == 0 ||
        !plan_matches(plan, B, H))
        return LLTM_ERR_ARGUMENT; /* the binding handles empty sequences */
    if (H == 0)
        return LLTM_OK;
    const lltm_seq::backward_args a = {steps,    B,     I,          H,         grad_output,
                                       grad_h_n, grad_c_n, weights, cells,     gates,
                                       grad_gates, grad_bias, grad_h0, grad_c0, workspace};
    LLTM_DISPATCH(plan->dtype, backward_dispatch<T>(*plan, a, (cudaStream_t)stream));
}

} /* extern "C" */
