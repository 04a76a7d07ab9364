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

/* Block: PU units x PR row lanes (256 threads); grid: unit chunks x row
 * chunks. Gate gradients, d_old_cell, and the bias gradient in fixed order:
 * each thread sums its rows in turn, the block its PR lanes; with one row
 * chunk the block writes grad_bias, with several each writes its chunk's
 * sums to `partial` ([row chunks, 3H], the accumulation type) and
 * bias_sum_kernel (lltm_cuda_math.cuh) adds them. Spread over every thread
 * of the grid: X = [h, x] for the weight gradient's matrix product.
 * Two layouts, by the rows a thread would walk:
 *   whole batch  8 units x 32 lanes, one row chunk: one launch, a block for
 *                every 8 units; up to WHOLE_BATCH_ROWS rows (4 a thread)
 *   chunked      32 units x 8 lanes (a warp reads 32 consecutive units of a
 *                row), chunks of 32 rows (4 a thread; more where the chunks
 *                would pass MAX_ROW_CHUNKS): a large batch fills the GPU
 *                whatever H is, for one more launch. */
constexpr int THREADS = 256, WHOLE_PU = 8, CHUNKED_PU = 32;
constexpr int64_t ROWS_PER_THREAD = 4;
constexpr int64_t WHOLE_BATCH_ROWS = ROWS_PER_THREAD * (THREADS / WHOLE_PU);
constexpr int64_t CHUNK_ROWS = ROWS_PER_THREAD * (THREADS / CHUNKED_PU), MAX_ROW_CHUNKS = 1024;

inline int64_t chunk_rows(int64_t B)
{
    if (B <= WHOLE_BATCH_ROWS)
        return B;
    const int64_t rows = ceil_div(B, MAX_ROW_CHUNKS);
    return rows > CHUNK_ROWS ? rows : CHUNK_ROWS;
}

inline int64_t row_chunks(int64_t B)
{
    return B > WHOLE_BATCH_ROWS ? ceil_div(B, chunk_rows(B)) : 1;
}

template <typename T, int PU, int PR>
__global__ void __launch_bounds__(PU * PR)
backward_pointwise_kernel(int64_t B, int64_t I, int64_t H, int64_t rows,
                          const T *__restrict__ grad_h, const T *__restrict__ grad_cell,
                          const T *__restrict__ new_cell, const T *__restrict__ gates,
                          const T *__restrict__ old_h, const T *__restrict__ input,
                          T *__restrict__ grad_gates, T *__restrict__ grad_old_cell,
                          T *__restrict__ grad_bias, typename acc_of<T>::type *__restrict__ partial,
                          T *__restrict__ X)
{
    typedef typename acc_of<T>::type A;
    __shared__ A lane_sums[PR][3 * PU];
    const int uu = threadIdx.x % PU, lane = threadIdx.x / PU;
    const int64_t u = (int64_t)blockIdx.x * PU + uu;
    const int64_t first = (int64_t)blockIdx.y * rows;
    const int64_t end = first + rows < B ? first + rows : B;
    A sum[3] = {0, 0, 0};
    if (u < H) {
        for (int64_t b = first + lane; b < end; b += PR) {
            A d[3], dc;
            backward_unit<T, A>(b, u, H, grad_h, grad_cell, new_cell, gates, d, &dc);
            store_gates<T>(grad_gates + b * 3 * H, H, u, d[0], d[1], d[2]);
            grad_old_cell[b * H + u] = from_acc<T>(dc);
            sum[0] += d[0];
            sum[1] += d[1];
            sum[2] += d[2];
        }
    }
    for (int g = 0; g < 3; ++g)
        lane_sums[lane][g * PU + uu] = sum[g];
    __syncthreads();
    if (threadIdx.x < 3 * PU) {
        const int g = threadIdx.x / PU;
        const int64_t v = (int64_t)blockIdx.x * PU + threadIdx.x % PU;
        A total = 0;
        for (int r = 0; r < PR; ++r)
            total += lane_sums[r][threadIdx.x];
        if (v < H) {
            if (partial != nullptr)
                partial[(int64_t)blockIdx.y * 3 * H + g * H + v] = total;
            else
                grad_bias[g * H + v] = from_acc<T>(total);
        }
    }
    if (X != nullptr) {
        const int64_t K = I + H, n = B * K;
        const int64_t threads = (int64_t)gridDim.x * gridDim.y * blockDim.x;
        for (int64_t e = ((int64_t)blockIdx.y * gridDim.x + blockIdx.x) * blockDim.x +
                         threadIdx.x;
             e < n; e += threads) {
            const int64_t b = e / K, k = e % K;
            X[e] = k < H ? old_h[b * H + k] : input[b * I + (k - H)];
        }
    }
}

template <typename T>
size_t backward_pointwise_workspace(int64_t B, int64_t H)
{
    const int64_t chunks = row_chunks(B);
    return chunks > 1 ? (size_t)(chunks * 3 * H) * sizeof(typename acc_of<T>::type) : 0;
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

/* One launch of backward_pointwise_kernel in the layout of PU units a
 * block, over `chunks` row chunks of `rows` rows. */
template <typename T, int PU>
void launch_backward_pointwise(int64_t B, int64_t I, int64_t H, int64_t chunks, int64_t rows,
                               const void *grad_h, const void *grad_cell, const void *new_cell,
                               const void *gates, const void *old_h, const void *input,
                               void *grad_gates, void *grad_old_cell, void *grad_bias,
                               typename acc_of<T>::type *partial, void *X, cudaStream_t stream)
{
    const dim3 grid((unsigned)(H > 0 ? ceil_div(H, PU) : 1), (unsigned)chunks);
    LLTM_LAUNCH(grid, THREADS, 0, stream, backward_pointwise_kernel<T, PU, THREADS / PU>)(
        B, I, H, rows, (const T *)grad_h, (const T *)grad_cell, (const T *)new_cell,
        (const T *)gates, (const T *)old_h, (const T *)input, (T *)grad_gates,
        (T *)grad_old_cell, (T *)grad_bias, partial, (T *)X);
}

template <typename T>
int backward_pointwise(int64_t B, int64_t I, int64_t H, const void *grad_h,
                       const void *grad_cell, const void *new_cell, const void *gates,
                       const void *old_h, const void *input, void *grad_gates,
                       void *grad_old_cell, void *grad_bias, void *X, void *workspace,
                       cudaStream_t stream)
{
    typedef typename acc_of<T>::type A;
    if (H == 0 && (X == nullptr || B * I == 0))
        return LLTM_OK;
    const int64_t chunks = row_chunks(B), rows = chunk_rows(B);
    if (chunks > 1 && H > 0 && workspace == nullptr)
        return LLTM_ERR_ARGUMENT;
    A *partial = chunks > 1 ? (A *)workspace : nullptr;
    if (chunks > 1)
        launch_backward_pointwise<T, CHUNKED_PU>(B, I, H, chunks, rows, grad_h, grad_cell,
                                                 new_cell, gates, old_h, input, grad_gates,
                                                 grad_old_cell, grad_bias, partial, X, stream);
    else
        launch_backward_pointwise<T, WHOLE_PU>(B, I, H, chunks, rows, grad_h, grad_cell,
                                               new_cell, gates, old_h, input, grad_gates,
                                               grad_old_cell, grad_bias, partial, X, stream);
    const int status = launch_status(cudaSuccess);
    if (status != LLTM_OK || partial == nullptr || H == 0)
        return status;
    LLTM_LAUNCH(pointwise_blocks(3 * H, 256), 256, 0, stream, bias_sum_kernel<T>)(
        chunks, 3 * H, partial, (T *)grad_bias);
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

size_t lltm_cell_backward_pointwise_workspace_cuda(lltm_dtype dtype, int64_t B, int64_t H)
{
    if (bad_sizes(B, 0, H))
        return 0;
    LLTM_DISPATCH_OR(dtype, backward_pointwise_workspace<T>(B, H), 0);
}

int lltm_cell_backward_pointwise_cuda(lltm_dtype dtype, int64_t B, int64_t I, int64_t H,
                                      const void *grad_h, const void *grad_cell,
                                      const void *new_cell, const void *gates,
                                      const void *old_h, const void *input, void *grad_gates,
                                      void *grad_old_cell, void *grad_bias, void *X,
                                      void *workspace, void *stream)
{
    if (bad_sizes(B, I, H))
        return LLTM_ERR_ARGUMENT;
    LLTM_DISPATCH(dtype, backward_pointwise<T>(B, I, H, grad_h, grad_cell, new_cell, gates,
                                               old_h, input, grad_gates, grad_old_cell,
                                               grad_bias, X, workspace, (cudaStream_t)stream));
}

} /* extern "C" */
