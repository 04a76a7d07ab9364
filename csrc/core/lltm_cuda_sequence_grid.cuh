/*
 * lltm_cuda_sequence_grid.cuh - the grid kernels of the persistent sequence
 * (lltm.h: family LLTM_SEQ_GRID) and their launchers, for one dtype: each
 * lltm_cuda_seq_grid_<dtype>.cu instantiates them (LLTM_SEQ_GRID_UNIT).
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
 * (H <= 512 and 1024; not float64: the registers that hold W_h); which one
 * runs is the plan's.
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
 *   h_work [2,B,H], c_work [B,H] (accumulation type): the recurrent state of
 *   the half types; NULL for float32/float64, which use output/cells.
 */
template <typename T, int KS, int KR, int CH, bool TF32>
__global__ void __launch_bounds__(NT, 1)
sequence_forward_kernel(int64_t steps, int64_t B, int64_t H, int64_t K,
                        const T *__restrict__ h0, const T *__restrict__ c0,
                        const T *__restrict__ weights, const T *__restrict__ bias,
                        T *__restrict__ gates, T *__restrict__ output, T *__restrict__ cells,
                        typename acc_of<T>::type *__restrict__ h_work,
                        typename acc_of<T>::type *__restrict__ c_work,
                        const int64_t *__restrict__ lengths)
{
    typedef typename acc_of<T>::type A;
    typedef typename vec_of<A>::type V;
    constexpr int U = NT / KS, VEC = vec_of<A>::n, KP = KS * KR;
    constexpr bool SAME = std::is_same<T, A>::value; /* state lives in the outputs */
    static_assert(KR % VEC == 0 && KS >= CH && KS <= 32 && NT % KS == 0 && CH <= BC,
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
    const bool owner = s < CH; /* holds a row after the reduction */
    const int64_t G = 3 * H, BH = B * H;

    A w[MMA ? 1 : 3][MMA ? 1 : KR], b_i, b_o, b_z;
    uint32_t wt[MN][MK][2];
    if constexpr (MMA) {
        load_gate_tiles<T, U, KW, MN, MK>(weights, H, K, (blockIdx.x % unit_blocks) * U, tid,
                                          wt);
        b_i = unit_ok ? to_acc(bias[u]) : A(0);
        b_o = unit_ok ? to_acc(bias[H + u]) : A(0);
        b_z = unit_ok ? to_acc(bias[2 * H + u]) : A(0);
        for (int e = CH * LDA + tid; e < BC * LDA; e += NT) /* rows past the chunk */
            ha[e] = from_acc<T>(0.0f);
    } else {
        load_unit_rows<T, KS, KR>(weights, bias, H, K, u, unit_ok, s, w, b_i, b_o, b_z);
    }

    const block_steps ends(lengths, first_row, row_step, CH, s & (CH - 1), B, steps);
    for (int64_t t = 0; t < steps; ++t) {
        int64_t chunk = 0; /* of this block's: b0 = first_row + chunk*row_step */
        for (int64_t b0 = first_row; b0 < B; b0 += row_step, ++chunk) {
            const int64_t b = b0 + (s & (CH - 1));
            const bool row_ok = owner && unit_ok && b < B;
            T *grow = gates + (t * B + b) * G;
            /* this lane's pointwise inputs, fetched before the dot products */
            A p_i = 0, p_o = 0, p_z = 0, c_prev = 0;
            bool live = false; /* step t lies within row b's length */
            if (row_ok) {
                live = t < ends.row(lengths, chunk, b, steps);
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
            /* Every row of the chunk has stopped (uniform over the block):
             * no product; the rows' outputs are still written below. */
            const bool chunk_live = t < ends.chunk(lengths, chunk, b0, CH, B, steps);
            A acc[CH * 3];
#pragma unroll
            for (int v = 0; v < CH * 3; ++v)
                acc[v] = 0;
            if constexpr (MMA) {
                if (chunk_live) {
                    stage_tile_rows<T, KP, LDA, CH>(ha, t == 0 ? h0 : output + (t - 1) * BH, B,
                                                    b0, H, tid);
                    __syncthreads();
                    chunk_products<T, KW, MN, MK, CH, LDA, 3 * U>(ha, wt, parts, tid);
                    if (owner)
#pragma unroll
                        for (int q = 0; q < 3; ++q)
                            acc[q] = sum_parts<CH, 3 * U>(parts, s, q * U + tid / KS);
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

            if (row_ok) {
                A i, o, z, c, h;
                forward_step_math<A>(live, acc[0] + p_i + b_i, acc[1] + p_o + b_o,
                                     acc[2] + p_z + b_z, c_prev, &i, &o, &z, &c, &h);
                grow[u] = from_acc<T>(i);
                grow[H + u] = from_acc<T>(o);
                grow[2 * H + u] = from_acc<T>(z);
                cells[t * BH + b * H + u] = from_acc<T>(c);
                output[t * BH + b * H + u] = from_acc<T>(h);
                if (!SAME) {
                    c_work[b * H + u] = c;
                    if (!MMA)
                        h_work[(t & 1) * BH + b * H + u] = h;
                }
            }
            if (chunk_live)
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
    typedef typename acc_of<T>::type A;
    typedef typename vec_of<A>::type V;
    constexpr int U = NT / KS, VEC = vec_of<A>::n, RR = 3 * KR, RP = KS * RR;
    constexpr int SUM_LD = KS * U + U; /* a row's partial sums (+U: rows on other banks) */
    constexpr bool SAME = std::is_same<T, A>::value;
    static_assert(RR % VEC == 0 && 32 % U == 0 && (NT / 32) * (32 / U) == KS, "configuration");
    static_assert(SUM_LD <= RP && 3 * U <= RP && CH * U <= NT && CH <= BC,
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
    /* this thread's pointwise work: row b0 + own_bb, unit own_u */
    const bool owner = tid < CH * U;
    const int own_bb = tid / U;
    const int64_t own_u = unit0 + tid % U;
    A *dc_state = SAME ? reinterpret_cast<A *>(grad_c0) : dc_work;

    A w[MMA ? 1 : RR];
    uint32_t wt[MN][MK][2];
    if constexpr (MMA) {
        load_unit_tiles<T, KW, MN, MK>(weights, H, K, unit0, tid, wt);
        for (int e = CH * LDA + tid; e < BC * LDA; e += NT) /* rows past the chunk */
            ga[e] = from_acc<T>(0.0f);
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
     * for unit j, and return the sum of the shares of (own_bb, own_u) */
    auto dh_from = [&](int64_t t, int64_t b0) -> A {
        if constexpr (MMA) {
            stage_tile_rows<T, RP, LDA, CH>(ga, grad_gates + t * BG, B, b0, G, tid);
            __syncthreads();
            chunk_products<T, KW, MN, MK, CH, LDA, U>(ga, wt, parts, tid);
            const A total = owner ? sum_parts<CH, U>(parts, own_bb, tid % U) : A(0);
            __syncthreads(); /* ga and parts are reused next */
            return total;
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
            A total = 0;
            if (owner)
#pragma unroll
                for (int q = 0; q < KS; ++q)
                    total += sums[own_bb * SUM_LD + q * U + tid % U];
            __syncthreads(); /* ds is restaged next */
            return total;
        }
    };

    A bias_sum[3] = {0, 0, 0};
    const block_steps ends(lengths, first_row, row_step, CH, own_bb, B, steps);
    for (int64_t t = steps - 1; t >= 0; --t) {
        const bool last = t == steps - 1;
        int64_t chunk = 0; /* of this block's: b0 = first_row + chunk*row_step */
        for (int64_t b0 = first_row; b0 < B; b0 += row_step, ++chunk) {
            const int64_t b = b0 + own_bb;
            const bool row_ok = owner && own_u < H && b < B;
            const int64_t jj = t * BH + b * H + own_u;
            const T *arow = gates + (t * B + b) * G;
            A i = 0, o = 0, z = 0, c = 0, dh = 0, dc_in = 0;
            bool live = false; /* step t lies within row b's length */
            if (row_ok) {
                const int64_t row_end = ends.row(lengths, chunk, b, steps);
                live = t < row_end;
                i = to_acc(arow[own_u]);
                o = to_acc(arow[H + own_u]);
                z = to_acc(arow[2 * H + own_u]);
                c = to_acc(cells[jj]);
                dh = to_acc(grad_output[jj]);
                if (t == row_end - 1) /* the row's last step: dL/dh_n enters */
                    dh += to_acc(grad_h_n[b * H + own_u]);
                /* dL/dc_n enters at the last step and passes the rows that
                 * ended before it unchanged */
                dc_in = last ? to_acc(grad_c_n[b * H + own_u]) : dc_state[b * H + own_u];
            }
            /* dG_{t+1} W_h: none at the last step (uniform over the grid),
             * and none once every row of the chunk stopped by step t+1 (its
             * dG_{t+1} is 0; uniform over the block) */
            A from_above = 0;
            if (!last && t + 1 < ends.chunk(lengths, chunk, b0, CH, B, steps))
                from_above = dh_from(t + 1, b0);
            if (row_ok) {
                A d[3], dc;
                backward_step_math<A>(live, i, o, z, c, dh + from_above, dc_in, d, &dc);
                T *drow = grad_gates + (t * B + b) * G;
                drow[own_u] = from_acc<T>(d[0]);
                drow[H + own_u] = from_acc<T>(d[1]);
                drow[2 * H + own_u] = from_acc<T>(d[2]);
                if (!SAME && !MMA) {
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
    A *bias_rows = ds; /* [3][CH][U] */
    if (owner)
#pragma unroll
        for (int q = 0; q < 3; ++q)
            bias_rows[(q * CH + own_bb) * U + tid % U] = bias_sum[q];
    __syncthreads();
    const bool unit_writer = tid < U && unit0 + tid < H;
    const int64_t u = unit0 + tid;
#pragma unroll
    for (int q = 0; q < 3; ++q) {
        bias_sum[q] = 0;
        if (unit_writer)
            for (int bb = 0; bb < CH; ++bb)
                bias_sum[q] += bias_rows[(q * CH + bb) * U + tid];
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

/* One cooperative launch of `blocks` blocks (co-residency: the chooser's) */
template <typename... P, typename... Args>
cudaError_t launch_cooperative(void (*kernel)(P...), int64_t blocks, size_t smem,
                               cudaStream_t stream, Args... args)
{
    void *pointers[] = {(void *)&args...};
    return cudaLaunchCooperativeKernel(kernel, dim3((unsigned)blocks), dim3(NT), pointers, smem,
                                       stream);
}

/* the kernel's dynamic shared-memory limit raised past the default 48 KB */
inline int allow_smem(const void *kernel, size_t smem)
{
    if (smem > 48 * 1024 &&
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) !=
            cudaSuccess) {
        cudaGetLastError();
        return LLTM_ERR_CUDA;
    }
    return LLTM_OK;
}

/* bytes of a value the kernel stages for tensor cores (grid_mma_bytes) */
template <typename T, bool TF32> constexpr size_t mma_bytes()
{
    return sizeof(T) == 2 ? 2 : std::is_same<T, float>::value && TF32 ? 4 : 0;
}

template <typename T, int KS, int KR, int CH, bool TF32>
int run_grid_forward(const lltm_sequence_launch &l, const lltm_seq::forward_args &a,
                     cudaStream_t stream)
{
    typedef typename acc_of<T>::type A;
    auto kernel = sequence_forward_kernel<T, KS, KR, CH, TF32>;
    const size_t smem =
        lltm_seq::grid_forward_smem(sizeof(A), mma_bytes<T, TF32>(), KS, KR, CH);
    if (l.blocks != ceil_div(a.H, NT / KS) || l.groups < 1)
        return LLTM_ERR_ARGUMENT;
    const int status = allow_smem((const void *)kernel, smem);
    if (status != LLTM_OK)
        return status;
    A *h_work = NULL, *c_work = NULL;
    if (!std::is_same<T, A>::value) {
        if (!a.workspace)
            return LLTM_ERR_ARGUMENT;
        h_work = (A *)a.workspace;
        c_work = h_work + 2 * a.B * a.H;
    }
    return launch_status(launch_cooperative(
        kernel, l.blocks * l.groups, smem, stream, a.steps, a.B, a.H, a.I + a.H,
        (const T *)a.h0, (const T *)a.c0, (const T *)a.weights, (const T *)a.bias, (T *)a.gates,
        (T *)a.output, (T *)a.cells, h_work, c_work, a.lengths));
}

template <typename T, int KS, int KR, int CH, bool TF32>
int run_grid_backward(const lltm_sequence_launch &l, const lltm_seq::backward_args &a,
                      cudaStream_t stream)
{
    typedef typename acc_of<T>::type A;
    auto kernel = sequence_backward_kernel<T, KS, KR, CH, TF32>;
    const size_t smem =
        lltm_seq::grid_backward_smem(sizeof(A), mma_bytes<T, TF32>(), KS, KR, CH);
    if (l.blocks != ceil_div(a.H, NT / KS) || l.groups < 1)
        return LLTM_ERR_ARGUMENT;
    const int status = allow_smem((const void *)kernel, smem);
    if (status != LLTM_OK)
        return status;
    A *dg_work = NULL, *dc_work = NULL, *bias_work = NULL;
    if (!std::is_same<T, A>::value) {
        if (!a.workspace)
            return LLTM_ERR_ARGUMENT;
        dg_work = (A *)a.workspace;
        dc_work = dg_work + 2 * a.B * 3 * a.H;
    }
    const int work_status = bias_groups_work<T>(a, l.groups, &bias_work);
    if (work_status != LLTM_OK)
        return work_status;
    return launch_status(launch_cooperative(
        kernel, l.blocks * l.groups, smem, stream, a.steps, a.B, a.H, a.I + a.H,
        (const T *)a.grad_output, (const T *)a.grad_h_n, (const T *)a.grad_c_n,
        (const T *)a.weights, (const T *)a.cells, (const T *)a.gates, (T *)a.grad_gates,
        (T *)a.grad_bias, (T *)a.grad_h0, (T *)a.grad_c0, dg_work, dc_work, bias_work,
        a.lengths));
}

/* The layouts of the library (lanes x values; float64: not those of 32
 * values a lane), each in chunks of 16 rows and of 4, and what the chooser
 * picks them for: see lltm.h, lltm_sequence_plan_cuda. float32's in 16-row
 * chunks come in two builds, FFMA and TF32 (lltm_sequence_launch.tf32);
 * the others in one (TF32 false). */
#define LLTM_SEQ_GRID_LAYOUTS(X)                                                             \
    X(16, 8, 16)                                                                             \
    X(16, 8, 4)                                                                              \
    X(32, 16, 16)                                                                            \
    X(32, 16, 4)                                                                             \
    if constexpr (!std::is_same<T, double>::value) {                                         \
        X(32, 32, 16)                                                                        \
        X(32, 32, 4)                                                                         \
        X(16, 32, 16)                                                                        \
        X(16, 32, 4)                                                                         \
    }

/* Either build of a layout: TF32 for float32 in 16-row chunks where asked
 * (tf32; in 4-row chunks the TF32 tile of 16 rows lost to FFMA on 4) */
#define LLTM_SEQ_GRID_BUILDS(KS, KR, CH, tf32, CALL)                                         \
    if constexpr (std::is_same<T, float>::value && CH == BC) {                               \
        if (tf32)                                                                            \
            return CALL(KS, KR, CH, true);                                                   \
    }                                                                                        \
    return CALL(KS, KR, CH, false);

template <typename T>
const void *grid_kernel_of(bool forward, int lanes, int values, int chunk, bool tf32)
{
#define LLTM_SEQ_GRID_KERNEL(KS, KR, CH, TF)                                                 \
    forward ? (const void *)sequence_forward_kernel<T, KS, KR, CH, TF>                       \
            : (const void *)sequence_backward_kernel<T, KS, KR, CH, TF>
#define LLTM_SEQ_GRID_CASE(KS, KR, CH)                                                       \
    if (lanes == KS && values == KR && chunk == CH) {                                        \
        LLTM_SEQ_GRID_BUILDS(KS, KR, CH, tf32, LLTM_SEQ_GRID_KERNEL)                         \
    }
    LLTM_SEQ_GRID_LAYOUTS(LLTM_SEQ_GRID_CASE)
#undef LLTM_SEQ_GRID_CASE
#undef LLTM_SEQ_GRID_KERNEL
    return NULL;
}

template <typename T>
int grid_forward_of(const lltm_sequence_launch &l, const lltm_seq::forward_args &a,
                    cudaStream_t stream)
{
#define LLTM_SEQ_GRID_RUN(KS, KR, CH, TF) run_grid_forward<T, KS, KR, CH, TF>(l, a, stream)
#define LLTM_SEQ_GRID_CASE(KS, KR, CH)                                                       \
    if (l.lanes == KS && l.values == KR && l.chunk == CH) {                                  \
        LLTM_SEQ_GRID_BUILDS(KS, KR, CH, l.tf32, LLTM_SEQ_GRID_RUN)                          \
    }
    LLTM_SEQ_GRID_LAYOUTS(LLTM_SEQ_GRID_CASE)
#undef LLTM_SEQ_GRID_CASE
#undef LLTM_SEQ_GRID_RUN
    return LLTM_ERR_ARGUMENT;
}

template <typename T>
int grid_backward_of(const lltm_sequence_launch &l, const lltm_seq::backward_args &a,
                     cudaStream_t stream)
{
#define LLTM_SEQ_GRID_RUN(KS, KR, CH, TF) run_grid_backward<T, KS, KR, CH, TF>(l, a, stream)
#define LLTM_SEQ_GRID_CASE(KS, KR, CH)                                                       \
    if (l.lanes == KS && l.values == KR && l.chunk == CH) {                                  \
        LLTM_SEQ_GRID_BUILDS(KS, KR, CH, l.tf32, LLTM_SEQ_GRID_RUN)                          \
    }
    LLTM_SEQ_GRID_LAYOUTS(LLTM_SEQ_GRID_CASE)
#undef LLTM_SEQ_GRID_CASE
#undef LLTM_SEQ_GRID_RUN
    return LLTM_ERR_ARGUMENT;
}

#undef LLTM_SEQ_GRID_BUILDS

} // namespace

/* The exported functions of one dtype's unit (lltm_cuda_sequence.cuh) */
#define LLTM_SEQ_GRID_UNIT(T)                                                                \
    namespace lltm_seq {                                                                     \
    template <>                                                                              \
    const void *grid_kernel<T>(bool forward, int lanes, int values, int chunk, bool tf32)    \
    {                                                                                        \
        return grid_kernel_of<T>(forward, lanes, values, chunk, tf32);                       \
    }                                                                                        \
    template <>                                                                              \
    int grid_forward<T>(const lltm_sequence_launch &l, const forward_args &a,                \
                        cudaStream_t stream)                                                 \
    {                                                                                        \
        return grid_forward_of<T>(l, a, stream);                                             \
    }                                                                                        \
    template <>                                                                              \
    int grid_backward<T>(const lltm_sequence_launch &l, const backward_args &a,              \
                         cudaStream_t stream)                                                \
    {                                                                                        \
        return grid_backward_of<T>(l, a, stream);                                            \
    }                                                                                        \
    }

#endif /* LLTM_CORE_CUDA_SEQUENCE_GRID_CUH */
