/*
 * lltm_cuda_cell.cu - CUDA kernels of the LLTM cell and their C launchers
 * (declared in lltm.h, section "CUDA").
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
 * launch).
 *
 * Precision: float32 and float64 compute in their own type (double math
 * functions for double); float16 and bfloat16 load, convert to float,
 * compute and accumulate in float, and round once when storing.
 *
 * All launches go to the caller's stream on the current device; every launch
 * is checked (cudaGetLastError). Index arithmetic on global memory is 64-bit.
 */
#include "lltm.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdint.h>

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
    T *grow = gates + b * 3 * H;
    grow[u] = from_acc<T>(i);
    grow[H + u] = from_acc<T>(o);
    grow[2 * H + u] = from_acc<T>(z);
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

/* ------------------------------------------------------ fused forward -- */

/*
 * Block: TB rows x TU units (3*TU gate rows of W), KS groups of threads each
 * summing every KS-th k of a chunk (more threads for small problems; the
 * groups' partial sums meet in shared memory at the end). Thread (tx, ty) of
 * a group owns rows ty + i*TY and units tx + j*TX, all three gates of each.
 * Chunks of KC columns of X and W are staged in shared memory (transposed,
 * k-major), the next chunk's global loads in flight in registers while the
 * current one is multiplied.
 */
template <typename T, int TB, int TU, int RB, int RU, int KC, int KS>
__global__ void __launch_bounds__((TB / RB) * (TU / RU) * KS)
forward_fused_kernel(int64_t B, int64_t I, int64_t H, const T *__restrict__ input,
                     const T *__restrict__ old_h, const T *__restrict__ weights,
                     const T *__restrict__ bias, const T *__restrict__ old_cell,
                     T *__restrict__ new_h, T *__restrict__ new_cell, T *__restrict__ gates)
{
    typedef typename acc_of<T>::type A;
    constexpr int TX = TU / RU, TY = TB / RB, GROUP = TX * TY, NT = GROUP * KS;
    constexpr int GU = 3 * TU;
    constexpr int LX = (TB * KC + NT - 1) / NT, LW = (GU * KC + NT - 1) / NT;
    __shared__ A xs[KC][TB + 1];
    __shared__ A ws[KC][GU + 1];
    __shared__ A partial[KS > 1 ? (KS - 1) * GROUP * RB * 3 * RU : 1];

    const int tid = threadIdx.x;
    const int split = tid / GROUP, tx = tid % TX, ty = (tid / TX) % TY;
    const int64_t b0 = (int64_t)blockIdx.x * TB, u0 = (int64_t)blockIdx.y * TU;
    const int64_t K = I + H;

    A acc[RB][3][RU];
#pragma unroll
    for (int i = 0; i < RB; ++i)
#pragma unroll
        for (int g = 0; g < 3; ++g)
#pragma unroll
            for (int j = 0; j < RU; ++j)
                acc[i][g][j] = 0;

    /* The epilogue's inputs (bias, old_cell) are loaded now, by the threads
     * that finish the step, so their latency overlaps the products instead of
     * adding a global round trip at the end. */
    A bias_r[3][RU], c_prev[RB][RU];
#pragma unroll
    for (int j = 0; j < RU; ++j) {
        const int64_t u = u0 + tx + j * TX;
        const bool ok = split == 0 && u < H;
#pragma unroll
        for (int g = 0; g < 3; ++g)
            bias_r[g][j] = ok ? to_acc(bias[g * H + u]) : A(0);
#pragma unroll
        for (int i = 0; i < RB; ++i) {
            const int64_t b = b0 + ty + i * TY;
            c_prev[i][j] = (ok && b < B) ? to_acc(old_cell[b * H + u]) : A(0);
        }
    }

    A xr[LX], wr[LW];
    auto fetch = [&](int64_t k0) {
#pragma unroll
        for (int l = 0; l < LX; ++l) {
            const int e = tid + l * NT, kk = e % KC, bb = e / KC;
            const int64_t b = b0 + bb, k = k0 + kk;
            xr[l] = (e < TB * KC && b < B && k < K) ? load_x(old_h, input, I, H, b, k) : A(0);
        }
#pragma unroll
        for (int l = 0; l < LW; ++l) {
            const int e = tid + l * NT, kk = e % KC, r = e / KC;
            const int g = r / TU;
            const int64_t u = u0 + r % TU, k = k0 + kk;
            wr[l] = (e < GU * KC && u < H && k < K) ? to_acc(weights[(g * H + u) * K + k]) : A(0);
        }
    };
    fetch(0);
    for (int64_t k0 = 0; k0 < K; k0 += KC) {
#pragma unroll
        for (int l = 0; l < LX; ++l) {
            const int e = tid + l * NT;
            if (e < TB * KC)
                xs[e % KC][e / KC] = xr[l];
        }
#pragma unroll
        for (int l = 0; l < LW; ++l) {
            const int e = tid + l * NT;
            if (e < GU * KC)
                ws[e % KC][e / KC] = wr[l];
        }
        __syncthreads();
        if (k0 + KC < K)
            fetch(k0 + KC);
#pragma unroll 4
        for (int kk = split; kk < KC; kk += KS) {
            A xv[RB], wv[3][RU];
#pragma unroll
            for (int i = 0; i < RB; ++i)
                xv[i] = xs[kk][ty + i * TY];
#pragma unroll
            for (int g = 0; g < 3; ++g)
#pragma unroll
                for (int j = 0; j < RU; ++j)
                    wv[g][j] = ws[kk][g * TU + tx + j * TX];
#pragma unroll
            for (int i = 0; i < RB; ++i)
#pragma unroll
                for (int g = 0; g < 3; ++g)
#pragma unroll
                    for (int j = 0; j < RU; ++j)
                        acc[i][g][j] += xv[i] * wv[g][j];
        }
        __syncthreads();
    }

    if (KS > 1) {
        constexpr int PER = RB * 3 * RU;
        if (split > 0) {
            A *mine = partial + ((split - 1) * GROUP + tid % GROUP) * PER;
#pragma unroll
            for (int i = 0; i < RB; ++i)
#pragma unroll
                for (int g = 0; g < 3; ++g)
#pragma unroll
                    for (int j = 0; j < RU; ++j)
                        mine[(i * 3 + g) * RU + j] = acc[i][g][j];
        }
        __syncthreads();
        if (split > 0)
            return;
#pragma unroll
        for (int s = 1; s < KS; ++s) {
            const A *theirs = partial + ((s - 1) * GROUP + tid) * PER;
#pragma unroll
            for (int i = 0; i < RB; ++i)
#pragma unroll
                for (int g = 0; g < 3; ++g)
#pragma unroll
                    for (int j = 0; j < RU; ++j)
                        acc[i][g][j] += theirs[(i * 3 + g) * RU + j];
        }
    }

#pragma unroll
    for (int j = 0; j < RU; ++j) {
        const int64_t u = u0 + tx + j * TX;
        if (u >= H)
            continue;
#pragma unroll
        for (int i = 0; i < RB; ++i) {
            const int64_t b = b0 + ty + i * TY;
            if (b < B)
                forward_unit<T, A>(acc[i][0][j] + bias_r[0][j], acc[i][1][j] + bias_r[1][j],
                                   acc[i][2][j] + bias_r[2][j], c_prev[i][j], b, u, H, new_h,
                                   new_cell, gates);
        }
    }
}

/* ----------------------------------------------------- fused backward -- */

/*
 * dW tile: TU units (rows g*H + u of dW for g = 0..2) x TK columns, summed
 * over the batch in chunks of BC rows. Per chunk the block first forms the
 * gate gradients of its units for those rows (shared memory ds[BC][3TU]) and
 * stages X (xs[BC][TK]); thread (tr, tc) owns dW rows tr + i*TR and columns
 * tc + j*TC. Blocks of the first column tile also write dG, d_old_cell and
 * the bias gradient of their units (every column tile needs dG, but only one
 * writes it).
 */
template <typename T, int TU, int TK, int RR, int RC, int BC>
__global__ void __launch_bounds__((3 * TU / RR) * (TK / RC))
backward_weights_kernel(int64_t B, int64_t I, int64_t H, const T *__restrict__ grad_h,
                        const T *__restrict__ grad_cell, const T *__restrict__ new_cell,
                        const T *__restrict__ gates, const T *__restrict__ input,
                        const T *__restrict__ old_h, T *__restrict__ grad_gates,
                        T *__restrict__ grad_old_cell, T *__restrict__ grad_bias,
                        T *__restrict__ grad_weights)
{
    typedef typename acc_of<T>::type A;
    constexpr int GU = 3 * TU, TR = GU / RR, TC = TK / RC, NT = TR * TC;
    __shared__ A ds[BC][GU];
    __shared__ A xs[BC][TK];

    const int tid = threadIdx.x, tc = tid % TC, tr = tid / TC;
    const int64_t u0 = (int64_t)blockIdx.y * TU, k0 = (int64_t)blockIdx.x * TK;
    const int64_t K = I + H;
    const bool first_tile = blockIdx.x == 0;

    A acc[RR][RC];
#pragma unroll
    for (int i = 0; i < RR; ++i)
#pragma unroll
        for (int j = 0; j < RC; ++j)
            acc[i][j] = 0;
    A bias_sum = 0; /* threads tid < GU: bias gradient of gate row tid */

    for (int64_t c0 = 0; c0 < B; c0 += BC) {
        for (int e = tid; e < BC * TU; e += NT) {
            const int bb = e / TU, uu = e % TU;
            const int64_t b = c0 + bb, u = u0 + uu;
            A d[3] = {0, 0, 0}, dc;
            if (b < B && u < H) {
                backward_unit<T, A>(b, u, H, grad_h, grad_cell, new_cell, gates, d, &dc);
                if (first_tile) {
                    T *drow = grad_gates + b * 3 * H;
                    drow[u] = from_acc<T>(d[0]);
                    drow[H + u] = from_acc<T>(d[1]);
                    drow[2 * H + u] = from_acc<T>(d[2]);
                    grad_old_cell[b * H + u] = from_acc<T>(dc);
                }
            }
            ds[bb][uu] = d[0];
            ds[bb][TU + uu] = d[1];
            ds[bb][2 * TU + uu] = d[2];
        }
        for (int e = tid; e < BC * TK; e += NT) {
            const int bb = e / TK, kk = e % TK;
            const int64_t b = c0 + bb, k = k0 + kk;
            xs[bb][kk] = (b < B && k < K) ? load_x(old_h, input, I, H, b, k) : A(0);
        }
        __syncthreads();
        if (first_tile && tid < GU) {
            for (int bb = 0; bb < BC; ++bb)
                bias_sum += ds[bb][tid];
        }
#pragma unroll 4
        for (int bb = 0; bb < BC; ++bb) {
            A dv[RR], xv[RC];
#pragma unroll
            for (int i = 0; i < RR; ++i)
                dv[i] = ds[bb][tr + i * TR];
#pragma unroll
            for (int j = 0; j < RC; ++j)
                xv[j] = xs[bb][tc + j * TC];
#pragma unroll
            for (int i = 0; i < RR; ++i)
#pragma unroll
                for (int j = 0; j < RC; ++j)
                    acc[i][j] += dv[i] * xv[j];
        }
        __syncthreads();
    }

    if (first_tile && tid < GU) {
        const int64_t u = u0 + tid % TU;
        if (u < H)
            grad_bias[(tid / TU) * H + u] = from_acc<T>(bias_sum);
    }
#pragma unroll
    for (int i = 0; i < RR; ++i) {
        const int r = tr + i * TR;
        const int64_t u = u0 + r % TU;
        if (u >= H)
            continue;
        T *wrow = grad_weights + ((r / TU) * H + u) * K;
#pragma unroll
        for (int j = 0; j < RC; ++j) {
            const int64_t k = k0 + tc + j * TC;
            if (k < K)
                wrow[k] = from_acc<T>(acc[i][j]);
        }
    }
}

/*
 * dX = dG W: [B, K] = [B, G] x [G, K]. Block: TB rows x TK columns, KS thread
 * groups splitting each chunk of GC gate rows. Thread (tc, tb) owns rows
 * tb + i*TY, columns tc + j*TX. Column k < H goes to grad_old_h, the rest to
 * grad_input (no [B, K] intermediate).
 */
template <typename T, int TB, int TK, int RB, int RC, int GC, int KS>
__global__ void __launch_bounds__((TB / RB) * (TK / RC) * KS)
backward_inputs_kernel(int64_t B, int64_t I, int64_t H, const T *__restrict__ grad_gates,
                       const T *__restrict__ weights, T *__restrict__ grad_input,
                       T *__restrict__ grad_old_h)
{
    typedef typename acc_of<T>::type A;
    constexpr int TX = TK / RC, TY = TB / RB, GROUP = TX * TY, NT = GROUP * KS;
    constexpr int LD = (TB * GC + NT - 1) / NT, LW = (GC * TK + NT - 1) / NT;
    __shared__ A dsm[GC][TB + 1];
    __shared__ A wsm[GC][TK];
    __shared__ A partial[KS > 1 ? (KS - 1) * GROUP * RB * RC : 1];

    const int tid = threadIdx.x;
    const int split = tid / GROUP, tx = tid % TX, ty = (tid / TX) % TY;
    const int64_t b0 = (int64_t)blockIdx.x * TB, k0 = (int64_t)blockIdx.y * TK;
    const int64_t K = I + H, G = 3 * H;

    A acc[RB][RC];
#pragma unroll
    for (int i = 0; i < RB; ++i)
#pragma unroll
        for (int j = 0; j < RC; ++j)
            acc[i][j] = 0;

    A dr[LD], wr[LW];
    auto fetch = [&](int64_t g0) {
#pragma unroll
        for (int l = 0; l < LD; ++l) {
            const int e = tid + l * NT, gg = e % GC, bb = e / GC;
            const int64_t b = b0 + bb, g = g0 + gg;
            dr[l] = (e < TB * GC && b < B && g < G) ? to_acc(grad_gates[b * G + g]) : A(0);
        }
#pragma unroll
        for (int l = 0; l < LW; ++l) {
            const int e = tid + l * NT, kk = e % TK, gg = e / TK;
            const int64_t g = g0 + gg, k = k0 + kk;
            wr[l] = (e < GC * TK && g < G && k < K) ? to_acc(weights[g * K + k]) : A(0);
        }
    };
    fetch(0);
    for (int64_t g0 = 0; g0 < G; g0 += GC) {
#pragma unroll
        for (int l = 0; l < LD; ++l) {
            const int e = tid + l * NT;
            if (e < TB * GC)
                dsm[e % GC][e / GC] = dr[l];
        }
#pragma unroll
        for (int l = 0; l < LW; ++l) {
            const int e = tid + l * NT;
            if (e < GC * TK)
                wsm[e / TK][e % TK] = wr[l];
        }
        __syncthreads();
        if (g0 + GC < G)
            fetch(g0 + GC);
#pragma unroll 4
        for (int gg = split; gg < GC; gg += KS) {
            A dv[RB], wv[RC];
#pragma unroll
            for (int i = 0; i < RB; ++i)
                dv[i] = dsm[gg][ty + i * TY];
#pragma unroll
            for (int j = 0; j < RC; ++j)
                wv[j] = wsm[gg][tx + j * TX];
#pragma unroll
            for (int i = 0; i < RB; ++i)
#pragma unroll
                for (int j = 0; j < RC; ++j)
                    acc[i][j] += dv[i] * wv[j];
        }
        __syncthreads();
    }

    if (KS > 1) {
        constexpr int PER = RB * RC;
        if (split > 0) {
            A *mine = partial + ((split - 1) * GROUP + tid % GROUP) * PER;
#pragma unroll
            for (int i = 0; i < RB; ++i)
#pragma unroll
                for (int j = 0; j < RC; ++j)
                    mine[i * RC + j] = acc[i][j];
        }
        __syncthreads();
        if (split > 0)
            return;
#pragma unroll
        for (int s = 1; s < KS; ++s) {
            const A *theirs = partial + ((s - 1) * GROUP + tid) * PER;
#pragma unroll
            for (int i = 0; i < RB; ++i)
#pragma unroll
                for (int j = 0; j < RC; ++j)
                    acc[i][j] += theirs[i * RC + j];
        }
    }

#pragma unroll
    for (int i = 0; i < RB; ++i) {
        const int64_t b = b0 + ty + i * TY;
        if (b >= B)
            continue;
#pragma unroll
        for (int j = 0; j < RC; ++j) {
            const int64_t k = k0 + tx + j * TX;
            if (k < H)
                grad_old_h[b * H + k] = from_acc<T>(acc[i][j]);
            else if (k < K)
                grad_input[b * I + (k - H)] = from_acc<T>(acc[i][j]);
        }
    }
}

/* ---------------------------------------------------- pointwise kernels -- */

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

/* ------------------------------------------------------------ launchers -- */

/* Tile configurations: "small" spreads a small problem over many blocks and
 * splits the reduction inside a block (latency-bound sizes), "large" gives
 * each thread a bigger register tile (throughput-bound sizes). A problem
 * takes the large tiles once they still make at least this many blocks. */
#ifndef LLTM_CUDA_LARGE_TILE_MIN_BLOCKS /* tests force one configuration */
#define LLTM_CUDA_LARGE_TILE_MIN_BLOCKS 120
#endif
constexpr int64_t LARGE_TILE_MIN_BLOCKS = LLTM_CUDA_LARGE_TILE_MIN_BLOCKS;
constexpr int64_t MAX_GRID_Y = 65535;

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int launch_status(void)
{
    return cudaGetLastError() == cudaSuccess ? LLTM_OK : LLTM_ERR_CUDA;
}

/* Blocks for a grid-stride pointwise kernel over n elements. */
unsigned pointwise_blocks(int64_t n, int threads)
{
    const int64_t blocks = ceil_div(n, threads);
    return (unsigned)(blocks < 4096 ? (blocks > 0 ? blocks : 1) : 4096);
}

template <typename T>
int forward_fused(int64_t B, int64_t I, int64_t H, const void *input, const void *old_h,
                  const void *weights, const void *bias, const void *old_cell, void *new_h,
                  void *new_cell, void *gates, cudaStream_t stream)
{
    const T *x = (const T *)input, *h = (const T *)old_h, *W = (const T *)weights,
            *b = (const T *)bias, *c = (const T *)old_cell;
    T *h_out = (T *)new_h, *c_out = (T *)new_cell, *g_out = (T *)gates;
    if (ceil_div(B, 64) * ceil_div(H, 32) >= LARGE_TILE_MIN_BLOCKS) {
        constexpr int TB = 64, TU = 32, RB = 4, RU = 2, KC = 32, KS = 1;
        const dim3 grid((unsigned)ceil_div(B, TB), (unsigned)ceil_div(H, TU));
        if (ceil_div(H, TU) > MAX_GRID_Y)
            return LLTM_ERR_ARGUMENT;
        forward_fused_kernel<T, TB, TU, RB, RU, KC, KS>
            <<<grid, (TB / RB) * (TU / RU) * KS, 0, stream>>>(B, I, H, x, h, W, b, c, h_out,
                                                              c_out, g_out);
    } else {
        /* Chunks as long as shared memory allows (48 KB static): a small K
         * then takes one round trip to global memory. Small tiles, many
         * blocks, K split 16 ways: the shortest latency of the configurations
         * scripts/cell_tiles.cu timed on the H100 (3.2-3.45 us per launch by
         * graph replay at B16/I32/H128 in three runs, against 4.43-4.45 for
         * 16 x 4 tiles). */
        constexpr int TB = 8, TU = 2, RB = 1, RU = 1, KS = 16;
        constexpr int KC = sizeof(typename acc_of<T>::type) == 8 ? 96 : 192;
        const dim3 grid((unsigned)ceil_div(B, TB), (unsigned)ceil_div(H, TU));
        if (ceil_div(H, TU) > MAX_GRID_Y)
            return LLTM_ERR_ARGUMENT;
        forward_fused_kernel<T, TB, TU, RB, RU, KC, KS>
            <<<grid, (TB / RB) * (TU / RU) * KS, 0, stream>>>(B, I, H, x, h, W, b, c, h_out,
                                                              c_out, g_out);
    }
    return launch_status();
}

template <typename T>
int backward_fused(int64_t B, int64_t I, int64_t H, const void *grad_h, const void *grad_cell,
                   const void *new_cell, const void *gates, const void *input,
                   const void *old_h, const void *weights, void *grad_gates, void *grad_input,
                   void *grad_weights, void *grad_bias, void *grad_old_h, void *grad_old_cell,
                   cudaStream_t stream)
{
    const T *gh = (const T *)grad_h, *gc = (const T *)grad_cell, *cn = (const T *)new_cell,
            *act = (const T *)gates, *x = (const T *)input, *h = (const T *)old_h,
            *W = (const T *)weights;
    T *dg = (T *)grad_gates, *dx = (T *)grad_input, *dW = (T *)grad_weights,
      *db = (T *)grad_bias, *dh = (T *)grad_old_h, *dc = (T *)grad_old_cell;
    const int64_t K = I + H;

    /* dG, d_old_cell, d_bias, dW: needed even for B == 0 (zero gradients). */
    if (H > 0) {
        int status;
        if (ceil_div(H, 32) * ceil_div(K, 128) >= LARGE_TILE_MIN_BLOCKS) {
            constexpr int TU = 32, TK = 128, RR = 6, RC = 8, BC = 16;
            const dim3 grid((unsigned)ceil_div(K, TK), (unsigned)ceil_div(H, TU));
            if (ceil_div(H, TU) > MAX_GRID_Y)
                return LLTM_ERR_ARGUMENT;
            backward_weights_kernel<T, TU, TK, RR, RC, BC>
                <<<grid, (3 * TU / RR) * (TK / RC), 0, stream>>>(B, I, H, gh, gc, cn, act, x, h,
                                                                 dg, dc, db, dW);
        } else {
            /* timed by scripts/cell_tiles.cu on the H100 at B16/I32/H128:
             * 2.78 us per launch against 3.12 for 32-column tiles */
            constexpr int TU = 8, TK = 16, RR = 3, RC = 1, BC = 16;
            const dim3 grid((unsigned)ceil_div(K, TK), (unsigned)ceil_div(H, TU));
            if (ceil_div(H, TU) > MAX_GRID_Y)
                return LLTM_ERR_ARGUMENT;
            backward_weights_kernel<T, TU, TK, RR, RC, BC>
                <<<grid, (3 * TU / RR) * (TK / RC), 0, stream>>>(B, I, H, gh, gc, cn, act, x, h,
                                                                 dg, dc, db, dW);
        }
        if ((status = launch_status()) != LLTM_OK)
            return status;
    }
    /* dX = dG W; with H == 0 this writes zeros into grad_input. */
    if (B > 0 && K > 0) {
        constexpr int SMALL_TK = 4; /* the small tiles' columns (grid y: K / 4) */
        if (ceil_div(B, 32) * ceil_div(K, 64) >= LARGE_TILE_MIN_BLOCKS ||
            ceil_div(K, SMALL_TK) > MAX_GRID_Y) {
            constexpr int TB = 32, TK = 64, RB = 2, RC = 4, GC = 32, KS = 1;
            const dim3 grid((unsigned)ceil_div(B, TB), (unsigned)ceil_div(K, TK));
            if (ceil_div(K, TK) > MAX_GRID_Y)
                return LLTM_ERR_ARGUMENT;
            backward_inputs_kernel<T, TB, TK, RB, RC, GC, KS>
                <<<grid, (TB / RB) * (TK / RC) * KS, 0, stream>>>(B, I, H, dg, W, dx, dh);
        } else {
            /* 8 rows x 4 columns, gate rows split 8 ways: 3.18 us per launch
             * against 6.54 for 16 x 8 tiles (scripts/cell_tiles.cu, H100,
             * B16/I32/H128) */
            constexpr int TB = 8, TK = SMALL_TK, RB = 1, RC = 1, KS = 8;
            constexpr int GC = sizeof(typename acc_of<T>::type) == 8 ? 128 : 384;
            const dim3 grid((unsigned)ceil_div(B, TB), (unsigned)ceil_div(K, TK));
            if (ceil_div(K, TK) > MAX_GRID_Y)
                return LLTM_ERR_ARGUMENT;
            backward_inputs_kernel<T, TB, TK, RB, RC, GC, KS>
                <<<grid, (TB / RB) * (TK / RC) * KS, 0, stream>>>(B, I, H, dg, W, dx, dh);
        }
        return launch_status();
    }
    return LLTM_OK;
}

template <typename T>
int concat(int64_t B, int64_t I, int64_t H, const void *old_h, const void *input, void *X,
           cudaStream_t stream)
{
    const int64_t n = B * (I + H);
    if (n == 0)
        return LLTM_OK;
    concat_kernel<T><<<pointwise_blocks(n, 256), 256, 0, stream>>>(
        B, I, H, (const T *)old_h, (const T *)input, (T *)X);
    return launch_status();
}

template <typename T>
int forward_pointwise(int64_t B, int64_t H, void *gates, const void *bias, const void *old_cell,
                      void *new_h, void *new_cell, cudaStream_t stream)
{
    const int64_t n = B * H;
    if (n == 0)
        return LLTM_OK;
    forward_pointwise_kernel<T><<<pointwise_blocks(n, 256), 256, 0, stream>>>(
        B, H, (T *)gates, (const T *)bias, (const T *)old_cell, (T *)new_h, (T *)new_cell);
    return launch_status();
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
    backward_pointwise_kernel<T><<<(unsigned)blocks, PU * PR, 0, stream>>>(
        B, I, H, (const T *)grad_h, (const T *)grad_cell, (const T *)new_cell,
        (const T *)gates, (const T *)old_h, (const T *)input, (T *)grad_gates,
        (T *)grad_old_cell, (T *)grad_bias, (T *)X);
    return launch_status();
}

bool bad_sizes(int64_t B, int64_t I, int64_t H)
{
    /* 2^31 blocks of at least 16 rows bound B; the rest keeps 64-bit
     * element offsets far from overflow. */
    return B < 0 || I < 0 || H < 0 || B > (int64_t)1 << 35 || I > (int64_t)1 << 31 ||
           H > (int64_t)1 << 29;
}

} // namespace

extern "C" {

int lltm_cell_forward_fused_cuda(lltm_dtype dtype, int64_t B, int64_t I, int64_t H,
                                 const void *input, const void *old_h, const void *weights,
                                 const void *bias, const void *old_cell, void *new_h,
                                 void *new_cell, void *gates, void *stream)
{
    if (bad_sizes(B, I, H))
        return LLTM_ERR_ARGUMENT;
    if (B == 0 || H == 0)
        return LLTM_OK;
    LLTM_DISPATCH(dtype, forward_fused<T>(B, I, H, input, old_h, weights, bias, old_cell, new_h,
                                          new_cell, gates, (cudaStream_t)stream));
}

int lltm_cell_backward_fused_cuda(lltm_dtype dtype, int64_t B, int64_t I, int64_t H,
                                  const void *grad_h, const void *grad_cell,
                                  const void *new_cell, const void *gates, const void *input,
                                  const void *old_h, const void *weights, void *grad_gates,
                                  void *grad_input, void *grad_weights, void *grad_bias,
                                  void *grad_old_h, void *grad_old_cell, void *stream)
{
    if (bad_sizes(B, I, H))
        return LLTM_ERR_ARGUMENT;
    LLTM_DISPATCH(dtype, backward_fused<T>(B, I, H, grad_h, grad_cell, new_cell, gates, input,
                                           old_h, weights, grad_gates, grad_input, grad_weights,
                                           grad_bias, grad_old_h, grad_old_cell,
                                           (cudaStream_t)stream));
}

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
