/*
 * lltm_cuda_sequence_cluster_backward.cuh - the backward kernel of the
 * cluster family (lltm.h: LLTM_SEQ_CLUSTER; sm_90+) and its launcher, for
 * one dtype: each lltm_cuda_seq_cbwd_<dtype>.cu instantiates them
 * (LLTM_SEQ_CLUSTER_BACKWARD_UNIT). The exchange is reduce-scatter, its
 * layout the plan's; the cluster protocol is described in
 * lltm_cuda_sequence_cluster_forward.cuh.
 */
#ifndef LLTM_CORE_CUDA_SEQUENCE_CLUSTER_BACKWARD_CUH
#define LLTM_CORE_CUDA_SEQUENCE_CLUSTER_BACKWARD_CUH

#include "lltm_cuda_sequence_device.cuh"

namespace {

/*
 * Backward recurrence, reverse time, cluster family (U units a block: 8 at
 * H <= 128, 16 past it): the REDUCE-SCATTER form. Block n keeps the forward's
 * weight layout, the gate rows R_n of its own units (rows q*H + u of W_h,
 * 3U x H), so the dG_t it needs is its own (its pointwise step computed it):
 * it forms a partial dh_{t-1}[:, all units] = dG_t[:, R_n] W_h[R_n, :] and
 * sends each block m only the partial of m's units (U values a row, 16-byte
 * pieces straight from registers with st.async, counted on m's transaction
 * barrier). Block m sums the partials of its units from the `ranks` blocks
 * in rank order (deterministic) and runs its pointwise step. Per block and
 * step that is B*HP values sent in all instead of 3*B*U to each of the
 * `ranks` blocks, 3*B*HP, as a broadcast of dG_t would send (8 KB instead
 * of 24 KB at B=16, H=128), and no block reads another's dG at all.
 * Measured on the H100 at B16/I32/H128 T=1000 (scripts/sequence_timing.py,
 * alternating runs): forward+backward 4.55-4.60 ms against 5.76-5.78 ms
 * with a broadcast backward (dev/cuda/sequence_cluster.cu keeps one).
 *
 * Threads (NB: CH x 32 in the 4-byte types, 256 at most), two roles per
 * chunk of CH rows:
 *   pointwise: thread tid < CH*U: unit j = tid % U, row b0 + tid / U
 *   product:   thread (kg = tid % KG, bg = tid / KG) forms the partial of
 *              PK = 16 / sizeof(A) units k = kg*PK + e (one 16-byte piece)
 *              over rows bg*RB .. bg*RB+RB-1 of the chunk, from W_h[R_n, k]
 *              in registers (3U*PK values) and the chunk's dG tile in shared
 *              memory (each warp reads the same row: broadcast loads).
 * Reception i (i = T-1-t: 1 .. T) is the partial dh of step t = T-1-i (dh of
 * step -1 is grad_h0), in buffer i & 1, phase (i-1)/2 of its mbarrier; the
 * two-buffer argument of the forward kernel holds unchanged (a block sends
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
template <typename T, int U, int CH = BC,
          int NB = lltm_seq::cluster_backward_rs_threads(sizeof(typename acc_of<T>::type), CH, U)>
__global__ void __launch_bounds__(NB, 1)
sequence_backward_cluster_rs_kernel(int64_t steps, int64_t B, int64_t H, int64_t K,
                                    const T *__restrict__ grad_output,
                                    const T *__restrict__ grad_h_n,
                                    const T *__restrict__ grad_c_n,
                                    const T *__restrict__ weights, const T *__restrict__ cells,
                                    const T *__restrict__ gates, T *__restrict__ grad_gates,
                                    T *__restrict__ grad_bias, T *__restrict__ grad_h0,
                                    T *__restrict__ grad_c0,
                                    typename acc_of<T>::type *__restrict__ bias_work,
                                    const int64_t *__restrict__ lengths)
{
#if LLTM_CUDA_HAS_CLUSTERS
    typedef typename acc_of<T>::type A;
    typedef typename vec_of<A>::type V;
    constexpr int PK = 16 / (int)sizeof(A), VEC = vec_of<A>::n, R = 3 * U;
    /* NB threads (lltm_seq::cluster_backward_rs_threads: every one a
     * product thread), RB rows each */
    constexpr int RANKS = lltm_seq::CLUSTER_RANKS, KG = RANKS * U / PK;
    constexpr int RB = CH * KG / NB;
    static_assert(PK == VEC && U % PK == 0 && R % VEC == 0 && NB % KG == 0 &&
                      CH * KG % NB == 0 && CH * U <= NB && CH <= BC,
                  "configuration");
    LLTM_DYNAMIC_SMEM(smem_raw);
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
    auto load_inputs = [&](int64_t t, int64_t b, A(&in)[8]) {
        load_backward_inputs(gates, cells, grad_output, grad_h_n, grad_c_n, lengths, steps, B, H,
                             t, b, u, in);
    };
    auto store_gradients = [&](int64_t t, int64_t b, const A(&d)[3]) {
        store_grad_gates(grad_gates, B, H, t, b, u, d);
    };
    const int64_t first_row = (int64_t)group * CH + pb; /* local chunk 0: row pb */
    const bool first_row_ok = unit_ok && first_row < B;
    A next[8] = {0, 0, 0, 0, 0, 0, 0, 0}; /* chunk 0's inputs of the coming step */
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
                store_gradients(t, b, d);
            b = global_row(lb0) + pb;
            row_ok = unit_ok && b < B;
            A in[8];
#pragma unroll
            for (int q = 0; q < 8; ++q)
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
                backward_step_math<A>(in[7] != A(0), in[0], in[1], in[2], in[3],
                                      in[4] + in[6] + dh_rec, in[5], d, &dc);
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
            store_gradients(t, b, d);
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
#else
    __trap(); /* code built without clusters: the chooser never plans this kernel */
#endif
}

/* The reduce-scatter backward in l.groups clusters of chunks of CH rows;
 * with groups > 1 the clusters' bias sums go through the workspace (after
 * the float32 state of the half types) and are added in group order. */
template <typename T, int U, int CH>
int run_cluster_backward_rs(const lltm_sequence_launch &l, const lltm_seq::backward_args &a,
                            cudaStream_t stream)
{
    typedef typename acc_of<T>::type A;
    if (l.blocks != ceil_div(a.H, U) || l.groups < 1)
        return LLTM_ERR_ARGUMENT;
    A *bias_work = NULL;
    const int work_status = bias_groups_work<T>(a, l.groups, &bias_work);
    if (work_status != LLTM_OK)
        return work_status;
    const size_t smem = lltm_seq::cluster_backward_rs_smem(
        sizeof(A), lltm_seq::group_rows(a.B, CH, l.groups), CH, U);
    const int status = launch_status(launch_cluster(
        sequence_backward_cluster_rs_kernel<T, U, CH>, l.blocks, l.groups, smem, stream,
        lltm_seq::cluster_backward_rs_threads(sizeof(A), CH, U), a.steps, a.B, a.H, a.I + a.H,
        (const T *)a.grad_output, (const T *)a.grad_h_n, (const T *)a.grad_c_n,
        (const T *)a.weights, (const T *)a.cells, (const T *)a.gates, (T *)a.grad_gates,
        (T *)a.grad_bias, (T *)a.grad_h0, (T *)a.grad_c0, bias_work, a.lengths));
    return status != LLTM_OK ? status : sum_bias_groups<T>(a, l.groups, bias_work, stream);
}

/*
 * The backward layouts of the library (reduce-scatter: units a block, chunk
 * rows; a launch names its units by lanes = NT / units), with the shapes
 * the chooser picks each for:
 *   8, 16      H <= 128, B > 16 or float64
 *   8, 4       H <= 128, B <= 16: a cluster per 4-row chunk (not float64)
 *   8, 8       the same where that many clusters do not fit
 *   16, 4 / 8  128 < H <= 256, a cluster per 4-row chunk (8 where that many
 *              do not fit; not float64)
 */
#define LLTM_SEQ_CLUSTER_BACKWARD_LAYOUTS(X)                                                 \
    X(lltm_seq::RS_UNITS, 16)                                                                \
    if constexpr (!std::is_same<T, double>::value) {                                         \
        X(lltm_seq::RS_UNITS, 4)                                                             \
        X(lltm_seq::RS_UNITS, 8)                                                             \
        X(lltm_seq::WIDE_UNITS, 4)                                                           \
        X(lltm_seq::WIDE_UNITS, 8)                                                           \
    }

} // namespace

/* The unit's functions (lltm_cuda_sequence.cuh) */
template <typename T>
const void *lltm_seq::cluster_backward_kernel(const lltm_sequence_launch &l)
{
#define LLTM_SEQ_CASE(U, CH)                                                                 \
    if (l.exchange == LLTM_SEQ_EXCHANGE_REDUCE_SCATTER && l.lanes * U == NT && l.chunk == CH) \
        return (const void *)sequence_backward_cluster_rs_kernel<T, U, CH>;
    LLTM_SEQ_CLUSTER_BACKWARD_LAYOUTS(LLTM_SEQ_CASE)
#undef LLTM_SEQ_CASE
    return NULL;
}

template <typename T>
int lltm_seq::cluster_backward(const lltm_sequence_launch &l, const backward_args &a,
                               cudaStream_t stream)
{
#define LLTM_SEQ_CASE(U, CH)                                                                 \
    if (l.exchange == LLTM_SEQ_EXCHANGE_REDUCE_SCATTER && l.lanes * U == NT && l.chunk == CH) \
        return run_cluster_backward_rs<T, U, CH>(l, a, stream);
    LLTM_SEQ_CLUSTER_BACKWARD_LAYOUTS(LLTM_SEQ_CASE)
#undef LLTM_SEQ_CASE
    return LLTM_ERR_ARGUMENT;
}

#define LLTM_SEQ_CLUSTER_BACKWARD_UNIT(T)                                                    \
    template const void *lltm_seq::cluster_backward_kernel<T>(const lltm_sequence_launch &); \
    template int lltm_seq::cluster_backward<T>(const lltm_sequence_launch &,                 \
                                               const lltm_seq::backward_args &, cudaStream_t);

#endif /* LLTM_CORE_CUDA_SEQUENCE_CLUSTER_BACKWARD_CUH */
