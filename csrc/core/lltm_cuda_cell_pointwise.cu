/*
 * lltm_cuda_cell_pointwise.cu - the pointwise kernels of the CUDA cell (the
 * binding runs the matrix products): concat, forward, backward
 * (lltm_cuda_cell.cuh describes the cell's kernels).
 */
#include "lltm_cuda_cell.cuh"

namespace {

/* X = [h, x], [B, I+H]. */
template <typename T>
__global__ void concat_kernel(int64_t B, int64_t I, int64_t H, const T *__restrict__ old_h,
                              const T *__restrict__ input, T *__restrict__ X)
{
    const int64_t K = I + H, n = B * K;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t b = e / K, k = e % K;
        X[e] = k < H ? old_h[b * H + k] : input[b * I + (k - H)];
    }
}

/* gates holds X W^T (no bias) on entry, the activations on exit. */
template <typename T>
__global__ void forward_pointwise_kernel(int64_t B, int64_t H, T *__restrict__ gates,
                                         const T *__restrict__ bias,
                                         const T *__restrict__ old_cell, T *__restrict__ new_h,
                                         T *__restrict__ new_cell)
{
    typedef typename acc_of<T>::type A;
    const int64_t n = B * H;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t b = e / H, u = e % H;
        const T *grow = gates + b * 3 * H;
        const A gi = to_acc(grow[u]) + to_acc(bias[u]);
        const A go = to_acc(grow[H + u]) + to_acc(bias[H + u]);
        const A gz = to_acc(grow[2 * H + u]) + to_acc(bias[2 * H + u]);
        forward_unit<T, A>(gi, go, gz, to_acc(old_cell[e]), b, u, H, new_h, new_cell, gates);
    }
}

/* Block: PU units x PR row groups. Gate gradients, d_old_cell, the bias
 * gradient (each block sums its units' columns over the batch: partial sums
 * per row group, then a fixed-order sum) and, spread over every thread of
 * the grid, X = [h, x] for the weight gradient's matrix product. */
constexpr int PU = 8, PR = 32;

template <typename T>
__global__ void __launch_bounds__(PU * PR)
backward_pointwise_kernel(int64_t B, int64_t I, int64_t H, const T *__restrict__ grad_h,
                          const T *__restrict__ grad_cell, const T *__restrict__ new_cell,
                          const T *__restrict__ gates, const T *__restrict__ old_h,
                          const T *__restrict__ input, T *__restrict__ grad_gates,
                          T *__restrict__ grad_old_cell, T *__restrict__ grad_bias,
                          T *__restrict__ X)
{
    typedef typename acc_of<T>::type A;
    __shared__ A partial[PR][3 * PU];
    const int uu = threadIdx.x % PU, rg = threadIdx.x / PU;
    const int64_t u = (int64_t)blockIdx.x * PU + uu;
    A sum[3] = {0, 0, 0};
    if (u < H) {
        for (int64_t b = rg; b < B; b += PR) {
            A d[3], dc;
            backward_unit<T, A>(b, u, H, grad_h, grad_cell, new_cell, gates, d, &dc);
            T *drow = grad_gates + b * 3 * H;
            drow[u] = from_acc<T>(d[0]);
            drow[H + u] = from_acc<T>(d[1]);
            drow[2 * H + u] = from_acc<T>(d[2]);
            grad_old_cell[b * H + u] = from_acc<T>(dc);
            sum[0] += d[0];
            sum[1] += d[1];
            sum[2] += d[2];
        }
    }
    for (int g = 0; g < 3; ++g)
        partial[rg][g * PU + uu] = sum[g];
    __syncthreads();
    if (threadIdx.x < 3 * PU) {
        const int g = threadIdx.x / PU;
        const int64_t v = (int64_t)blockIdx.x * PU + threadIdx.x % PU;
        A total = 0;
        for (int r = 0; r < PR; ++r)
            total += partial[r][threadIdx.x];
        if (v < H)
            grad_bias[g * H + v] = from_acc<T>(total);
    }
    if (X != nullptr) {
        const int64_t K = I + H, n = B * K;
        for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n;
             e += (int64_t)gridDim.x * blockDim.x) {
            const int64_t b = e / K, k = e % K;
            X[e] = k < H ? old_h[b * H + k] : input[b * I + (k - H)];
        }
    }
}


template <typename T>
int concat(int64_t B, int64_t I, int64_t H, const void *old_h, const void *input, void *X,
           cudaStream_t stream)
{
    const int64_t n = B * (I + H);
    if (n == 0)
        return LLTM_OK;
    LLTM_LAUNCH(pointwise_blocks(n, 256), 256, 0, stream, concat_kernel<T>)(
        B, I, H, (const T *)old_h, (const T *)input, (T *)X);
    return launch_status(cudaSuccess);
}

template <typename T>
int forward_pointwise(int64_t B, int64_t H, void *gates, const void *bias, const void *old_cell,
                      void *new_h, void *new_cell, cudaStream_t stream)
{
    const int64_t n = B * H;
    if (n == 0)
        return LLTM_OK;
    LLTM_LAUNCH(pointwise_blocks(n, 256), 256, 0, stream, forward_pointwise_kernel<T>)(
        B, H, (T *)gates, (const T *)bias, (const T *)old_cell, (T *)new_h, (T *)new_cell);
    return launch_status(cudaSuccess);
}

template <typename T>
int backward_pointwise(int64_t B, int64_t I, int64_t H, const void *grad_h,
                       const void *grad_cell, const void *new_cell, const void *gates,
                       const void *old_h, const void *input, void *grad_gates,
                       void *grad_old_cell, void *grad_bias, void *X, cudaStream_t stream)
{
    if (H == 0 && (X == nullptr || B * I == 0))
        return LLTM_OK;
    const int64_t blocks = ceil_div(H, PU) > 0 ? ceil_div(H, PU) : 1;
    LLTM_LAUNCH((unsigned)blocks, PU * PR, 0, stream, backward_pointwise_kernel<T>)(
        B, I, H, (const T *)grad_h, (const T *)grad_cell, (const T *)new_cell,
        (const T *)gates, (const T *)old_h, (const T *)input, (T *)grad_gates,
        (T *)grad_old_cell, (T *)grad_bias, (T *)X);
    return launch_status(cudaSuccess);
}

} // namespace

extern "C" {

int lltm_concat_state_input_cuda(lltm_dtype dtype, int64_t B, int64_t I, int64_t H,
                                 const void *old_h, const void *input, void *X, void *stream)
{
    if (bad_sizes(B, I, H))
        return LLTM_ERR_ARGUMENT;
    LLTM_DISPATCH(dtype, concat<T>(B, I, H, old_h, input, X, (cudaStream_t)stream));
}

int lltm_cell_forward_pointwise_cuda(lltm_dtype dtype, int64_t B, int64_t H, void *gates,
                                     const void *bias, const void *old_cell, void *new_h,
                                     void *new_cell, void *stream)
{
    if (bad_sizes(B, 0, H))
        return LLTM_ERR_ARGUMENT;
    LLTM_DISPATCH(dtype, forward_pointwise<T>(B, H, gates, bias, old_cell, new_h, new_cell,
                                              (cudaStream_t)stream));
}

int lltm_cell_backward_pointwise_cuda(lltm_dtype dtype, int64_t B, int64_t I, int64_t H,
                                      const void *grad_h, const void *grad_cell,
                                      const void *new_cell, const void *gates,
                                      const void *old_h, const void *input, void *grad_gates,
                                      void *grad_old_cell, void *grad_bias, void *X,
                                      void *stream)
{
    if (bad_sizes(B, I, H))
        return LLTM_ERR_ARGUMENT;
    LLTM_DISPATCH(dtype, backward_pointwise<T>(B, I, H, grad_h, grad_cell, new_cell, gates,
                                               old_h, input, grad_gates, grad_old_cell,
                                               grad_bias, X, (cudaStream_t)stream));
}

} /* extern "C" */
