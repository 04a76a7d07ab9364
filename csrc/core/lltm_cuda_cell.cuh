/*
 * lltm_cuda_cell.cuh - what the CUDA cell's translation units share
 * (lltm_cuda_cell_forward.cu, lltm_cuda_cell_backward.cu,
 * lltm_cuda_cell_pointwise.cu; C launchers declared in lltm.h, section
 * "CUDA, cell").
 *
 * Two ways to run a step; the binding picks one per call:
 *
 * Fused (own matrix products; forward 1 launch, backward 2):
 *   forward_fused    one block per tile of TB batch rows x TU hidden units
 *                    computes g = X W^T for the three gate rows (i, o, z) of
 *                    its units, reading X = [h, x] straight from old_h and
 *                    input (no concatenated copy), and finishes the step in
 *                    the same kernel: each thread holds i, o and z of the
 *                    same (row, unit), so bias, activations and the state
 *                    update need no other thread.
 *   backward_weights one block per tile of TU units x TK columns of W: forms
 *                    the gate gradients of its units for the whole batch
 *                    (pointwise), and from them its tile of
 *                    dW = dG^T X, plus (first column tile only) dG itself,
 *                    d_old_cell and the bias gradient (a column sum in fixed
 *                    order: deterministic).
 *   backward_inputs  dX = dG W, each block a tile of rows x columns of X,
 *                    written straight into grad_old_h (columns < H) or
 *                    grad_input.
 *
 * Pointwise (the binding runs the matrix products through aten::mm, i.e.
 * cuBLAS and tensor cores): concat (X = [h, x]), forward_pointwise,
 * backward_pointwise (gate gradients, d_old_cell, bias gradient and X in one
 * launch; above 128 rows the batch is split into row chunks and
 * bias_sum adds their bias sums).
 *
 * Precision: float32 and float64 compute in their own type (double math
 * functions for double); float16 and bfloat16 load, convert to float,
 * compute and accumulate in float, and round once when storing.
 *
 * All launches go to the caller's stream on the current device; every launch
 * is checked (cudaGetLastError). Index arithmetic on global memory is 64-bit.
 */
#ifndef LLTM_CORE_CUDA_CELL_CUH
#define LLTM_CORE_CUDA_CELL_CUH

#include "lltm.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdint.h>

#include "lltm_cuda_cell_tiles.h"
#include "lltm_cuda_launch.cuh"
#include "lltm_cuda_math.cuh"

namespace {

/* X = [h, x]: element (b, k) of the virtual [B, I+H] matrix. */
template <typename T>
__device__ __forceinline__ typename acc_of<T>::type
load_x(const T *__restrict__ old_h, const T *__restrict__ input, int64_t I, int64_t H,
       int64_t b, int64_t k)
{
    return to_acc(k < H ? old_h[b * H + k] : input[b * I + (k - H)]);
}

/* The forward's pointwise part for one (row, unit); g* include the bias. */
template <typename T, typename A>
__device__ __forceinline__ void forward_unit(A gi, A go, A gz, A c_prev, int64_t b, int64_t u,
                                             int64_t H, T *__restrict__ new_h,
                                             T *__restrict__ new_cell, T *__restrict__ gates)
{
    const A i = sigmoid_(gi), o = sigmoid_(go), z = elu_(gz);
    const A c = c_prev + i * z;
    store_gates<T>(gates + b * 3 * H, H, u, i, o, z);
    new_cell[b * H + u] = from_acc<T>(c);
    new_h[b * H + u] = from_acc<T>(tanh_(c) * o);
}

/* The backward's pointwise part for one (row, unit): gate gradients
 * d[0..2] = dL/dg_{i,o,z} and *d_cell = dL/dc. */
template <typename T, typename A>
__device__ __forceinline__ void backward_unit(int64_t b, int64_t u, int64_t H,
                                              const T *__restrict__ grad_h,
                                              const T *__restrict__ grad_cell,
                                              const T *__restrict__ new_cell,
                                              const T *__restrict__ gates, A d[3], A *d_cell)
{
    const int64_t j = b * H + u;
    const T *grow = gates + b * 3 * H;
    backward_math<A>(to_acc(grow[u]), to_acc(grow[H + u]), to_acc(grow[2 * H + u]),
                     to_acc(new_cell[j]), to_acc(grad_h[j]), to_acc(grad_cell[j]), d, d_cell);
}

/* The fused kernels' k split: KS groups of GROUP threads each hold PER
 * partial sums (acc, a thread's register tile in row-major order); groups
 * 1..KS-1 leave theirs in shared memory (partial: (KS-1)*GROUP*PER) and are
 * done (false), group 0 adds them in group order. */
template <int KS, int GROUP, int PER, typename A>
__device__ __forceinline__ bool add_split_sums(A *acc, A *partial, int tid, int split)
{
    if (split > 0) {
        A *mine = partial + ((split - 1) * GROUP + tid % GROUP) * PER;
#pragma unroll
        for (int p = 0; p < PER; ++p)
            mine[p] = acc[p];
    }
    __syncthreads();
    if (split > 0)
        return false;
#pragma unroll
    for (int s = 1; s < KS; ++s) {
        const A *theirs = partial + ((s - 1) * GROUP + tid) * PER;
#pragma unroll
        for (int p = 0; p < PER; ++p)
            acc[p] += theirs[p];
    }
    return true;
}

/* Which tiles a kernel takes: lltm_cuda_cell_tiles.h. */
constexpr int64_t MAX_GRID_Y = LLTM_CUDA_MAX_GRID_Y;

/* One launch of a fused kernel over grid_x x grid_y tiles. */
template <typename... P, typename... Args>
int launch_tiles(void (*kernel)(P...), int64_t grid_x, int64_t grid_y, int threads,
                 cudaStream_t stream, Args... args)
{
    if (grid_y > MAX_GRID_Y)
        return LLTM_ERR_ARGUMENT;
    LLTM_LAUNCH(dim3((unsigned)grid_x, (unsigned)grid_y), threads, 0, stream, kernel)(args...);
    return launch_status(cudaSuccess);
}

bool bad_sizes(int64_t B, int64_t I, int64_t H)
{
    /* 2^31 blocks of at least 16 rows bound B; the rest keeps 64-bit
     * element offsets far from overflow. */
    return B < 0 || I < 0 || H < 0 || B > (int64_t)1 << 35 || I > (int64_t)1 << 31 ||
           H > (int64_t)1 << 29;
}

} // namespace

#endif /* LLTM_CORE_CUDA_CELL_CUH */
