/*
 * sequence_stack.cuh - the lab's stacked-layer kernels (sequence_stack.cu):
 * L layers in one cooperative launch, forward (stack_forward_kernel) and
 * backward (stack_backward_kernel), float32, on the library's device
 * helpers (lltm_cuda_sequence_device.cuh).
 */
#ifndef LLTM_DEV_SEQUENCE_STACK_CUH
#define LLTM_DEV_SEQUENCE_STACK_CUH

#include "lltm_cuda_sequence_device.cuh"

namespace {

constexpr int MAX_L = 4;

/* the arrays of L layers (layer l: weights [3H, K_l], K_0 = H (the input
 * product comes in gates), K_l = 2H above; gates [T,B,3H]: layer 0 in/out,
 * above out) */
struct stack_arrays {
    const float *weights[MAX_L], *bias[MAX_L], *h0[MAX_L], *c0[MAX_L];
    float *gates[MAX_L], *output[MAX_L], *cells[MAX_L];
};

template <int KS, int KR, int CH, int L>
__global__ void __launch_bounds__(NT, 1)
stack_forward_kernel(int64_t steps, int64_t B, int64_t H, stack_arrays a)
{
    typedef float A;
    typedef float4 V;
    constexpr int U = NT / KS, VEC = 4, KP = KS * KR, PER = 3 * L;
    static_assert(KR % VEC == 0 && KS >= CH && KS <= 32 && NT % KS == 0 && L <= MAX_L, "");
    LLTM_DYNAMIC_SMEM(smem_raw);
    A *hs = reinterpret_cast<A *>(smem_raw); /* [2L - 1][CH][KP]: h^l_{t-1}, then h^{l-1}_t */

    const int tid = threadIdx.x, s = tid % KS;
    const int64_t unit_blocks = (H + U - 1) / U, groups = gridDim.x / unit_blocks;
    const int64_t u = (int64_t)(blockIdx.x % unit_blocks) * U + tid / KS;
    const int64_t first_row = (int64_t)(blockIdx.x / unit_blocks) * CH, row_step = groups * CH;
    const bool unit_ok = u < H, owner = s < CH;
    const int64_t G = 3 * H, BH = B * H;

    A wh[L][3][KR], wx[L][3][KR], bi[L], bo[L], bz[L];
#pragma unroll
    for (int l = 0; l < L; ++l) {
        const int64_t K = l == 0 ? H : 2 * H;
        load_unit_rows<float, KS, KR>(a.weights[l], a.bias[l], H, K, u, unit_ok, s, wh[l],
                                      bi[l], bo[l], bz[l]);
        if (l > 0) {
            A x0, x1, x2;
            load_unit_rows<float, KS, KR>(a.weights[l] + H, a.bias[l], H, K, u, unit_ok, s,
                                          wx[l], x0, x1, x2);
        }
    }

    for (int64_t step = 0; step < steps + L - 1; ++step) {
        for (int64_t b0 = first_row; b0 < B; b0 += row_step) {
            const int64_t b = b0 + (s & (CH - 1));
            const bool row_ok = owner && unit_ok && b < B;
#pragma unroll
            for (int l = 0; l < L; ++l) {
                const int64_t t = step - l;
                if (t < 0 || t >= steps)
                    continue;
                A *own = hs + l * CH * KP;
                if (t == 0) {
                    for (int e = tid; e < CH * KP; e += NT) {
                        const int64_t row = b0 + e / KP, k = e % KP;
                        own[e] = (row < B && k < H) ? a.h0[l][row * H + k] : A(0);
                    }
                } else {
                    stage_rows<A, KP, CH>(own, a.output[l] + (t - 1) * BH, B, b0, H, tid);
                }
                if (l > 0)
                    stage_rows<A, KP, CH>(hs + (L + l - 1) * CH * KP, a.output[l - 1] + t * BH,
                                          B, b0, H, tid);
            }
            __syncthreads();

            A acc[CH * PER];
#pragma unroll
            for (int v = 0; v < CH * PER; ++v)
                acc[v] = 0;
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
                        const V hv = *reinterpret_cast<const V *>(&hs[(l * CH + bb) * KP + k]);
                        V xv = V{};
                        if (l > 0)
                            xv = *reinterpret_cast<const V *>(
                                &hs[((L + l - 1) * CH + bb) * KP + k]);
#pragma unroll
                        for (int e = 0; e < VEC; ++e)
#pragma unroll
                            for (int q = 0; q < 3; ++q) {
                                acc[bb * PER + l * 3 + q] += wh[l][q][kv * VEC + e] * component(hv, e);
                                if (l > 0)
                                    acc[bb * PER + l * 3 + q] +=
                                        wx[l][q][kv * VEC + e] * component(xv, e);
                            }
                    }
            }
            reduce_rows<KS, CH, PER>(acc, s);

#pragma unroll
            for (int l = 0; l < L; ++l) {
                const int64_t t = step - l;
                if (t < 0 || t >= steps || !row_ok)
                    continue;
                float *grow = a.gates[l] + (t * B + b) * G;
                const A p_i = l == 0 ? grow[u] : A(0), p_o = l == 0 ? grow[H + u] : A(0),
                        p_z = l == 0 ? grow[2 * H + u] : A(0);
                const A c_prev = t == 0 ? a.c0[l][b * H + u] : a.cells[l][(t - 1) * BH + b * H + u];
                A i, o, z, c, h;
                forward_step_math<A>(true, acc[l * 3] + p_i + bi[l], acc[l * 3 + 1] + p_o + bo[l],
                                     acc[l * 3 + 2] + p_z + bz[l], c_prev, &i, &o, &z, &c, &h);
                grow[u] = i;
                grow[H + u] = o;
                grow[2 * H + u] = z;
                a.cells[l][t * BH + b * H + u] = c;
                a.output[l][t * BH + b * H + u] = h;
            }
            __syncthreads(); /* hs is restaged by the next chunk */
        }
        if (step + 1 < steps + L - 1)
            step_barrier();
    }
}

/* the backward's arrays of L layers: the forward's activations (gates) and
 * cells; dL/d output of the top layer; dL/dh_n, dL/dc_n of each layer;
 * out: dG [T,B,3H], dL/dh0, and dL/dc (the running state, then dL/dc0) */
struct stack_grads {
    const float *weights[MAX_L], *gates[MAX_L], *cells[MAX_L], *grad_h_n[MAX_L],
        *grad_c_n[MAX_L];
    const float *grad_output;
    float *grad_gates[MAX_L], *grad_h0[MAX_L], *grad_c0[MAX_L];
};

/*
 * Backward, reverse time, skewed the other way: at global step s layer l
 * runs its step t = T - 1 - s + (L - 1 - l) (the top layer first). Its dL/dh
 * is dG^l_{t+1} W_h^l (own recurrence) + dG^{l+1}_t W_x^{l+1} (the layer
 * above's input gradient, formed in the step instead of by a product over
 * all steps) + dL/d output (top layer) or dL/dh_n (its last step). Both dG
 * rows were written at step s - 1, and dG^{l+1}_t is what layer l+1 stages
 * for itself at step s (its own t + 1): L staged arrays serve 2L - 1
 * products. Block n owns columns u of W_h^l and of W_x^{l+1} (the library's
 * backward layout: lane = unit j + slice s); the KS slices' partial sums
 * meet in shared memory and are added in slice order (deterministic).
 */
template <int KS, int KR, int CH, int L>
__global__ void __launch_bounds__(NT, 1)
stack_backward_kernel(int64_t steps, int64_t B, int64_t H, stack_grads g)
{
    typedef float A;
    typedef float4 V;
    constexpr int U = NT / KS, VEC = 4, RR = 3 * KR, RP = KS * RR, SUM_LD = KS * U + U;
    static_assert(RR % VEC == 0 && 32 % U == 0 && (NT / 32) * (32 / U) == KS && CH * U <= NT,
                  "configuration");
    LLTM_DYNAMIC_SMEM(smem_raw);
    A *ds = reinterpret_cast<A *>(smem_raw); /* [L][CH][RP]: dG^l_{t_l + 1} */
    A *sums = ds + L * CH * RP;              /* [L][CH][SUM_LD] */

    const int tid = threadIdx.x, lane = tid % 32;
    const int j = lane % U, s = (tid / 32) * (32 / U) + lane / U;
    const int64_t unit_blocks = (H + U - 1) / U, groups = gridDim.x / unit_blocks;
    const int64_t group = blockIdx.x / unit_blocks, unit0 = (blockIdx.x % unit_blocks) * U;
    const int64_t first_row = group * CH, row_step = groups * CH;
    const int64_t G = 3 * H, BH = B * H, BG = B * G;
    const bool owner = tid < CH * U;
    const int own_bb = tid / U;
    const int64_t own_u = unit0 + tid % U;

    A wh[L][RR], wx[L][RR];
    {
        const int64_t u = unit0 + j;
#pragma unroll
        for (int l = 0; l < L; ++l)
#pragma unroll
            for (int rv = 0; rv < RR / VEC; ++rv)
#pragma unroll
                for (int e = 0; e < VEC; ++e) {
                    const int64_t r = (int64_t)(rv * KS + s) * VEC + e;
                    const bool ok = u < H && r < G;
                    const int64_t K = l == 0 ? H : 2 * H;
                    wh[l][rv * VEC + e] = ok ? g.weights[l][r * K + u] : A(0);
                    if (l + 1 < L)
                        wx[l][rv * VEC + e] = ok ? g.weights[l + 1][r * 2 * H + H + u] : A(0);
                }
    }

    /* the owner's totals of every layer's KS partial sums in `sums` (after a
     * barrier), added in slice order; the layers' chains interleave */
    auto totals = [&](A (&tot)[L]) {
#pragma unroll
        for (int l = 0; l < L; ++l)
            tot[l] = 0;
#pragma unroll
        for (int q = 0; q < KS; ++q)
#pragma unroll
            for (int l = 0; l < L; ++l)
                tot[l] += sums[(l * CH + own_bb) * SUM_LD + q * U + tid % U];
    };

    const int64_t total_steps = steps + L - 1;
    for (int64_t step = 0; step < total_steps; ++step) {
        for (int64_t b0 = first_row; b0 < B; b0 += row_step) {
#pragma unroll
            for (int l = 0; l < L; ++l) {
                const int64_t tn = steps - step + (L - 1 - l); /* t_l + 1 */
                if (tn >= 0 && tn < steps)
                    stage_rows<A, RP, CH>(ds + l * CH * RP, g.grad_gates[l] + tn * BG, B, b0,
                                          G, tid);
            }
            __syncthreads();
#pragma unroll
            for (int l = 0; l < L; ++l) {
                const int64_t t = steps - 1 - step + (L - 1 - l);
                if (t < 0 || t >= steps)
                    continue;
                const bool own = t + 1 < steps, above = l + 1 < L;
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
            __syncthreads();
            A tot[L];
            if (owner)
                totals(tot);
#pragma unroll
            for (int l = 0; l < L; ++l) {
                const int64_t t = steps - 1 - step + (L - 1 - l);
                const int64_t b = b0 + own_bb;
                if (t < 0 || t >= steps || !owner || own_u >= H || b >= B)
                    continue;
                const A from_products = tot[l];
                const int64_t jj = t * BH + b * H + own_u;
                const float *arow = g.gates[l] + (t * B + b) * G;
                const bool last = t == steps - 1;
                A dh = from_products;
                if (l == L - 1)
                    dh += g.grad_output[jj];
                if (last)
                    dh += g.grad_h_n[l][b * H + own_u];
                const A dc_in = last ? g.grad_c_n[l][b * H + own_u] : g.grad_c0[l][b * H + own_u];
                A d[3], dc;
                backward_step_math<A>(true, arow[own_u], arow[H + own_u], arow[2 * H + own_u],
                                      g.cells[l][jj], dh, dc_in, d, &dc);
                float *drow = g.grad_gates[l] + (t * B + b) * G;
                drow[own_u] = d[0];
                drow[H + own_u] = d[1];
                drow[2 * H + own_u] = d[2];
                g.grad_c0[l][b * H + own_u] = dc;
            }
            __syncthreads(); /* ds and sums are reused by the next chunk */
        }
        step_barrier();
    }
    /* dL/dh0 of each layer: dG^l_0 W_h^l */
    for (int64_t b0 = first_row; b0 < B; b0 += row_step) {
#pragma unroll
        for (int l = 0; l < L; ++l)
            stage_rows<A, RP, CH>(ds + l * CH * RP, g.grad_gates[l], B, b0, G, tid);
        __syncthreads();
#pragma unroll
        for (int l = 0; l < L; ++l) {
            A acc[CH];
#pragma unroll
            for (int bb = 0; bb < CH; ++bb) {
                acc[bb] = 0;
#pragma unroll
                for (int rv = 0; rv < RR / VEC; ++rv) {
                    const V dv = *reinterpret_cast<const V *>(
                        &ds[(l * CH + bb) * RP + (rv * KS + s) * VEC]);
#pragma unroll
                    for (int e = 0; e < VEC; ++e)
                        acc[bb] += wh[l][rv * VEC + e] * component(dv, e);
                }
                sums[(l * CH + bb) * SUM_LD + s * U + j] = acc[bb];
            }
        }
        __syncthreads();
        A tot[L];
        if (owner)
            totals(tot);
#pragma unroll
        for (int l = 0; l < L; ++l) {
            const int64_t b = b0 + own_bb;
            if (owner && own_u < H && b < B)
                g.grad_h0[l][b * H + own_u] = tot[l];
        }
        __syncthreads();
    }
}

} // namespace

#endif /* LLTM_DEV_SEQUENCE_STACK_CUH */
