/*
 * lltm_cuda_sequence_grid.cuh - the grid kernels of the persistent sequence
 * (lltm.h: family LLTM_SEQ_GRID), for one dtype; their launchers are
 * lltm_cuda_sequence_grid_launch.cuh.
 *
 * A cooperative launch of unit blocks x batch groups: the chunks of B (CH
 * rows: 16, or 4 where B is small) are shared out over as many copies of
 * the unit blocks as the device holds (each copy keeps its own W_h), so a
 * block stages and multiplies fewer chunks per step. A thread's
 * multiply-adds a step grow with the rows of a chunk, padding rows
 * included: B <= 4 in 16-row chunks does 4x the work it needs, and B = 16
 * in one 16-row chunk 4x what four 4-row chunks side by side do. Each step
 * a block writes its results to global memory, meets the others at
 * grid.sync() and stages the state back from L2 into shared memory; a
 * chunk whose rows have all stopped (lengths) forms no product. Layouts
 * (lanes x values): 16x8 (H <= 128), 32x16 (H <= 512), 16x32 and 32x32
 * (H <= 512 and 1024; not float64: the registers that hold W_h), and on
 * tensor cores only
 * 8x64 and 16x64 (H <= 512 and 1024: 32 and 16 units a
 * block, half the blocks, so more batch groups fit; a forward lane then
 * takes two rows of a 16-row chunk, a backward thread two (row, unit)
 * pairs); which one runs is the plan's.
 *
 * The half types on sm_80 and newer form each step's product on tensor
 * cores instead (lltm_cuda_mma.cuh): the block's weights as B tiles in its
 * warps' registers (each warp a share of k), the chunk staged from the
 * outputs in the half type (h_{t-1}, dG_{t+1}: the values the products of
 * a plain half-type step take too), and the warps' float sums added in
 * warp order; the pointwise step and its float state are the same. A
 * 4-row chunk costs the same tile work as a 16-row one there.
 */
#ifndef LLTM_CORE_CUDA_SEQUENCE_GRID_CUH
#define LLTM_CORE_CUDA_SEQUENCE_GRID_CUH

#include "lltm_cuda_mma.cuh"
#include "lltm_cuda_sequence_device.cuh"

namespace {

/*
 * Forward recurrence. The grid is unit_blocks x groups blocks (groups =
 * gridDim.x / unit_blocks, see grid_groups): block n owns units
 * u = (n % unit_blocks)*U + j (j = tid / KS) for the CH-row chunks c of the
 * batch with c % groups == n / unit_blocks (splitting the batch spreads a
 * small H over more SMs: each block stages and multiplies fewer chunks per
 * step). Lane s (tid % KS) of a unit holds W_h[q*H + u, k] for
 * k = (kv*KS + s)*VEC + e in registers (zero where k >= H or u >= H).
 *   gates [T,B,G]  in: x_t W_x^T of every step; out: the activations
 *   output, cells [T,B,H] out
 *   h_n, c_n [B,H] out, where not NULL (store_final_state)
 *   h_work [2,B,H], c_work [B,H] (accumulation type): the recurrent state of
 *   the half types; NULL for float32/float64, which use output/cells.
 */
template <typename T, int KS, int KR, int CH, bool TF32>
__device__ __forceinline__ void
forward_recurrence(int64_t steps, int64_t B, int64_t H, int64_t K, const T *__restrict__ h0,
                   const T *__restrict__ c0, const T *__restrict__ weights,
                   const T *__restrict__ bias, T *__restrict__ gates, T *__restrict__ output,
                   T *__restrict__ cells, typename acc_of<T>::type *__restrict__ h_work,
                   typename acc_of<T>::type *__restrict__ c_work,
                   const int64_t *__restrict__ lengths, T *__restrict__ h_n,
                   T *__restrict__ c_n)
{
    typedef typename acc_of<T>::type A;
    typedef typename vec_of<A>::type V;
    constexpr int U = NT / KS, VEC = vec_of<A>::n, KP = KS * KR;
    constexpr bool SAME = std::is_same<T, A>::value; /* state lives in the outputs */
    /* rows of a chunk a lane takes after the products: s, s + KS, ... (one
     * but in the layouts of fewer lanes a unit than rows a chunk, which run
     * on tensor cores only) */
    constexpr int RL = KS < CH ? CH / KS : 1;
    static_assert(KR % VEC == 0 && RL * KS >= CH && KS <= 32 && NT % KS == 0 && CH <= BC,
                  "configuration");
    LLTM_DYNAMIC_SMEM(smem_raw);
    A *hs = reinterpret_cast<A *>(smem_raw); /* [CH][KP]: h_{t-1} of one chunk */
    /* Tensor cores (half types, float32 on TF32; sm_80+): the warps split
     * k, each holds the B tiles of its k range for the block's 3U gate rows
     * (columns n = q*U + j: row q*H + u of W_h), h_{t-1} is staged in T
     * (the outputs hold it exactly) and the warps' sums meet in `parts`. */
    constexpr bool MMA = mma_products<T, TF32>();
    constexpr int LDA = KP + lltm_seq::MMA_ROW_PAD_BYTES / (int)sizeof(T), KW = KP / (NT / 32);
    constexpr int MK = MMA ? KW / mma_k<T>() : 1, MN = MMA ? 3 * U / 8 : 1;
    static_assert(!MMA || (KW % mma_k<T>() == 0 && (3 * U) % 8 == 0), "tensor-core tiles");
    T *ha = reinterpret_cast<T *>(smem_raw); /* [BC][LDA] */
    float *parts = reinterpret_cast<float *>(smem_raw + (size_t)BC * LDA * sizeof(T));

    const int tid = threadIdx.x, s = tid % KS;
    const int64_t unit_blocks = (H + U - 1) / U, groups = gridDim.x / unit_blocks;
    const int64_t u = (int64_t)(blockIdx.x % unit_blocks) * U + tid / KS;
    const int64_t first_row = (int64_t)(blockIdx.x / unit_blocks) * CH, row_step = groups * CH;
    const bool unit_ok = u < H;
    const int64_t G = 3 * H, BH = B * H;

    A w[MMA ? 1 : 3][MMA ? 1 : KR], b_i, b_o, b_z;
    uint32_t wt[MN][MK][2];
    if constexpr (MMA) {
        load_gate_tiles<T, U, KW, MN, MK>(weights, H, K, (blockIdx.x % unit_blocks) * U, tid,
                                          wt);
        b_i = unit_ok ? to_acc(bias[u]) : A(0);
        b_o = unit_ok ? to_acc(bias[H + u]) : A(0);
        b_z = unit_ok ? to_acc(bias[2 * H + u]) : A(0);
        zero_rows_past_chunk<T, CH, LDA>(ha, 1, tid);
    } else {
        load_unit_rows<T, KS, KR>(weights, bias, H, K, u, unit_ok, s, w, b_i, b_o, b_z);
    }

    /* this lane's rows of a chunk: row_of[r] (r < RL); owns[r]: it takes
     * that row after the reduction */
    int row_of[RL];
    bool owns[RL];
    block_steps ends[RL];
#pragma unroll
    for (int r = 0; r < RL; ++r) {
        row_of[r] = (s + r * KS) & (CH - 1);
        owns[r] = s + r * KS < CH;
        ends[r] = block_steps(lengths, first_row, row_step, CH, row_of[r], B, steps);
    }
    for (int64_t t = 0; t < steps; ++t) {
        int64_t chunk = 0; /* of this block's: b0 = first_row + chunk*row_step */
        for (int64_t b0 = first_row; b0 < B; b0 += row_step, ++chunk) {
            int64_t b[RL];
            bool row_ok[RL];
            /* this lane's pointwise inputs, fetched before the dot products */
            A p_i[RL], p_o[RL], p_z[RL], c_prev[RL];
            bool live[RL]; /* step t lies within row b's length */
#pragma unroll
            for (int r = 0; r < RL; ++r) {
                b[r] = b0 + row_of[r];
                row_ok[r] = owns[r] && unit_ok && b[r] < B;
                p_i[r] = p_o[r] = p_z[r] = c_prev[r] = 0;
                live[r] = false;
                if (row_ok[r]) {
                    const T *grow = gates + (t * B + b[r]) * G;
                    const int64_t bu = b[r] * H + u;
                    live[r] = t < ends[r].row(lengths, chunk, b[r], steps);
                    p_i[r] = to_acc(grow[u]);
                    p_o[r] = to_acc(grow[H + u]);
                    p_z[r] = to_acc(grow[2 * H + u]);
                    if (t == 0)
                        c_prev[r] = to_acc(c0[bu]);
                    else if (SAME)
                        c_prev[r] = to_acc(cells[(t - 1) * BH + bu]);
                    else
                        c_prev[r] = c_work[bu];
                }
            }
            /* Every row of the chunk has stopped (uniform over the block):
             * no product; the rows' outputs are still written below. */
            const bool chunk_live = t < ends[0].chunk(lengths, chunk, b0, CH, B, steps);
            A acc[CH * 3];
#pragma unroll
            for (int v = 0; v < CH * 3; ++v)
                acc[v] = 0;
            if constexpr (MMA) {
                constexpr int LDP =
                    lltm_seq::mma_parts_ld(3 * U, lltm_seq::mma_parts_bank(true, KS));
                if (chunk_live) {
                    stage_tile_rows<T, KP, LDA, CH>(ha, t == 0 ? h0 : output + (t - 1) * BH, B,
                                                    b0, H, tid);
                    __syncthreads();
                    chunk_products<T, KW, MN, MK, CH, LDA, 3 * U, LDP>(ha, wt, parts, tid);
#pragma unroll
                    for (int r = 0; r < RL; ++r)
                        if (owns[r])
#pragma unroll
                            for (int q = 0; q < 3; ++q)
                                acc[r * 3 + q] =
                                    sum_parts<CH, LDP>(parts, row_of[r], q * U + tid / KS);
                }
            } else if (chunk_live) {
                /* stage h_{t-1} of rows b0 .. b0+CH-1 (zero beyond B and H) */
                if (t == 0) {
                    for (int e = tid; e < CH * KP; e += NT) {
                        const int64_t row = b0 + e / KP, k = e % KP;
                        hs[e] = (row < B && k < H) ? to_acc(h0[row * H + k]) : A(0);
                    }
                } else if constexpr (SAME) {
                    stage_rows<A, KP, CH>(hs, reinterpret_cast<const A *>(output) + (t - 1) * BH,
                                          B, b0, H, tid);
                } else {
                    stage_rows<A, KP, CH>(hs, h_work + ((t - 1) & 1) * BH, B, b0, H, tid);
                }
                __syncthreads();

#pragma unroll
                for (int bb = 0; bb < CH; ++bb) {
#pragma unroll
                    for (int kv = 0; kv < KR / VEC; ++kv) {
                        const V hv =
                            *reinterpret_cast<const V *>(&hs[bb * KP + (kv * KS + s) * VEC]);
#pragma unroll
                        for (int e = 0; e < VEC; ++e)
#pragma unroll
                            for (int q = 0; q < 3; ++q)
                                acc[bb * 3 + q] += w[q][kv * VEC + e] * component(hv, e);
                    }
                }
                reduce_rows<KS, CH, 3>(acc, s);
            }

#pragma unroll
            for (int r = 0; r < RL; ++r) {
                if (!row_ok[r])
                    continue;
                A i, o, z, c, h;
                forward_step_math<A>(live[r], acc[r * 3] + p_i[r] + b_i,
                                     acc[r * 3 + 1] + p_o[r] + b_o,
                                     acc[r * 3 + 2] + p_z[r] + b_z, c_prev[r], &i, &o, &z, &c,
                                     &h);
                const int64_t bu = b[r] * H + u;
                store_forward_outputs(gates, cells, output, B, H, t, b[r], u, i, o, z, c, h);
                store_final_state(h_n, c_n, lengths, steps, H, t, b[r], u, c, h);
                if (!SAME) {
                    c_work[bu] = c;
                    if (!MMA)
                        h_work[(t & 1) * BH + bu] = h;
                }
            }
            if (chunk_live)
                __syncthreads(); /* hs is restaged by the next chunk */
        }
        if (t + 1 < steps)
            step_barrier(); /* h_t of every unit is written */
    }
}

/* The forward kernel. A layout that exists on tensor cores only
 * (lltm_seq::grid_mma_only) is still compiled into code without them (a
 * binary's PTX for an older GPU), where the chooser never runs it. */
template <typename T, int KS, int KR, int CH, bool TF32>
__global__ void __launch_bounds__(NT, 1)
sequence_forward_kernel(int64_t steps, int64_t B, int64_t H, int64_t K,
                        const T *__restrict__ h0, const T *__restrict__ c0,
                        const T *__restrict__ weights, const T *__restrict__ bias,
                        T *__restrict__ gates, T *__restrict__ output, T *__restrict__ cells,
                        typename acc_of<T>::type *__restrict__ h_work,
                        typename acc_of<T>::type *__restrict__ c_work,
                        const int64_t *__restrict__ lengths, T *__restrict__ h_n,
                        T *__restrict__ c_n)
{
    if constexpr (lltm_seq::grid_mma_only(KR) && !mma_products<T, TF32>())
        __trap();
    else
        forward_recurrence<T, KS, KR, CH, TF32>(steps, B, H, K, h0, c0, weights, bias, gates,
                                                output, cells, h_work, c_work, lengths, h_n,
                                                c_n);
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
 * shared memory and thread t = bb*U + j (t < CH*U) adds them in slice order
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
template <typename T, int KS, int KR, int CH, bool TF32>
__device__ __forceinline__ void
backward_recurrence(int64_t steps, int64_t B, int64_t H, int64_t K,
                    const T *__restrict__ grad_output, const T *__restrict__ grad_h_n,
                    const T *__restrict__ grad_c_n, const T *__restrict__ weights,
                    const T *__restrict__ cells, const T *__restrict__ gates,
                    T *__restrict__ grad_gates, T *__restrict__ grad_bias,
                    T *__restrict__ grad_h0, T *__restrict__ grad_c0,
                    typename acc_of<T>::type *__restrict__ dg_work,
                    typename acc_of<T>::type *__restrict__ dc_work,
                    typename acc_of<T>::type *__restrict__ bias_work,
                    const int64_t *__restrict__ lengths)
{
    typedef typename acc_of<T>::type A;
    typedef typename vec_of<A>::type V;
    constexpr int U = NT / KS, VEC = vec_of<A>::n, RR = 3 * KR, RP = KS * RR;
    constexpr int SUM_LD = KS * U + U; /* a row's partial sums (+U: rows on other banks) */
    constexpr bool SAME = std::is_same<T, A>::value;
    /* (row, unit) pairs of a chunk a thread takes after the products: one,
     * but in the layouts of more units a block than threads a chunk's row
     * (tensor cores only) rows own_bb + r*KS */
    constexpr int RB = CH * U > NT ? CH * U / NT : 1;
    static_assert(RR % VEC == 0 && 32 % U == 0 && (NT / 32) * (32 / U) == KS, "configuration");
    static_assert(SUM_LD <= RP && 3 * U <= RP && CH * U <= NT * RB && CH <= BC,
                  "sums fit in the staging");
    LLTM_DYNAMIC_SMEM(smem_raw);
    A *ds = reinterpret_cast<A *>(smem_raw); /* [CH][RP]: dG_{t+1} of one chunk */
    A *sums = ds; /* [CH][SUM_LD], reusing ds once a chunk's products are formed */
    /* Tensor cores (half types, float32 on TF32; sm_80+): the warps split
     * the 3H rows of W_h, each holds the B tiles of its rows for the
     * block's U unit columns, dG_{t+1} is staged in T (grad_gates holds it
     * exactly) and the warps' sums meet in `parts`. */
    constexpr bool MMA = mma_products<T, TF32>();
    constexpr int LDA = RP + lltm_seq::MMA_ROW_PAD_BYTES / (int)sizeof(T), KW = RP / (NT / 32);
    constexpr int MK = MMA ? KW / mma_k<T>() : 1, MN = MMA ? U / 8 : 1;
    static_assert(!MMA || (KW % mma_k<T>() == 0 && U % 8 == 0), "tensor-core tiles");
    T *ga = reinterpret_cast<T *>(smem_raw); /* [BC][LDA] */
    float *parts = reinterpret_cast<float *>(smem_raw + (size_t)BC * LDA * sizeof(T));

    const int tid = threadIdx.x, lane = tid % 32;
    const int j = lane % U, s = (tid / 32) * (32 / U) + lane / U; /* this lane's products */
    const int64_t unit_blocks = (H + U - 1) / U, groups = gridDim.x / unit_blocks;
    const int64_t group = blockIdx.x / unit_blocks, unit0 = (blockIdx.x % unit_blocks) * U;
    const int64_t first_row = group * CH, row_step = groups * CH;
    const int64_t G = 3 * H, BH = B * H, BG = B * G;
    /* this thread's pointwise work: rows b0 + own_bb + r*KS (r < RB; owns[r]:
     * within the chunk), unit own_u */
    const int own_bb = tid / U;
    const int64_t own_u = unit0 + tid % U;
    bool owns[RB];
#pragma unroll
    for (int r = 0; r < RB; ++r)
        owns[r] = own_bb + r * KS < CH;
    A *dc_state = SAME ? reinterpret_cast<A *>(grad_c0) : dc_work;

    A w[MMA ? 1 : RR];
    uint32_t wt[MN][MK][2];
    if constexpr (MMA) {
        load_unit_tiles<T, KW, MN, MK>(weights, H, K, unit0, tid, wt);
        zero_rows_past_chunk<T, CH, LDA>(ga, 1, tid);
    } else {
        const int64_t u = unit0 + j;
#pragma unroll
        for (int rv = 0; rv < RR / VEC; ++rv)
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                const int64_t r = (int64_t)(rv * KS + s) * VEC + e;
                w[rv * VEC + e] = (u < H && r < G) ? to_acc(weights[r * K + u]) : A(0);
            }
    }

    /* stage dG_t of rows b0 .. b0+CH-1, form this lane's share of dG_t W_h
     * for unit j, and set total[r] to the sum of the shares of (own_bb +
     * r*KS, own_u) */
    auto dh_from = [&](int64_t t, int64_t b0, A (&total)[RB]) {
        if constexpr (MMA) {
            constexpr int LDP = lltm_seq::mma_parts_ld(U, lltm_seq::mma_parts_bank(false, KS));
            stage_tile_rows<T, RP, LDA, CH>(ga, grad_gates + t * BG, B, b0, G, tid);
            __syncthreads();
            chunk_products<T, KW, MN, MK, CH, LDA, U, LDP>(ga, wt, parts, tid);
#pragma unroll
            for (int r = 0; r < RB; ++r)
                total[r] = owns[r] ? sum_parts<CH, LDP>(parts, own_bb + r * KS, tid % U) : A(0);
            __syncthreads(); /* ga and parts are reused next */
        } else {
            if constexpr (SAME)
                stage_rows<A, RP, CH>(ds, reinterpret_cast<const A *>(grad_gates) + t * BG, B, b0,
                                      G, tid);
            else
                stage_rows<A, RP, CH>(ds, dg_work + (t & 1) * BG, B, b0, G, tid);
            __syncthreads();
            A acc[CH];
#pragma unroll
            for (int bb = 0; bb < CH; ++bb)
                acc[bb] = 0;
#pragma unroll
            for (int bb = 0; bb < CH; ++bb) {
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
            for (int bb = 0; bb < CH; ++bb)
                sums[bb * SUM_LD + s * U + j] = acc[bb];
            __syncthreads();
            total[0] = 0;
            if (owns[0])
#pragma unroll
                for (int q = 0; q < KS; ++q)
                    total[0] += sums[own_bb * SUM_LD + q * U + tid % U];
            __syncthreads(); /* ds is restaged next */
        }
    };

    A bias_sum[RB][3] = {};
    block_steps ends[RB];
#pragma unroll
    for (int r = 0; r < RB; ++r)
        ends[r] = block_steps(lengths, first_row, row_step, CH, own_bb + r * KS, B, steps);
    for (int64_t t = steps - 1; t >= 0; --t) {
        const bool last = t == steps - 1;
        int64_t chunk = 0; /* of this block's: b0 = first_row + chunk*row_step */
        for (int64_t b0 = first_row; b0 < B; b0 += row_step, ++chunk) {
            int64_t b[RB];
            bool row_ok[RB];
            A i[RB], o[RB], z[RB], c[RB], dh[RB], dc_in[RB];
            bool live[RB]; /* step t lies within row b's length */
#pragma unroll
            for (int r = 0; r < RB; ++r) {
                b[r] = b0 + own_bb + r * KS;
                row_ok[r] = owns[r] && own_u < H && b[r] < B;
                i[r] = o[r] = z[r] = c[r] = dh[r] = dc_in[r] = 0;
                live[r] = false;
                if (row_ok[r]) {
                    const int64_t bu = b[r] * H + own_u, jj = t * BH + bu;
                    const T *arow = gates + (t * B + b[r]) * G;
                    const int64_t row_end = ends[r].row(lengths, chunk, b[r], steps);
                    live[r] = t < row_end;
                    i[r] = to_acc(arow[own_u]);
                    o[r] = to_acc(arow[H + own_u]);
                    z[r] = to_acc(arow[2 * H + own_u]);
                    c[r] = to_acc(cells[jj]);
                    dh[r] = to_acc(grad_output[jj]);
                    if (t == row_end - 1) /* the row's last step: dL/dh_n enters */
                        dh[r] += to_acc(grad_h_n[bu]);
                    /* dL/dc_n enters at the last step and passes the rows
                     * that ended before it unchanged */
                    dc_in[r] = last ? to_acc(grad_c_n[bu]) : dc_state[bu];
                }
            }
            /* dG_{t+1} W_h: none at the last step (uniform over the grid),
             * and none once every row of the chunk stopped by step t+1 (its
             * dG_{t+1} is 0; uniform over the block) */
            A from_above[RB] = {};
            if (!last && t + 1 < ends[0].chunk(lengths, chunk, b0, CH, B, steps))
                dh_from(t + 1, b0, from_above);
#pragma unroll
            for (int r = 0; r < RB; ++r) {
                if (!row_ok[r])
                    continue;
                A d[3], dc;
                backward_step_math<A>(live[r], i[r], o[r], z[r], c[r], dh[r] + from_above[r],
                                      dc_in[r], d, &dc);
                store_gates<T>(grad_gates + (t * B + b[r]) * G, H, own_u, d[0], d[1], d[2]);
                if (!SAME && !MMA)
                    store_gates<A>(dg_work + (t & 1) * BG + b[r] * G, H, own_u, d[0], d[1], d[2]);
                dc_state[b[r] * H + own_u] = dc;
                bias_sum[r][0] += d[0];
                bias_sum[r][1] += d[1];
                bias_sum[r][2] += d[2];
            }
        }
        step_barrier(); /* dG_t of every unit is written */
    }

    /* grad_h0 = dG_0 W_h; grad_c0 (half types: from the float state) */
    for (int64_t b0 = first_row; b0 < B; b0 += row_step) {
        A dh0[RB];
        dh_from(0, b0, dh0);
#pragma unroll
        for (int r = 0; r < RB; ++r) {
            const int64_t b = b0 + own_bb + r * KS;
            if (owns[r] && own_u < H && b < B) {
                grad_h0[b * H + own_u] = from_acc<T>(dh0[r]);
                if (!SAME)
                    grad_c0[b * H + own_u] = from_acc<T>(dc_work[b * H + own_u]);
            }
        }
    }
    /* bias: the owners of each unit add their row sums (fixed order) */
    A *bias_rows = ds; /* [3][CH][U] */
#pragma unroll
    for (int r = 0; r < RB; ++r)
        if (owns[r])
#pragma unroll
            for (int q = 0; q < 3; ++q)
                bias_rows[(q * CH + own_bb + r * KS) * U + tid % U] = bias_sum[r][q];
    __syncthreads();
    const bool unit_writer = tid < U && unit0 + tid < H;
    const int64_t u = unit0 + tid;
    A unit_sum[3] = {0, 0, 0};
#pragma unroll
    for (int q = 0; q < 3; ++q)
        if (unit_writer)
            for (int bb = 0; bb < CH; ++bb)
                unit_sum[q] += bias_rows[(q * CH + bb) * U + tid];
    if (groups > 1) { /* then the groups' sums, in group order */
        if (unit_writer)
#pragma unroll
            for (int q = 0; q < 3; ++q)
                bias_work[group * G + q * H + u] = unit_sum[q];
        step_barrier();
        if (group != 0)
            return;
#pragma unroll
        for (int q = 0; q < 3; ++q) {
            unit_sum[q] = 0;
            if (unit_writer)
                for (int64_t g = 0; g < groups; ++g)
                    unit_sum[q] += __ldcg(&bias_work[g * G + q * H + u]);
        }
    }
    if (unit_writer) {
        store_gates<T>(grad_bias, H, u, unit_sum[0], unit_sum[1], unit_sum[2]);
    }
}

/* The backward kernel (as the forward's: sequence_forward_kernel) */
template <typename T, int KS, int KR, int CH, bool TF32>
__global__ void __launch_bounds__(NT, 1)
sequence_backward_kernel(int64_t steps, int64_t B, int64_t H, int64_t K,
                         const T *__restrict__ grad_output, const T *__restrict__ grad_h_n,
                         const T *__restrict__ grad_c_n, const T *__restrict__ weights,
                         const T *__restrict__ cells, const T *__restrict__ gates,
                         T *__restrict__ grad_gates, T *__restrict__ grad_bias,
                         T *__restrict__ grad_h0, T *__restrict__ grad_c0,
                         typename acc_of<T>::type *__restrict__ dg_work,
                         typename acc_of<T>::type *__restrict__ dc_work,
                         typename acc_of<T>::type *__restrict__ bias_work,
                         const int64_t *__restrict__ lengths)
{
    if constexpr (lltm_seq::grid_mma_only(KR) && !mma_products<T, TF32>())
        __trap();
    else
        backward_recurrence<T, KS, KR, CH, TF32>(steps, B, H, K, grad_output, grad_h_n,
                                                 grad_c_n, weights, cells, gates, grad_gates,
                                                 grad_bias, grad_h0, grad_c0, dg_work, dc_work,
                                                 bias_work, lengths);
}

} // namespace

#endif /* LLTM_CORE_CUDA_SEQUENCE_GRID_CUH */
