/*
 * lltm_cuda_sequence.cu - one LLTM layer over a sequence on CUDA (lltm.h,
 * section "CUDA, sequence"): the persistent launches (check the plan against
 * the call, hand it to the unit of its kernel family and dtype;
 * lltm_cuda_sequence.cuh lists the parts), and the layer around them
 * (lltm_sequence_forward_cuda / _backward_cuda): the input projection, the
 * per-step loop where no persistent kernel fits and its h_n / c_n, the
 * weight-gradient products.
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

bool persistent(const lltm_sequence_plan *plan)
{
    return plan->family == LLTM_SEQ_GRID || plan->family == LLTM_SEQ_CLUSTER ||
           plan->family == LLTM_SEQ_BLOCK;
}

/* the plan was made for these arguments and runs a persistent family */
bool plan_matches(const lltm_sequence_plan *plan, int64_t B, int64_t H)
{
    return plan && persistent(plan) && plan->B == B && plan->H == H;
}

template <typename T>
int forward_dispatch(const lltm_sequence_plan &plan, const lltm_seq::forward_args &a,
                     cudaStream_t stream)
{
    return plan.family == LLTM_SEQ_CLUSTER ? lltm_seq::cluster_forward<T>(plan.forward, a, stream)
           : plan.family == LLTM_SEQ_BLOCK ? lltm_seq::block_run<T>(plan.forward, a, stream)
                                           : lltm_seq::grid_run<T>(plan.forward, a, stream);
}

template <typename T>
int backward_dispatch(const lltm_sequence_plan &plan, const lltm_seq::backward_args &a,
                      cudaStream_t stream)
{
    return plan.family == LLTM_SEQ_CLUSTER
               ? lltm_seq::cluster_backward<T>(plan.backward, a, stream)
           : plan.family == LLTM_SEQ_BLOCK ? lltm_seq::block_run<T>(plan.backward, a, stream)
                                           : lltm_seq::grid_run<T>(plan.backward, a, stream);
}

} // namespace

extern "C" {

int lltm_sequence_forward_persistent_cuda(const lltm_sequence_plan *plan, int64_t steps,
                                          int64_t B, int64_t I, int64_t H, const void *h0,
                                          const void *c0, const void *weights,
                                          const void *bias, void *gates, void *output,
                                          void *cells, void *h_n, void *c_n, void *workspace,
                                          const int64_t *lengths, void *stream)
{
    if (lltm_seq::bad_sizes(steps, B, I, H) || !plan_matches(plan, B, H))
        return LLTM_ERR_ARGUMENT;
    if (steps == 0 || B == 0 || H == 0)
        return LLTM_OK;
    const lltm_seq::forward_args a = {steps, B,     I,      H,     h0,        c0,      weights,
                                      bias,  gates, output, cells, workspace, lengths, h_n,
                                      c_n};
    LLTM_DISPATCH(plan->dtype, forward_dispatch<T>(*plan, a, (cudaStream_t)stream));
}

int lltm_sequence_backward_persistent_cuda(const lltm_sequence_plan *plan, int64_t steps,
                                           int64_t B, int64_t I, int64_t H,
                                           const void *grad_output, const void *grad_h_n,
                                           const void *grad_c_n, const void *weights,
                                           const void *cells, const void *gates,
                                           void *grad_gates, void *grad_bias, void *grad_h0,
                                           void *grad_c0, void *workspace,
                                           const int64_t *lengths, void *stream)
{
    if (lltm_seq::bad_sizes(steps, B, I, H) || steps == 0 || B == 0 ||
        !plan_matches(plan, B, H))
        return LLTM_ERR_ARGUMENT; /* the binding handles empty sequences */
    if (H == 0)
        return LLTM_OK;
    const lltm_seq::backward_args a = {steps,    B,     I,          H,         grad_output,
                                       grad_h_n, grad_c_n, weights, cells,     gates,
                                       grad_gates, grad_bias, grad_h0, grad_c0, workspace,
                                       lengths};
    LLTM_DISPATCH(plan->dtype, backward_dispatch<T>(*plan, a, (cudaStream_t)stream));
}

} /* extern "C" */

/* --------------------------------------------------------- the layer -- */

namespace {

using lltm_seq::round_up;

/* bytes of an element (0: unknown dtype) */
size_t elem_size(lltm_dtype dtype)
{
    return (unsigned)dtype <= (unsigned)LLTM_BFLOAT16 ? lltm_seq::elem_bytes(dtype) : 0;
}

void *at(const void *base, int64_t index, size_t elem)
{
    return (char *)base + (size_t)index * elem;
}

/* Readies the gemm for captures to come: its first call on a thread and
 * device may set up what a CUDA-graph capture forbids (torch makes a
 * thread's cuBLAS handle at its first product on a device: cublasCreate
 * allocates), and a thread whose eager products all ran on the small kernel
 * would make it inside its first capture, and fail. So the first eager
 * product of a thread on a device also runs the gemm, once, on c's first
 * element (which the small kernel then writes after it on the stream). */
int ready_gemm(lltm_dtype dtype, const void *a, const void *b, void *c, lltm_gemm gemm,
               void *gemm_ctx)
{
    static thread_local uint64_t ready = 0; /* a bit a device ordinal below 64 */
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) {
        cudaGetLastError();
        return LLTM_ERR_CUDA;
    }
    if (device < 0 || device >= 64 || (ready >> device & 1u))
        return LLTM_OK;
    if (gemm(gemm_ctx, dtype, 1, 1, 1, a, 1, 1, b, 1, 1, c, 1) != 0)
        return LLTM_ERR_GEMM;
    ready |= (uint64_t)1 << device;
    return LLTM_OK;
}

int call_gemm(lltm_gemm gemm, void *gemm_ctx, lltm_dtype dtype, int64_t M, int64_t N, int64_t K,
              const void *a, int64_t a_rs, int64_t a_cs, const void *b, int64_t b_rs,
              int64_t b_cs, void *c, int64_t ldc)
{
    return gemm(gemm_ctx, dtype, M, N, K, a, a_rs, a_cs, b, b_rs, b_cs, c, ldc) == 0
               ? LLTM_OK
               : LLTM_ERR_GEMM;
}

/* c [M,N] = a [M,K] b [K,N] on the stream: the library's one-launch product
 * where it fits (lltm_small_mm_fits: a library call costs more host time
 * than such a product's GPU time), else the caller's gemm. Not while the
 * stream is captured: the host's time is paid once, at capture, and the
 * gemm's products take less GPU time (cuBLAS's tiles; the small kernel's
 * reduction runs one k tile after another) */
int product(lltm_dtype dtype, int64_t M, int64_t N, int64_t K, const void *a, int64_t a_rs,
            int64_t a_cs, const void *b, int64_t b_rs, int64_t b_cs, void *c, int64_t ldc,
            lltm_gemm gemm, void *gemm_ctx, void *stream)
{
    if (lltm_small_mm_fits(M, N, K) && !lltm_cuda_stream_capturing(stream)) {
        if (M > 0 && N > 0 && K > 0) {
            const int status = ready_gemm(dtype, a, b, c, gemm, gemm_ctx);
            if (status != LLTM_OK)
                return status;
        }
        return lltm_small_mm_cuda(dtype, M, N, K, a, a_rs, a_cs, b, b_rs, b_cs, c, ldc, stream);
    }
    return call_gemm(gemm, gemm_ctx, dtype, M, N, K, a, a_rs, a_cs, b, b_rs, b_cs, c, ldc);
}

/* the per-step backward's bias sums: lltm_sequence_step_bias_parts lines
 * of G in the accumulation type */
size_t steps_bias_bytes(const lltm_sequence_plan *plan, int64_t B, int64_t H)
{
    const size_t acc = plan->dtype == LLTM_FLOAT64 ? sizeof(double) : sizeof(float);
    return (size_t)(lltm_sequence_step_bias_parts(B, H) * 3 * H) * acc;
}

bool layer_args_ok(const lltm_sequence_plan *plan, int64_t T, int64_t B, int64_t I, int64_t H)
{
    return plan && !lltm_seq::bad_sizes(T, B, I, H) &&
           (plan->family == LLTM_SEQ_STEPS || (plan->B == B && plan->H == H)) &&
           elem_size(plan->dtype) > 0;
}

} // namespace

namespace lltm_seq {

int input_projection(lltm_dtype dtype, int64_t TB, int64_t I, int64_t H, const void *input,
                     const void *weights, void *gates, lltm_gemm gemm, void *gemm_ctx,
                     void *stream)
{
    const int64_t G = 3 * H, K = I + H;
    const size_t elem = elem_size(dtype);
    /* gates [T*B,G] = x [T*B,I] W_x^T: the input projection of every step */
    return I > 0 ? product(dtype, TB, G, I, input, I, 1, at(weights, H, elem), 1, K, gates, G,
                           gemm, gemm_ctx, stream)
                 : lltm_cuda_zero(gates, (size_t)(TB * G) * elem, stream);
}

/* h_n, c_n [B,H] after the per-step family or an empty sequence (the
 * persistent recurrences write them themselves): the last step's state (h0,
 * c0 for an empty sequence); with lengths h_n is each row's h at its own
 * last step, and c_T is each row's c already (kept past the row's end) */
static int final_state(lltm_dtype dtype, int64_t T, int64_t B, int64_t H,
                       const int64_t *lengths, const void *h0, const void *c0,
                       const void *output, const void *cells, void *h_n, void *c_n,
                       void *stream)
{
    const size_t elem = elem_size(dtype), state_bytes = (size_t)(B * H) * elem;
    if (B * H == 0)
        return LLTM_OK;
    const int status =
        T > 0 && lengths
            ? lltm_sequence_last_state_cuda(dtype, T, B, H, lengths, output, h_n, stream)
            : lltm_cuda_copy(h_n, T > 0 ? at(output, (T - 1) * B * H, elem) : h0, state_bytes,
                             stream);
    return status != LLTM_OK ? status
                             : lltm_cuda_copy(c_n, T > 0 ? at(cells, (T - 1) * B * H, elem) : c0,
                                              state_bytes, stream);
}

int weight_grads(lltm_dtype dtype, int64_t T, int64_t B, int64_t I, int64_t H, const void *dG,
                 const void *h0, const void *output, const void *input, const void *weights,
                 void *hx, void *grad_weights, void *grad_input, lltm_gemm gemm, void *gemm_ctx,
                 void *stream)
{
    const int64_t G = 3 * H, K = I + H, TB = T * B;
    const size_t elem = elem_size(dtype);
    int status = LLTM_OK;
    if (grad_weights) {
        /* hx [T*B,K] = [h_prev | x], the rows of the weights' columns:
         * h_prev = [h0; h_1 .. h_{T-1}] (one product for all of dW instead
         * of two: one library call less); joined by one kernel a part
         * (cudaMemcpy2D moves rows of a few hundred bytes at a fraction of
         * the bandwidth) */
        const size_t row_H = (size_t)H * elem, row_I = (size_t)I * elem;
        status = lltm_cuda_join_rows(hx, h0, row_H, input, row_I, (size_t)B, stream);
        if (status == LLTM_OK)
            status = lltm_cuda_join_rows(at(hx, B * K, elem), output, row_H,
                                         at(input, B * I, elem), row_I, (size_t)((T - 1) * B),
                                         stream);
        /* dW = dG^T [h_prev | x]: all steps at once */
        if (status == LLTM_OK)
            status = product(dtype, G, K, TB, dG, 1, G, hx, K, 1, grad_weights, K, gemm,
                             gemm_ctx, stream);
    }
    /* dx = dG W_x: all steps at once */
    if (status == LLTM_OK && I > 0 && grad_input)
        status = product(dtype, TB, I, G, dG, G, 1, at(weights, H, elem), K, 1, grad_input, I,
                         gemm, gemm_ctx, stream);
    return status;
}

} // namespace lltm_seq

extern "C" {

size_t lltm_sequence_forward_workspace_cuda(const lltm_sequence_plan *plan, int64_t T,
                                            int64_t B, int64_t I, int64_t H)
{
    if (!layer_args_ok(plan, T, B, I, H) || T * B == 0)
        return 0;
    if (persistent(plan))
        return plan->workspace_bytes;
    return (size_t)(B * 3 * H) * elem_size(plan->dtype); /* r [B,G] */
}

size_t lltm_sequence_backward_workspace_cuda(const lltm_sequence_plan *plan, int64_t T,
                                             int64_t B, int64_t I, int64_t H)
{
    if (!layer_args_ok(plan, T, B, I, H) || T * B == 0)
        return 0;
    const size_t elem = elem_size(plan->dtype);
    const size_t first = persistent(plan) ? plan->workspace_bytes : steps_bias_bytes(plan, B, H);
    /* then dG [T,B,G], [h_prev | x] [T*B, H+I], and where the caller wants
     * no gradient of h0, c0 or the bias, the kernels' places for them:
     * [B,H], [B,H], [G] */
    return round_up(first) + round_up((size_t)(T * B * 3 * H) * elem) +
           round_up((size_t)(T * B * (H + I)) * elem) + 2 * round_up((size_t)(B * H) * elem) +
           (size_t)(3 * H) * elem;
}

int lltm_sequence_forward_cuda(const lltm_sequence_plan *plan, int64_t T, int64_t B, int64_t I,
                               int64_t H, const lltm_sequence_forward_tensors *tensors,
                               void *workspace, lltm_gemm gemm, void *gemm_ctx, void *stream)
{
    if (!layer_args_ok(plan, T, B, I, H) || !tensors || !gemm)
        return LLTM_ERR_ARGUMENT;
    const void *input = tensors->input, *weights = tensors->weights, *bias = tensors->bias;
    const void *h0 = tensors->h0, *c0 = tensors->c0;
    void *output = tensors->output, *h_n = tensors->h_n, *c_n = tensors->c_n;
    void *cells = tensors->cells, *gates = tensors->gates;
    const int64_t *lengths = tensors->lengths;
    const lltm_dtype dtype = plan->dtype;
    const int64_t G = 3 * H, K = I + H, TB = T * B;
    const size_t elem = elem_size(dtype);
    int status = LLTM_OK;
    if (TB > 0 && H > 0) {
        status = lltm_seq::input_projection(dtype, TB, I, H, input, weights, gates, gemm,
                                            gemm_ctx, stream);
        if (status != LLTM_OK)
            return status;
        if (persistent(plan)) /* h_n, c_n written by the recurrence */
            return lltm_sequence_forward_persistent_cuda(plan, T, B, I, H, h0, c0, weights,
                                                         bias, gates, output, cells, h_n, c_n,
                                                         workspace, lengths, stream);
        /* per step: r = h_{t-1} W_h^T (the caller's gemm), then one
         * pointwise kernel */
        void *r = workspace;
        for (int64_t t = 0; t < T && status == LLTM_OK; ++t) {
            const void *h_prev = t == 0 ? h0 : at(output, (t - 1) * B * H, elem);
            const void *c_prev = t == 0 ? c0 : at(cells, (t - 1) * B * H, elem);
            status = call_gemm(gemm, gemm_ctx, dtype, B, G, H, h_prev, H, 1, weights, 1, K, r,
                               G);
            if (status == LLTM_OK)
                status = lltm_sequence_forward_step_cuda(
                    dtype, B, H, t, lengths, r, at(gates, t * B * G, elem), bias, c_prev,
                    at(output, t * B * H, elem), at(cells, t * B * H, elem), stream);
        }
        if (status != LLTM_OK)
            return status;
    }
    return lltm_seq::final_state(dtype, T, B, H, lengths, h0, c0, output, cells, h_n, c_n,
                                 stream);
}

int lltm_sequence_backward_cuda(const lltm_sequence_plan *plan, int64_t T, int64_t B, int64_t I,
                                int64_t H, const lltm_sequence_backward_tensors *tensors,
                                void *workspace, lltm_gemm gemm, void *gemm_ctx, void *stream)
{
    if (!layer_args_ok(plan, T, B, I, H) || !tensors || !gemm)
        return LLTM_ERR_ARGUMENT;
    const void *grad_output = tensors->grad_output, *grad_h_n = tensors->grad_h_n;
    const void *grad_c_n = tensors->grad_c_n, *input = tensors->input;
    const void *weights = tensors->weights, *h0 = tensors->h0, *output = tensors->output;
    const void *cells = tensors->cells, *gates = tensors->gates;
    void *grad_input = tensors->grad_input, *grad_weights = tensors->grad_weights;
    void *grad_bias = tensors->grad_bias, *grad_h0 = tensors->grad_h0;
    void *grad_c0 = tensors->grad_c0;
    const int64_t *lengths = tensors->lengths;
    const lltm_dtype dtype = plan->dtype;
    const int64_t G = 3 * H, K = I + H, TB = T * B;
    const size_t elem = elem_size(dtype), state_bytes = (size_t)(B * H) * elem;
    int status = LLTM_OK;
    if (TB == 0 || H == 0) { /* nothing ran: the state's gradients pass through */
        if (grad_h0)
            status = lltm_cuda_copy(grad_h0, grad_h_n, state_bytes, stream);
        if (status == LLTM_OK && grad_c0)
            status = lltm_cuda_copy(grad_c0, grad_c_n, state_bytes, stream);
        if (status == LLTM_OK && grad_weights)
            status = lltm_cuda_zero(grad_weights, (size_t)(G * K) * elem, stream);
        if (status == LLTM_OK && grad_bias)
            status = lltm_cuda_zero(grad_bias, (size_t)G * elem, stream);
        if (status == LLTM_OK && TB > 0 && grad_input)
            status = lltm_cuda_zero(grad_input, (size_t)(TB * I) * elem, stream);
        return status;
    }
    /* workspace: the plan's (per-step kernels: the bias sums' lines), dG, hx,
     * then where the kernels put the gradients of h0, c0 and the bias that
     * the caller does not want */
    const size_t first = persistent(plan) ? plan->workspace_bytes : steps_bias_bytes(plan, B, H);
    void *own_dG = (char *)workspace + round_up(first);
    void *dG = tensors->grad_gates ? tensors->grad_gates : own_dG;
    void *hx = (char *)own_dG + round_up((size_t)(TB * G) * elem);
    void *spare_h0 = (char *)hx + round_up((size_t)(TB * K) * elem);
    void *spare_c0 = (char *)spare_h0 + round_up(state_bytes);
    void *spare_bias = (char *)spare_c0 + round_up(state_bytes);
    void *d_h0 = grad_h0 ? grad_h0 : spare_h0, *d_c0 = grad_c0 ? grad_c0 : spare_c0;
    void *d_bias = grad_bias ? grad_bias : spare_bias;
    if (persistent(plan)) {
        status = lltm_sequence_backward_persistent_cuda(
            plan, T, B, I, H, grad_output, grad_h_n, grad_c_n, weights, cells, gates, dG,
            d_bias, d_h0, d_c0, first ? workspace : NULL, lengths, stream);
    } else {
        /* per step, reverse time: the pointwise kernel (dG_t, dL/dc_{t-1}
         * into d_c0, from grad_c_n at the first step and in place after,
         * the bias sums' lines), then dh = dG_t W_h (the caller's gemm) into
         * d_h0; the first step's product only where grad_h0 is wanted; then
         * the bias sums' lines summed into d_bias */
        const void *dh_next = grad_h_n, *dc_next = grad_c_n;
        for (int64_t t = T - 1; t >= 0 && status == LLTM_OK; --t) {
            status = lltm_sequence_backward_step_cuda(
                dtype, B, H, t, T, lengths, at(grad_output, t * B * H, elem), dh_next, grad_h_n,
                dc_next, d_c0, at(cells, t * B * H, elem), at(gates, t * B * G, elem),
                at(dG, t * B * G, elem), workspace, stream);
            if (status == LLTM_OK && (t > 0 || grad_h0))
                status = call_gemm(gemm, gemm_ctx, dtype, B, H, G, at(dG, t * B * G, elem), G, 1,
                                   weights, K, 1, d_h0, H);
            dh_next = d_h0;
            dc_next = d_c0;
        }
        if (status == LLTM_OK)
            status = lltm_sequence_bias_sum_cuda(dtype, lltm_sequence_step_bias_parts(B, H), G,
                                                 workspace, d_bias, stream);
    }
    if (status != LLTM_OK)
        return status;

    return lltm_seq::weight_grads(dtype, T, B, I, H, dG, h0, output, input, weights, hx,
                                  grad_weights, grad_input, gemm, gemm_ctx, stream);
}

} /* extern "C" */
