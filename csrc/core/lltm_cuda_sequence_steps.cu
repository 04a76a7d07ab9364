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
 * step's state: one thread per (row, unit). */
template <typename T>
__global__ void forward_step_kernel(int64_t B, int64_t H, const T *__restrict__ recurrent,
                                    T *__restrict__ gates, const T *__restrict__ bias,
                                    const T *__restrict__ old_cell, T *__restrict__ new_h,
                                    T *__restrict__ new_cell)
{
    typedef typename acc_of<T>::type A;
    const int64_t n = B * H, G = 3 * H;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t b = e / H, u = e % H;
        T *g = gates + b * G;
        const T *r = recurrent + b * G;
        const A i = sigmoid_(to_acc(g[u]) + to_acc(r[u]) + to_acc(bias[u]));
        const A o = sigmoid_(to_acc(g[H + u]) + to_acc(r[H + u]) + to_acc(bias[H + u]));
        const A z = elu_(to_acc(g[2 * H + u]) + to_acc(r[2 * H + u]) + to_acc(bias[2 * H + u]));
        const A c = to_acc(old_cell[e]) + i * z;
        g[u] = from_acc<T>(i);
        g[H + u] = from_acc<T>(o);
        g[2 * H + u] = from_acc<T>(z);
        new_cell[e] = from_acc<T>(c);
        new_h[e] = from_acc<T>(tanh_(c) * o);
    }
}

/* One thread per unit, over the batch in order (the bias sum is
 * deterministic): gate gradients of the step, dL/dc_{t-1} in place, and
 * bias_acc (accumulation type) += the batch sum. */
template <typename T>
__global__ void backward_step_kernel(int64_t B, int64_t H, const T *__restrict__ grad_output,
                                     const T *__restrict__ grad_h, T *__restrict__ grad_cell,
                                     const T *__restrict__ cell, const T *__restrict__ gates,
                                     T *__restrict__ grad_gates,
                                     typename acc_of<T>::type *__restrict__ bias_acc)
{
    typedef typename acc_of<T>::type A;
    const int64_t G = 3 * H;
    for (int64_t u = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; u < H;
         u += (int64_t)gridDim.x * blockDim.x) {
        A sum[3] = {0, 0, 0};
        for (int64_t b = 0; b < B; ++b) {
            const int64_t j = b * H + u;
            const T *a = gates + b * G;
            A d[3], dc;
            backward_math<A>(to_acc(a[u]), to_acc(a[H + u]), to_acc(a[2 * H + u]),
                             to_acc(cell[j]), to_acc(grad_output[j]) + to_acc(grad_h[j]),
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
        bias_acc[u] += sum[0];
        bias_acc[H + u] += sum[1];
        bias_acc[2 * H + u] += sum[2];
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
int forward_step(int64_t B, int64_t H, const void *recurrent, void *gates, const void *bias,
                 const void *old_cell, void *new_h, void *new_cell, cudaStream_t stream)
{
    const int64_t n = B * H;
    if (n == 0)
        return LLTM_OK;
    LLTM_LAUNCH(pointwise_blocks(n, 256), 256, 0, stream, forward_step_kernel<T>)(
        B, H, (const T *)recurrent, (T *)gates, (const T *)bias, (const T *)old_cell,
        (T *)new_h, (T *)new_cell);
    return launch_status(cudaSuccess);
}

template <typename T>
int backward_step(int64_t B, int64_t H, const void *grad_output, const void *grad_h,
                  void *grad_cell, const void *cell, const void *gates, void *grad_gates,
                  void *bias_acc, cudaStream_t stream)
{
    if (H == 0)
        return LLTM_OK;
    LLTM_LAUNCH(pointwise_blocks(H, 128), 128, 0, stream, backward_step_kernel<T>)(
        B, H, (const T *)grad_output, (const T *)grad_h, (T *)grad_cell, (const T *)cell,
        (const T *)gates, (T *)grad_gates, (typename acc_of<T>::type *)bias_acc);
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

int lltm_sequence_forward_step_cuda(lltm_dtype dtype, int64_t B, int64_t H,
                                    const void *recurrent, void *gates, const void *bias,
                                    const void *old_cell, void *new_h, void *new_cell,
                                    void *stream)
{
    if (lltm_seq::bad_sizes(1, B, 0, H))
        return LLTM_ERR_ARGUMENT;
    LLTM_DISPATCH(dtype, forward_step<T>(B, H, recurrent, gates, bias, old_cell, new_h,
                                             new_cell, (cudaStream_t)stream));
}

int lltm_sequence_backward_step_cuda(lltm_dtype dtype, int64_t B, int64_t H,
                                     const void *grad_output, const void *grad_h,
                                     void *grad_cell, const void *cell, const void *gates,
                                     void *grad_gates, void *bias_acc, void *stream)
{
    if (lltm_seq::bad_sizes(1, B, 0, H))
        return LLTM_ERR_ARGUMENT;
    LLTM_DISPATCH(dtype, backward_step<T>(B, H, grad_output, grad_h, grad_cell, cell,
                                              gates, grad_gates, bias_acc,
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
