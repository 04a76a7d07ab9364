/*
 * lltm_cuda_sequence_stack.cuh - the kernels of stacked layers in one
 * cooperative launch (lltm_stack.h), for one dtype; their launchers are
 * lltm_cuda_sequence_stack_launch.cuh.
 *
 * L layers of H units run skewed in time: at global step s layer l runs its
 * step t = s - l, whose inputs h^l_{t-1} (its own state) and h^{l-1}_t (the
 * layer below's output) were both written at step s - 1; the layers of a
 * step are independent and share its grid barrier, and the stack takes
 * T + L - 1 barriers instead of L launches of T with a product between
 * them. Block n owns the same units of every layer (the grid kernels'
 * layout: unit blocks x batch groups, lanes x values of W a unit) and holds
 * W_h of each layer and W_x of each layer above the first in registers:
 * layer 0's input product comes in its gates (one product over all steps,
 * as for one layer), the layers above form theirs in the step. A step
 * stages the 2L - 1 state rows it needs at once, forms all the products,
 * reduces them in one pass of warp shuffles, and runs each layer's
 * pointwise math. The backward runs skewed the other way, the top layer
 * first: layer l's dL/dh_t is dG^l_{t+1} W_h^l + dG^{l+1}_t W_x^{l+1}
 * (+ dL/d output at the top), and dG^{l+1}_t is what layer l+1 stages for
 * itself in the same step, so L staged rows serve 2L - 1 products.
 * The half types on sm_80+ form the products on tensor cores
 * (lltm_cuda_mma.cuh, as the grid kernels): 16 units a block there, so
 * that half as many blocks stage every row of the 2L - 1 states a step (a
 * block's L2 reads, not its arithmetic, grow with L), the tiles' copies in
 * flight together (cp.async).
 * Variable lengths: per row, as the grid kernels (a row past its length
 * keeps its state, outputs 0; backward: dG 0, dL/dc passed on, dL/dh_n
 * entering at its last step), the same lengths for every layer.
 */
#ifndef LLTM_CORE_CUDA_SEQUENCE_STACK_CUH
#define LLTM_CORE_CUDA_SEQUENCE_STACK_CUH

#include "lltm_cuda_mma.cuh"
#include "lltm_cuda_sequence_device.cuh"
#include "lltm_stack.h"

namespace lltm_seq {

/* one stacked call's arrays, per layer (lltm_stack.h) and the state of the
 * half types in float (NULL for float32): h [2,B,H] and c [B,H] forward, dG
 * [2,B,3H] and dc [B,H] backward, per layer; bias_work [groups,L,3H] */
template <typename T> struct stack_forward_args {
    int64_t steps, B, I, H;
    const T *weights[LLTM_STACK_MAX_LAYERS], *bias[LLTM_STACK_MAX_LAYERS];
    const T *h0[LLTM_STACK_MAX_LAYERS], *c0[LLTM_STACK_MAX_LAYERS];
    T *gates[LLTM_STACK_MAX_LAYERS], *output[LLTM_STACK_MAX_LAYERS],
        *cells[LLTM_STACK_MAX_LAYERS];
    T *h_n[LLTM_STACK_MAX_LAYERS], *c_n[LLTM_STACK_MAX_LAYERS]; /* NULL: not written */
    float *h_work[LLTM_STACK_MAX_LAYERS], *c_work[LLTM_STACK_MAX_LAYERS];
    const int64_t *lengths;
};
template <typename T> struct stack_backward_args {
    int64_t steps, B, I, H;
    const T *grad_output;
    const T *weights[LLTM_STACK_MAX_LAYERS], *gates[LLTM_STACK_MAX_LAYERS],
        *cells[LLTM_STACK_MAX_LAYERS];
    const T *grad_h_n[LLTM_STACK_MAX_LAYERS], *grad_c_n[LLTM_STACK_MAX_LAYERS];
    T *grad_gates[LLTM_STACK_MAX_LAYERS], *grad_bias[LLTM_STACK_MAX_LAYERS],
        *grad_h0[LLTM_STACK_MAX_LAYERS], *grad_c0[LLTM_STACK_MAX_LAYERS];
    float *dg_work[LLTM_STACK_MAX_LAYERS], *dc_work[LLTM_STACK_MAX_LAYERS];
    float *bias_work;
    const int64_t *lengths;
};

/* The stack's layouts that exist on tensor cores only: 16 lanes a unit
 * (16 units a block), 16 values a lane, 16-row chunks (FFMA code would
 * hold 3 x 16 weights of 2L - 1 matrices, or 16 rows' sums of every layer,
 * a thread) */
__host__ __device__ constexpr bool stack_mma_only(int ks, int kr, int ch)
{
    return ks != 32 || kr > 8 || ch > 4;
}

} // namespace lltm_seq

namespace {

/* the row's steps, or 0 past B */
__device__ __forceinline__ int64_t stack_row_steps(const int64_t *__restrict__ lengths,
                                                   int64_t b, int64_t B, int64_t steps)
{
    return b < B ? row_steps(lengths, b, steps) : 0;
}

/*
 * Forward. FFMA: lane s (tid % KS) of unit u holds, per layer, W_h[q*H + u, k]
 * and (l > 0) W_x[q*H + u, k] = weights_l[q*H + u, H + k] for
 * k = (kv*KS + s)*VEC + e, as the grid forward's lanes hold W_h. Tensor
 * cores (the half types, sm_80+): the warps split k, each holds the B tiles
 * of its k range of the same matrices for the block's 3U gate rows, as the
 * grid forward does one; the chunk's rows are staged in T (the outputs
 * hold them exactly) and each layer's two products meet in one tile of
 * sums, the warps' sums in `parts`. Lane s < CH of a unit takes row s of
 * the chunk after the products.
 */
template <typename T, int KS, int KR, int CH, int L>
__device__ __forceinline__ void stack_forward_steps(const lltm_seq::stack_forward_args<T> &a)
{
    typedef float A;
    typedef float4 V;
    constexpr int U = NT / KS, VEC = 4, KP = KS * KR, PER = 3 * L;
    constexpr bool SAME = std::is_same<T, A>::value; /* state lives in the outputs */
    static_assert(KR % VEC == 0 && KS >= CH && KS <= 32 && NT % KS == 0 && CH <= BC &&
                      L >= 2 && L <= LLTM_STACK_MAX_LAYERS,
                  "configuration");
    LLTM_DYNAMIC_SMEM(smem_raw);
    A *hs = reinterpret_cast<A *>(smem_raw); /* [2L - 1][CH][KP]: h^l_{t-1}, then h^{l-1}_t */
    constexpr bool MMA = mma_products<T>();
    constexpr int LDA = KP + lltm_seq::MMA_ROW_PAD_BYTES / (int)sizeof(T), KW = KP / (NT / 32);
    constexpr int MK = MMA ? KW / mma_k<T>() : 1, MN = MMA ? 3 * U / 8 : 1;
    constexpr int LDP = lltm_seq::mma_parts_ld(3 * U, lltm_seq::mma_parts_bank(true, KS));
    static_assert(!MMA || (KW % mma_k<T>() == 0 && (3 * U) % 8 == 0), "tensor-core tiles");
    T *ha = reinterpret_cast<T *>(smem_raw); /* [2L - 1][BC][LDA]: as hs */
    float *parts = reinterpret_cast<float *>(smem_raw + (size_t)(2 * L - 1) * BC * LDA *
                                                            sizeof(T)); /* [L][NT/32][CH][LDP] */

    const int64_t steps = a.steps, B = a.B, H = a.H, G = 3 * H, BH = B * H;
    const int tid = threadIdx.x, s = tid % KS;
    const int64_t unit_blocks = (H + U - 1) / U, groups = gridDim.x / unit_blocks;
    const int64_t unit0 = (int64_t)(blockIdx.x % unit_blocks) * U, u = unit0 + tid / KS;
    const int64_t first_row = (int64_t)(blockIdx.x / unit_blocks) * CH, row_step = groups * CH;
    const bool unit_ok = u < H, owner = s < CH;

    constexpr int WL = MMA ? 1 : L, WQ = MMA ? 1 : 3, WR = MMA ? 1 : KR, TL = MMA ? L : 1;
    A wh[WL][WQ][WR], wx[WL][WQ][WR], bi[L], bo[L], bz[L];
    uint32_t th[TL][MN][MK][2], tx[TL][MN][MK][2];
#pragma unroll
    for (int l = 0; l < L; ++l) {
        const int64_t K = l == 0 ? H + a.I : 2 * H;
        if constexpr (MMA) {
            load_gate_tiles<T, U, KW, MN, MK>(a.weights[l], H, K, unit0, tid, th[l]);
            if (l > 0)
                load_gate_tiles<T, U, KW, MN, MK>(a.weights[l] + H, H, K, unit0, tid, tx[l]);
            bi[l] = unit_ok ? to_acc(a.bias[l][u]) : A(0);
            bo[l] = unit_ok ? to_acc(a.bias[l][H + u]) : A(0);
            bz[l] = unit_ok ? to_acc(a.bias[l][2 * H + u]) : A(0);
        } else {
            load_unit_rows<T, KS, KR>(a.weights[l], a.bias[l], H, K, u, unit_ok, s, wh[l], bi[l],
                                      bo[l], bz[l]);
            if (l > 0) {
                A unused[3];
                load_unit_rows<T, KS, KR>(a.weights[l] + H, a.bias[l], H, K, u, unit_ok, s,
                                          wx[l], unused[0], unused[1], unused[2]);
            }
        }
    }
    if constexpr (MMA)
        zero_rows_past_chunk<T, CH, LDA>(ha, 2 * L - 1, tid);

    for (int64_t step = 0; step < steps + L - 1; ++step) {
        for (int64_t b0 = first_row; b0 < B; b0 += row_step) {
            const int64_t b = b0 + (s & (CH - 1));
            const bool row_ok = owner && unit_ok && b < B;
            const int64_t row_end = stack_row_steps(a.lengths, b, B, steps);
            /* this lane's pointwise inputs, fetched before the products */
            A p_i = 0, p_o = 0, p_z = 0, c_prev[L];
#pragma unroll
            for (int l = 0; l < L; ++l) {
                const int64_t t = step - l;
                c_prev[l] = 0;
                if (t < 0 || t >= steps || !row_ok)
                    continue;
                if (l == 0) {
                    const T *grow = a.gates[0] + (t * B + b) * G;
                    p_i = to_acc(grow[u]);
                    p_o = to_acc(grow[H + u]);
                    p_z = to_acc(grow[2 * H + u]);
                }
                if (t == 0)
                    c_prev[l] = to_acc(a.c0[l][b * H + u]);
                else if constexpr (SAME)
                    c_prev[l] = to_acc(a.cells[l][(t - 1) * BH + b * H + u]);
                else
                    c_prev[l] = a.c_work[l][b * H + u];
            }
            /* stage h^l_{t-1} and h^{l-1}_t of rows b0 .. b0+CH-1 (zero beyond B, H;
             * tensor cores: every tile's copies in flight at once) */
#pragma unroll
            for (int l = 0; l < L; ++l) {
                const int64_t t = step - l;
                if (t < 0 || t >= steps)
                    continue; /* uniform over the grid */
                if constexpr (MMA) {
                    stage_tile_rows_async<T, KP, LDA, CH>(
                        ha + l * BC * LDA, t == 0 ? a.h0[l] : a.output[l] + (t - 1) * BH, B, b0,
                        H, tid);
                    if (l > 0)
                        stage_tile_rows_async<T, KP, LDA, CH>(ha + (L + l - 1) * BC * LDA,
                                                              a.output[l - 1] + t * BH, B, b0, H,
                                                              tid);
                } else {
                    A *own = hs + l * CH * KP;
                    if (t == 0) {
                        for (int e = tid; e < CH * KP; e += NT) {
                            const int64_t row = b0 + e / KP, k = e % KP;
                            own[e] = (row < B && k < H) ? to_acc(a.h0[l][row * H + k]) : A(0);
                        }
                    } else if constexpr (SAME) {
                        stage_rows<A, KP, CH>(own, reinterpret_cast<const A *>(a.output[l]) +
                                                       (t - 1) * BH,
                                              B, b0, H, tid);
                    } else {
                        stage_rows<A, KP, CH>(own, a.h_work[l] + ((t - 1) & 1) * BH, B, b0, H, tid);
                    }
                    if (l > 0) {
                        A *in = hs + (L + l - 1) * CH * KP;
                        if constexpr (SAME)
                            stage_rows<A, KP, CH>(in, reinterpret_cast<const A *>(a.output[l - 1]) +
                                                          t * BH,
                                                  B, b0, H, tid);
                        else
                            stage_rows<A, KP, CH>(in, a.h_work[l - 1] + (t & 1) * BH, B, b0, H,
                                                  tid);
                    }
                }
            }
            if constexpr (MMA)
                copy_async_wait();
            __syncthreads();

            /* this lane's row's sums (after reduce_rows in FFMA) */
            A acc[MMA ? PER : CH * PER];
#pragma unroll
            for (int v = 0; v < (MMA ? PER : CH * PER); ++v)
                acc[v] = 0;
            if constexpr (MMA) {
#pragma unroll
                for (int l = 0; l < L; ++l) {
                    const int64_t t = step - l;
                    if (t < 0 || t >= steps)
                        continue;
                    float c[MN][4];
#pragma unroll
                    for (int n = 0; n < MN; ++n)
                        c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.0f;
                    tile_products<T, KW, MN, MK, LDA>(c, ha + l * BC * LDA, th[l], tid);
                    if (l > 0)
                        tile_products<T, KW, MN, MK, LDA>(c, ha + (L + l - 1) * BC * LDA, tx[l],
                                                          tid);
                    store_parts<MN, CH, 3 * U, LDP>(c, parts + l * (NT / 32) * CH * LDP, tid);
                }
                __syncthreads();
#pragma unroll
                for (int l = 0; l < L; ++l)
                    if (owner && step - l >= 0 && step - l < steps)
#pragma unroll
                        for (int q = 0; q < 3; ++q)
                            acc[l * 3 + q] = sum_parts<CH, LDP>(parts + l * (NT / 32) * CH * LDP,
                                                                s, q * U + tid / KS);
            } else {
#pragma unroll
                for (int l = 0; l < L; ++l) {
                    const int64_t t = step - l;
                    if (t < 0 || t >= steps)
                        continue;
#pragma unroll
                    for (int bb = 0; bb < CH; ++bb)
#pragma unroll
                        for (int kv = 0; kv < KR / VEC; ++kv) {
                            const int k = (kv * KS + s) * VEC;
                            const V hv =
                                *reinterpret_cast<const V *>(&hs[(l * CH + bb) * KP + k]);
#pragma unroll
                            for (int e = 0; e < VEC; ++e)
#pragma unroll
                                for (int q = 0; q < 3; ++q)
                                    acc[bb * PER + l * 3 + q] +=
                                        wh[l][q][kv * VEC + e] * component(hv, e);
                            if (l > 0) {
                                const V xv = *reinterpret_cast<const V *>(
                                    &hs[((L + l - 1) * CH + bb) * KP + k]);
#pragma unroll
                                for (int e = 0; e < VEC; ++e)
#pragma unroll
                                    for (int q = 0; q < 3; ++q)
                                        acc[bb * PER + l * 3 + q] +=
                                            wx[l][q][kv * VEC + e] * component(xv, e);
                            }
                        }
                }
                reduce_rows<KS, CH, PER>(acc, s);
            }

#pragma unroll
            for (int l = 0; l < L; ++l) {
                const int64_t t = step - l;
                if (t < 0 || t >= steps || !row_ok)
                    continue;
                const bool bottom = l == 0; /* its gates hold x_t W_x^T */
                A i, o, z, c, h;
                forward_step_math<A>(t < row_end, acc[l * 3] + (bottom ? p_i : A(0)) + bi[l],
                                     acc[l * 3 + 1] + (bottom ? p_o : A(0)) + bo[l],
                                     acc[l * 3 + 2] + (bottom ? p_z : A(0)) + bz[l], c_prev[l],
                                     &i, &o, &z, &c, &h);
                store_forward_outputs(a.gates[l], a.cells[l], a.output[l], B, H, t, b, u, i, o,
                                      z, c, h);
                store_final_state(a.h_n[l], a.c_n[l], a.lengths, steps, H, t, b, u, c, h);
                if (!SAME) {
                    a.c_work[l][b * H + u] = c;
                    if (!MMA)
                        a.h_work[l][(t & 1) * BH + b * H + u] = h;
                }
            }
            __syncthreads(); /* hs (ha, parts) is restaged by the next chunk */
        }
        if (step + 1 < steps + L - 1)
            step_barrier(); /* every layer's state of the step is written */
    }
}

/* The forward kernel. A layout that exists on tensor cores only
 * (lltm_seq::stack_mma_only) is still compiled into code without them (a
 * binary's PTX for an older GPU), where the plan never takes it. */
template <typename T, int KS, int KR, int CH, int L>
__global__ void __launch_bounds__(NT, 1)
stack_forward_kernel(lltm_seq::stack_forward_args<T> a)
{
    if constexpr (lltm_seq::stack_mma_only(KS, KR, CH) && !mma_products<T>())
        __trap();
    else
        stack_forward_steps<T, KS, KR, CH, L>(a);
}

/*
 * Backward. FFMA: lane (unit j, slice s) holds, per layer, column u of W_h^l
 * and of W_x^{l+1} (l < L - 1) for rows r = (rv*KS + s)*VEC + e < G, as the
 * grid backward's lanes hold W_h; the KS slices' partial sums meet in
 * shared memory and thread t = bb*U + j adds them in slice order
 * (deterministic), every layer's chains interleaved. Tensor cores (the half
 * types, sm_80+): the warps split the 3H rows, each holds the B tiles of
 * its rows of the same columns, as the grid backward does one; dG is staged
 * in T (grad_gates holds it exactly), layer l's two products meet in one
 * tile of sums and the warps' sums in `parts`, added in warp order.
 */
template <typename T, int KS, int KR, int CH, int L>
__device__ __forceinline__ void stack_backward_steps(const lltm_seq::stack_backward_args<T> &a)
{
    typedef float A;
    typedef float4 V;
    constexpr int U = NT / KS, VEC = 4, RR = 3 * KR, RP = KS * RR, SUM_LD = KS * U + U;
    constexpr bool SAME = std::is_same<T, A>::value;
    static_assert(RR % VEC == 0 && 32 % U == 0 && (NT / 32) * (32 / U) == KS &&
                      CH * U <= NT && CH <= BC && L >= 2 && L <= LLTM_STACK_MAX_LAYERS,
                  "configuration");
    LLTM_DYNAMIC_SMEM(smem_raw);
    A *ds = reinterpret_cast<A *>(smem_raw); /* [L][CH][RP]: dG^l_{t_l + 1} */
    A *sums = ds + L * CH * RP;              /* [L][CH][SUM_LD] */
    constexpr bool MMA = mma_products<T>();
    constexpr int LDA = RP + lltm_seq::MMA_ROW_PAD_BYTES / (int)sizeof(T), KW = RP / (NT / 32);
    constexpr int MK = MMA ? KW / mma_k<T>() : 1, MN = MMA ? U / 8 : 1;
    constexpr int LDP = lltm_seq::mma_parts_ld(U, lltm_seq::mma_parts_bank(false, KS));
    constexpr int PARTS = (NT / 32) * CH * LDP; /* a layer's */
    static_assert(!MMA || (KW % mma_k<T>() == 0 && U % 8 == 0), "tensor-core tiles");
    T *ga = reinterpret_cast<T *>(smem_raw); /* [L][BC][LDA]: as ds */
    float *parts = reinterpret_cast<float *>(smem_raw + (size_t)L * BC * LDA * sizeof(T));

    const int64_t steps = a.steps, B = a.B, H = a.H, G = 3 * H, BH = B * H, BG = B * G;
    const int tid = threadIdx.x, lane = tid % 32;
    const int j = lane % U, s = (tid / 32) * (32 / U) + lane / U;
    const int64_t unit_blocks = (H + U - 1) / U, groups = gridDim.x / unit_blocks;
    const int64_t group = blockIdx.x / unit_blocks, unit0 = (blockIdx.x % unit_blocks) * U;
    const int64_t first_row = group * CH, row_step = groups * CH;
    const bool owner = tid < CH * U;
    const int own_bb = tid / U;
    const int64_t own_u = unit0 + tid % U;

    constexpr int WL = MMA ? 1 : L, WR = MMA ? 1 : RR, TL = MMA ? L : 1;
    A wh[WL][WR], wx[WL][WR];
    uint32_t th[TL][MN][MK][2], tx[TL][MN][MK][2];
#pragma unroll
    for (int l = 0; l < L; ++l) {
        const int64_t K = l == 0 ? H + a.I : 2 * H;
        if constexpr (MMA) {
            load_unit_tiles<T, KW, MN, MK>(a.weights[l], H, K, unit0, tid, th[l]);
            if (l + 1 < L)
                load_unit_tiles<T, KW, MN, MK>(a.weights[l + 1] + H, H, 2 * H, unit0, tid, tx[l]);
        } else {
            const int64_t u = unit0 + j;
#pragma unroll
            for (int rv = 0; rv < RR / VEC; ++rv)
#pragma unroll
                for (int e = 0; e < VEC; ++e) {
                    const int64_t r = (int64_t)(rv * KS + s) * VEC + e;
                    const bool ok = u < H && r < G;
                    wh[l][rv * VEC + e] = ok ? to_acc(a.weights[l][r * K + u]) : A(0);
                    if (l + 1 < L)
                        wx[l][rv * VEC + e] =
                            ok ? to_acc(a.weights[l + 1][r * 2 * H + H + u]) : A(0);
                }
        }
    }
    if constexpr (MMA)
        zero_rows_past_chunk<T, CH, LDA>(ga, L, tid);
    /* the owner's totals of each layer's partial sums (after a barrier) */
    auto totals = [&](A(&tot)[L]) {
#pragma unroll
        for (int l = 0; l < L; ++l)
            tot[l] = 0;
        if constexpr (MMA) {
#pragma unroll
            for (int l = 0; l < L; ++l)
                tot[l] = sum_parts<CH, LDP>(parts + l * PARTS, own_bb, tid % U);
        } else {
#pragma unroll
            for (int q = 0; q < KS; ++q)
#pragma unroll
                for (int l = 0; l < L; ++l)
                    tot[l] += sums[(l * CH + own_bb) * SUM_LD + q * U + tid % U];
        }
    };
    /* dG^l_t of every row of the chunk into ds (the grad_gates, or the half
     * types' float copy by parity; tensor cores: the grad_gates into ga) */
    auto stage_dg = [&](int l, int64_t t, int64_t b0) {
        if constexpr (MMA) /* in flight until copy_async_wait */
            stage_tile_rows_async<T, RP, LDA, CH>(ga + l * BC * LDA, a.grad_gates[l] + t * BG, B,
                                                  b0, G, tid);
        else if constexpr (SAME)
            stage_rows<A, RP, CH>(ds + l * CH * RP,
                                  reinterpret_cast<const A *>(a.grad_gates[l]) + t * BG, B, b0, G,
                                  tid);
        else
            stage_rows<A, RP, CH>(ds + l * CH * RP, a.dg_work[l] + (t & 1) * BG, B, b0, G, tid);
    };
    /* layer l's sums of this lane's share: dG^l W_h^l where `own`, plus
     * dG^{l+1} W_x^{l+1} where `above` (into parts, or sums) */
    auto products = [&](int l, bool own, bool above) {
        if constexpr (MMA) {
            float c[MN][4];
#pragma unroll
            for (int n = 0; n < MN; ++n)
                c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.0f;
            if (own)
                tile_products<T, KW, MN, MK, LDA>(c, ga + l * BC * LDA, th[l], tid);
            if (above)
                tile_products<T, KW, MN, MK, LDA>(c, ga + (l + 1) * BC * LDA, tx[l], tid);
            store_parts<MN, CH, U, LDP>(c, parts + l * PARTS, tid);
        } else {
            A acc[CH];
#pragma unroll
            for (int bb = 0; bb < CH; ++bb)
                acc[bb] = 0;
#pragma unroll
            for (int bb = 0; bb < CH; ++bb)
#pragma unroll
                for (int rv = 0; rv < RR / VEC; ++rv) {
                    const int r = (rv * KS + s) * VEC;
                    if (own) {
                        const V dv = *reinterpret_cast<const V *>(&ds[(l * CH + bb) * RP + r]);
#pragma unroll
                        for (int e = 0; e < VEC; ++e)
                            acc[bb] += wh[l][rv * VEC + e] * component(dv, e);
                    }
                    if (above) {
                        const V xv =
                            *reinterpret_cast<const V *>(&ds[((l + 1) * CH + bb) * RP + r]);
#pragma unroll
                        for (int e = 0; e < VEC; ++e)
                            acc[bb] += wx[l][rv * VEC + e] * component(xv, e);
                    }
                }
#pragma unroll
            for (int bb = 0; bb < CH; ++bb)
                sums[(l * CH + bb) * SUM_LD + s * U + j] = acc[bb];
        }
    };

    A bias_sum[L][3];
#pragma unroll
    for (int l = 0; l < L; ++l)
        bias_sum[l][0] = bias_sum[l][1] = bias_sum[l][2] = 0;
    for (int64_t step = 0; step < steps + L - 1; ++step) {
        for (int64_t b0 = first_row; b0 < B; b0 += row_step) {
            const int64_t b = b0 + own_bb;
            const bool row_ok = owner && own_u < H && b < B;
            const int64_t row_end = stack_row_steps(a.lengths, b, B, steps);
            /* the owner's pointwise inputs of layer l: activations, cell, dL/dh
             * from outside, dL/dc; every layer's fetched before the products on
             * tensor cores, each layer's as it comes in FFMA (whose registers
             * hold the weights) */
            A i_[L], o_[L], z_[L], c_[L], dh_[L], dc_in[L];
            auto fetch = [&](int l) {
                const int64_t t = steps - 1 - step + (L - 1 - l);
                i_[l] = o_[l] = z_[l] = c_[l] = dh_[l] = dc_in[l] = 0;
                if (t < 0 || t >= steps || !row_ok)
                    return;
                const int64_t jj = t * BH + b * H + own_u, bu = b * H + own_u;
                const T *arow = a.gates[l] + (t * B + b) * G;
                i_[l] = to_acc(arow[own_u]);
                o_[l] = to_acc(arow[H + own_u]);
                z_[l] = to_acc(arow[2 * H + own_u]);
                c_[l] = to_acc(a.cells[l][jj]);
                if (l == L - 1)
                    dh_[l] = to_acc(a.grad_output[jj]);
                if (t == row_end - 1) /* the row's last step: dL/dh_n enters */
                    dh_[l] += to_acc(a.grad_h_n[l][bu]);
                const A *dc_state = SAME ? reinterpret_cast<const A *>(a.grad_c0[l]) : a.dc_work[l];
                dc_in[l] = t == steps - 1 ? to_acc(a.grad_c_n[l][bu]) : dc_state[bu];
            };
            if constexpr (MMA)
#pragma unroll
                for (int l = 0; l < L; ++l)
                    fetch(l);
#pragma unroll
            for (int l = 0; l < L; ++l) {
                const int64_t tn = steps - step + (L - 1 - l); /* t_l + 1 */
                if (tn >= 0 && tn < steps)
                    stage_dg(l, tn, b0);
            }
            if constexpr (MMA)
                copy_async_wait();
            __syncthreads();
#pragma unroll
            for (int l = 0; l < L; ++l) {
                const int64_t t = steps - 1 - step + (L - 1 - l);
                if (t < 0 || t >= steps)
                    continue;
                products(l, t + 1 < steps, l + 1 < L);
            }
            __syncthreads();
            A tot[L];
            if (row_ok)
                totals(tot);
#pragma unroll
            for (int l = 0; l < L; ++l) {
                const int64_t t = steps - 1 - step + (L - 1 - l);
                if (t < 0 || t >= steps || !row_ok)
                    continue;
                if constexpr (!MMA)
                    fetch(l);
                A *dc_state = SAME ? reinterpret_cast<A *>(a.grad_c0[l]) : a.dc_work[l];
                A d[3], dc;
                backward_step_math<A>(t < row_end, i_[l], o_[l], z_[l], c_[l], tot[l] + dh_[l],
                                      dc_in[l], d, &dc);
                store_gates<T>(a.grad_gates[l] + (t * B + b) * G, H, own_u, d[0], d[1], d[2]);
                if (!SAME && !MMA)
                    store_gates<A>(a.dg_work[l] + (t & 1) * BG + b * G, H, own_u, d[0], d[1],
                                   d[2]);
                dc_state[b * H + own_u] = dc;
                bias_sum[l][0] += d[0];
                bias_sum[l][1] += d[1];
                bias_sum[l][2] += d[2];
            }
            __syncthreads(); /* ds and sums (ga, parts) are reused by the next chunk */
        }
        step_barrier(); /* every layer's dG of the step is written */
    }

    /* dL/dh0 of each layer: dG^l_0 W_h^l; dL/dc0 (half types: from the float state) */
    for (int64_t b0 = first_row; b0 < B; b0 += row_step) {
#pragma unroll
        for (int l = 0; l < L; ++l)
            stage_dg(l, 0, b0);
        if constexpr (MMA)
            copy_async_wait();
        __syncthreads();
#pragma unroll
        for (int l = 0; l < L; ++l)
            products(l, true, false);
        __syncthreads();
        const int64_t b = b0 + own_bb;
        if (owner && own_u < H && b < B) {
            A tot[L];
            totals(tot);
#pragma unroll
            for (int l = 0; l < L; ++l) {
                a.grad_h0[l][b * H + own_u] = from_acc<T>(tot[l]);
                if (!SAME)
                    a.grad_c0[l][b * H + own_u] = from_acc<T>(a.dc_work[l][b * H + own_u]);
            }
        }
        __syncthreads();
    }

    /* the bias gradients: each unit's row sums in row order, then the batch
     * groups' in group order (deterministic) */
    A *bias_rows = reinterpret_cast<A *>(smem_raw); /* [L][3][CH][U] */
    if (owner)
#pragma unroll
        for (int l = 0; l < L; ++l)
#pragma unroll
            for (int q = 0; q < 3; ++q)
                bias_rows[((l * 3 + q) * CH + own_bb) * U + tid % U] = bias_sum[l][q];
    __syncthreads();
    const bool unit_writer = tid < U && unit0 + tid < H;
    const int64_t u = unit0 + tid;
#pragma unroll
    for (int l = 0; l < L; ++l)
#pragma unroll
        for (int q = 0; q < 3; ++q) {
            A total = 0;
            if (unit_writer)
                for (int bb = 0; bb < CH; ++bb)
                    total += bias_rows[((l * 3 + q) * CH + bb) * U + tid];
            bias_sum[l][q] = total;
        }
    if (groups > 1) {
        if (unit_writer)
#pragma unroll
            for (int l = 0; l < L; ++l)
#pragma unroll
                for (int q = 0; q < 3; ++q)
                    a.bias_work[(group * L + l) * G + q * H + u] = bias_sum[l][q];
        step_barrier();
        if (group != 0)
            return;
#pragma unroll
        for (int l = 0; l < L; ++l)
#pragma unroll
            for (int q = 0; q < 3; ++q) {
                A total = 0;
                if (unit_writer)
                    for (int64_t g = 0; g < groups; ++g)
                        total += __ldcg(&a.bias_work[(g * L + l) * G + q * H + u]);
                bias_sum[l][q] = total;
            }
    }
    if (unit_writer)
#pragma unroll
        for (int l = 0; l < L; ++l)
#pragma unroll
            for (int q = 0; q < 3; ++q)
                a.grad_bias[l][q * H + u] = from_acc<T>(bias_sum[l][q]);
}

/* The backward kernel (as the forward's: stack_forward_kernel) */
template <typename T, int KS, int KR, int CH, int L>
__global__ void __launch_bounds__(NT, 1)
stack_backward_kernel(lltm_seq::stack_backward_args<T> a)
{
    if constexpr (lltm_seq::stack_mma_only(KS, KR, CH) && !mma_products<T>())
        __trap();
    else
        stack_backward_steps<T, KS, KR, CH, L>(a);
}

} // namespace

#endif /* LLTM_CORE_CUDA_SEQUENCE_STACK_CUH */
