/*
 * lltm_cuda_sequence.cu - CUDA kernels of one LLTM layer over a whole
 * sequence, and their C launchers (lltm.h, section "CUDA, sequence").
 *
 * The caller (csrc/binding/sequence_cuda.c) computes the input projection of
 * every step as one matrix product (gates[T*B,G] = x W_x^T, cuBLAS) and the
 * weight gradients after the backward as large products too. What is here is
 * the recurrence, run one of two ways:
 *
 * Persistent (one launch per layer and direction). The grid stays resident
 * for all T steps; block n owns hidden units [n*U, (n+1)*U) and keeps, in
 * registers, the recurrent weights W_h that its units need:
 *   forward   rows i/o/z of its units ([3U, H] of W_h): g = h_{t-1} W_h^T
 *   backward  columns of its units ([3H, U] of W_h):   dh = dG_{t+1} W_h
 * Each step a block stages h_{t-1} (or dG_{t+1}) from global memory (L2) in
 * shared memory, 16 batch rows at a time, forms its dot products (KS lanes
 * of a warp split one unit's k range; their partial sums meet by warp
 * shuffles, which also leave each lane holding exactly one batch row of the
 * unit), finishes the step's pointwise math in that lane, writes the step's
 * results to global memory and meets the other blocks at a barrier:
 *   - a thread-block cluster (cluster.sync(), hardware) when the grid is at
 *     most 8 blocks (H <= 128), launched as one cluster;
 *   - otherwise a cooperative launch and grid.sync().
 * Limits: H <= 1024 for float32/float16/bfloat16 and H <= 512 for float64
 * (the registers that hold W_h: 3 * H / KS values per lane), and the grid
 * must be co-resident (<= 128 blocks of 256 threads, one per SM); any B.
 *
 * Per step (fallback for everything else, the time loop stays in C): the
 * binding runs h_{t-1} W_h^T (or dG_t W_h) through aten::mm and one fused
 * pointwise kernel per step from here.
 *
 * Precision: float32 and float64 compute in their own type; float16 and
 * bfloat16 load, convert to float and accumulate in float, and the
 * persistent kernels carry the recurrent state (h, c, dG, dc) between steps
 * in float32 workspaces (only the tensors they return are rounded).
 *
 * Every launch is checked; all work goes to the caller's stream on the
 * current device.
 */
#include "lltm.h"

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdint.h>

#include "lltm_cuda_math.cuh"
#include <type_traits>

namespace cg = cooperative_groups;

namespace {

/* 16-byte shared-memory vectors of the accumulation type; component e is a
 * compile-time constant wherever the loops are unrolled. */
template <typename A> struct vec_of;
template <> struct vec_of<float> { typedef float4 type; static constexpr int n = 4; };
template <> struct vec_of<double> { typedef double2 type; static constexpr int n = 2; };
__device__ __forceinline__ float component(const float4 &v, int e)
{
    return e == 0 ? v.x : e == 1 ? v.y : e == 2 ? v.z : v.w;
}
__device__ __forceinline__ double component(const double2 &v, int e)
{
    return e == 0 ? v.x : v.y;
}

/* ------------------------------------------------- persistent kernels -- */

constexpr int NT = 256; /* threads per block */
constexpr int BC = 16;  /* batch rows per chunk (a power of two, <= KS) */
constexpr int LOG2_BC = 4;
static_assert((1 << LOG2_BC) == BC, "BC = 2^LOG2_BC");

/*
 * Sum acc over the KS lanes that share a unit (aligned groups of KS lanes
 * of a warp) and leave each lane with the PER values of one batch row:
 * on entry acc[bb*PER + p] holds this lane's partial sums for rows bb < BC;
 * on exit acc[0..PER) holds the full sums of row (s & (BC-1)), s the lane's
 * index in its group. Halving exchanges (masks BC/2 .. 1) send away the half
 * of the rows the partner keeps; the remaining masks (KS/2 .. BC) add whole.
 * Fixed order: the same bits for the same inputs every run.
 */
template <int PER, int STAGE, typename A>
__device__ __forceinline__ void halve_rows(A (&acc)[BC * PER], int s)
{
    /* one template level per stage: every index below is a constant, so acc
     * stays in registers */
    if constexpr (STAGE < LOG2_BC) {
        constexpr int mask = BC >> (STAGE + 1);
        constexpr int half = (BC * PER) >> (STAGE + 1);
        const bool upper = (s & mask) != 0;
#pragma unroll
        for (int v = 0; v < half; ++v) {
            const A send = upper ? acc[v] : acc[v + half];
            const A keep = upper ? acc[v + half] : acc[v];
            acc[v] = keep + __shfl_xor_sync(0xffffffffu, send, mask);
        }
        halve_rows<PER, STAGE + 1>(acc, s);
    }
}

template <int KS, int PER, typename A>
__device__ __forceinline__ void reduce_rows(A (&acc)[BC * PER], int s)
{
    halve_rows<PER, 0>(acc, s);
#pragma unroll
    for (int mask = KS / 2; mask >= BC; mask /= 2)
#pragma unroll
        for (int p = 0; p < PER; ++p)
            acc[p] += __shfl_xor_sync(0xffffffffu, acc[p], mask);
}

/*
 * Stage rows [b0, b0+BC) x columns [0, ncols) of src (row-major, `nrows`
 * rows of ncols, accumulation type, written by other blocks: read through
 * L2 with __ldcg) into dst[BC][LD] in shared memory, zero beyond nrows and
 * ncols. The loads of a group are all issued before the first store, so a
 * group costs one L2 round trip, not one per element (16-byte vectors when
 * rows are 16-byte multiples). Call from every thread of the block.
 */
template <typename A, int LD>
__device__ __forceinline__ void stage_rows(A *__restrict__ dst, const A *__restrict__ src,
                                           int64_t nrows, int64_t b0, int64_t ncols, int tid)
{
    typedef typename vec_of<A>::type V;
    constexpr int VEC = vec_of<A>::n, GROUP = 16;
    if (ncols % VEC == 0) {
        constexpr int ROW_V = LD / VEC, NV = BC * ROW_V, PER = (NV + NT - 1) / NT;
#pragma unroll 1 /* one group's registers at a time */
        for (int n0 = 0; n0 < PER; n0 += GROUP) {
            V v[GROUP];
#pragma unroll
            for (int n = 0; n < GROUP; ++n) {
                const int e = tid + (n0 + n) * NT;
                const int64_t row = b0 + e / ROW_V, k = (int64_t)(e % ROW_V) * VEC;
                v[n] = V{};
                if (n0 + n < PER && e < NV && row < nrows && k < ncols)
                    v[n] = __ldcg(reinterpret_cast<const V *>(src + row * ncols + k));
            }
#pragma unroll
            for (int n = 0; n < GROUP; ++n) {
                const int e = tid + (n0 + n) * NT;
                if (n0 + n < PER && e < NV)
                    reinterpret_cast<V *>(dst)[e] = v[n];
            }
        }
    } else {
        constexpr int NS = BC * LD, PER = (NS + NT - 1) / NT;
#pragma unroll 1
        for (int n0 = 0; n0 < PER; n0 += GROUP) {
            A v[GROUP];
#pragma unroll
            for (int n = 0; n < GROUP; ++n) {
                const int e = tid + (n0 + n) * NT;
                const int64_t row = b0 + e / LD, k = e % LD;
                v[n] = 0;
                if (n0 + n < PER && e < NS && row < nrows && k < ncols)
                    v[n] = __ldcg(src + row * ncols + k);
            }
#pragma unroll
            for (int n = 0; n < GROUP; ++n) {
                const int e = tid + (n0 + n) * NT;
                if (n0 + n < PER && e < NS)
                    dst[e] = v[n];
            }
        }
    }
}

template <bool CLUSTER> __device__ __forceinline__ void step_barrier()
{
    if constexpr (CLUSTER)
        cg::this_cluster().sync(); /* arrive.release / wait.acquire, cluster scope */
    else
        cg::this_grid().sync(); /* fences device-wide */
}

/*
 * Forward recurrence. Block n owns units u = n*U + j (j = tid / KS); lane s
 * (tid % KS) of a unit holds W_h[q*H + u, k] for k = (kv*KS + s)*VEC + e in
 * registers (zero where k >= H or u >= H).
 *   gates [T,B,G]  in: x_t W_x^T of every step; out: the activations
 *   output, cells [T,B,H] out
 *   h_work [2,B,H], c_work [B,H] (accumulation type): the recurrent state of
 *   the half types; NULL for float32/float64, which use output/cells.
 */
template <typename T, int KS, int KR, bool CLUSTER>
__global__ void __launch_bounds__(NT, 1)
sequence_forward_kernel(int64_t steps, int64_t B, int64_t H, int64_t K,
                        const T *__restrict__ h0, const T *__restrict__ c0,
                        const T *__restrict__ weights, const T *__restrict__ bias,
                        T *__restrict__ gates, T *__restrict__ output, T *__restrict__ cells,
                        typename acc_of<T>::type *__restrict__ h_work,
                        typename acc_of<T>::type *__restrict__ c_work)
{
    typedef typename acc_of<T>::type A;
    typedef typename vec_of<A>::type V;
    constexpr int U = NT / KS, VEC = vec_of<A>::n, KP = KS * KR;
    constexpr bool SAME = std::is_same<T, A>::value; /* state lives in the outputs */
    static_assert(KR % VEC == 0 && KS >= BC && KS <= 32 && NT % KS == 0, "configuration");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    A *hs = reinterpret_cast<A *>(smem_raw); /* [BC][KP]: h_{t-1} of one chunk */

    const int tid = threadIdx.x, s = tid % KS;
    const int64_t u = (int64_t)blockIdx.x * U + tid / KS;
    const bool unit_ok = u < H;
    const bool owner = s < BC; /* holds a row after the reduction */
    const int64_t G = 3 * H, BH = B * H;

    A w[3][KR];
#pragma unroll
    for (int q = 0; q < 3; ++q)
#pragma unroll
        for (int kv = 0; kv < KR / VEC; ++kv)
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                const int64_t k = (int64_t)(kv * KS + s) * VEC + e;
                w[q][kv * VEC + e] =
                    (unit_ok && k < H) ? to_acc(weights[(q * H + u) * K + k]) : A(0);
            }
    A b_i = 0, b_o = 0, b_z = 0;
    if (unit_ok) {
        b_i = to_acc(bias[u]);
        b_o = to_acc(bias[H + u]);
        b_z = to_acc(bias[2 * H + u]);
    }

    for (int64_t t = 0; t < steps; ++t) {
        for (int64_t b0 = 0; b0 < B; b0 += BC) {
            const int64_t b = b0 + (s & (BC - 1));
            const bool row_ok = owner && unit_ok && b < B;
            T *grow = gates + (t * B + b) * G;
            /* this lane's pointwise inputs, fetched before the dot products */
            A p_i = 0, p_o = 0, p_z = 0, c_prev = 0;
            if (row_ok) {
                p_i = to_acc(grow[u]);
                p_o = to_acc(grow[H + u]);
                p_z = to_acc(grow[2 * H + u]);
                if (t == 0)
                    c_prev = to_acc(c0[b * H + u]);
                else if (SAME)
                    c_prev = to_acc(cells[(t - 1) * BH + b * H + u]);
                else
                    c_prev = c_work[b * H + u];
            }
            /* stage h_{t-1} of rows b0 .. b0+BC-1 (zero beyond B and H) */
            if (t == 0) {
                for (int e = tid; e < BC * KP; e += NT) {
                    const int64_t row = b0 + e / KP, k = e % KP;
                    hs[e] = (row < B && k < H) ? to_acc(h0[row * H + k]) : A(0);
                }
            } else if constexpr (SAME) {
                stage_rows<A, KP>(hs, reinterpret_cast<const A *>(output) + (t - 1) * BH, B, b0,
                                  H, tid);
            } else {
                stage_rows<A, KP>(hs, h_work + ((t - 1) & 1) * BH, B, b0, H, tid);
            }
            __syncthreads();

            A acc[BC * 3];
#pragma unroll
            for (int v = 0; v < BC * 3; ++v)
                acc[v] = 0;
#pragma unroll
            for (int bb = 0; bb < BC; ++bb) {
#pragma unroll
                for (int kv = 0; kv < KR / VEC; ++kv) {
                    const V hv = *reinterpret_cast<const V *>(&hs[bb * KP + (kv * KS + s) * VEC]);
#pragma unroll
                    for (int e = 0; e < VEC; ++e)
#pragma unroll
                        for (int q = 0; q < 3; ++q)
                            acc[bb * 3 + q] += w[q][kv * VEC + e] * component(hv, e);
                }
            }
            reduce_rows<KS, 3>(acc, s);

            if (row_ok) {
                const A i = sigmoid_(acc[0] + p_i + b_i);
                const A o = sigmoid_(acc[1] + p_o + b_o);
                const A z = elu_(acc[2] + p_z + b_z);
                const A c = c_prev + i * z;
                const A h = tanh_(c) * o;
                grow[u] = from_acc<T>(i);
                grow[H + u] = from_acc<T>(o);
                grow[2 * H + u] = from_acc<T>(z);
                cells[t * BH + b * H + u] = from_acc<T>(c);
                output[t * BH + b * H + u] = from_acc<T>(h);
                if (!SAME) {
                    c_work[b * H + u] = c;
                    h_work[(t & 1) * BH + b * H + u] = h;
                }
            }
            __syncthreads(); /* hs is restaged by the next chunk */
        }
        if (t + 1 < steps)
            step_barrier<CLUSTER>(); /* h_t of every unit is written */
    }
}

/*
 * Backward recurrence, reverse time. Lane s of unit u holds column u of W_h
 * (rows r = (rv*KS + s)*VEC + e < G) in registers.
 *   grad_output [T,B,H], grad_h_n, grad_c_n [B,H], cells [T,B,H],
 *   gates [T,B,G] (activations)
 *   grad_gates [T,B,G] out: dL/dg of every step
 *   grad_bias [G] out; grad_h0, grad_c0 [B,H] out
 *   dg_work [2,B,G], dc_work [B,H] (accumulation type): the recurrent state
 *   of the half types; NULL for float32/float64 (grad_gates and grad_c0).
 */
template <typename T, int KS, int KR, bool CLUSTER>
__global__ void __launch_bounds__(NT, 1)
sequence_backward_kernel(int64_t steps, int64_t B, int64_t H, int64_t K,
                         const T *__restrict__ grad_output, const T *__restrict__ grad_h_n,
                         const T *__restrict__ grad_c_n, const T *__restrict__ weights,
                         const T *__restrict__ cells, const T *__restrict__ gates,
                         T *__restrict__ grad_gates, T *__restrict__ grad_bias,
                         T *__restrict__ grad_h0, T *__restrict__ grad_c0,
                         typename acc_of<T>::type *__restrict__ dg_work,
                         typename acc_of<T>::type *__restrict__ dc_work)
{
    typedef typename acc_of<T>::type A;
    typedef typename vec_of<A>::type V;
    constexpr int U = NT / KS, VEC = vec_of<A>::n, RR = 3 * KR, RP = KS * RR;
    constexpr bool SAME = std::is_same<T, A>::value;
    static_assert(RR % VEC == 0 && KS >= BC && KS <= 32 && NT % KS == 0, "configuration");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    A *ds = reinterpret_cast<A *>(smem_raw); /* [BC][RP]: dG_{t+1} of one chunk */

    const int tid = threadIdx.x, s = tid % KS;
    const int64_t u = (int64_t)blockIdx.x * U + tid / KS;
    const bool unit_ok = u < H;
    const bool owner = s < BC;
    const int64_t G = 3 * H, BH = B * H, BG = B * G;
    A *dc_state = SAME ? reinterpret_cast<A *>(grad_c0) : dc_work;

    A w[RR];
#pragma unroll
    for (int rv = 0; rv < RR / VEC; ++rv)
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
            const int64_t r = (int64_t)(rv * KS + s) * VEC + e;
            w[rv * VEC + e] = (unit_ok && r < G) ? to_acc(weights[r * K + u]) : A(0);
        }

    /* stage dG_t of rows b0 .. b0+BC-1 and form this lane's share of
     * dG_t W_h for its unit: acc[bb] */
    auto dh_from = [&](int64_t t, int64_t b0, A(&acc)[BC]) {
        if constexpr (SAME)
            stage_rows<A, RP>(ds, reinterpret_cast<const A *>(grad_gates) + t * BG, B, b0, G,
                              tid);
        else
            stage_rows<A, RP>(ds, dg_work + (t & 1) * BG, B, b0, G, tid);
        __syncthreads();
#pragma unroll
        for (int bb = 0; bb < BC; ++bb)
            acc[bb] = 0;
#pragma unroll
        for (int bb = 0; bb < BC; ++bb) {
#pragma unroll
            for (int rv = 0; rv < RR / VEC; ++rv) {
                const V dv = *reinterpret_cast<const V *>(&ds[bb * RP + (rv * KS + s) * VEC]);
#pragma unroll
                for (int e = 0; e < VEC; ++e)
                    acc[bb] += w[rv * VEC + e] * component(dv, e);
            }
        }
        reduce_rows<KS, 1>(acc, s);
    };

    A bias_sum[3] = {0, 0, 0};
    for (int64_t t = steps - 1; t >= 0; --t) {
        const bool last = t == steps - 1;
        for (int64_t b0 = 0; b0 < B; b0 += BC) {
            const int64_t b = b0 + (s & (BC - 1));
            const bool row_ok = owner && unit_ok && b < B;
            const int64_t j = t * BH + b * H + u;
            const T *arow = gates + (t * B + b) * G;
            A i = 0, o = 0, z = 0, c = 0, dh = 0, dc_in = 0;
            if (row_ok) {
                i = to_acc(arow[u]);
                o = to_acc(arow[H + u]);
                z = to_acc(arow[2 * H + u]);
                c = to_acc(cells[j]);
                dh = to_acc(grad_output[j]);
                if (last) {
                    dh += to_acc(grad_h_n[b * H + u]);
                    dc_in = to_acc(grad_c_n[b * H + u]);
                } else {
                    dc_in = dc_state[b * H + u];
                }
            }
            A acc[BC];
            acc[0] = 0;
            if (!last) { /* uniform over the grid */
                dh_from(t + 1, b0, acc);
                __syncthreads(); /* ds is restaged by the next chunk */
            }
            if (row_ok) {
                A d[3], dc;
                backward_math<A>(i, o, z, c, dh + acc[0], dc_in, d, &dc);
                T *drow = grad_gates + (t * B + b) * G;
                drow[u] = from_acc<T>(d[0]);
                drow[H + u] = from_acc<T>(d[1]);
                drow[2 * H + u] = from_acc<T>(d[2]);
                if (!SAME) {
                    A *wrow = dg_work + (t & 1) * BG + b * G;
                    wrow[u] = d[0];
                    wrow[H + u] = d[1];
                    wrow[2 * H + u] = d[2];
                }
                dc_state[b * H + u] = dc;
                bias_sum[0] += d[0];
                bias_sum[1] += d[1];
                bias_sum[2] += d[2];
            }
        }
        step_barrier<CLUSTER>(); /* dG_t of every unit is written */
    }

    /* grad_h0 = dG_0 W_h; grad_c0 (half types: from the float state) */
    for (int64_t b0 = 0; b0 < B; b0 += BC) {
        const int64_t b = b0 + (s & (BC - 1));
        const bool row_ok = owner && unit_ok && b < B;
        A acc[BC];
        dh_from(0, b0, acc);
        if (row_ok) {
            grad_h0[b * H + u] = from_acc<T>(acc[0]);
            if (!SAME)
                grad_c0[b * H + u] = from_acc<T>(dc_work[b * H + u]);
        }
        __syncthreads();
    }
    /* bias: sum the lanes' row sums (fixed order) */
#pragma unroll
    for (int mask = KS / 2; mask >= 1; mask /= 2)
#pragma unroll
        for (int q = 0; q < 3; ++q)
            bias_sum[q] += __shfl_xor_sync(0xffffffffu, bias_sum[q], mask);
    if (s == 0 && unit_ok) {
        grad_bias[u] = from_acc<T>(bias_sum[0]);
        grad_bias[H + u] = from_acc<T>(bias_sum[1]);
        grad_bias[2 * H + u] = from_acc<T>(bias_sum[2]);
    }
}

/* ----------------------------------------------------- per-step kernels -- */

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

/* ------------------------------------------------------------ launchers -- */

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int launch_status(cudaError_t launch)
{
    const cudaError_t last = cudaGetLastError();
    return (launch == cudaSuccess && last == cudaSuccess) ? LLTM_OK : LLTM_ERR_CUDA;
}

unsigned pointwise_blocks(int64_t n, int threads)
{
    const int64_t blocks = ceil_div(n, threads);
    return (unsigned)(blocks < 4096 ? (blocks > 0 ? blocks : 1) : 4096);
}

/* Persistent configurations: KS lanes per unit, KR k values per lane and
 * gate; a block holds U = NT / KS units; H <= KS * KR. */
struct persistent_shape {
    int ks, kr;
};
constexpr persistent_shape SHAPES[] = {{16, 8}, {32, 16}, {32, 32}};
constexpr int CLUSTER_MAX_BLOCKS = 8; /* the portable cluster size */

template <typename T> size_t forward_smem(int ks, int kr)
{
    return (size_t)BC * ks * kr * sizeof(typename acc_of<T>::type);
}
template <typename T> size_t backward_smem(int ks, int kr)
{
    return (size_t)BC * ks * 3 * kr * sizeof(typename acc_of<T>::type);
}

/* The kernel pair of one plan; CALL receives them as `fwd` and `bwd`. */
#define LLTM_WITH_KERNELS(T, plan, CALL)                                                     \
    switch (plan) {                                                                          \
    case LLTM_SEQ_PLAN_CLUSTER_16_8: {                                                       \
        auto fwd = sequence_forward_kernel<T, 16, 8, true>;                                  \
        auto bwd = sequence_backward_kernel<T, 16, 8, true>;                                 \
        return CALL;                                                                         \
    }                                                                                        \
    case LLTM_SEQ_PLAN_GRID_16_8: {                                                          \
        auto fwd = sequence_forward_kernel<T, 16, 8, false>;                                 \
        auto bwd = sequence_backward_kernel<T, 16, 8, false>;                                \
        return CALL;                                                                         \
    }                                                                                        \
    case LLTM_SEQ_PLAN_GRID_32_16: {                                                         \
        auto fwd = sequence_forward_kernel<T, 32, 16, false>;                                \
        auto bwd = sequence_backward_kernel<T, 32, 16, false>;                               \
        return CALL;                                                                         \
    }                                                                                        \
    case LLTM_SEQ_PLAN_GRID_32_32:                                                           \
        if constexpr (!std::is_same<T, double>::value) {                                    \
            auto fwd = sequence_forward_kernel<T, 32, 32, false>;                            \
            auto bwd = sequence_backward_kernel<T, 32, 32, false>;                           \
            return CALL;                                                                     \
        }                                                                                    \
        return LLTM_ERR_ARGUMENT;                                                            \
    default:                                                                                 \
        return LLTM_ERR_ARGUMENT;                                                            \
    }

int plan_shape(int plan, persistent_shape *shape, bool *cluster)
{
    switch (plan) {
    case LLTM_SEQ_PLAN_CLUSTER_16_8: *shape = SHAPES[0]; *cluster = true; return LLTM_OK;
    case LLTM_SEQ_PLAN_GRID_16_8: *shape = SHAPES[0]; *cluster = false; return LLTM_OK;
    case LLTM_SEQ_PLAN_GRID_32_16: *shape = SHAPES[1]; *cluster = false; return LLTM_OK;
    case LLTM_SEQ_PLAN_GRID_32_32: *shape = SHAPES[2]; *cluster = false; return LLTM_OK;
    default: return LLTM_ERR_ARGUMENT;
    }
}

/* How many blocks of `kernel` (smem bytes each) can run at once on `device`:
 * as one cluster (up to CLUSTER_MAX_BLOCKS, or 0), or as a cooperative grid
 * (blocks per SM x SMs, 0 without cooperative launch). Raises the kernel's
 * dynamic shared-memory limit as needed. */
template <typename K>
int64_t max_resident_blocks(K kernel, size_t smem, bool cluster, int device)
{
    int sms = 0, coop = 0, cluster_ok = 0, optin = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&cluster_ok, cudaDevAttrClusterLaunch, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
            cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    if (smem > (size_t)optin ||
        cudaFuncSetAttribute((const void *)kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)smem) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    if (cluster) {
        if (!cluster_ok)
            return 0;
        cudaLaunchConfig_t config = {};
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = CLUSTER_MAX_BLOCKS;
        attr[0].val.clusterDim.y = 1;
        attr[0].val.clusterDim.z = 1;
        config.gridDim = dim3(CLUSTER_MAX_BLOCKS);
        config.blockDim = dim3(NT);
        config.dynamicSmemBytes = smem;
        config.attrs = attr;
        config.numAttrs = 1;
        int clusters = 0;
        if (cudaOccupancyMaxActiveClusters(&clusters, (const void *)kernel, &config) !=
            cudaSuccess) {
            cudaGetLastError();
            return 0;
        }
        return clusters >= 1 ? CLUSTER_MAX_BLOCKS : 0;
    }
    int per_sm = 0;
    if (!coop || cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, (const void *)kernel, NT,
                                                               smem) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return (int64_t)per_sm * sms;
}

/* max_resident_blocks of a plan's two kernels plus one (0: not asked yet),
 * asked once per device, dtype and plan: the answers do not change, and the
 * queries cost host time and are best kept out of CUDA-graph capture. */
constexpr int MAX_DEVICES = 64, NUM_DTYPES = 4, NUM_PLANS = 5;
int64_t resident_cache[MAX_DEVICES][NUM_DTYPES][NUM_PLANS];

template <typename T, typename KF, typename KB>
int check_plan(KF fwd, KB bwd, int plan, int64_t H, int device, int dtype_index)
{
    persistent_shape shape;
    bool cluster;
    if (plan_shape(plan, &shape, &cluster) != LLTM_OK || H > (int64_t)shape.ks * shape.kr)
        return LLTM_ERR_ARGUMENT;
    const bool cached = device >= 0 && device < MAX_DEVICES;
    int64_t resident =
        cached ? __atomic_load_n(&resident_cache[device][dtype_index][plan], __ATOMIC_RELAXED) - 1
               : -1;
    if (resident < 0) {
        const int64_t f = max_resident_blocks(fwd, forward_smem<T>(shape.ks, shape.kr), cluster,
                                              device);
        const int64_t b = max_resident_blocks(bwd, backward_smem<T>(shape.ks, shape.kr),
                                              cluster, device);
        resident = f < b ? f : b;
        if (cached)
            __atomic_store_n(&resident_cache[device][dtype_index][plan], resident + 1,
                             __ATOMIC_RELAXED);
    }
    return ceil_div(H, NT / shape.ks) <= resident ? LLTM_OK : LLTM_ERR_ARGUMENT;
}

template <typename T> int check_plan_dispatch(int plan, int64_t H, int device, int dtype_index)
{
    LLTM_WITH_KERNELS(T, plan, (check_plan<T>(fwd, bwd, plan, H, device, dtype_index)))
}

/* One launch of a persistent kernel: as one cluster of `blocks` blocks, or
 * as a cooperative grid (co-residency checked by lltm_sequence_plan_cuda). */
template <typename... P, typename... Args>
cudaError_t launch_persistent(void (*kernel)(P...), int64_t blocks, size_t smem, bool cluster,
                              cudaStream_t stream, Args... args)
{
    if (cluster) {
        cudaLaunchConfig_t config = {};
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = (unsigned)blocks;
        attr[0].val.clusterDim.y = 1;
        attr[0].val.clusterDim.z = 1;
        config.gridDim = dim3((unsigned)blocks);
        config.blockDim = dim3(NT);
        config.dynamicSmemBytes = smem;
        config.stream = stream;
        config.attrs = attr;
        config.numAttrs = 1;
        return cudaLaunchKernelEx(&config, kernel, args...);
    }
    void *pointers[] = {(void *)&args...};
    return cudaLaunchCooperativeKernel(kernel, dim3((unsigned)blocks), dim3(NT), pointers, smem,
                                       stream);
}

template <typename T, typename KF>
int run_forward(KF kernel, int plan, int64_t steps, int64_t B, int64_t I, int64_t H,
                const void *h0, const void *c0, const void *weights, const void *bias,
                void *gates, void *output, void *cells, void *workspace, cudaStream_t stream)
{
    typedef typename acc_of<T>::type A;
    persistent_shape shape;
    bool cluster;
    if (plan_shape(plan, &shape, &cluster) != LLTM_OK)
        return LLTM_ERR_ARGUMENT;
    const int64_t blocks = ceil_div(H, NT / shape.ks), K = I + H;
    const size_t smem = forward_smem<T>(shape.ks, shape.kr);
    if (smem > 48 * 1024 &&
        cudaFuncSetAttribute((const void *)kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)smem) != cudaSuccess) {
        cudaGetLastError();
        return LLTM_ERR_CUDA;
    }
    const T *h0_ = (const T *)h0, *c0_ = (const T *)c0, *W = (const T *)weights,
            *b_ = (const T *)bias;
    T *g = (T *)gates, *out = (T *)output, *cel = (T *)cells;
    A *h_work = NULL, *c_work = NULL;
    if (!std::is_same<T, A>::value) {
        h_work = (A *)workspace;
        c_work = h_work + 2 * B * H;
    }
    return launch_status(launch_persistent(kernel, blocks, smem, cluster, stream, steps, B, H,
                                           K, h0_, c0_, W, b_, g, out, cel, h_work, c_work));
}

template <typename T, typename KB>
int run_backward(KB kernel, int plan, int64_t steps, int64_t B, int64_t I, int64_t H,
                 const void *grad_output, const void *grad_h_n, const void *grad_c_n,
                 const void *weights, const void *cells, const void *gates, void *grad_gates,
                 void *grad_bias, void *grad_h0, void *grad_c0, void *workspace,
                 cudaStream_t stream)
{
    typedef typename acc_of<T>::type A;
    persistent_shape shape;
    bool cluster;
    if (plan_shape(plan, &shape, &cluster) != LLTM_OK)
        return LLTM_ERR_ARGUMENT;
    const int64_t blocks = ceil_div(H, NT / shape.ks), K = I + H;
    const size_t smem = backward_smem<T>(shape.ks, shape.kr);
    if (smem > 48 * 1024 &&
        cudaFuncSetAttribute((const void *)kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)smem) != cudaSuccess) {
        cudaGetLastError();
        return LLTM_ERR_CUDA;
    }
    const T *go = (const T *)grad_output, *gh = (const T *)grad_h_n, *gc = (const T *)grad_c_n,
            *W = (const T *)weights, *cel = (const T *)cells, *act = (const T *)gates;
    T *dg = (T *)grad_gates, *db = (T *)grad_bias, *dh0 = (T *)grad_h0, *dc0 = (T *)grad_c0;
    A *dg_work = NULL, *dc_work = NULL;
    if (!std::is_same<T, A>::value) {
        dg_work = (A *)workspace;
        dc_work = dg_work + 2 * B * 3 * H;
    }
    return launch_status(launch_persistent(kernel, blocks, smem, cluster, stream, steps, B, H,
                                           K, go, gh, gc, W, cel, act, dg, db, dh0, dc0,
                                           dg_work, dc_work));
}

template <typename T>
int forward_dispatch(int plan, int64_t steps, int64_t B, int64_t I, int64_t H, const void *h0,
                     const void *c0, const void *weights, const void *bias, void *gates,
                     void *output, void *cells, void *workspace, cudaStream_t stream)
{
    LLTM_WITH_KERNELS(T, plan,
                      ((void)bwd, run_forward<T>(fwd, plan, steps, B, I, H, h0, c0, weights,
                                                 bias, gates, output, cells, workspace,
                                                 stream)))
}

template <typename T>
int backward_dispatch(int plan, int64_t steps, int64_t B, int64_t I, int64_t H,
                      const void *grad_output, const void *grad_h_n, const void *grad_c_n,
                      const void *weights, const void *cells, const void *gates,
                      void *grad_gates, void *grad_bias, void *grad_h0, void *grad_c0,
                      void *workspace, cudaStream_t stream)
{
    LLTM_WITH_KERNELS(T, plan,
                      ((void)fwd, run_backward<T>(bwd, plan, steps, B, I, H, grad_output,
                                                  grad_h_n, grad_c_n, weights, cells, gates,
                                                  grad_gates, grad_bias, grad_h0, grad_c0,
                                                  workspace, stream)))
}

template <typename T>
int forward_step(int64_t B, int64_t H, const void *recurrent, void *gates, const void *bias,
                 const void *old_cell, void *new_h, void *new_cell, cudaStream_t stream)
{
    const int64_t n = B * H;
    if (n == 0)
        return LLTM_OK;
    forward_step_kernel<T><<<pointwise_blocks(n, 256), 256, 0, stream>>>(
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
    backward_step_kernel<T><<<pointwise_blocks(H, 128), 128, 0, stream>>>(
        B, H, (const T *)grad_output, (const T *)grad_h, (T *)grad_cell, (const T *)cell,
        (const T *)gates, (T *)grad_gates, (typename acc_of<T>::type *)bias_acc);
    return launch_status(cudaSuccess);
}

template <typename T>
int convert(int64_t n, const void *src, void *dst, cudaStream_t stream)
{
    if (n == 0)
        return LLTM_OK;
    convert_kernel<T><<<pointwise_blocks(n, 256), 256, 0, stream>>>(
        n, (const typename acc_of<T>::type *)src, (T *)dst);
    return launch_status(cudaSuccess);
}

bool bad_sizes(int64_t steps, int64_t B, int64_t I, int64_t H)
{
    const int64_t big = (int64_t)1 << 40;
    return steps < 0 || B < 0 || I < 0 || H < 0 || steps > big || B > big || I > big ||
           H > ((int64_t)1 << 29) || (B > 0 && steps > big / B) ||
           (B > 0 && H > 0 && steps * B > big / (3 * H));
}

} // namespace

#define LLTM_SEQ_DISPATCH(dtype, CALL)                                                       \
    switch (dtype) {                                                                         \
    case LLTM_FLOAT32: { typedef float T; return CALL; }                                     \
    case LLTM_FLOAT64: { typedef double T; return CALL; }                                    \
    case LLTM_FLOAT16: { typedef __half T; return CALL; }                                    \
    case LLTM_BFLOAT16: { typedef __nv_bfloat16 T; return CALL; }                            \
    }                                                                                        \
    return LLTM_ERR_DTYPE

extern "C" {

int lltm_sequence_plan_cuda(lltm_dtype dtype, int64_t B, int64_t H, int mode, int *plan)
{
    (void)B; /* any B: the kernels take the batch 16 rows at a time */
    *plan = LLTM_SEQ_PLAN_STEPS;
    if (H <= 0 || mode == LLTM_SEQ_MODE_STEPS)
        return LLTM_OK;
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) {
        cudaGetLastError();
        return LLTM_ERR_CUDA;
    }
    int candidates[4], n = 0;
    if (H <= 128 && mode != LLTM_SEQ_MODE_GRID)
        candidates[n++] = LLTM_SEQ_PLAN_CLUSTER_16_8;
    if (mode != LLTM_SEQ_MODE_CLUSTER) {
        if (H <= 128)
            candidates[n++] = LLTM_SEQ_PLAN_GRID_16_8;
        if (H <= 512)
            candidates[n++] = LLTM_SEQ_PLAN_GRID_32_16;
        if (H <= 1024 && dtype != LLTM_FLOAT64)
            candidates[n++] = LLTM_SEQ_PLAN_GRID_32_32;
    }
    for (int k = 0; k < n; ++k) {
        int status;
        const int c = candidates[k];
        switch (dtype) {
        case LLTM_FLOAT32: status = check_plan_dispatch<float>(c, H, device, 0); break;
        case LLTM_FLOAT64: status = check_plan_dispatch<double>(c, H, device, 1); break;
        case LLTM_FLOAT16: status = check_plan_dispatch<__half>(c, H, device, 2); break;
        case LLTM_BFLOAT16: status = check_plan_dispatch<__nv_bfloat16>(c, H, device, 3); break;
        default: return LLTM_ERR_DTYPE;
        }
        if (status == LLTM_OK) {
            *plan = candidates[k];
            return LLTM_OK;
        }
    }
    /* a persistent mode asked for by name but impossible here */
    return mode == LLTM_SEQ_MODE_AUTO ? LLTM_OK : LLTM_ERR_ARGUMENT;
}

size_t lltm_sequence_workspace_cuda(lltm_dtype dtype, int64_t B, int64_t H)
{
    if (dtype != LLTM_FLOAT16 && dtype != LLTM_BFLOAT16)
        return 0;
    /* forward: h [2,B,H] + c [B,H]; backward: dG [2,B,3H] + dc [B,H] */
    return (size_t)(7 * B * H) * sizeof(float);
}

int lltm_sequence_forward_persistent_cuda(lltm_dtype dtype, int plan, int64_t steps,
                                          int64_t B, int64_t I, int64_t H, const void *h0,
                                          const void *c0, const void *weights,
                                          const void *bias, void *gates, void *output,
                                          void *cells, void *workspace, void *stream)
{
    if (bad_sizes(steps, B, I, H))
        return LLTM_ERR_ARGUMENT;
    if (steps == 0 || B == 0 || H == 0)
        return LLTM_OK;
    LLTM_SEQ_DISPATCH(dtype, forward_dispatch<T>(plan, steps, B, I, H, h0, c0, weights, bias,
                                                 gates, output, cells, workspace,
                                                 (cudaStream_t)stream));
}

int lltm_sequence_backward_persistent_cuda(lltm_dtype dtype, int plan, int64_t steps,
                                           int64_t B, int64_t I, int64_t H,
                                           const void *grad_output, const void *grad_h_n,
                                           const void *grad_c_n, const void *weights,
                                           const void *cells, const void *gates,
                                           void *grad_gates, void *grad_bias, void *grad_h0,
                                           void *grad_c0, void *workspace, void *stream)
{
    if (bad_sizes(steps, B, I, H) || steps == 0 || B == 0)
        return LLTM_ERR_ARGUMENT; /* the binding handles empty sequences */
    if (H == 0)
        return LLTM_OK;
    LLTM_SEQ_DISPATCH(dtype, backward_dispatch<T>(plan, steps, B, I, H, grad_output, grad_h_n,
                                                  grad_c_n, weights, cells, gates, grad_gates,
                                                  grad_bias, grad_h0, grad_c0, workspace,
                                                  (cudaStream_t)stream));
}

int lltm_sequence_forward_step_cuda(lltm_dtype dtype, int64_t B, int64_t H,
                                    const void *recurrent, void *gates, const void *bias,
                                    const void *old_cell, void *new_h, void *new_cell,
                                    void *stream)
{
    if (bad_sizes(1, B, 0, H))
        return LLTM_ERR_ARGUMENT;
    LLTM_SEQ_DISPATCH(dtype, forward_step<T>(B, H, recurrent, gates, bias, old_cell, new_h,
                                             new_cell, (cudaStream_t)stream));
}

int lltm_sequence_backward_step_cuda(lltm_dtype dtype, int64_t B, int64_t H,
                                     const void *grad_output, const void *grad_h,
                                     void *grad_cell, const void *cell, const void *gates,
                                     void *grad_gates, void *bias_acc, void *stream)
{
    if (bad_sizes(1, B, 0, H))
        return LLTM_ERR_ARGUMENT;
    LLTM_SEQ_DISPATCH(dtype, backward_step<T>(B, H, grad_output, grad_h, grad_cell, cell,
                                              gates, grad_gates, bias_acc,
                                              (cudaStream_t)stream));
}

int lltm_sequence_convert_cuda(lltm_dtype dtype, int64_t n, const void *src, void *dst,
                               void *stream)
{
    if (n < 0)
        return LLTM_ERR_ARGUMENT;
    LLTM_SEQ_DISPATCH(dtype, convert<T>(n, src, dst, (cudaStream_t)stream));
}

int lltm_cuda_copy(void *dst, const void *src, size_t bytes, void *stream)
{
    if (bytes == 0)
        return LLTM_OK;
    return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, (cudaStream_t)stream) ==
                   cudaSuccess
               ? LLTM_OK
               : (cudaGetLastError(), LLTM_ERR_CUDA);
}

int lltm_cuda_zero(void *dst, size_t bytes, void *stream)
{
    if (bytes == 0)
        return LLTM_OK;
    return cudaMemsetAsync(dst, 0, bytes, (cudaStream_t)stream) == cudaSuccess
               ? LLTM_OK
               : (cudaGetLastError(), LLTM_ERR_CUDA);
}

} /* extern "C" */
