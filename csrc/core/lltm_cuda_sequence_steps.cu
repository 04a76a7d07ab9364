/*
 * lltm_cuda_sequence_steps.cu - the per-step kernels of the CUDA sequence
 * (lltm.h: LLTM_SEQ_STEPS, the fallback where no persistent kernel fits):
 * the caller runs h_{t-1} W_h^T (or dG_t W_h) as a matrix product and one
 * fused pointwise kernel per step from here; and the rounding of the bias
 * gradient's float32 sums for the half types.
 */
#include "lltm.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdint.h>

#include "lltm_cuda_launch.cuh"
#include "lltm_cuda_math.cuh"
#include "lltm_cuda_sequence.cuh"

namespace {

/* gates (in: x_t W_x^T, out: activations) += recurrent + bias, then the
 * step's state: one thread per (row, unit). Rows past their length at step
 * t (lengths, or NULL: none) keep their cell; gates and h are 0. */
template <typename T>
__global__ void forward_step_kernel(int64_t B, int64_t H, int64_t t,
                                    const int64_t *__restrict__ lengths,
                                    const T *__restrict__ recurrent, T *__restrict__ gates,
                                    const T *__restrict__ bias, const T *__restrict__ old_cell,
                                    T *__restrict__ new_h, T *__restrict__ new_cell)
{
    typedef typename acc_of<T>::type A;
    const int64_t n = B * H, G = 3 * H;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t b = e / H, u = e % H;
        T *g = gates + b * G;
        const T *r = recurrent + b * G;
        const bool live = t < row_steps(lengths, b, t + 1);
        A i, o, z, c, h;
        forward_step_math<A>(live, to_acc(g[u]) + to_acc(r[u]) + to_acc(bias[u]),
                             to_acc(g[H + u]) + to_acc(r[H + u]) + to_acc(bias[H + u]),
                             to_acc(g[2 * H + u]) + to_acc(r[2 * H + u]) +
                                 to_acc(bias[2 * H + u]),
                             to_acc(old_cell[e]), &i, &o, &z, &c, &h);
        g[u] = from_acc<T>(i);
        g[H + u] = from_acc<T>(o);
        g[2 * H + u] = from_acc<T>(z);
        new_cell[e] = from_acc<T>(c);
        new_h[e] = from_acc<T>(h);
    }
}

/* h_n [B,H]: row b of output [steps,B,H] at the row's last step
 * lengths[b] - 1 (clamped into the output: lengths are not checked on the
 * device) */
template <typename T>
__global__ void last_state_kernel(int64_t steps, int64_t B, int64_t H,
                                  const int64_t *__restrict__ lengths,
                                  const T *__restrict__ output, T *__restrict__ h_n)
{
    const int64_t n = B * H;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t last = __ldg(lengths + e / H) - 1;
        h_n[e] = output[(last < 0 ? 0 : last < steps ? last : steps - 1) * n + e];
    }
}

/* A block: STEP_UNITS consecutive units x STEP_SLICES slices of the batch;
 * thread (unit u, slice s) takes rows s, s + STEP_SLICES, ... of unit u
 * (a warp: 32 consecutive units of one row, coalesced): gate gradients of
 * the step, dL/dc_{t-1} in place; the slices' bias sums meet in shared
 * memory and bias_acc (accumulation type) += their total, summed in slice
 * order (deterministic). The rows run STEP_SLICES at a time: one thread per
 * unit walking the whole batch took ~0.5 us a row (B = 512, H = 64: 240 us
 * a step on the H100). dL/dh_t is grad_output plus grad_h_n at the row's
 * last step (lengths[b] - 1, or T - 1 without lengths), plus grad_h before
 * it; past it the row has no gate gradient and dL/dc passes through. */
constexpr int STEP_UNITS = 32, STEP_SLICES = 8;

template <typename T>
__global__ void __launch_bounds__(STEP_UNITS *STEP_SLICES)
backward_step_kernel(int64_t B, int64_t H, int64_t t, int64_t T_,
                     const int64_t *__restrict__ lengths, const T *__restrict__ grad_output,
                     const T *__restrict__ grad_h, const T *__restrict__ grad_h_n,
                     T *__restrict__ grad_cell, const T *__restrict__ cell,
                     const T *__restrict__ gates, T *__restrict__ grad_gates,
                     typename acc_of<T>::type *__restrict__ bias_acc)
{
    typedef typename acc_of<T>::type A;
    __shared__ A partial[STEP_SLICES][3][STEP_UNITS];
    const int lane = threadIdx.x % STEP_UNITS, slice = threadIdx.x / STEP_UNITS;
    const int64_t G = 3 * H;
    /* u0 is the same for the whole block: every thread meets the barriers */
    for (int64_t u0 = (int64_t)blockIdx.x * STEP_UNITS; u0 < H;
         u0 += (int64_t)gridDim.x * STEP_UNITS) {
        const int64_t u = u0 + lane;
        A sum[3] = {0, 0, 0};
        if (u < H) {
            for (int64_t b = slice; b < B; b += STEP_SLICES) {
                const int64_t j = b * H + u;
                const T *a = gates + b * G;
                const int64_t row_end = row_steps(lengths, b, T_);
                const T *dh = t == row_end - 1 ? grad_h_n : grad_h;
                A d[3], dc;
                backward_step_math<A>(t < row_end, to_acc(a[u]), to_acc(a[H + u]),
                                      to_acc(a[2 * H + u]), to_acc(cell[j]),
                                      to_acc(grad_output[j]) + to_acc(dh[j]),
                                      to_acc(grad_cell[j]), d, &dc);
                T *dg = grad_gates + b * G;
                dg[u] = from_acc<T>(d[0]);
                dg[H + u] = from_acc<T>(d[1]);
                dg[2 * H + u] = from_acc<T>(d[2]);
                grad_cell[j] = from_acc<T>(dc);
                sum[0] += d[0];
                sum[1] += d[1];
                sum[2] += d[2];
            }
        }
        for (int g = 0; g < 3; ++g)
            partial[slice][g][lane] = sum[g];
        __syncthreads();
        if (slice == 0 && u < H) {
            A total[3] = {0, 0, 0};
            for (int s = 0; s < STEP_SLICES; ++s)
                for (int g = 0; g < 3; ++g)
                    total[g] += partial[s][g][lane];
            bias_acc[u] += total[0];
            bias_acc[H + u] += total[1];
            bias_acc[2 * H + u] += total[2];
        }
        __syncthreads();
    }
}

template <typename T>
__global__ void convert_kernel(int64_t n, const typename acc_of<T>::type *__restrict__ src,
                               T *__restrict__ dst)
{
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n;
         e += (int64_t)gridDim.x * blockDim.x)
        dst[e] = from_acc<T>(src[e]);
}

template <typename T>
int forward_step(int64_t B, int64_t H, int64_t t, const int64_t *lengths, const void *recurrent,
                 void *gates, const void *bias, const void *old_cell, void *new_h,
                 void *new_cell, cudaStream_t stream)
{
    const int64_t n = B * H;
    if (n == 0)
        return LLTM_OK;
    LLTM_LAUNCH(pointwise_blocks(n, 256), 256, 0, stream, forward_step_kernel<T>)(
        B, H, t, lengths, (const T *)recurrent, (T *)gates, (const T *)bias,
        (const T *)old_cell, (T *)new_h, (T *)new_cell);
    return launch_status(cudaSuccess);
}

template <typename T>
int last_state(int64_t steps, int64_t B, int64_t H, const int64_t *lengths, const void *output,
               void *h_n, cudaStream_t stream)
{
    const int64_t n = B * H;
    if (n == 0)
        return LLTM_OK;
    LLTM_LAUNCH(pointwise_blocks(n, 256), 256, 0, stream, last_state_kernel<T>)(
        steps, B, H, lengths, (const T *)output, (T *)h_n);
    return launch_status(cudaSuccess);
}

template <typename T>
int backward_step(int64_t B, int64_t H, int64_t t, int64_t T_, const int64_t *lengths,
                  const void *grad_output, const void *grad_h, const void *grad_h_n,
                  void *grad_cell, const void *cell, const void *gates, void *grad_gates,
                  void *bias_acc, cudaStream_t stream)
{
    if (H == 0)
        return LLTM_OK;
    LLTM_LAUNCH(pointwise_blocks(H, STEP_UNITS), STEP_UNITS * STEP_SLICES, 0, stream,
                backward_step_kernel<T>)(
        B, H, t, T_, lengths, (const T *)grad_output, (const T *)grad_h, (const T *)grad_h_n,
        (T *)grad_cell, (const T *)cell, (const T *)gates, (T *)grad_gates,
        (typename acc_of<T>::type *)bias_acc);
    return launch_status(cudaSuccess);
}

template <typename T>
int convert(int64_t n, const void *src, void *dst, cudaStream_t stream)
{
    if (n == 0)
        return LLTM_OK;
    LLTM_LAUNCH(pointwise_blocks(n, 256), 256, 0, stream, convert_kernel<T>)(
        n, (const typename acc_of<T>::type *)src, (T *)dst);
    return launch_status(cudaSuccess);
}

} // namespace

extern "C" {

int lltm_sequence_forward_step_cuda(lltm_dtype dtype, int64_t B, int64_t H, int64_t t,
                                    const int64_t *lengths, const void *recurrent, void *gates,
                                    const void *bias, const void *old_cell, void *new_h,
                                    void *new_cell, void *stream)
{
    if (lltm_seq::bad_sizes(1, B, 0, H) || t < 0)
        return LLTM_ERR_ARGUMENT;
    LLTM_DISPATCH(dtype, forward_step<T>(B, H, t, lengths, recurrent, gates, bias, old_cell,
                                             new_h, new_cell, (cudaStream_t)stream));
}

int lltm_sequence_backward_step_cuda(lltm_dtype dtype, int64_t B, int64_t H, int64_t t,
                                     int64_t steps, const int64_t *lengths,
                                     const void *grad_output, const void *grad_h,
                                     const void *grad_h_n, void *grad_cell, const void *cell,
                                     const void *gates, void *grad_gates, void *bias_acc,
                                     void *stream)
{
    if (lltm_seq::bad_sizes(steps, B, 0, H) || t < 0 || t >= steps)
        return LLTM_ERR_ARGUMENT;
    LLTM_DISPATCH(dtype, backward_step<T>(B, H, t, steps, lengths, grad_output, grad_h, grad_h_n,
                                              grad_cell, cell, gates, grad_gates, bias_acc,
                                              (cudaStream_t)stream));
}

int lltm_sequence_last_state_cuda(lltm_dtype dtype, int64_t steps, int64_t B, int64_t H,
                                  const int64_t *lengths, const void *output, void *h_n,
                                  void *stream)
{
    if (lltm_seq::bad_sizes(steps, B, 0, H) || (B * H > 0 && (!lengths || steps < 1)))
        return LLTM_ERR_ARGUMENT;
    LLTM_DISPATCH(dtype, last_state<T>(steps, B, H, lengths, output, h_n,
                                           (cudaStream_t)stream));
}

int lltm_sequence_convert_cuda(lltm_dtype dtype, int64_t n, const void *src, void *dst,
                               void *stream)
{
    if (n < 0)
        return LLTM_ERR_ARGUMENT;
    LLTM_DISPATCH(dtype, convert<T>(n, src, dst, (cudaStream_t)stream));
}

} /* extern "C" */
