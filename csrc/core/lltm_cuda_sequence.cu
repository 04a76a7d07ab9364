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
 * Each step a block forms its dot products over h_{t-1} (or dG_{t+1}) held
 * in shared memory, 16 batch rows at a time (KS lanes of a warp split one
 * unit's k range; their partial sums meet by warp shuffles, which also leave
 * each lane holding exactly one batch row of the unit), finishes the step's
 * pointwise math in that lane, and the blocks exchange the new state:
 *   - cluster plan (H <= 128, B <= 64; 32 for float64): the grid is one
 *     thread-block cluster of up to 8 blocks (16 lanes per unit) or 16
 *     (non-portable; half the work per block; its forward runs 4 lanes a
 *     unit on 2 of each chunk's 16 rows, which shrinks the shuffle
 *     reduction to 6 values over 4 lanes, see sequence_forward_cluster_kernel;
 *     32 lanes a unit for float64, and its backward; for B <= 16 both its
 *     kernels split the batch into clusters of 4-row chunks, see
 *     cluster_split). Each block
 *     sends its units' new state straight into the shared memory of every
 *     block of the cluster (distributed shared memory, st.async in 16-byte
 *     pieces, double-buffered by step parity) and waits on its own
 *     transaction barrier until the whole state of the step has arrived: no
 *     cluster-wide barrier per step; the step's global stores and the next
 *     step's loads run while the pieces travel. The state never goes
 *     through global memory. The backward of the 16-block shape instead
 *     keeps the forward's layout (rows of its units) and sends each block
 *     only the partial dh of that block's units, which the owner sums
 *     (reduce-scatter: a third of the bytes, see
 *     sequence_backward_cluster_rs_kernel); LLTM_CUDA_CLUSTER_BWD=broadcast
 *     picks the broadcast kernel there for measurements (the 8-block shape
 *     keeps it: 16 units' rows would need 192 weight registers a thread).
 *   - grid plans: a cooperative launch; each step a block writes its results
 *     to global memory, meets the others at grid.sync() and stages the state
 *     back from L2 into shared memory. The grid is unit blocks x batch
 *     groups: the 16-row chunks of B are shared out over as many copies of
 *     the unit blocks as the device holds (each copy keeps its own W_h), so
 *     a block stages and multiplies fewer chunks per step.
 * Limits: H <= 1024 for float32/float16/bfloat16 and H <= 512 for float64
 * (the registers that hold W_h: 3 * H / KS values per lane), and the grid
 * must be co-resident (<= 128 blocks of 256 threads, one per SM); any B on
 * the grid plans.
 *
 * Per step (fallback for everything else, the time loop stays in C): the
 * binding runs h_{t-1} W_h^T (or dG_t W_h) through aten::mm and one fused
 * pointwise kernel per step from here.
 *
 * Precision: float32 and float64 compute in their own type; float16 and
 * bfloat16 load, convert to float and accumulate in float, and the
 * persistent kernels carry the recurrent state (h, c, dG, dc) between steps
 * in float32 (workspaces, or shared memory on the cluster plan; only the
 * tensors they return are rounded).
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lltm_cuda_cluster.cuh"
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
constexpr int BC = 16;  /* batch rows per chunk (a power of two) */

/*
 * Sum acc over the KS lanes that share a unit (aligned groups of KS lanes
 * of a warp) and leave each lane with the PER values of one batch row:
 * on entry acc[bb*PER + p] holds this lane's partial sums for its ROWS rows
 * (ROWS <= KS, both powers of two); on exit acc[0..PER) holds the full sums
 * of row (s & (ROWS-1)), s the lane's index in its group. Halving exchanges
 * (masks ROWS/2 .. 1) send away the half of the rows the partner keeps; the
 * remaining masks (KS/2 .. ROWS) add whole. Fixed order: the same bits for
 * the same inputs every run.
 */
template <int ROWS, int PER, int STAGE, typename A>
__device__ __forceinline__ void halve_rows(A (&acc)[ROWS * PER], int s)
{
    /* one template level per stage: every index below is a constant, so acc
     * stays in registers */
    if constexpr ((1 << STAGE) < ROWS) {
        constexpr int mask = ROWS >> (STAGE + 1);
        constexpr int half = (ROWS * PER) >> (STAGE + 1);
        const bool upper = (s & mask) != 0;
#pragma unroll
        for (int v = 0; v < half; ++v) {
            const A send = upper ? acc[v] : acc[v + half];
            const A keep = upper ? acc[v + half] : acc[v];
            acc[v] = keep + __shfl_xor_sync(0xffffffffu, send, mask);
        }
        halve_rows<ROWS, PER, STAGE + 1>(acc, s);
    }
}

template <int KS, int ROWS, int PER, typename A>
__device__ __forceinline__ void reduce_rows(A (&acc)[ROWS * PER], int s)
{
    static_assert(ROWS <= KS && (ROWS & (ROWS - 1)) == 0 && (KS & (KS - 1)) == 0, "lanes");
    halve_rows<ROWS, PER, 0>(acc, s);
#pragma unroll
    for (int mask = KS / 2; mask >= ROWS; mask /= 2)
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

__device__ __forceinline__ void step_barrier()
{
    cg::this_grid().sync(); /* fences device-wide */
}

/* Lane s's registers of unit u for the forward: w[q][*] = W_h[q*H + u, k]
 * for k = (kv*KS + s)*VEC + e (zero where k >= H or the unit is out of
 * range), and the unit's three biases. */
template <typename T, int KS, int KR>
__device__ __forceinline__ void
load_unit_rows(const T *__restrict__ weights, const T *__restrict__ bias, int64_t H, int64_t K,
               int64_t u, bool unit_ok, int s, typename acc_of<T>::type (&w)[3][KR],
               typename acc_of<T>::type &b_i, typename acc_of<T>::type &b_o,
               typename acc_of<T>::type &b_z)
{
    typedef typename acc_of<T>::type A;
    constexpr int VEC = vec_of<A>::n;
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
    b_i = unit_ok ? to_acc(bias[u]) : A(0);
    b_o = unit_ok ? to_acc(bias[H + u]) : A(0);
    b_z = unit_ok ? to_acc(bias[2 * H + u]) : A(0);
}

/* The backward step's inputs of (t, b, u) for the cluster kernels:
 * activations i, o, z, the cell, dL/dh from above, and at the last step
 * dL/dh_n (in[6]) and dL/dc_n (in[5]). Loads only: nothing here may use a
 * loaded value, or the thread waits for the load here instead of a step
 * later (a predicated-off add waits on its operands too). */
template <typename T, typename A>
__device__ __forceinline__ void
load_backward_inputs(const T *__restrict__ gates, const T *__restrict__ cells,
                     const T *__restrict__ grad_output, const T *__restrict__ grad_h_n,
                     const T *__restrict__ grad_c_n, int64_t steps, int64_t B, int64_t H,
                     int64_t t, int64_t b, int64_t u, A (&in)[7])
{
    const T *arow = gates + (t * B + b) * 3 * H;
    const int64_t jj = (t * B + b) * H + u;
    in[0] = to_acc(arow[u]);
    in[1] = to_acc(arow[H + u]);
    in[2] = to_acc(arow[2 * H + u]);
    in[3] = to_acc(cells[jj]);
    in[4] = to_acc(grad_output[jj]);
    in[5] = 0;
    in[6] = 0;
    if (t == steps - 1) {
        in[6] = to_acc(grad_h_n[b * H + u]);
        in[5] = to_acc(grad_c_n[b * H + u]);
    }
}

/*
 * Forward recurrence. The grid is unit_blocks x groups blocks (groups =
 * gridDim.x / unit_blocks, see grid_groups): block n owns units
 * u = (n % unit_blocks)*U + j (j = tid / KS) for the 16-row chunks c of the
 * batch with c % groups == n / unit_blocks (splitting the batch spreads a
 * small H over more SMs: each block stages and multiplies fewer chunks per
 * step). Lane s (tid % KS) of a unit holds W_h[q*H + u, k] for
 * k = (kv*KS + s)*VEC + e in registers (zero where k >= H or u >= H).
 *   gates [T,B,G]  in: x_t W_x^T of every step; out: the activations
 *   output, cells [T,B,H] out
 *   h_work [2,B,H], c_work [B,H] (accumulation type): the recurrent state of
 *   the half types; NULL for float32/float64, which use output/cells.
 */
template <typename T, int KS, int KR>
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
    const int64_t unit_blocks = (H + U - 1) / U, groups = gridDim.x / unit_blocks;
    const int64_t u = (int64_t)(blockIdx.x % unit_blocks) * U + tid / KS;
    const int64_t first_row = (int64_t)(blockIdx.x / unit_blocks) * BC, row_step = groups * BC;
    const bool unit_ok = u < H;
    const bool owner = s < BC; /* holds a row after the reduction */
    const int64_t G = 3 * H, BH = B * H;

    A w[3][KR], b_i, b_o, b_z;
    load_unit_rows<T, KS, KR>(weights, bias, H, K, u, unit_ok, s, w, b_i, b_o, b_z);

    for (int64_t t = 0; t < steps; ++t) {
        for (int64_t b0 = first_row; b0 < B; b0 += row_step) {
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
            reduce_rows<KS, BC, 3>(acc, s);

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
            step_barrier(); /* h_t of every unit is written */
    }
}

/*
 * Backward recurrence, reverse time, on the forward's grid (unit blocks x
 * batch groups). Row slice s of unit j (j < U, s < KS) holds column u of
 * W_h for rows r = (rv*KS + s)*VEC + e < G in registers, as the forward's
 * lanes hold its rows, but laid out across the block the other way round:
 * lane l of warp w is unit j = l % U, slice s = w*(32/U) + l/U. Each step the
 * lanes of one slice read the same dG_{t+1} values from shared memory (one
 * broadcast; the warp's 32/U slices are adjacent 16-byte pieces), so the
 * block reads the staged chunk once per warp-slice group rather than once
 * per pair of units: half the shared-memory traffic of a unit-major layout,
 * which bound this kernel. The KS partial sums of each (row, unit) meet in
 * shared memory and thread t = bb*U + j (t < BC*U) adds them in slice order
 * (deterministic) and runs the pointwise step of row b0 + bb, unit j.
 *   grad_output [T,B,H], grad_h_n, grad_c_n [B,H], cells [T,B,H],
 *   gates [T,B,G] (activations)
 *   grad_gates [T,B,G] out: dL/dg of every step
 *   grad_bias [G] out; grad_h0, grad_c0 [B,H] out
 *   dg_work [2,B,G], dc_work [B,H] (accumulation type): the recurrent state
 *   of the half types; NULL for float32/float64 (grad_gates and grad_c0).
 *   bias_work [groups,G] (accumulation type): each group's bias sums, added
 *   in group order at the end (deterministic); NULL when groups == 1.
 */
template <typename T, int KS, int KR>
__global__ void __launch_bounds__(NT, 1)
sequence_backward_kernel(int64_t steps, int64_t B, int64_t H, int64_t K,
                         const T *__restrict__ grad_output, const T *__restrict__ grad_h_n,
                         const T *__restrict__ grad_c_n, const T *__restrict__ weights,
                         const T *__restrict__ cells, const T *__restrict__ gates,
                         T *__restrict__ grad_gates, T *__restrict__ grad_bias,
                         T *__restrict__ grad_h0, T *__restrict__ grad_c0,
                         typename acc_of<T>::type *__restrict__ dg_work,
                         typename acc_of<T>::type *__restrict__ dc_work,
                         typename acc_of<T>::type *__restrict__ bias_work)
{
    typedef typename acc_of<T>::type A;
    typedef typename vec_of<A>::type V;
    constexpr int U = NT / KS, VEC = vec_of<A>::n, RR = 3 * KR, RP = KS * RR;
    constexpr int SUM_LD = KS * U + U; /* a row's partial sums (+U: rows on other banks) */
    constexpr bool SAME = std::is_same<T, A>::value;
    static_assert(RR % VEC == 0 && 32 % U == 0 && (NT / 32) * (32 / U) == KS, "configuration");
    static_assert(BC * SUM_LD <= BC * RP && 3 * BC * U <= BC * RP, "sums fit in the staging");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    A *ds = reinterpret_cast<A *>(smem_raw); /* [BC][RP]: dG_{t+1} of one chunk */
    A *sums = ds; /* [BC][SUM_LD], reusing ds once a chunk's products are formed */

    const int tid = threadIdx.x, lane = tid % 32;
    const int j = lane % U, s = (tid / 32) * (32 / U) + lane / U; /* this lane's products */
    const int64_t unit_blocks = (H + U - 1) / U, groups = gridDim.x / unit_blocks;
    const int64_t group = blockIdx.x / unit_blocks, unit0 = (blockIdx.x % unit_blocks) * U;
    const int64_t first_row = group * BC, row_step = groups * BC;
    const int64_t G = 3 * H, BH = B * H, BG = B * G;
    /* this thread's pointwise work: row b0 + own_bb, unit own_u */
    const bool owner = tid < BC * U;
    const int own_bb = tid / U;
    const int64_t own_u = unit0 + tid % U;
    A *dc_state = SAME ? reinterpret_cast<A *>(grad_c0) : dc_work;

    A w[RR];
    {
        const int64_t u = unit0 + j;
#pragma unroll
        for (int rv = 0; rv < RR / VEC; ++rv)
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                const int64_t r = (int64_t)(rv * KS + s) * VEC + e;
                w[rv * VEC + e] = (u < H && r < G) ? to_acc(weights[r * K + u]) : A(0);
            }
    }

    /* stage dG_t of rows b0 .. b0+BC-1, form this lane's share of dG_t W_h
     * for unit j, and return the sum of the shares of (own_bb, own_u) */
    auto dh_from = [&](int64_t t, int64_t b0) -> A {
        if constexpr (SAME)
            stage_rows<A, RP>(ds, reinterpret_cast<const A *>(grad_gates) + t * BG, B, b0, G,
                              tid);
        else
            stage_rows<A, RP>(ds, dg_work + (t & 1) * BG, B, b0, G, tid);
        __syncthreads();
        A acc[BC];
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
        __syncthreads(); /* every lane is done with ds: the sums reuse it */
#pragma unroll
        for (int bb = 0; bb < BC; ++bb)
            sums[bb * SUM_LD + s * U + j] = acc[bb];
        __syncthreads();
        A total = 0;
        if (owner)
#pragma unroll
            for (int q = 0; q < KS; ++q)
                total += sums[own_bb * SUM_LD + q * U + tid % U];
        __syncthreads(); /* ds is restaged next */
        return total;
    };

    A bias_sum[3] = {0, 0, 0};
    for (int64_t t = steps - 1; t >= 0; --t) {
        const bool last = t == steps - 1;
        for (int64_t b0 = first_row; b0 < B; b0 += row_step) {
            const int64_t b = b0 + own_bb;
            const bool row_ok = owner && own_u < H && b < B;
            const int64_t jj = t * BH + b * H + own_u;
            const T *arow = gates + (t * B + b) * G;
            A i = 0, o = 0, z = 0, c = 0, dh = 0, dc_in = 0;
            if (row_ok) {
                i = to_acc(arow[own_u]);
                o = to_acc(arow[H + own_u]);
                z = to_acc(arow[2 * H + own_u]);
                c = to_acc(cells[jj]);
                dh = to_acc(grad_output[jj]);
                if (last) {
                    dh += to_acc(grad_h_n[b * H + own_u]);
                    dc_in = to_acc(grad_c_n[b * H + own_u]);
                } else {
                    dc_in = dc_state[b * H + own_u];
                }
            }
            A from_above = 0;
            if (!last) /* uniform over the grid */
                from_above = dh_from(t + 1, b0);
            if (row_ok) {
                A d[3], dc;
                backward_math<A>(i, o, z, c, dh + from_above, dc_in, d, &dc);
                T *drow = grad_gates + (t * B + b) * G;
                drow[own_u] = from_acc<T>(d[0]);
                drow[H + own_u] = from_acc<T>(d[1]);
                drow[2 * H + own_u] = from_acc<T>(d[2]);
                if (!SAME) {
                    A *wrow = dg_work + (t & 1) * BG + b * G;
                    wrow[own_u] = d[0];
                    wrow[H + own_u] = d[1];
                    wrow[2 * H + own_u] = d[2];
                }
                dc_state[b * H + own_u] = dc;
                bias_sum[0] += d[0];
                bias_sum[1] += d[1];
                bias_sum[2] += d[2];
            }
        }
        step_barrier(); /* dG_t of every unit is written */
    }

    /* grad_h0 = dG_0 W_h; grad_c0 (half types: from the float state) */
    for (int64_t b0 = first_row; b0 < B; b0 += row_step) {
        const int64_t b = b0 + own_bb;
        const bool row_ok = owner && own_u < H && b < B;
        const A dh0 = dh_from(0, b0);
        if (row_ok) {
            grad_h0[b * H + own_u] = from_acc<T>(dh0);
            if (!SAME)
                grad_c0[b * H + own_u] = from_acc<T>(dc_work[b * H + own_u]);
        }
    }
    /* bias: the owners of each unit add their row sums (fixed order) */
    A *bias_rows = ds; /* [3][BC][U] */
    if (owner)
#pragma unroll
        for (int q = 0; q < 3; ++q)
            bias_rows[(q * BC + own_bb) * U + tid % U] = bias_sum[q];
    __syncthreads();
    const bool unit_writer = tid < U && unit0 + tid < H;
    const int64_t u = unit0 + tid;
#pragma unroll
    for (int q = 0; q < 3; ++q) {
        bias_sum[q] = 0;
        if (unit_writer)
            for (int bb = 0; bb < BC; ++bb)
                bias_sum[q] += bias_rows[(q * BC + bb) * U + tid];
    }
    if (groups > 1) { /* then the groups' sums, in group order */
        if (unit_writer)
#pragma unroll
            for (int q = 0; q < 3; ++q)
                bias_work[group * G + q * H + u] = bias_sum[q];
        step_barrier();
        if (group != 0)
            return;
#pragma unroll
        for (int q = 0; q < 3; ++q) {
            bias_sum[q] = 0;
            if (unit_writer)
                for (int64_t g = 0; g < groups; ++g)
                    bias_sum[q] += __ldcg(&bias_work[g * G + q * H + u]);
        }
    }
    if (unit_writer) {
        grad_bias[u] = from_acc<T>(bias_sum[0]);
        grad_bias[H + u] = from_acc<T>(bias_sum[1]);
        grad_bias[2 * H + u] = from_acc<T>(bias_sum[2]);
    }
}

/* ------------------------------------------------------ cluster kernels -- */

/*
 * The cluster plan (H <= 128): the grid is ONE thread-block cluster, block
 * n = its rank, and the recurrent state moves through distributed shared
 * memory. Every block keeps the whole state of a step (all rows, all units)
 * in its own shared memory, in two buffers picked by step parity, each with
 * a transaction barrier (mbarrier) in that block. At the end of its step a
 * block gathers its units' new values in a local tile and sends the tile in
 * 16-byte pieces to the buffer of every block of the cluster with st.async,
 * each piece counted on the receiver's mbarrier (complete_tx); a block waits
 * on its own mbarrier until every byte of the step's state arrived, then
 * computes. No barrier across the cluster per step (only data-flow waits),
 * no fences, nothing of the state through global memory; the step's outputs
 * go to global memory while the pieces travel, and the next step's inputs
 * (chunk 0) are loaded a whole step ahead.
 *
 * Why two buffers suffice: a block sends into buffer p for step t+2 only
 * after it received everything for step t+1, which every block sent after it
 * finished step t, that is, after it read buffer p (its state of step t).
 * The same argument keeps the mbarrier phases apart (a phase of buffer p
 * cannot complete before every thread of the block waited for the one
 * before). The receiver arms each phase (arrive.expect_tx of the bytes it
 * will receive) once it waited for the previous phase of that buffer; pieces
 * arriving before the arming leave the count negative, which mbarriers
 * allow. The kernels end with a cluster barrier: no block leaves while
 * another may still write into its shared memory.
 *
 * Layout: a row of a buffer is LD = width + one 16-byte vector long (rows
 * 16-byte aligned; the 16 rows of a tile land in different banks). The
 * state's units are spaced by HP = ranks * U (the cluster's units, >= H): a
 * block's units are then one 16-byte aligned run per row (and gate); the
 * padding units carry zeros. Shared memory: 16 bytes of mbarriers, the two
 * buffers, two send tiles and this block's own state (c or dc).
 *
 * The send tiles alternate (by the parity of the tiles sent so far): a
 * thread writes tile p again only after the __syncthreads that follows the
 * next tile's writes, which every thread reaches after it sent its pieces
 * of tile p. One tile would not do: a thread may pass the next step's wait
 * (its block needs none of a slow thread's pieces) and overwrite the tile
 * that slow thread still reads.
 */

constexpr int CLUSTER_MAX_CHUNKS = 8; /* bookkeeping bound; shared memory allows fewer */

/* the cluster primitives (mbarriers, st.async): lltm_cuda_cluster.cuh */

/* Send this block's tile of one chunk to every block of its cluster: tile
 * [CH][RUNS][W] (W values of the accumulation type per run, a multiple of 16
 * bytes) goes to rows [b0, b0+CH) of `buffer`, run q of row b at
 * buffer[b*LD + q*QS + n*W] (n this block's rank). Call from every thread
 * (after the tile is complete); each sends some of the 16-byte pieces. */
template <typename A, int RUNS, int W, int LD, int CH = BC>
__device__ __forceinline__ void send_tile(const A *tile, A *buffer, uint64_t *bar, int64_t b0,
                                          int64_t QS, int n, int ranks, int tid)
{
    constexpr int PER_RUN = W * (int)sizeof(A) / 16, PER_RANK = CH * RUNS * PER_RUN;
    static_assert(W * sizeof(A) % 16 == 0, "16-byte pieces");
    for (int e = tid; e < PER_RANK * ranks; e += NT) {
        const int rank = e / PER_RANK, piece = e % PER_RANK;
        const int bb = piece / (RUNS * PER_RUN), q = piece / PER_RUN % RUNS, v = piece % PER_RUN;
        const A *src = tile + (bb * RUNS + q) * W + v * (16 / (int)sizeof(A));
        A *dst = buffer + (b0 + bb) * LD + q * QS + (int64_t)n * W + v * (16 / (int)sizeof(A));
        send16(src, dst, bar, rank);
    }
}

/*
 * Forward recurrence, cluster plan. Lane s (tid % KS) of unit j holds
 * W_h[q*H + u, k] for k = (kv*KS + s)*VEC + e, as in sequence_forward_kernel,
 * but for RW of a chunk's CH rows: thread tid is lane s of unit
 * j = (tid / KS) % U for the rows slice*RW .. slice*RW+RW-1 of each chunk,
 * slice = tid / (KS*U). RW = CH = 16 (one slice: the units of a block spread
 * over its warps, every lane of a unit on all 16 rows) is the layout of the
 * grid kernels; RW < CH puts a slice's rows on fewer lanes with more k
 * values each: the same multiply-adds per thread, but a shuffle reduction
 * over KS lanes of RW*3 partial sums instead of 32 lanes of 48 (it cost the
 * 32x4 layout as many instructions as its multiply-adds). No workspace (the
 * state stays in shared memory, in the accumulation type, also for the half
 * types).
 *
 * Batch groups: the grid may be several clusters of `ranks` blocks (gridDim.x
 * = groups * ranks); cluster g takes the chunks g, g + groups, ... of CH rows
 * (rows are independent: the clusters never meet). With CH = 4 (8 lanes a
 * unit on 1 row) and B = 16 that is four clusters of a quarter of the rows:
 * a quarter of the multiply-adds a thread, a quarter of the bytes exchanged
 * per block and step (see cluster_split).
 * Buffers hold the cluster's own rows ("local" rows lb = lc*CH + r of its
 * chunk lc, global row b = (lc*groups + g)*CH + r).
 *   bars[2] (shared): mbarriers of the buffers
 *   hs [2][BPL][LD] (shared): h_{t-1} of the local rows in buffer t & 1, unit
 *                             u at column u
 *   tiles [2][CH][U] (shared): this block's h_t of one chunk, to send
 *   cs [BPL][U] (shared): c_{t-1} of this block's units (one lane each)
 */
template <typename T, int KS, int KR, int RW, int CH>
__global__ void __launch_bounds__(NT, 1)
sequence_forward_cluster_kernel(int64_t steps, int64_t B, int64_t H, int64_t K,
                                const T *__restrict__ h0, const T *__restrict__ c0,
                                const T *__restrict__ weights, const T *__restrict__ bias,
                                T *__restrict__ gates, T *__restrict__ output,
                                T *__restrict__ cells)
{
    typedef typename acc_of<T>::type A;
    typedef typename vec_of<A>::type V;
    constexpr int SLICES = CH / RW, U = NT / KS / SLICES, VEC = vec_of<A>::n, KP = KS * KR,
                  LD = KP + VEC;
    static_assert(KR % VEC == 0 && KS >= RW && KS <= 32 && CH % RW == 0 && CH <= BC &&
                      NT % (KS * SLICES) == 0 && (SLICES == 1 || KS * U % 32 == 0),
                  "configuration");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int ranks = (int)((H + U - 1) / U); /* blocks a cluster */
    const int groups = (int)(gridDim.x / ranks), group = (int)(blockIdx.x / ranks);
    const int64_t group_chunks = ((B + CH - 1) / CH - group + groups - 1) / groups;
    const int64_t BPL = group_chunks * CH; /* this cluster's rows, padded */
    uint64_t *bars = reinterpret_cast<uint64_t *>(smem_raw);
    A *hs = reinterpret_cast<A *>(smem_raw + 16);
    A *tiles = hs + 2 * BPL * LD;
    A *cs = tiles + 2 * CH * U;
    cg::cluster_group cluster = cg::this_cluster();

    const int tid = threadIdx.x, s = tid % KS, j = tid / KS % U, n = (int)(blockIdx.x % ranks);
    const int slice = tid / (KS * U);
    const int64_t u = (int64_t)n * U + j;
    const bool unit_ok = u < H;
    const bool owner = s < RW; /* holds a row after the reduction */
    const int r = slice * RW + (s & (RW - 1)); /* that row, in its chunk */
    const int64_t G = 3 * H, BH = B * H;
    const unsigned step_bytes = (unsigned)(BPL * ranks * U * sizeof(A)); /* one buffer's fill */
    auto global_row = [&](int64_t lb) { return (lb / CH * groups + group) * CH + lb % CH; };

    /* buffer 0 <- h0; everything else 0 (padding meets zero weights, but
     * must not hold NaN) */
    for (int64_t e = tid; e < 2 * BPL * LD; e += NT) {
        const int64_t lb = e / LD, k = e % LD, b = global_row(lb);
        hs[e] = (lb < BPL && b < B && k < H) ? to_acc(h0[b * H + k]) : A(0);
    }
    if (tid == 0) {
        /* step t >= 1 waits for buffer t & 1; arm the first two phases */
        mbar_init(&bars[0], 1);
        mbar_init(&bars[1], 1);
        mbar_fence_init();
        if (steps > 1)
            mbar_expect_tx(&bars[1], step_bytes);
        if (steps > 2)
            mbar_expect_tx(&bars[0], step_bytes);
    }
    A w[3][KR], b_i, b_o, b_z;
    load_unit_rows<T, KS, KR>(weights, bias, H, K, u, unit_ok, s, w, b_i, b_o, b_z);
    /* the projection x_t W_x^T of (t, b) for this lane's unit */
    auto load_projection = [&](int64_t t, int64_t b, A &p_i, A &p_o, A &p_z) {
        const T *grow = gates + (t * B + b) * G;
        p_i = to_acc(grow[u]);
        p_o = to_acc(grow[H + u]);
        p_z = to_acc(grow[2 * H + u]);
    };
    auto store_outputs = [&](int64_t t, int64_t b, A i, A o, A z, A c, A h) {
        T *grow = gates + (t * B + b) * G;
        grow[u] = from_acc<T>(i);
        grow[H + u] = from_acc<T>(o);
        grow[2 * H + u] = from_acc<T>(z);
        cells[t * BH + b * H + u] = from_acc<T>(c);
        output[t * BH + b * H + u] = from_acc<T>(h);
    };
    const int64_t first_row = (int64_t)group * CH + r; /* local chunk 0: row r */
    const bool first_row_ok = owner && unit_ok && first_row < B;
    A n_i = 0, n_o = 0, n_z = 0; /* chunk 0's projection of the coming step */
    if (first_row_ok)
        load_projection(0, first_row, n_i, n_o, n_z);
    cluster.sync(); /* every block running, its barriers armed, before any send */

    unsigned sent = 0; /* tiles sent so far: their parity picks the tile */
    for (int64_t t = 0; t < steps; ++t) {
        if (t >= 1) {
            mbar_wait(&bars[t & 1], (unsigned)((t - 1) >> 1) & 1u); /* h_{t-1} arrived */
            if (tid == 0 && t + 2 < steps)
                mbar_expect_tx(&bars[t & 1], step_bytes); /* for step t + 2 */
        }
        const A *h_prev = hs + (t & 1) * BPL * LD;
        A *h_next = hs + ((t + 1) & 1) * BPL * LD;
        const bool exchange = t + 1 < steps; /* uniform over the cluster */
        A i = 0, o = 0, z = 0, c = 0, h = 0;
        int64_t b = 0;
        bool row_ok = false;
        for (int64_t lb0 = 0; lb0 < BPL; lb0 += CH) {
            if (row_ok) /* the previous chunk's outputs */
                store_outputs(t, b, i, o, z, c, h);
            b = global_row(lb0) + r;
            row_ok = owner && unit_ok && b < B;
            A p_i = n_i, p_o = n_o, p_z = n_z, c_prev = 0;
            if (lb0 == 0 && exchange && first_row_ok) /* a whole step ahead */
                load_projection(t + 1, first_row, n_i, n_o, n_z);
            if (row_ok) {
                if (lb0 > 0)
                    load_projection(t, b, p_i, p_o, p_z);
                c_prev = t == 0 ? to_acc(c0[b * H + u]) : cs[(lb0 + r) * U + j];
            }

            A acc[RW * 3];
#pragma unroll
            for (int v = 0; v < RW * 3; ++v)
                acc[v] = 0;
            const A *rows = h_prev + (lb0 + slice * RW) * LD;
#pragma unroll
            for (int bb = 0; bb < RW; ++bb) {
#pragma unroll
                for (int kv = 0; kv < KR / VEC; ++kv) {
                    const V hv =
                        *reinterpret_cast<const V *>(&rows[bb * LD + (kv * KS + s) * VEC]);
#pragma unroll
                    for (int e = 0; e < VEC; ++e)
#pragma unroll
                        for (int q = 0; q < 3; ++q)
                            acc[bb * 3 + q] += w[q][kv * VEC + e] * component(hv, e);
                }
            }
            reduce_rows<KS, RW, 3>(acc, s);

            h = 0;
            if (row_ok) {
                i = sigmoid_(acc[0] + p_i + b_i);
                o = sigmoid_(acc[1] + p_o + b_o);
                z = elu_(acc[2] + p_z + b_z);
                c = c_prev + i * z;
                h = tanh_(c) * o;
                cs[(lb0 + r) * U + j] = c;
            }
            if (exchange) { /* uniform */
                A *tile = tiles + (sent++ & 1) * CH * U;
                if (owner)
                    tile[r * U + j] = h; /* 0 for padding rows and units */
                __syncthreads();
                send_tile<A, 1, U, LD, CH>(tile, h_next, &bars[(t + 1) & 1], lb0, 0, n, ranks,
                                           tid);
            }
        }
        if (row_ok)
            store_outputs(t, b, i, o, z, c, h);
    }
    cluster.sync(); /* no block leaves while pieces may still arrive in it */
}

/*
 * Backward recurrence, reverse time, cluster plan. Same register layout as
 * sequence_backward_kernel, over the state's columns: lane s holds, for
 * column r = q*HP + k of a buffer, W_h[q*H + k, u] (0 for k >= H).
 *   bars[2] (shared): mbarriers of the buffers
 *   ds [2][BP][LD] (shared): dG_t in buffer t & 1
 *   tiles [2][BC][3][U] (shared): this block's dG_t of one chunk, to send
 *   dcs [BP][U] (shared): dL/dc_t of this block's units (one lane each)
 */
template <typename T, int KS, int KR>
__global__ void __launch_bounds__(NT, 1)
sequence_backward_cluster_kernel(int64_t steps, int64_t B, int64_t H, int64_t K,
                                 const T *__restrict__ grad_output,
                                 const T *__restrict__ grad_h_n, const T *__restrict__ grad_c_n,
                                 const T *__restrict__ weights, const T *__restrict__ cells,
                                 const T *__restrict__ gates, T *__restrict__ grad_gates,
                                 T *__restrict__ grad_bias, T *__restrict__ grad_h0,
                                 T *__restrict__ grad_c0)
{
    typedef typename acc_of<T>::type A;
    typedef typename vec_of<A>::type V;
    constexpr int U = NT / KS, VEC = vec_of<A>::n, RR = 3 * KR, RP = KS * RR, LD = RP + VEC;
    static_assert(RR % VEC == 0 && KS >= BC && KS <= 32 && NT % KS == 0, "configuration");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int64_t BP = (B + BC - 1) / BC * BC;
    uint64_t *bars = reinterpret_cast<uint64_t *>(smem_raw);
    A *ds = reinterpret_cast<A *>(smem_raw + 16);
    A *tiles = ds + 2 * BP * LD;
    A *dcs = tiles + 2 * BC * 3 * U;
    cg::cluster_group cluster = cg::this_cluster();

    const int tid = threadIdx.x, s = tid % KS, j = tid / KS, n = (int)blockIdx.x;
    const int64_t u = (int64_t)n * U + j;
    const int ranks = (int)((H + U - 1) / U);
    const int64_t HP = (int64_t)ranks * U; /* the state's gate stride */
    const bool unit_ok = u < H;
    const bool owner = s < BC;
    const int64_t G = 3 * H;
    const unsigned step_bytes = (unsigned)(BP * 3 * HP * sizeof(A));

    for (int64_t e = tid; e < 2 * BP * LD; e += NT)
        ds[e] = 0;
    /* dG_s (s = T-1 .. 0) is waited for in buffer s & 1, phase (T-1-s) / 2;
     * arm the first two phases */
    if (tid == 0) {
        mbar_init(&bars[0], 1);
        mbar_init(&bars[1], 1);
        mbar_fence_init();
        mbar_expect_tx(&bars[(steps - 1) & 1], step_bytes);
        if (steps > 1)
            mbar_expect_tx(&bars[steps & 1], step_bytes);
    }
    A w[RR];
#pragma unroll
    for (int rv = 0; rv < RR / VEC; ++rv)
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
            const int64_t r = (int64_t)(rv * KS + s) * VEC + e, q = r / HP, k = r % HP;
            w[rv * VEC + e] = (unit_ok && q < 3 && k < H) ? to_acc(weights[(q * H + k) * K + u])
                                                          : A(0);
        }

    /* dG_s has arrived (every thread waits; then one re-arms the buffer
     * for dG_{s-2}) */
    auto wait_for = [&](int64_t s_) {
        mbar_wait(&bars[s_ & 1], (unsigned)((steps - 1 - s_) >> 1) & 1u);
        if (tid == 0 && s_ >= 2)
            mbar_expect_tx(&bars[s_ & 1], step_bytes);
    };
    /* this lane's share of dG W_h over rows [b0, b0+BC) of `rows` (a buffer
     * of ds), summed to acc[0] = row (b0 + s) */
    auto dh_from = [&](const A *rows, A(&acc)[BC]) {
#pragma unroll
        for (int bb = 0; bb < BC; ++bb)
            acc[bb] = 0;
#pragma unroll
        for (int bb = 0; bb < BC; ++bb) {
#pragma unroll
            for (int rv = 0; rv < RR / VEC; ++rv) {
                const V dv = *reinterpret_cast<const V *>(&rows[bb * LD + (rv * KS + s) * VEC]);
#pragma unroll
                for (int e = 0; e < VEC; ++e)
                    acc[bb] += w[rv * VEC + e] * component(dv, e);
            }
        }
        reduce_rows<KS, BC, 1>(acc, s);
    };
    auto load_inputs = [&](int64_t t, int64_t b, A(&in)[7]) {
        load_backward_inputs(gates, cells, grad_output, grad_h_n, grad_c_n, steps, B, H, t, b, u,
                             in);
    };
    auto store_grad_gates = [&](int64_t t, int64_t b, const A(&d)[3]) {
        T *drow = grad_gates + (t * B + b) * G;
        drow[u] = from_acc<T>(d[0]);
        drow[H + u] = from_acc<T>(d[1]);
        drow[2 * H + u] = from_acc<T>(d[2]);
    };
    const bool first_row_ok = owner && unit_ok && s < B;
    A next[7] = {0, 0, 0, 0, 0, 0, 0}; /* chunk 0's inputs of the coming step */
    if (first_row_ok)
        load_inputs(steps - 1, s, next);
    cluster.sync(); /* every block running, its barriers armed, before any send */

    A bias_sum[3] = {0, 0, 0};
    unsigned sent = 0; /* tiles sent so far: their parity picks the tile */
    for (int64_t t = steps - 1; t >= 0; --t) {
        const bool last = t == steps - 1;
        if (!last)
            wait_for(t + 1);
        const A *d_next = ds + ((t + 1) & 1) * BP * LD; /* dG_{t+1} */
        A *d_this = ds + (t & 1) * BP * LD;
        A d[3] = {0, 0, 0};
        int64_t b = 0;
        bool row_ok = false;
        for (int64_t b0 = 0; b0 < B; b0 += BC) {
            if (row_ok) /* the previous chunk's outputs */
                store_grad_gates(t, b, d);
            b = b0 + (s & (BC - 1));
            row_ok = owner && unit_ok && b < B;
            A in[7];
#pragma unroll
            for (int q = 0; q < 7; ++q)
                in[q] = next[q];
            if (b0 == 0 && t > 0 && first_row_ok) /* a whole step ahead */
                load_inputs(t - 1, s, next);
            if (row_ok) {
                if (b0 > 0)
                    load_inputs(t, b, in);
                if (!last)
                    in[5] = dcs[b * U + j];
            }
            A acc[BC];
            acc[0] = 0;
            if (!last) /* uniform over the cluster */
                dh_from(d_next + b0 * LD, acc);
            d[0] = d[1] = d[2] = 0;
            if (row_ok) {
                A dc;
                backward_math<A>(in[0], in[1], in[2], in[3], in[4] + in[6] + acc[0], in[5], d,
                                 &dc);
                dcs[b * U + j] = dc;
                bias_sum[0] += d[0];
                bias_sum[1] += d[1];
                bias_sum[2] += d[2];
            }
            A *tile = tiles + (sent++ & 1) * BC * 3 * U;
            if (owner) {
                A *trow = tile + (s & (BC - 1)) * 3 * U + j;
                trow[0] = d[0]; /* 0 for padding rows and units */
                trow[U] = d[1];
                trow[2 * U] = d[2];
            }
            __syncthreads();
            send_tile<A, 3, U, LD>(tile, d_this, &bars[t & 1], b0, HP, n, ranks, tid);
        }
        if (row_ok)
            store_grad_gates(t, b, d);
    }

    /* grad_h0 = dG_0 W_h (buffer 0), grad_c0 = dL/dc_0 */
    wait_for(0);
    for (int64_t b0 = 0; b0 < B; b0 += BC) {
        const int64_t b = b0 + (s & (BC - 1));
        const bool row_ok = owner && unit_ok && b < B;
        A acc[BC];
        dh_from(ds + b0 * LD, acc);
        if (row_ok) {
            grad_h0[b * H + u] = from_acc<T>(acc[0]);
            grad_c0[b * H + u] = from_acc<T>(dcs[b * U + j]);
        }
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
    cluster.sync(); /* no block leaves while pieces may still arrive in it */
}

/*
 * Backward recurrence, reverse time, cluster plan with 8 units a block (the
 * 16-block shape): the REDUCE-SCATTER form. Block n keeps the forward's
 * weight layout, the gate rows R_n of its own units (rows q*H + u of W_h,
 * 3U x H), so the dG_t it needs is its own (its pointwise step computed it):
 * it forms a partial dh_{t-1}[:, all units] = dG_t[:, R_n] W_h[R_n, :] and
 * sends each block m only the partial of m's units (U values a row, 16-byte
 * pieces straight from registers with st.async, counted on m's transaction
 * barrier). Block m sums the partials of its units from the `ranks` blocks
 * in rank order (deterministic) and runs its pointwise step. Per block and
 * step that is B*HP values sent in all instead of 3*B*U to each of the
 * `ranks` blocks, 3*B*HP (the broadcast form above: 8 KB instead of 24 KB
 * at B=16, H=128), and no block reads another's dG at all. Measured on
 * the H100 at B16/I32/H128 T=1000 (scripts/sequence_timing.py, alternating
 * runs): forward+backward 4.55-4.60 ms against 5.76-5.78 ms broadcast.
 *
 * Threads, two roles per chunk of BC rows:
 *   pointwise: thread tid < BC*U: unit j = tid % U, row b0 + tid / U
 *   product:   thread (kg = tid % KG, bg = tid / KG) forms the partial of
 *              PK = 16 / sizeof(A) units k = kg*PK + e (one 16-byte piece)
 *              over rows bg*RB .. bg*RB+RB-1 of the chunk, from W_h[R_n, k]
 *              in registers (3U*PK values) and the chunk's dG tile in shared
 *              memory (each warp reads the same row: broadcast loads).
 * Reception i (i = T-1-t: 1 .. T) is the partial dh of step t = T-1-i (dh of
 * step -1 is grad_h0), in buffer i & 1, phase (i-1)/2 of its mbarrier; the
 * two-buffer argument of the broadcast kernel holds unchanged (a block sends
 * reception i+1 only after it waited for reception i, which every block
 * sends after it read reception i-1 of the same parity).
 *
 * Batch groups as in sequence_forward_cluster_kernel: several clusters,
 * cluster g on the chunks g, g + groups, ... of CH rows (local rows in its
 * buffers). The bias gradient sums over every row: with groups > 1 each
 * cluster writes its sums to bias_work [groups][3H] and the launcher adds
 * them in group order (sum_bias_groups_kernel).
 *   bars[2] (shared): mbarriers of the receive buffers
 *   recv [2][RANKS][BPL][U] (shared): the partials, by sender rank
 *   tiles [2][CH][3U] (shared): this block's dG of one chunk (i|o|z rows)
 *   dcs [BPL][U] (shared): dL/dc of this block's units
 */
constexpr int RS_MAX_UNITS = 128; /* the cluster plan's H */

template <typename T, int U, int CH = BC>
__global__ void __launch_bounds__(NT, 1)
sequence_backward_cluster_rs_kernel(int64_t steps, int64_t B, int64_t H, int64_t K,
                                    const T *__restrict__ grad_output,
                                    const T *__restrict__ grad_h_n,
                                    const T *__restrict__ grad_c_n,
                                    const T *__restrict__ weights, const T *__restrict__ cells,
                                    const T *__restrict__ gates, T *__restrict__ grad_gates,
                                    T *__restrict__ grad_bias, T *__restrict__ grad_h0,
                                    T *__restrict__ grad_c0,
                                    typename acc_of<T>::type *__restrict__ bias_work)
{
    typedef typename acc_of<T>::type A;
    typedef typename vec_of<A>::type V;
    constexpr int PK = 16 / (int)sizeof(A), VEC = vec_of<A>::n, R = 3 * U;
    /* RB rows a product thread: 1 where a chunk has fewer rows than the
     * threads cover (CH * KG < NT; the rest of the threads idle then) */
    constexpr int RANKS = RS_MAX_UNITS / U, KG = RANKS * U / PK;
    constexpr int RB = CH * KG >= NT ? CH * KG / NT : 1;
    static_assert(PK == VEC && U % PK == 0 && R % VEC == 0 && NT % KG == 0 &&
                      (CH * KG % NT == 0 || NT % (CH * KG) == 0) && CH * U <= NT && CH <= BC,
                  "configuration");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int ranks = (int)((H + U - 1) / U);
    const int groups = (int)(gridDim.x / ranks), group = (int)(blockIdx.x / ranks);
    const int64_t group_chunks = ((B + CH - 1) / CH - group + groups - 1) / groups;
    const int64_t BPL = group_chunks * CH; /* this cluster's rows, padded */
    uint64_t *bars = reinterpret_cast<uint64_t *>(smem_raw);
    A *recv = reinterpret_cast<A *>(smem_raw + 16);
    A *tiles = recv + 2 * RANKS * BPL * U;
    A *dcs = tiles + 2 * CH * R;
    cg::cluster_group cluster = cg::this_cluster();

    const int tid = threadIdx.x, n = (int)(blockIdx.x % ranks);
    const int64_t HP = (int64_t)ranks * U;
    const int64_t G = 3 * H;
    auto global_row = [&](int64_t lb) { return (lb / CH * groups + group) * CH + lb % CH; };
    /* pointwise role */
    const bool pointwise = tid < CH * U;
    const int j = tid % U, pb = tid / U;
    const int64_t u = (int64_t)n * U + j;
    const bool unit_ok = pointwise && u < H;
    /* product role */
    const int kg = tid % KG, bg = tid / KG;
    const int64_t k0 = (int64_t)kg * PK;
    const bool k_ok = k0 < HP && bg * RB < CH; /* the piece goes to block k0 / U */
    const int dest = (int)(k0 / U), dest_off = (int)(k0 % U);
    const unsigned step_bytes = (unsigned)(ranks * BPL * U * sizeof(A)); /* one reception */

    if (tid == 0) {
        /* reception i in buffer i & 1: arm receptions 1 and 2 */
        mbar_init(&bars[0], 1);
        mbar_init(&bars[1], 1);
        mbar_fence_init();
        mbar_expect_tx(&bars[1], step_bytes);
        if (steps > 1)
            mbar_expect_tx(&bars[0], step_bytes);
    }
    A w[R][PK];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int e = 0; e < PK; ++e) {
            const int64_t row_u = (int64_t)n * U + r % U, k = k0 + e;
            w[r][e] = (row_u < H && k < H) ? to_acc(weights[((r / U) * H + row_u) * K + k])
                                           : A(0);
        }

    /* reception i has arrived (every thread waits; one re-arms for i+2) */
    auto wait_for = [&](int64_t i) {
        mbar_wait(&bars[i & 1], (unsigned)((i - 1) >> 1) & 1u);
        if (tid == 0 && i + 2 <= steps)
            mbar_expect_tx(&bars[i & 1], step_bytes);
    };
    /* the partials of (reception buffer p, row b) for unit j, summed in a
     * fixed order: four chains over the ranks m = c (mod 4), then the chains
     * pairwise (a quarter of the dependent adds of one chain) */
    auto gather = [&](int p, int64_t lb) {
        const A *src = recv + ((int64_t)p * RANKS * BPL + lb) * U + j;
        A chain[4] = {0, 0, 0, 0};
#pragma unroll
        for (int m = 0; m < RANKS; ++m)
            if (m < ranks)
                chain[m % 4] += src[(int64_t)m * BPL * U];
        return (chain[0] + chain[1]) + (chain[2] + chain[3]);
    };
    auto load_inputs = [&](int64_t t, int64_t b, A(&in)[7]) {
        load_backward_inputs(gates, cells, grad_output, grad_h_n, grad_c_n, steps, B, H, t, b, u,
                             in);
    };
    auto store_grad_gates = [&](int64_t t, int64_t b, const A(&d)[3]) {
        T *drow = grad_gates + (t * B + b) * G;
        drow[u] = from_acc<T>(d[0]);
        drow[H + u] = from_acc<T>(d[1]);
        drow[2 * H + u] = from_acc<T>(d[2]);
    };
    const int64_t first_row = (int64_t)group * CH + pb; /* local chunk 0: row pb */
    const bool first_row_ok = unit_ok && first_row < B;
    A next[7] = {0, 0, 0, 0, 0, 0, 0}; /* chunk 0's inputs of the coming step */
    if (first_row_ok)
        load_inputs(steps - 1, first_row, next);
    cluster.sync(); /* every block running, its barriers armed, before any send */

    A bias_sum[3] = {0, 0, 0};
    unsigned chunks_done = 0; /* their parity picks the tile */
    for (int64_t t = steps - 1; t >= 0; --t) {
        const int64_t i = steps - 1 - t; /* this step waits for reception i */
        const bool last = i == 0;
        if (!last)
            wait_for(i);
        const int p_in = (int)(i & 1), p_out = (int)((i + 1) & 1);
        A *recv_out = recv + (int64_t)p_out * RANKS * BPL * U; /* in block `dest` */
        A d[3] = {0, 0, 0};
        int64_t b = 0;
        bool row_ok = false;
        for (int64_t lb0 = 0; lb0 < BPL; lb0 += CH) {
            if (row_ok) /* the previous chunk's outputs */
                store_grad_gates(t, b, d);
            b = global_row(lb0) + pb;
            row_ok = unit_ok && b < B;
            A in[7];
#pragma unroll
            for (int q = 0; q < 7; ++q)
                in[q] = next[q];
            if (lb0 == 0 && t > 0 && first_row_ok) /* a whole step ahead */
                load_inputs(t - 1, first_row, next);
            A dh_rec = 0;
            if (row_ok) {
                if (lb0 > 0)
                    load_inputs(t, b, in);
                if (!last) {
                    in[5] = dcs[(lb0 + pb) * U + j];
                    dh_rec = gather(p_in, lb0 + pb);
                }
            }
            d[0] = d[1] = d[2] = 0;
            if (row_ok) {
                A dc;
                backward_math<A>(in[0], in[1], in[2], in[3], in[4] + in[6] + dh_rec, in[5], d,
                                 &dc);
                dcs[(lb0 + pb) * U + j] = dc;
                bias_sum[0] += d[0];
                bias_sum[1] += d[1];
                bias_sum[2] += d[2];
            }
            A *tile = tiles + (chunks_done++ & 1) * CH * R;
            if (pointwise) {
                A *trow = tile + pb * R + j;
                trow[0] = d[0]; /* 0 for padding rows and units */
                trow[U] = d[1];
                trow[2 * U] = d[2];
            }
            __syncthreads();
            /* partial dh of the chunk's rows for units k0 .. k0+PK-1 */
            if (k_ok) {
                A acc[RB][PK];
#pragma unroll
                for (int rb = 0; rb < RB; ++rb)
#pragma unroll
                    for (int e = 0; e < PK; ++e)
                        acc[rb][e] = 0;
#pragma unroll
                for (int rb = 0; rb < RB; ++rb) {
                    const A *trow = tile + (bg * RB + rb) * R;
#pragma unroll
                    for (int rv = 0; rv < R / VEC; ++rv) {
                        const V dv = *reinterpret_cast<const V *>(&trow[rv * VEC]);
#pragma unroll
                        for (int c = 0; c < VEC; ++c)
#pragma unroll
                            for (int e = 0; e < PK; ++e)
                                acc[rb][e] += component(dv, c) * w[rv * VEC + c][e];
                    }
                }
#pragma unroll
                for (int rb = 0; rb < RB; ++rb) {
                    A *dst = recv_out + ((int64_t)n * BPL + lb0 + bg * RB + rb) * U + dest_off;
                    send16v<A, PK>(acc[rb], dst, &bars[p_out], dest);
                }
            }
        }
        if (row_ok)
            store_grad_gates(t, b, d);
    }

    /* grad_h0 = dG_0 W_h (reception T), grad_c0 = dL/dc_0 */
    wait_for(steps);
    for (int64_t lb0 = 0; lb0 < BPL; lb0 += CH) {
        const int64_t b = global_row(lb0) + pb;
        if (unit_ok && b < B) {
            grad_h0[b * H + u] = from_acc<T>(gather((int)(steps & 1), lb0 + pb));
            grad_c0[b * H + u] = from_acc<T>(dcs[(lb0 + pb) * U + j]);
        }
    }
    /* bias: each pointwise thread's row sums, added over its unit's threads
     * in row order (in the tiles, which no thread reads any more) */
    __syncthreads();
    if (pointwise) {
        tiles[pb * R + j] = bias_sum[0];
        tiles[pb * R + U + j] = bias_sum[1];
        tiles[pb * R + 2 * U + j] = bias_sum[2];
    }
    __syncthreads();
    if (tid < R) {
        const int64_t ur = (int64_t)n * U + tid % U;
        if (ur < H) {
            A sum = 0;
            for (int r = 0; r < CH; ++r)
                sum += tiles[r * R + tid];
            if (groups == 1)
                grad_bias[(tid / U) * H + ur] = from_acc<T>(sum);
            else
                bias_work[group * G + (tid / U) * H + ur] = sum;
        }
    }
    cluster.sync(); /* no block leaves while pieces may still arrive in it */
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

/* C[M,N] = A[M,K] B[K,N] for the binding's small products (see
 * lltm_small_mm_cuda): a 32 x 32 tile of C a block, 2 x 2 a thread, k in
 * steps of 32 through shared memory, each sum in k order in the
 * accumulation type (deterministic). The tiles are loaded along whichever
 * of an operand's strides is 1, so the loads coalesce for A and A^T alike. */
constexpr int MM_TILE = 32;
template <typename T>
__global__ void __launch_bounds__(256)
small_mm_kernel(int64_t M, int64_t N, int64_t K, const T *__restrict__ a, int64_t a_rs,
                int64_t a_cs, const T *__restrict__ b, int64_t b_rs, int64_t b_cs,
                T *__restrict__ c, int64_t ldc)
{
    typedef typename acc_of<T>::type A;
    __shared__ A as[MM_TILE][MM_TILE + 1], bs[MM_TILE][MM_TILE + 1]; /* as[m][k], bs[k][n] */
    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    const int64_t m0 = (int64_t)blockIdx.x * MM_TILE, n0 = (int64_t)blockIdx.y * MM_TILE;
    const bool a_by_m = a_rs == 1, b_by_k = b_rs == 1 && b_cs != 1;
    A acc[2][2] = {{0, 0}, {0, 0}};
    for (int64_t k0 = 0; k0 < K; k0 += MM_TILE) {
        for (int e = tid; e < MM_TILE * MM_TILE; e += 256) {
            const int inner = e % MM_TILE, outer = e / MM_TILE;
            const int i = a_by_m ? inner : outer, ka = a_by_m ? outer : inner;
            const int64_t m = m0 + i, k = k0 + ka;
            as[i][ka] = (m < M && k < K) ? to_acc(a[m * a_rs + k * a_cs]) : A(0);
            const int kb = b_by_k ? inner : outer, j = b_by_k ? outer : inner;
            const int64_t kk = k0 + kb, n = n0 + j;
            bs[kb][j] = (kk < K && n < N) ? to_acc(b[kk * b_rs + n * b_cs]) : A(0);
        }
        __syncthreads();
#pragma unroll 8
        for (int k = 0; k < MM_TILE; ++k) {
            const A a0 = as[2 * ty][k], a1 = as[2 * ty + 1][k];
            const A b0 = bs[k][2 * tx], b1 = bs[k][2 * tx + 1];
            acc[0][0] += a0 * b0;
            acc[0][1] += a0 * b1;
            acc[1][0] += a1 * b0;
            acc[1][1] += a1 * b1;
        }
        __syncthreads();
    }
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int q = 0; q < 2; ++q) {
            const int64_t m = m0 + 2 * ty + r, n = n0 + 2 * tx + q;
            if (m < M && n < N)
                c[m * ldc + n] = from_acc<T>(acc[r][q]);
        }
}

/* grad_bias[e] = the groups' sums work[g][e] added in group order (the
 * cluster backward's batch groups) */
template <typename T>
__global__ void sum_bias_groups_kernel(int64_t n, int groups,
                                       const typename acc_of<T>::type *__restrict__ work,
                                       T *__restrict__ grad_bias)
{
    const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e < n) {
        typename acc_of<T>::type sum = 0;
        for (int g = 0; g < groups; ++g)
            sum += work[g * n + e];
        grad_bias[e] = from_acc<T>(sum);
    }
}

/* ------------------------------------------------------------ launchers -- */

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* index of a dtype in the per-dtype caches */
template <typename T> constexpr int dtype_index()
{
    return std::is_same<T, float>::value ? 0 : std::is_same<T, double>::value ? 1
         : std::is_same<T, __half>::value ? 2 : 3;
}


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
constexpr persistent_shape SHAPES[] = {{16, 8}, {32, 16}, {32, 32}, {16, 32}};

/* Workspace bytes where float16/bfloat16 carry their recurrent state in
 * float32 (forward: h [2,B,H] + c [B,H]; backward: dG [2,B,3H] + dc [B,H]),
 * 0 for float32/float64; the grid plans' bias sums follow them. */
template <typename T> size_t half_state_bytes(int64_t B, int64_t H)
{
    return std::is_same<T, typename acc_of<T>::type>::value ? 0
                                                             : (size_t)(7 * B * H) * sizeof(float);
}

template <typename T> size_t forward_smem(int ks, int kr)
{
    return (size_t)BC * ks * kr * sizeof(typename acc_of<T>::type);
}
template <typename T> size_t backward_smem(int ks, int kr)
{
    return (size_t)BC * ks * 3 * kr * sizeof(typename acc_of<T>::type);
}

/* The kernel pair of one grid plan; CALL receives them as `fwd` and `bwd`.
 * float64 has no 32x32 or 16x32 plan (the registers that hold W_h). */
#define LLTM_GRID_CASE(plan, KS, KR, FITS, ...)                                              \
    case plan:                                                                               \
        if constexpr (FITS) {                                                                \
            auto fwd = sequence_forward_kernel<T, KS, KR>;                                   \
            auto bwd = sequence_backward_kernel<T, KS, KR>;                                  \
            return __VA_ARGS__;                                                              \
        }                                                                                    \
        return LLTM_ERR_ARGUMENT;
#define LLTM_WITH_KERNELS(T, plan, CALL)                                                     \
    switch (plan) {                                                                          \
        LLTM_GRID_CASE(LLTM_SEQ_PLAN_GRID_16_8, 16, 8, true, CALL)                           \
        LLTM_GRID_CASE(LLTM_SEQ_PLAN_GRID_32_16, 32, 16, true, CALL)                         \
        LLTM_GRID_CASE(LLTM_SEQ_PLAN_GRID_32_32, 32, 32, (!std::is_same<T, double>::value), CALL) \
        LLTM_GRID_CASE(LLTM_SEQ_PLAN_GRID_16_32, 16, 32, (!std::is_same<T, double>::value), CALL) \
    default:                                                                                 \
        return LLTM_ERR_ARGUMENT;                                                            \
    }

int plan_shape(int plan, persistent_shape *shape)
{
    switch (plan) {
    case LLTM_SEQ_PLAN_GRID_16_8: *shape = SHAPES[0]; return LLTM_OK;
    case LLTM_SEQ_PLAN_GRID_32_16: *shape = SHAPES[1]; return LLTM_OK;
    case LLTM_SEQ_PLAN_GRID_32_32: *shape = SHAPES[2]; return LLTM_OK;
    case LLTM_SEQ_PLAN_GRID_16_32: *shape = SHAPES[3]; return LLTM_OK;
    default: return LLTM_ERR_ARGUMENT;
    }
}

/* How many blocks of `kernel` (smem bytes each) can run at once on `device`
 * as a cooperative grid (blocks per SM x SMs, 0 without cooperative
 * launch). Raises the kernel's dynamic shared-memory limit as needed. */
template <typename K> int64_t max_resident_blocks(K kernel, size_t smem, int device)
{
    int sms = 0, coop = 0, optin = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, device) != cudaSuccess ||
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
constexpr int MAX_DEVICES = 64, NUM_DTYPES = 4, NUM_PLANS = 6;
int64_t resident_cache[MAX_DEVICES][NUM_DTYPES][NUM_PLANS];

template <typename T, typename KF, typename KB>
int64_t plan_resident_blocks(KF fwd, KB bwd, int plan, int device, int dtype_index)
{
    persistent_shape shape;
    if (plan_shape(plan, &shape) != LLTM_OK)
        return 0;
    const bool cached = device >= 0 && device < MAX_DEVICES;
    int64_t resident =
        cached ? __atomic_load_n(&resident_cache[device][dtype_index][plan], __ATOMIC_RELAXED) - 1
               : -1;
    if (resident < 0) {
        const int64_t f = max_resident_blocks(fwd, forward_smem<T>(shape.ks, shape.kr), device);
        const int64_t b = max_resident_blocks(bwd, backward_smem<T>(shape.ks, shape.kr), device);
        resident = f < b ? f : b;
        if (cached)
            __atomic_store_n(&resident_cache[device][dtype_index][plan], resident + 1,
                             __ATOMIC_RELAXED);
    }
    return resident;
}

template <typename T, typename KF, typename KB>
int check_plan(KF fwd, KB bwd, int plan, int64_t H, int device, int dtype_index)
{
    persistent_shape shape;
    if (plan_shape(plan, &shape) != LLTM_OK || H > (int64_t)shape.ks * shape.kr)
        return LLTM_ERR_ARGUMENT;
    const int64_t resident = plan_resident_blocks<T>(fwd, bwd, plan, device, dtype_index);
    return ceil_div(H, NT / shape.ks) <= resident ? LLTM_OK : LLTM_ERR_ARGUMENT;
}

/* Batch groups of a grid plan (the grid is unit_blocks x groups): as many
 * as fit beside the unit blocks, at most one per 16-row chunk of B.
 * LLTM_CUDA_GRID_GROUPS=n in the environment caps them (1: every block
 * takes every chunk, the layout before the split; for measurements and
 * tests). */
int64_t grid_groups(int64_t resident, int64_t unit_blocks, int64_t B)
{
    int64_t groups = resident / unit_blocks;
    const int64_t chunks = ceil_div(B, BC);
    if (groups > chunks)
        groups = chunks;
    const char *cap = getenv("LLTM_CUDA_GRID_GROUPS");
    if (cap && atoll(cap) >= 1 && atoll(cap) < groups)
        groups = atoll(cap);
    return groups < 1 ? 1 : groups;
}

int64_t grid_plan_cost_of(persistent_shape shape, int64_t resident, int64_t B, int64_t H)
{
    const int64_t unit_blocks = ceil_div(H, NT / shape.ks);
    const int64_t passes = ceil_div(ceil_div(B, BC), grid_groups(resident, unit_blocks, B));
    return (passes * shape.kr) * 4096 + passes;
}

/* The launch of one kernel of a grid plan on the current device: the grid
 * (unit blocks x batch groups) and that kernel's dynamic shared memory
 * (forward or backward), its limit raised past the default 48 KB. */
template <typename T, typename KF, typename KB>
int grid_launch_shape(KF fwd, KB bwd, bool forward, int plan, int64_t B, int64_t H,
                      int64_t *blocks, int64_t *groups, size_t *smem)
{
    persistent_shape shape;
    int device = 0;
    if (plan_shape(plan, &shape) != LLTM_OK)
        return LLTM_ERR_ARGUMENT;
    if (cudaGetDevice(&device) != cudaSuccess) {
        cudaGetLastError();
        return LLTM_ERR_CUDA;
    }
    const int64_t unit_blocks = ceil_div(H, NT / shape.ks);
    *groups = grid_groups(plan_resident_blocks<T>(fwd, bwd, plan, device, dtype_index<T>()),
                          unit_blocks, B);
    *blocks = unit_blocks * *groups;
    *smem = forward ? forward_smem<T>(shape.ks, shape.kr) : backward_smem<T>(shape.ks, shape.kr);
    if (*smem > 48 * 1024 &&
        cudaFuncSetAttribute(forward ? (const void *)fwd : (const void *)bwd,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)*smem) !=
            cudaSuccess) {
        cudaGetLastError();
        return LLTM_ERR_CUDA;
    }
    return LLTM_OK;
}

template <typename T> int check_plan_dispatch(int plan, int64_t H, int device, int dtype_index)
{
    LLTM_WITH_KERNELS(T, plan, (check_plan<T>(fwd, bwd, plan, H, device, dtype_index)))
}

template <typename T> int cluster_shape_for(int64_t B, int device);

/* LLTM_OK when `plan` runs B rows of H units on `device` */
template <typename T> int check_any_plan(int plan, int64_t B, int64_t H, int device)
{
    if (plan == LLTM_SEQ_PLAN_CLUSTER_16_8)
        return H <= 128 && cluster_shape_for<T>(B, device) >= 0 ? LLTM_OK : LLTM_ERR_ARGUMENT;
    return check_plan_dispatch<T>(plan, H, device, dtype_index<T>());
}

/* The time a grid plan takes per step, relative to the others: the chunk
 * passes of a block (ceil(chunks / groups)) times its lanes' multiply-adds
 * per pass (KR), ties going to fewer passes (less staging and fewer block
 * barriers); -1 where the plan does not fit B, H here. */
template <typename T> int64_t grid_plan_cost(int plan, int64_t B, int64_t H, int device)
{
    persistent_shape shape;
    if (check_any_plan<T>(plan, B, H, device) != LLTM_OK || plan_shape(plan, &shape) != LLTM_OK)
        return -1;
    int64_t resident;
    LLTM_WITH_KERNELS(T, plan, (resident = plan_resident_blocks<T>(fwd, bwd, plan, device,
                                                                   dtype_index<T>()),
                                grid_plan_cost_of(shape, resident, B, H)))
}

/* One launch of a persistent grid-plan kernel as a cooperative grid
 * (co-residency checked by lltm_sequence_plan_cuda). */
template <typename... P, typename... Args>
cudaError_t launch_persistent(void (*kernel)(P...), int64_t blocks, size_t smem,
                              cudaStream_t stream, Args... args)
{
    void *pointers[] = {(void *)&args...};
    return cudaLaunchCooperativeKernel(kernel, dim3((unsigned)blocks), dim3(NT), pointers, smem,
                                       stream);
}

template <typename T, typename KF, typename KB>
int run_forward(KF kernel, KB backward_kernel, int plan, int64_t steps, int64_t B, int64_t I,
                int64_t H, const void *h0, const void *c0, const void *weights,
                const void *bias, void *gates, void *output, void *cells, void *workspace,
                cudaStream_t stream)
{
    typedef typename acc_of<T>::type A;
    int64_t blocks, groups;
    size_t smem;
    const int status =
        grid_launch_shape<T>(kernel, backward_kernel, true, plan, B, H, &blocks, &groups, &smem);
    if (status != LLTM_OK)
        return status;
    const int64_t K = I + H;
    const T *h0_ = (const T *)h0, *c0_ = (const T *)c0, *W = (const T *)weights,
            *b_ = (const T *)bias;
    T *g = (T *)gates, *out = (T *)output, *cel = (T *)cells;
    A *h_work = NULL, *c_work = NULL;
    if (!std::is_same<T, A>::value) {
        h_work = (A *)workspace;
        c_work = h_work + 2 * B * H;
    }
    return launch_status(launch_persistent(kernel, blocks, smem, stream, steps, B, H,
                                           K, h0_, c0_, W, b_, g, out, cel, h_work, c_work));
}

template <typename T, typename KF, typename KB>
int run_backward(KF forward_kernel, KB kernel, int plan, int64_t steps, int64_t B, int64_t I,
                 int64_t H, const void *grad_output, const void *grad_h_n,
                 const void *grad_c_n, const void *weights, const void *cells,
                 const void *gates, void *grad_gates, void *grad_bias, void *grad_h0,
                 void *grad_c0, void *workspace, cudaStream_t stream)
{
    typedef typename acc_of<T>::type A;
    int64_t blocks, groups;
    size_t smem;
    const int status =
        grid_launch_shape<T>(forward_kernel, kernel, false, plan, B, H, &blocks, &groups, &smem);
    if (status != LLTM_OK)
        return status;
    const int64_t K = I + H;
    const T *go = (const T *)grad_output, *gh = (const T *)grad_h_n, *gc = (const T *)grad_c_n,
            *W = (const T *)weights, *cel = (const T *)cells, *act = (const T *)gates;
    T *dg = (T *)grad_gates, *db = (T *)grad_bias, *dh0 = (T *)grad_h0, *dc0 = (T *)grad_c0;
    A *dg_work = NULL, *dc_work = NULL, *bias_work = NULL;
    if (!std::is_same<T, A>::value) {
        dg_work = (A *)workspace;
        dc_work = dg_work + 2 * B * 3 * H;
    }
    if (groups > 1) {
        if (!workspace)
            return LLTM_ERR_ARGUMENT;
        bias_work = (A *)((char *)workspace + half_state_bytes<T>(B, H));
    }
    return launch_status(launch_persistent(kernel, blocks, smem, stream, steps, B, H,
                                           K, go, gh, gc, W, cel, act, dg, db, dh0, dc0,
                                           dg_work, dc_work, bias_work));
}

/* The cluster plan's two shapes (lanes per unit x values per lane):
 *   0: 16 x 8, 16 units a block, up to 8 blocks (the portable cluster size);
 *   1: 32 x 4, 8 units a block, up to 16 blocks (a non-portable cluster:
 *      half the arithmetic per block and step, twice the remote stores).
 * Either holds H <= 128. */
constexpr int CLUSTER_DEFAULT_SHAPE = 1;
constexpr int PORTABLE_CLUSTER_BLOCKS = 8;

/* units a block of the cluster forward with KS lanes a unit on RW rows of
 * CH-row chunks */
template <int KS, int RW, int CH = BC> constexpr int cluster_forward_units()
{
    return NT / KS / (CH / RW);
}

/* The 16-block forward's lane layout (sequence_forward_cluster_kernel):
 * 4 lanes a unit on 2 rows of a chunk (32 k values a lane), except for
 * float64 (96 values a lane would take 192 registers) and where
 * LLTM_CUDA_CLUSTER_FWD=lanes32 asks for 32 lanes a unit on all 16 rows
 * (the layout before; for side-by-side measurements). */
template <typename T> bool cluster_forward_lanes32()
{
    if (std::is_same<T, double>::value)
        return true;
    const char *v = getenv("LLTM_CUDA_CLUSTER_FWD");
    return v && !strcmp(v, "lanes32");
}

/* shared memory of the cluster kernels (see "cluster kernels"); the
 * forward's clusters of `groups` take ceil(chunks / groups) chunks of ch
 * rows at most */
template <typename T>
size_t cluster_forward_smem(int ks, int kr, int units, int64_t B, int ch = BC, int groups = 1)
{
    typedef typename acc_of<T>::type A;
    const int64_t rows = ceil_div(ceil_div(B, ch), groups) * ch, U = units;
    return 16 + sizeof(A) * (size_t)(2 * rows * (ks * kr + vec_of<A>::n) + 2 * ch * U +
                                     rows * U);
}
/* the reduce-scatter backward (8 units a block): see its kernel */
template <typename T> size_t cluster_backward_rs_smem(int64_t B, int ch = BC, int groups = 1)
{
    typedef typename acc_of<T>::type A;
    constexpr int U = 8, RANKS = RS_MAX_UNITS / U;
    const int64_t rows = ceil_div(ceil_div(B, ch), groups) * ch;
    return 16 + sizeof(A) * (size_t)(2 * RANKS * rows * U + 2 * ch * 3 * U + rows * U);
}

/* The backward of the 16-block shape: the reduce-scatter kernel, unless
 * LLTM_CUDA_CLUSTER_BWD=broadcast asks for the broadcast kernel (for
 * side-by-side measurements). */
inline bool cluster_backward_broadcast()
{
    const char *v = getenv("LLTM_CUDA_CLUSTER_BWD");
    return v && !strcmp(v, "broadcast");
}

template <typename T> size_t cluster_backward_smem(int ks, int kr, int64_t B)
{
    typedef typename acc_of<T>::type A;
    const int64_t rows = ceil_div(B, BC) * BC, U = NT / ks;
    return 16 + sizeof(A) * (size_t)(2 * rows * (3 * ks * kr + vec_of<A>::n) +
                                     2 * BC * 3 * U + rows * U);
}

/* The attributes a cluster launch of `blocks` blocks with smem bytes each
 * needs: the dynamic shared-memory limit, a non-portable cluster size. */
template <typename K> cudaError_t cluster_attributes(K kernel, int64_t blocks, size_t smem)
{
    cudaError_t e = cudaSuccess;
    if (smem > 48 * 1024)
        e = cudaFuncSetAttribute((const void *)kernel,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e == cudaSuccess && blocks > PORTABLE_CLUSTER_BLOCKS)
        e = cudaFuncSetAttribute((const void *)kernel,
                                 cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    return e;
}

/* The launch of `clusters` clusters of `blocks` blocks (the grid), smem
 * bytes of dynamic shared memory each, on `stream`; *attr holds the cluster
 * size. */
cudaLaunchConfig_t cluster_config(int64_t blocks, size_t smem, cudaStream_t stream,
                                  cudaLaunchAttribute *attr, int clusters = 1)
{
    attr->id = cudaLaunchAttributeClusterDimension;
    attr->val.clusterDim.x = (unsigned)blocks;
    attr->val.clusterDim.y = 1;
    attr->val.clusterDim.z = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3((unsigned)(blocks * clusters));
    config.blockDim = dim3(NT);
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    config.attrs = attr;
    config.numAttrs = 1;
    return config;
}

/* Whether `clusters` clusters of `blocks` blocks of `kernel`, smem bytes
 * each, can run at once on `device` (sets the kernel's attributes). */
template <typename K>
bool cluster_fits(K kernel, int64_t blocks, size_t smem, int device, int clusters = 1)
{
    int cluster_ok = 0, optin = 0;
    if (cudaDeviceGetAttribute(&cluster_ok, cudaDevAttrClusterLaunch, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
            cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    if (!cluster_ok || smem > (size_t)optin)
        return false;
    if (cluster_attributes(kernel, blocks, smem) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t config = cluster_config(blocks, smem, nullptr, &attr);
    int resident = 0;
    if (cudaOccupancyMaxActiveClusters(&resident, (const void *)kernel, &config) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return resident >= clusters;
}

/* the reduce-scatter backward, on the shape of 8 units a block */
template <typename T, int U> bool cluster_rs_fits(int64_t blocks, int64_t B, int device)
{
    if constexpr (U == 8)
        return cluster_fits(sequence_backward_cluster_rs_kernel<T, 8>, blocks,
                            cluster_backward_rs_smem<T>(B), device);
    return true;
}

/* the forward of a shape: KS lanes a unit on RW rows (its blocks: H = 128) */
template <typename T, int KS, int KR, int RW> bool cluster_forward_fits(int64_t B, int device)
{
    constexpr int U = cluster_forward_units<KS, RW>();
    return cluster_fits(sequence_forward_cluster_kernel<T, KS, KR, RW, BC>, KS * KR / U,
                        cluster_forward_smem<T>(KS, KR, U, B), device);
}

/* the kernels of a shape (KS x KR: the backward's lanes a unit, values a
 * lane; the forward's layout of the same units, see cluster_forward_lanes32) */
template <typename T, int KS, int KR> bool cluster_pair_fits(int64_t B, int device)
{
    const int64_t blocks = KS * KR / (NT / KS); /* the most: H = 128 */
    bool forward_fits;
    if constexpr (KS == 32 && KR == 4 && !std::is_same<T, double>::value)
        forward_fits = cluster_forward_lanes32<T>()
                           ? cluster_forward_fits<T, 32, 4, BC>(B, device)
                           : cluster_forward_fits<T, 4, 32, 2>(B, device);
    else
        forward_fits = cluster_forward_fits<T, KS, KR, BC>(B, device);
    return forward_fits &&
           cluster_fits(sequence_backward_cluster_kernel<T, KS, KR>, blocks,
                        cluster_backward_smem<T>(KS, KR, B), device) &&
           cluster_rs_fits<T, NT / KS>(blocks, B, device);
}

/* cluster_pair_fits per device, dtype, shape and number of 16-row chunks
 * (0: not asked yet, 1: no, 2: yes), asked once like resident_cache */
signed char cluster_cache[MAX_DEVICES][NUM_DTYPES][2][CLUSTER_MAX_CHUNKS + 1];

template <typename T> bool cluster_shape_fits(int shape, int64_t B, int device)
{
    const int64_t chunks = ceil_div(B, BC);
    if (chunks < 1 || chunks > CLUSTER_MAX_CHUNKS)
        return false;
    const bool cached = device >= 0 && device < MAX_DEVICES;
    signed char *slot = cached ? &cluster_cache[device][dtype_index<T>()][shape][chunks] : NULL;
    const int known = slot ? __atomic_load_n(slot, __ATOMIC_RELAXED) : 0;
    if (known)
        return known == 2;
    const int64_t rows = chunks * BC; /* the answer holds for every B of these chunks */
    const bool fits = shape == 0 ? cluster_pair_fits<T, 16, 8>(rows, device)
                                 : cluster_pair_fits<T, 32, 4>(rows, device);
    if (slot)
        __atomic_store_n(slot, (signed char)(fits ? 2 : 1), __ATOMIC_RELAXED);
    return fits;
}

/* The cluster plan's shape for B rows on `device`, or -1 when none fits:
 * the one LLTM_CUDA_CLUSTER_BLOCKS names (8 or 16; for measurements), else
 * CLUSTER_DEFAULT_SHAPE, else the other. */
template <typename T> int cluster_shape_for(int64_t B, int device)
{
    const char *forced = getenv("LLTM_CUDA_CLUSTER_BLOCKS");
    if (forced && (!strcmp(forced, "8") || !strcmp(forced, "16"))) {
        const int shape = forced[0] == '8' ? 0 : 1;
        return cluster_shape_fits<T>(shape, B, device) ? shape : -1;
    }
    if (cluster_shape_fits<T>(CLUSTER_DEFAULT_SHAPE, B, device))
        return CLUSTER_DEFAULT_SHAPE;
    return cluster_shape_fits<T>(1 - CLUSTER_DEFAULT_SHAPE, B, device)
               ? 1 - CLUSTER_DEFAULT_SHAPE
               : -1;
}

/* One launch as `clusters` clusters of `blocks` blocks (the grid). */
template <typename... P, typename... Args>
cudaError_t launch_cluster(void (*kernel)(P...), int64_t blocks, int clusters, size_t smem,
                           cudaStream_t stream, Args... args)
{
    const cudaError_t e = cluster_attributes(kernel, blocks, smem);
    if (e != cudaSuccess)
        return e;
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t config = cluster_config(blocks, smem, stream, &attr, clusters);
    return cudaLaunchKernelEx(&config, kernel, args...);
}

template <typename T, int KS, int KR, int RW, int CH = BC>
int run_forward_cluster(int64_t steps, int64_t B, int64_t I, int64_t H, const void *h0,
                        const void *c0, const void *weights, const void *bias, void *gates,
                        void *output, void *cells, cudaStream_t stream, int groups = 1)
{
    constexpr int U = cluster_forward_units<KS, RW, CH>();
    const int64_t blocks = ceil_div(H, U), K = I + H;
    return launch_status(launch_cluster(
        sequence_forward_cluster_kernel<T, KS, KR, RW, CH>, blocks, groups,
        cluster_forward_smem<T>(KS, KR, U, B, CH, groups), stream, steps, B, H, K,
        (const T *)h0, (const T *)c0, (const T *)weights, (const T *)bias, (T *)gates,
        (T *)output, (T *)cells));
}

/* The 16-block shape's batch split: for B <= 16 (float accumulation), both
 * kernels run chunks of SPLIT_ROWS = 4 rows (else 8, where that many
 * clusters do not fit at once), one cluster of 16 blocks each: fewer
 * multiply-adds a thread (the forward: 8 lanes a unit on 1 row of 4, or 4
 * lanes on 1 row of 8; the backward's products on 1 row) and fewer bytes
 * exchanged per block and step. The chunk rows (*rows) and the number of
 * clusters, or 0 (no split: B > 16, float64, LLTM_CUDA_CLUSTER_FWD=lanes32
 * or nosplit for the forward, LLTM_CUDA_CLUSTER_BWD=broadcast or nosplit for
 * the backward, LLTM_CUDA_CLUSTER_SPLIT=8 for chunks of 8 (measurements), or
 * no split fits; cached per device and dtype like cluster_cache). */
constexpr int SPLIT_ROWS = 4, SPLIT_MAX_ROWS = 16;
enum split_kernel { SPLIT_FORWARD, SPLIT_BACKWARD };
signed char split_cache[MAX_DEVICES][NUM_DTYPES][2][2][SPLIT_MAX_ROWS / SPLIT_ROWS];

template <typename T, int CH> bool cluster_split_fits(int64_t B, split_kernel kernel, int device)
{
    constexpr int blocks = RS_MAX_UNITS / 8; /* 8 units a block, H = 128 */
    constexpr int KS = NT / 8 / CH;          /* the forward: one row a thread */
    const int groups = (int)ceil_div(B, CH);
    if (kernel == SPLIT_FORWARD)
        return cluster_fits(sequence_forward_cluster_kernel<T, KS, RS_MAX_UNITS / KS, 1, CH>,
                            blocks, cluster_forward_smem<T>(KS, RS_MAX_UNITS / KS, 8, B, CH, groups),
                            device, groups);
    return cluster_fits(sequence_backward_cluster_rs_kernel<T, 8, CH>, blocks,
                        cluster_backward_rs_smem<T>(B, CH, groups), device, groups);
}

template <typename T> int cluster_split(int64_t B, split_kernel kernel, int *rows)
{
    const char *v = getenv(kernel == SPLIT_FORWARD ? "LLTM_CUDA_CLUSTER_FWD"
                                                   : "LLTM_CUDA_CLUSTER_BWD");
    const char *other = kernel == SPLIT_FORWARD ? "lanes32" : "broadcast";
    if (std::is_same<T, double>::value || B > SPLIT_MAX_ROWS ||
        (v && (!strcmp(v, other) || !strcmp(v, "nosplit"))))
        return 0;
    const char *forced = getenv("LLTM_CUDA_CLUSTER_SPLIT");
    const bool eight_only = forced && !strcmp(forced, "8");
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    for (int ch = eight_only ? 8 : SPLIT_ROWS; ch <= 8; ch *= 2) {
        signed char *slot = device >= 0 && device < MAX_DEVICES
                                ? &split_cache[device][dtype_index<T>()][kernel][ch / 8]
                                              [ceil_div(B, SPLIT_ROWS) - 1]
                                : NULL;
        int known = slot ? __atomic_load_n(slot, __ATOMIC_RELAXED) : 0;
        if (!known) {
            const bool fits = ch == 4 ? cluster_split_fits<T, 4>(B, kernel, device)
                                      : cluster_split_fits<T, 8>(B, kernel, device);
            known = fits ? 2 : 1;
            if (slot)
                __atomic_store_n(slot, (signed char)known, __ATOMIC_RELAXED);
        }
        if (known == 2) {
            *rows = ch;
            return (int)ceil_div(B, ch);
        }
    }
    return 0;
}

/* the 16-block shape's forward (8 units a block) */
template <typename T>
int run_forward_cluster16(int64_t steps, int64_t B, int64_t I, int64_t H, const void *h0,
                          const void *c0, const void *weights, const void *bias, void *gates,
                          void *output, void *cells, cudaStream_t stream)
{
    if constexpr (!std::is_same<T, double>::value) {
        if (!cluster_forward_lanes32<T>()) {
            int rows = 0;
            const int groups = cluster_split<T>(B, SPLIT_FORWARD, &rows);
            if (groups > 0 && rows == 4)
                return run_forward_cluster<T, 8, 16, 1, 4>(
                    steps, B, I, H, h0, c0, weights, bias, gates, output, cells, stream, groups);
            if (groups > 0)
                return run_forward_cluster<T, 4, 32, 1, 8>(
                    steps, B, I, H, h0, c0, weights, bias, gates, output, cells, stream, groups);
            return run_forward_cluster<T, 4, 32, 2>(steps, B, I, H, h0, c0, weights, bias,
                                                    gates, output, cells, stream);
        }
    }
    return run_forward_cluster<T, 32, 4, BC>(steps, B, I, H, h0, c0, weights, bias, gates,
                                             output, cells, stream);
}

/* The reduce-scatter backward in `groups` clusters of chunks of CH rows;
 * with groups > 1 the clusters' bias sums go through the workspace. */
template <typename T, int CH>
int run_backward_cluster_rs(int64_t steps, int64_t B, int64_t I, int64_t H, int groups,
                            const void *grad_output, const void *grad_h_n, const void *grad_c_n,
                            const void *weights, const void *cells, const void *gates,
                            void *grad_gates, void *grad_bias, void *grad_h0, void *grad_c0,
                            void *workspace, cudaStream_t stream)
{
    typedef typename acc_of<T>::type A;
    A *bias_work = NULL;
    if (groups > 1) {
        if (!workspace)
            return LLTM_ERR_ARGUMENT;
        bias_work = (A *)((char *)workspace + half_state_bytes<T>(B, H));
    }
    const int status = launch_status(launch_cluster(
        sequence_backward_cluster_rs_kernel<T, 8, CH>, ceil_div(H, 8), groups,
        cluster_backward_rs_smem<T>(B, CH, groups), stream, steps, B, H, I + H,
        (const T *)grad_output, (const T *)grad_h_n, (const T *)grad_c_n, (const T *)weights,
        (const T *)cells, (const T *)gates, (T *)grad_gates, (T *)grad_bias, (T *)grad_h0,
        (T *)grad_c0, bias_work));
    if (status != LLTM_OK || groups == 1)
        return status;
    sum_bias_groups_kernel<T><<<pointwise_blocks(3 * H, 128), 128, 0, stream>>>(
        3 * H, groups, bias_work, (T *)grad_bias);
    return launch_status(cudaGetLastError());
}

template <typename T, int KS, int KR>
int run_backward_cluster(int64_t steps, int64_t B, int64_t I, int64_t H,
                         const void *grad_output, const void *grad_h_n, const void *grad_c_n,
                         const void *weights, const void *cells, const void *gates,
                         void *grad_gates, void *grad_bias, void *grad_h0, void *grad_c0,
                         void *workspace, cudaStream_t stream)
{
    const int64_t blocks = ceil_div(H, NT / KS), K = I + H;
    if constexpr (NT / KS == 8) {
        if (!cluster_backward_broadcast()) {
            int rows = 0;
            const int groups = cluster_split<T>(B, SPLIT_BACKWARD, &rows);
            if (groups > 0 && rows == 4)
                return run_backward_cluster_rs<T, 4>(
                    steps, B, I, H, groups, grad_output, grad_h_n, grad_c_n, weights, cells,
                    gates, grad_gates, grad_bias, grad_h0, grad_c0, workspace, stream);
            if (groups > 0)
                return run_backward_cluster_rs<T, 8>(
                    steps, B, I, H, groups, grad_output, grad_h_n, grad_c_n, weights, cells,
                    gates, grad_gates, grad_bias, grad_h0, grad_c0, workspace, stream);
            return run_backward_cluster_rs<T, BC>(steps, B, I, H, 1, grad_output, grad_h_n,
                                                  grad_c_n, weights, cells, gates, grad_gates,
                                                  grad_bias, grad_h0, grad_c0, workspace,
                                                  stream);
        }
    }
    return launch_status(launch_cluster(
        sequence_backward_cluster_kernel<T, KS, KR>, blocks, 1,
        cluster_backward_smem<T>(KS, KR, B), stream, steps, B, H, K, (const T *)grad_output,
        (const T *)grad_h_n, (const T *)grad_c_n, (const T *)weights, (const T *)cells,
        (const T *)gates, (T *)grad_gates, (T *)grad_bias, (T *)grad_h0, (T *)grad_c0));
}

/* The cluster plan's shape for a launch, or -1 (LLTM_ERR_ARGUMENT) */
template <typename T> int cluster_launch_shape(int64_t B, int64_t H)
{
    int device = 0;
    if (H > 128 || cudaGetDevice(&device) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    return cluster_shape_for<T>(B, device);
}

template <typename T>
int forward_dispatch(int plan, int64_t steps, int64_t B, int64_t I, int64_t H, const void *h0,
                     const void *c0, const void *weights, const void *bias, void *gates,
                     void *output, void *cells, void *workspace, cudaStream_t stream)
{
    if (plan == LLTM_SEQ_PLAN_CLUSTER_16_8) {
        switch (cluster_launch_shape<T>(B, H)) {
        case 0:
            return run_forward_cluster<T, 16, 8, BC>(steps, B, I, H, h0, c0, weights, bias,
                                                     gates, output, cells, stream);
        case 1:
            return run_forward_cluster16<T>(steps, B, I, H, h0, c0, weights, bias, gates,
                                            output, cells, stream);
        default:
            return LLTM_ERR_ARGUMENT;
        }
    }
    LLTM_WITH_KERNELS(T, plan,
                      run_forward<T>(fwd, bwd, plan, steps, B, I, H, h0, c0, weights, bias,
                                     gates, output, cells, workspace, stream))
}

template <typename T>
int backward_dispatch(int plan, int64_t steps, int64_t B, int64_t I, int64_t H,
                      const void *grad_output, const void *grad_h_n, const void *grad_c_n,
                      const void *weights, const void *cells, const void *gates,
                      void *grad_gates, void *grad_bias, void *grad_h0, void *grad_c0,
                      void *workspace, cudaStream_t stream)
{
    if (plan == LLTM_SEQ_PLAN_CLUSTER_16_8) {
        switch (cluster_launch_shape<T>(B, H)) {
        case 0:
            return run_backward_cluster<T, 16, 8>(steps, B, I, H, grad_output, grad_h_n,
                                                  grad_c_n, weights, cells, gates, grad_gates,
                                                  grad_bias, grad_h0, grad_c0, workspace,
                                                  stream);
        case 1:
            return run_backward_cluster<T, 32, 4>(steps, B, I, H, grad_output, grad_h_n,
                                                  grad_c_n, weights, cells, gates, grad_gates,
                                                  grad_bias, grad_h0, grad_c0, workspace,
                                                  stream);
        default:
            return LLTM_ERR_ARGUMENT;
        }
    }
    LLTM_WITH_KERNELS(T, plan,
                      run_backward<T>(fwd, bwd, plan, steps, B, I, H, grad_output, grad_h_n,
                                      grad_c_n, weights, cells, gates, grad_gates, grad_bias,
                                      grad_h0, grad_c0, workspace, stream))
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

template <typename T>
int small_mm(int64_t M, int64_t N, int64_t K, const void *a, int64_t a_rs, int64_t a_cs,
             const void *b, int64_t b_rs, int64_t b_cs, void *c, int64_t ldc,
             cudaStream_t stream)
{
    const dim3 grid((unsigned)ceil_div(M, MM_TILE), (unsigned)ceil_div(N, MM_TILE));
    small_mm_kernel<T><<<grid, 256, 0, stream>>>(M, N, K, (const T *)a, a_rs, a_cs,
                                                 (const T *)b, b_rs, b_cs, (T *)c, ldc);
    return launch_status(cudaGetLastError());
}

bool bad_sizes(int64_t steps, int64_t B, int64_t I, int64_t H)
{
    const int64_t big = (int64_t)1 << 40;
    return steps < 0 || B < 0 || I < 0 || H < 0 || steps > big || B > big || I > big ||
           H > ((int64_t)1 << 29) || (B > 0 && steps > big / B) ||
           (B > 0 && H > 0 && steps * B > big / (3 * H));
}

} // namespace

/* lltm_sequence_plan_cuda for one dtype: the cluster plan where it fits
 * (it keeps the state of all rows in shared memory, which bounds B), else
 * the cheapest grid plan that fits (grid_plan_cost; the grid plans take any
 * B, 16 rows at a time), or only the shape LLTM_CUDA_GRID_SHAPE names
 * (16x8, 16x32, 32x16, 32x32: measurements). */
template <typename T> int choose_plan(int64_t B, int64_t H, int mode, int device, int *plan)
{
    if (H <= 128 && mode != LLTM_SEQ_MODE_GRID &&
        check_any_plan<T>(LLTM_SEQ_PLAN_CLUSTER_16_8, B, H, device) == LLTM_OK) {
        *plan = LLTM_SEQ_PLAN_CLUSTER_16_8;
        return LLTM_OK;
    }
    const int grids[] = {LLTM_SEQ_PLAN_GRID_16_8, LLTM_SEQ_PLAN_GRID_16_32,
                         LLTM_SEQ_PLAN_GRID_32_16, LLTM_SEQ_PLAN_GRID_32_32};
    const char *only = getenv("LLTM_CUDA_GRID_SHAPE");
    int64_t best = -1;
    for (int k = 0; k < 4 && mode != LLTM_SEQ_MODE_CLUSTER; ++k) {
        persistent_shape shape = {0, 0};
        char name[16];
        plan_shape(grids[k], &shape);
        snprintf(name, sizeof name, "%dx%d", shape.ks, shape.kr);
        if (only && *only && strcmp(only, name) != 0)
            continue;
        const int64_t cost = grid_plan_cost<T>(grids[k], B, H, device);
        if (cost >= 0 && (best < 0 || cost < best)) {
            best = cost;
            *plan = grids[k];
        }
    }
    if (best >= 0)
        return LLTM_OK;
    /* a persistent mode asked for by name but impossible here */
    return mode == LLTM_SEQ_MODE_AUTO ? LLTM_OK : LLTM_ERR_ARGUMENT;
}

extern "C" {

int lltm_sequence_plan_cuda(lltm_dtype dtype, int64_t B, int64_t H, int mode, int *plan)
{
    *plan = LLTM_SEQ_PLAN_STEPS;
    if (H <= 0 || mode == LLTM_SEQ_MODE_STEPS)
        return LLTM_OK;
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) {
        cudaGetLastError();
        return LLTM_ERR_CUDA;
    }
    LLTM_DISPATCH(dtype, choose_plan<T>(B, H, mode, device, plan));
}

size_t lltm_sequence_workspace_cuda(lltm_dtype dtype, int plan, int64_t B, int64_t H)
{
    size_t state, acc;
    switch (dtype) {
    case LLTM_FLOAT32: state = half_state_bytes<float>(B, H); acc = sizeof(float); break;
    case LLTM_FLOAT64: state = half_state_bytes<double>(B, H); acc = sizeof(double); break;
    case LLTM_FLOAT16: state = half_state_bytes<__half>(B, H); acc = sizeof(float); break;
    case LLTM_BFLOAT16:
        state = half_state_bytes<__nv_bfloat16>(B, H);
        acc = sizeof(float);
        break;
    default: return 0;
    }
    /* the grid plans' bias sums of each batch group (at most one a chunk),
     * the cluster plan's of its clusters when the 16-block backward splits
     * the batch (cluster_split: at most one a SPLIT_ROWS chunk) */
    const int64_t chunks = ceil_div(B, BC);
    const bool grid = plan == LLTM_SEQ_PLAN_GRID_16_8 || plan == LLTM_SEQ_PLAN_GRID_32_16 ||
                      plan == LLTM_SEQ_PLAN_GRID_32_32 || plan == LLTM_SEQ_PLAN_GRID_16_32;
    const bool split = plan == LLTM_SEQ_PLAN_CLUSTER_16_8 && B > SPLIT_ROWS &&
                       B <= SPLIT_MAX_ROWS;
    if (grid && chunks > 1)
        return state + (size_t)(chunks * 3 * H) * acc;
    return state + (split ? (size_t)(ceil_div(B, SPLIT_ROWS) * 3 * H) * acc : 0);
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
    LLTM_DISPATCH(dtype, forward_dispatch<T>(plan, steps, B, I, H, h0, c0, weights, bias,
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
    LLTM_DISPATCH(dtype, backward_dispatch<T>(plan, steps, B, I, H, grad_output, grad_h_n,
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
    LLTM_DISPATCH(dtype, forward_step<T>(B, H, recurrent, gates, bias, old_cell, new_h,
                                             new_cell, (cudaStream_t)stream));
}

int lltm_sequence_backward_step_cuda(lltm_dtype dtype, int64_t B, int64_t H,
                                     const void *grad_output, const void *grad_h,
                                     void *grad_cell, const void *cell, const void *gates,
                                     void *grad_gates, void *bias_acc, void *stream)
{
    if (bad_sizes(1, B, 0, H))
        return LLTM_ERR_ARGUMENT;
    LLTM_DISPATCH(dtype, backward_step<T>(B, H, grad_output, grad_h, grad_cell, cell,
                                              gates, grad_gates, bias_acc,
                                              (cudaStream_t)stream));
}

int lltm_small_mm_fits(int64_t M, int64_t N, int64_t K)
{
    return M >= 0 && N >= 0 && K >= 0 && K <= LLTM_SMALL_MM_MAX_K && N <= 65535LL * MM_TILE &&
           (double)M * (double)N * (double)K <= (double)LLTM_SMALL_MM_MAX_PRODUCT;
}

int lltm_small_mm_cuda(lltm_dtype dtype, int64_t M, int64_t N, int64_t K, const void *a,
                       int64_t a_rs, int64_t a_cs, const void *b, int64_t b_rs, int64_t b_cs,
                       void *c, int64_t ldc, void *stream)
{
    if (!lltm_small_mm_fits(M, N, K))
        return LLTM_ERR_ARGUMENT;
    if (M == 0 || N == 0)
        return LLTM_OK;
    LLTM_DISPATCH(dtype, small_mm<T>(M, N, K, a, a_rs, a_cs, b, b_rs, b_cs, c, ldc,
                                     (cudaStream_t)stream));
}

int lltm_sequence_convert_cuda(lltm_dtype dtype, int64_t n, const void *src, void *dst,
                               void *stream)
{
    if (n < 0)
        return LLTM_ERR_ARGUMENT;
    LLTM_DISPATCH(dtype, convert<T>(n, src, dst, (cudaStream_t)stream));
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

int lltm_cuda_copy_2d(void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                      size_t bytes, size_t rows, void *stream)
{
    if (bytes == 0 || rows == 0)
        return LLTM_OK;
    return cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, bytes, rows,
                             cudaMemcpyDeviceToDevice, (cudaStream_t)stream) == cudaSuccess
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
