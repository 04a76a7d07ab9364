/*
 * lltm_cuda_sequence_cluster_forward.cuh - the forward kernel of the
 * cluster family (lltm.h: LLTM_SEQ_CLUSTER; sm_90+) and its launcher, for
 * one dtype: each lltm_cuda_seq_cfwd_<dtype>.cu instantiates them
 * (LLTM_SEQ_CLUSTER_FORWARD_UNIT). Which layout runs is the plan's.
 */
#ifndef LLTM_CORE_CUDA_SEQUENCE_CLUSTER_FORWARD_CUH
#define LLTM_CORE_CUDA_SEQUENCE_CLUSTER_FORWARD_CUH

#include "lltm_cuda_sequence_device.cuh"

namespace {

/*
 * The cluster family (H <= 256): the grid is ONE thread-block cluster, block
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


/*
 * Forward recurrence, cluster family. Lane s (tid % KS) of unit j holds
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
 * per block and step (see cluster_split in lltm_cuda_sequence_plan.cu).
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
                                T *__restrict__ cells, const int64_t *__restrict__ lengths,
                                T *__restrict__ h_n, T *__restrict__ c_n)
{
#if LLTM_CUDA_HAS_CLUSTERS
    typedef typename acc_of<T>::type A;
    typedef typename vec_of<A>::type V;
    constexpr int SLICES = CH / RW, U = NT / KS / SLICES, VEC = vec_of<A>::n, KP = KS * KR,
                  LD = KP + VEC;
    static_assert(KR % VEC == 0 && KS >= RW && KS <= 32 && CH % RW == 0 && CH <= BC &&
                      NT % (KS * SLICES) == 0 && (SLICES == 1 || KS * U % 32 == 0),
                  "configuration");
    LLTM_DYNAMIC_SMEM(smem_raw);
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
        ::load_projection(gates, B, H, t, b, u, p_i, p_o, p_z);
    };
    auto store_outputs = [&](int64_t t, int64_t b, A i, A o, A z, A c, A h) {
        store_forward_outputs(gates, cells, output, B, H, t, b, u, i, o, z, c, h);
        store_final_state(h_n, c_n, lengths, steps, H, t, b, u, c, h);
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
            bool live = false; /* step t lies within row b's length */
            if (row_ok) {
                live = t < row_steps(lengths, b, steps);
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
                forward_step_math<A>(live, acc[0] + p_i + b_i, acc[1] + p_o + b_o,
                                     acc[2] + p_z + b_z, c_prev, &i, &o, &z, &c, &h);
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
#else
    __trap(); /* code built without clusters: the chooser never plans this kernel */
#endif
}

template <typename T, int KS, int KR, int RW, int CH>
int run_cluster_forward(const lltm_sequence_launch &l, const lltm_seq::forward_args &a,
                        cudaStream_t stream)
{
    typedef typename acc_of<T>::type A;
    constexpr int U = NT / KS / (CH / RW);
    if (l.blocks != ceil_div(a.H, U) || l.groups < 1)
        return LLTM_ERR_ARGUMENT;
    const size_t smem = lltm_seq::cluster_forward_smem(
        sizeof(A), KS, KR, U, lltm_seq::group_rows(a.B, CH, l.groups), CH);
    return launch_status(launch_cluster(
        sequence_forward_cluster_kernel<T, KS, KR, RW, CH>, l.blocks, l.groups, smem, stream,
        NT, a.steps, a.B, a.H, a.I + a.H, (const T *)a.h0, (const T *)a.c0, (const T *)a.weights,
        (const T *)a.bias, (T *)a.gates, (T *)a.output, (T *)a.cells, a.lengths, (T *)a.h_n,
        (T *)a.c_n));
}

/*
 * The forward layouts of the library (lanes x values, rows of a chunk,
 * chunk rows), with the shapes the chooser picks each for (16-block
 * clusters; H <= 128 but the last two):
 *   32 x 4,  16 of 16   8 units a block, float64
 *   4 x 32,  2 of 16    8 units a block, B > 16 (not float64)
 *   8 x 16,  1 of 4     8 units a block, B <= 16: a cluster per 4-row chunk
 *   4 x 32,  1 of 8     the same where that many clusters do not fit
 *   8 x 32,  2 of 4     16 units a block, 128 < H <= 256: a cluster per
 *                       4-row chunk (not float64)
 *   16 x 16, 8 of 8     the same in 8-row chunks, where that many clusters
 *                       do not fit
 */
#define LLTM_SEQ_CLUSTER_FORWARD_LAYOUTS(X)                                                  \
    if constexpr (std::is_same<T, double>::value) {                                          \
        X(32, 4, 16, 16)                                                                     \
    } else {                                                                                 \
        X(4, 32, 2, 16)                                                                      \
        X(8, 16, 1, 4)                                                                       \
        X(4, 32, 1, 8)                                                                       \
        X(8, 32, 2, 4)                                                                       \
        X(16, 16, 8, 8)                                                                      \
    }

} // namespace

/* The unit's functions (lltm_cuda_sequence.cuh) */
template <typename T>
const void *lltm_seq::cluster_forward_kernel(const lltm_sequence_launch &l)
{
#define LLTM_SEQ_CASE(KS, KR, RW, CH)                                                        \
    if (l.lanes == KS && l.values == KR && l.rows == RW && l.chunk == CH)                    \
        return (const void *)sequence_forward_cluster_kernel<T, KS, KR, RW, CH>;
    LLTM_SEQ_CLUSTER_FORWARD_LAYOUTS(LLTM_SEQ_CASE)
#undef LLTM_SEQ_CASE
    return NULL;
}

template <typename T>
int lltm_seq::cluster_forward(const lltm_sequence_launch &l, const forward_args &a,
                              cudaStream_t stream)
{
#define LLTM_SEQ_CASE(KS, KR, RW, CH)                                                        \
    if (l.lanes == KS && l.values == KR && l.rows == RW && l.chunk == CH)                    \
        return run_cluster_forward<T, KS, KR, RW, CH>(l, a, stream);
    LLTM_SEQ_CLUSTER_FORWARD_LAYOUTS(LLTM_SEQ_CASE)
#undef LLTM_SEQ_CASE
    return LLTM_ERR_ARGUMENT;
}

#define LLTM_SEQ_CLUSTER_FORWARD_UNIT(T)                                                     \
    template const void *lltm_seq::cluster_forward_kernel<T>(const lltm_sequence_launch &);  \
    template int lltm_seq::cluster_forward<T>(const lltm_sequence_launch &,                  \
                                              const lltm_seq::forward_args &, cudaStream_t);

#endif /* LLTM_CORE_CUDA_SEQUENCE_CLUSTER_FORWARD_CUH */
