/*
 * lltm_cuda_sequence_steps.cu - the per-step kernels of the CUDA sequence
 * (lltm.h: LLTM_SEQ_STEPS): the caller runs h_{t-1} W_h^T (or dG_t W_h)
 * as a matrix product (cuBLAS, tensor cores where the dtype has them) and
 * one fused pointwise kernel per step from here; and the deterministic sum
 * of the bias gradient's partial sums at the end.
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

/* The per-step kernels run on a 2-D grid: blockIdx.x picks STEP_UNITS
 * consecutive units, blockIdx.y a block of consecutive rows of the batch;
 * a block's STEP_UNITS x STEP_SLICES threads take unit lane of the block's
 * units and rows slice, slice + STEP_SLICES, ... of its rows (a warp: 32
 * consecutive units of one row, coalesced). One thread a unit walking the
 * whole batch, or a grid over units alone, left the GPU idle at small H
 * (bfloat16 B = 256, H = 128: four blocks, 26 us a backward step on the
 * H100). */
constexpr int STEP_UNITS = 32, STEP_SLICES = 8;
constexpr int STEP_THREADS = STEP_UNITS * STEP_SLICES;
static_assert(STEP_UNITS == 32 && STEP_SLICES == 8,
              "lltm_sequence_step_rows (lltm.h) counts blocks of 32 units and 8 slices");
constexpr int64_t GRID_Y_MAX = 65535;

/* gates (in: x_t W_x^T, out: activations) += recurrent + bias, then the
 * step's state; a thread takes one (row, unit) and the next rows
 * STEP_SLICES x gridDim.y apart. Rows past their length at step t
 * (lengths, or NULL: none) keep their cell; gates and h are 0. */
template <typename T>
__global__ void __launch_bounds__(STEP_THREADS)
forward_step_kernel(int64_t B, int64_t H, int64_t t, const int64_t *__restrict__ lengths,
                    const T *__restrict__ recurrent, T *__restrict__ gates,
                    const T *__restrict__ bias, const T *__restrict__ old_cell,
                    T *__restrict__ new_h, T *__restrict__ new_cell)
{
    typedef typename acc_of<T>::type A;
    const int64_t u = (int64_t)blockIdx.x * STEP_UNITS + threadIdx.x % STEP_UNITS;
    if (u >= H)
        return;
    const int64_t G = 3 * H;
    const A bias_i = to_acc(bias[u]), bias_o = to_acc(bias[H + u]);
    const A bias_z = to_acc(bias[2 * H + u]);
    for (int64_t b = (int64_t)blockIdx.y * STEP_SLICES + threadIdx.x / STEP_UNITS; b < B;
         b += (int64_t)gridDim.y * STEP_SLICES) {
        const int64_t e = b * H + u;
        T *g = gates + b * G;
        const T *r = recurrent + b * G;
        const bool live = t < row_steps(lengths, b, t + 1);
        A i, o, z, c, h;
        forward_step_math<A>(live, to_acc(g[u]) + to_acc(r[u]) + bias_i,
                             to_acc(g[H + u]) + to_acc(r[H + u]) + bias_o,
                             to_acc(g[2 * H + u]) + to_acc(r[2 * H + u]) + bias_z,
                             to_acc(old_cell[e]), &i, &o, &z, &c, &h);
        store_gates<T>(g, H, u, i, o, z);
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
         e += (int64_t)gridDim.x * blockDim.x)
        h_n[e] = output[row_last_step(lengths, e / H, steps) * n + e];
}

/* The backward step t of T_: a block takes `rows` consecutive rows
 * (lltm_sequence_step_rows) of STEP_UNITS units: gate gradients, dL/dc_{t-1} from
 * dL/dc_t (grad_c_next; it may be grad_cell: in place). The bias gradient
 * without float atomics: the block's slices sum their rows, meet in shared
 * memory and are summed in slice order; the block's total goes to its row
 * block's line of bias_parts [parts, G] (accumulation type), written at the
 * first step the backward runs (t = T_ - 1) and added to after, so that
 * each line sums its rows over all steps in one fixed order; bias_sum_kernel
 * sums the lines at the end, in line order (deterministic). dL/dh_t is
 * grad_output plus grad_h_n at the row's last step (lengths[b] - 1, or T_ -
 * 1 without lengths), plus grad_h before it; past it the row has no gate
 * gradient and dL/dc passes through. */
template <typename T>
__global__ void __launch_bounds__(STEP_THREADS)
backward_step_kernel(int64_t B, int64_t H, int64_t t, int64_t T_, int64_t rows,
                     const int64_t *__restrict__ lengths, const T *__restrict__ grad_output,
                     const T *__restrict__ grad_h, const T *__restrict__ grad_h_n,
                     const T *grad_c_next, T *grad_cell, const T *__restrict__ cell,
                     const T *__restrict__ gates, T *__restrict__ grad_gates,
                     typename acc_of<T>::type *__restrict__ bias_parts)
{
    typedef typename acc_of<T>::type A;
    __shared__ A partial[STEP_SLICES][3][STEP_UNITS];
    const int lane = threadIdx.x % STEP_UNITS, slice = threadIdx.x / STEP_UNITS;
    const int64_t G = 3 * H, u = (int64_t)blockIdx.x * STEP_UNITS + lane;
    const int64_t first = (int64_t)blockIdx.y * rows;
    const int64_t last = first + rows < B ? first + rows : B;
    A *line = bias_parts + (int64_t)blockIdx.y * G;
    /* the line's sums so far, loaded now so that their latency overlaps the
     * rows' (0 at the first step, whose line holds no sums yet) */
    A sum[3] = {0, 0, 0}, before[3] = {0, 0, 0};
    if (slice == 0 && u < H && t != T_ - 1)
        for (int g = 0; g < 3; ++g)
            before[g] = line[g * H + u];
    if (u < H) {
        for (int64_t b = first + slice; b < last; b += STEP_SLICES) {
            const int64_t j = b * H + u;
            const T *a = gates + b * G;
            const int64_t row_end = row_steps(lengths, b, T_);
            const T *dh = t == row_end - 1 ? grad_h_n : grad_h;
            A d[3], dc;
            backward_step_math<A>(t < row_end, to_acc(a[u]), to_acc(a[H + u]),
                                  to_acc(a[2 * H + u]), to_acc(cell[j]),
                                  to_acc(grad_output[j]) + to_acc(dh[j]),
                                  to_acc(grad_c_next[j]), d, &dc);
            store_gates<T>(grad_gates + b * G, H, u, d[0], d[1], d[2]);
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
        for (int g = 0; g < 3; ++g)
            line[g * H + u] = before[g] + total[g];
    }
}

template <typename T>
int forward_step(int64_t B, int64_t H, int64_t t, const int64_t *lengths, const void *recurrent,
                 void *gates, const void *bias, const void *old_cell, void *new_h,
                 void *new_cell, cudaStream_t stream)
{
    if (B == 0 || H == 0)
        return LLTM_OK;
    const int64_t row_blocks = ceil_div(B, STEP_SLICES);
    const dim3 grid((unsigned)ceil_div(H, STEP_UNITS),
                    (unsigned)(row_blocks < GRID_Y_MAX ? row_blocks : GRID_Y_MAX));
    LLTM_LAUNCH(grid, STEP_THREADS, 0, stream, forward_step_kernel<T>)(
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
                  const void *grad_c_next, void *grad_cell, const void *cell, const void *gates,
                  void *grad_gates, void *bias_parts, cudaStream_t stream)
{
    const int64_t rows = lltm_sequence_step_rows(B, H);
    const dim3 grid((unsigned)ceil_div(H, STEP_UNITS), (unsigned)ceil_div(B, rows));
    LLTM_LAUNCH(grid, STEP_THREADS, 0, stream, backward_step_kernel<T>)(
        B, H, t, T_, rows, lengths, (const T *)grad_output, (const T *)grad_h,
        (const T *)grad_h_n, (const T *)grad_c_next, (T *)grad_cell, (const T *)cell,
        (const T *)gates, (T *)grad_gates, (typename acc_of<T>::type *)bias_parts);
    return launch_status(cudaSuccess);
}

template <typename T>
int bias_sum(int64_t parts, int64_t G, const void *bias_parts, void *grad_bias,
             cudaStream_t stream)
{
    LLTM_LAUNCH(pointwise_blocks(G, 256), 256, 0, stream, bias_sum_kernel<T>)(
        parts, G, (const typename acc_of<T>::type *)bias_parts, (T *)grad_bias);
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

int64_t lltm_sequence_step_bias_parts(int64_t B, int64_t H)
{
    return B > 0 && H > 0 ? ceil_div(B, lltm_sequence_step_rows(B, H)) : 0;
}

int lltm_sequence_backward_step_cuda(lltm_dtype dtype, int64_t B, int64_t H, int64_t t,
                                     int64_t steps, const int64_t *lengths,
                                     const void *grad_output, const void *grad_h,
                                     const void *grad_h_n, const void *grad_c_next,
                                     void *grad_cell, const void *cell, const void *gates,
                                     void *grad_gates, void *bias_parts, void *stream)
{
    if (lltm_seq::bad_sizes(steps, B, 0, H) || t < 0 || t >= steps)
        return LLTM_ERR_ARGUMENT;
    if (B == 0 || H == 0)
        return LLTM_OK;
    LLTM_DISPATCH(dtype, backward_step<T>(B, H, t, steps, lengths, grad_output, grad_h, grad_h_n,
                                              grad_c_next, grad_cell, cell, gates, grad_gates,
                                              bias_parts, (cudaStream_t)stream));
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

int lltm_sequence_bias_sum_cuda(lltm_dtype dtype, int64_t parts, int64_t G,
                                const void *bias_parts, void *grad_bias, void *stream)
{
    if (parts < 0 || G < 0)
        return LLTM_ERR_ARGUMENT;
    if (G == 0)
        return LLTM_OK;
    LLTM_DISPATCH(dtype, bias_sum<T>(parts, G, bias_parts, grad_bias, (cudaStream_t)stream));
}

} /* extern "C" */
