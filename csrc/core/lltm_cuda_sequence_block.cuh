/*
 * lltm_cuda_sequence_block.cuh - the kernels of the block family (lltm.h:
 * LLTM_SEQ_BLOCK; H <= 64, any compute capability) and their launchers, for
 * one dtype: each lltm_cuda_seq_block_<dtype>.cu instantiates them
 * (LLTM_SEQ_BLOCK_UNIT). Which layout runs is the plan's.
 *
 * One block holds every unit of the layer: 64 units of KS lanes each
 * (lltm_seq::block_lanes: 2 or 4), W_h in registers (forward: the unit's
 * rows, 3 x 64/KS values a lane; backward: its column, 3 x 64/KS). The state
 * of a step never leaves the block: each step a block reads h_{t-1}
 * (dG_{t+1}) of its rows from one shared buffer, writes h_t (dG_t) into the
 * other, and meets its own threads at one __syncthreads. Blocks never wait
 * for each other, so each is a batch group on its own (block g takes the
 * chunks g, g + groups, ...) and the groups need not be co-resident. What
 * the cluster family spends a step on its exchange between blocks (a round
 * trip through distributed shared memory) is gone; the price is a thread's
 * multiply-adds: all H of a unit's k range over KS lanes.
 *
 * Chunks of CH rows (1 or 4): the lanes of a unit split its k range
 * (lane s: k = (kv*KS + s)*VEC + e) for every row of the chunk; their partial
 * sums meet by shuffles (reduce_rows), which leave lane s holding row s of a
 * 4-row chunk (with 1-row chunks lane 0 owns the row). A step's critical
 * path is one thread's math (products, shuffles, activations), so a 1-row
 * chunk keeps P partial sums a gate and the activations branch-free
 * (lltm_cuda_math.cuh), and no instruction of a step waits for global
 * memory: chunk 0's inputs are loaded two steps ahead, after the step's own
 * are used; c0 and the row's length are read before the time loop.
 * Shared memory (accumulation type):
 *   forward   hs [2][BPL][LD]   h of the block's rows, buffer t & 1 = h_{t-1}
 *             cs [BPL][U]       c_{t-1} of every (row, unit)
 *   backward  ds [2][BPL][LD3]  dG, buffer t & 1 = dG_t, gate q of unit k at
 *                               column q*U + k
 *             dcs [BPL][U]      dL/dc_t
 * (BPL: the block's rows padded to whole chunks; LD = 64 + VEC,
 * LD3 = 3*64 + VEC: rows 16-byte aligned.)
 */
#ifndef LLTM_CORE_CUDA_SEQUENCE_BLOCK_CUH
#define LLTM_CORE_CUDA_SEQUENCE_BLOCK_CUH

#include "lltm_cuda_sequence_device.cuh"

namespace {

using lltm_seq::BLOCK_UNITS;

/* threads of a block kernel in chunks of `chunk` rows (lanes x 64 units) */
template <typename T> constexpr int block_threads(int chunk)
{
    return lltm_seq::block_lanes(sizeof(typename acc_of<T>::type), chunk) * BLOCK_UNITS;
}

/* Forward recurrence, block family (registers as load_unit_rows). */
template <typename T, int CH>
__global__ void __launch_bounds__(block_threads<T>(CH), 1)
sequence_forward_block_kernel(int64_t steps, int64_t B, int64_t H, int64_t K,
                              const T *__restrict__ h0, const T *__restrict__ c0,
                              const T *__restrict__ weights, const T *__restrict__ bias,
                              T *__restrict__ gates, T *__restrict__ output,
                              T *__restrict__ cells, const int64_t *__restrict__ lengths,
                              T *__restrict__ h_n, T *__restrict__ c_n)
{
    typedef typename acc_of<T>::type A;
    typedef typename vec_of<A>::type V;
    constexpr int KS = lltm_seq::block_lanes(sizeof(A), CH), U = BLOCK_UNITS, THREADS = KS * U,
                  KR = U / KS, VEC = vec_of<A>::n, LD = U + VEC, P = CH == 1 ? 2 : 1;
    static_assert(KR % VEC == 0 && CH <= KS && (CH & (CH - 1)) == 0, "configuration");
    LLTM_DYNAMIC_SMEM(smem_raw);
    const int groups = (int)gridDim.x, group = (int)blockIdx.x;
    const int64_t group_chunks = ((B + CH - 1) / CH - group + groups - 1) / groups;
    const int64_t BPL = group_chunks * CH; /* this block's rows, padded */
    A *hs = reinterpret_cast<A *>(smem_raw);
    A *cs = hs + 2 * BPL * LD;

    const int tid = threadIdx.x, s = tid % KS, j = tid / KS;
    const int64_t u = j;
    const bool unit_ok = u < H;
    const bool owner = s < CH; /* holds a row after the reduction */
    const int r = s & (CH - 1);  /* that row, in its chunk */
    auto global_row = [&](int64_t lb) { return (lb / CH * groups + group) * CH + lb % CH; };

    /* buffer 0 <- h0; everything else 0 (padding meets zero weights, but
     * must not hold NaN) */
    for (int64_t e = tid; e < 2 * BPL * LD; e += THREADS) {
        const int64_t lb = e / LD, k = e % LD, b = global_row(lb);
        hs[e] = (lb < BPL && b < B && k < H) ? to_acc(h0[b * H + k]) : A(0);
    }
    /* cs <- c0: a step reads its rows' state from shared memory only */
    for (int64_t e = tid; e < BPL * U; e += THREADS) {
        const int64_t b = global_row(e / U), k = e % U;
        cs[e] = (b < B && k < H) ? to_acc(c0[b * H + k]) : A(0);
    }
    A w[3][KR], b_i, b_o, b_z;
    load_unit_rows<T, KS, KR>(weights, bias, H, K, u, unit_ok, s, w, b_i, b_o, b_z);
    auto load_projection = [&](int64_t t, int64_t b, A &p_i, A &p_o, A &p_z) {
        ::load_projection(gates, B, H, t, b, u, p_i, p_o, p_z);
    };
    auto store_outputs = [&](int64_t t, int64_t b, A i, A o, A z, A c, A h) {
        store_forward_outputs(gates, cells, output, B, H, t, b, u, i, o, z, c, h);
    };
    /* Chunk 0's inputs come two steps ahead, in three register sets taken
     * in turn (the time loop unrolled by three): a step's loads are issued
     * after its own inputs are used, so that nothing in a step waits for
     * them (a wait for an earlier load can cover later ones), and they have
     * a whole step to land. Its row's length is read once. */
    const int64_t first_row = (int64_t)group * CH + r; /* local chunk 0: row r */
    const bool first_row_ok = owner && unit_ok && first_row < B;
    const int64_t first_row_end = first_row_ok ? row_steps(lengths, first_row, steps) : 0;
    A pa[3] = {0, 0, 0}, pb[3] = {0, 0, 0}, pc[3] = {0, 0, 0};
    if (first_row_ok) {
        load_projection(0, first_row, pa[0], pa[1], pa[2]);
        if (steps > 1)
            load_projection(1, first_row, pb[0], pb[1], pb[2]);
    }
    __syncthreads();

    /* step t of the chunk of rows [lb0, lb0 + CH), this lane's row b given
     * with its projection and whether t lies within the row's length */
    auto chunk_step = [&](int64_t t, int64_t lb0, int64_t b, bool row_ok, bool live, A p_i,
                          A p_o, A p_z) {
        const A *h_prev = hs + (t & 1) * BPL * LD;
        A *h_next = hs + ((t + 1) & 1) * BPL * LD;
        /* read by the owner alone, which writes the slot below: another
         * lane's read would race with that write */
        const A c_prev = owner ? cs[(lb0 + r) * U + j] : A(0);

        /* P partial sums a row and gate: one row has too few chains of
         * multiply-adds to hide their latency */
        A part[CH * 3][P];
#pragma unroll
        for (int v = 0; v < CH * 3; ++v)
#pragma unroll
            for (int p = 0; p < P; ++p)
                part[v][p] = 0;
        const A *rows = h_prev + lb0 * LD;
#pragma unroll
        for (int bb = 0; bb < CH; ++bb) {
#pragma unroll
            for (int kv = 0; kv < KR / VEC; ++kv) {
                const V hv = *reinterpret_cast<const V *>(&rows[bb * LD + (kv * KS + s) * VEC]);
#pragma unroll
                for (int e = 0; e < VEC; ++e)
#pragma unroll
                    for (int q = 0; q < 3; ++q)
                        part[bb * 3 + q][kv % P] += w[q][kv * VEC + e] * component(hv, e);
            }
        }
        A acc[CH * 3];
#pragma unroll
        for (int v = 0; v < CH * 3; ++v) {
            acc[v] = part[v][0];
#pragma unroll
            for (int p = 1; p < P; ++p)
                acc[v] += part[v][p];
        }
        reduce_rows<KS, CH, 3>(acc, s);

        A h = 0;
        if (row_ok) {
            A i, o, z, c;
            forward_step_math<A>(live, acc[0] + p_i + b_i, acc[1] + p_o + b_o,
                                 acc[2] + p_z + b_z, c_prev, &i, &o, &z, &c, &h);
            cs[(lb0 + r) * U + j] = c;
            store_outputs(t, b, i, o, z, c, h);
        }
        if (owner)
            h_next[(lb0 + r) * LD + j] = h; /* 0 for padding rows and units */
    };
    auto step = [&](int64_t t, const A(&now)[3], A(&later)[3]) {
        chunk_step(t, 0, first_row, first_row_ok, t < first_row_end, now[0], now[1], now[2]);
        if (t + 2 < steps && first_row_ok)
            load_projection(t + 2, first_row, later[0], later[1], later[2]);
        for (int64_t lb0 = CH; lb0 < BPL; lb0 += CH) {
            const int64_t b = global_row(lb0) + r;
            const bool row_ok = owner && unit_ok && b < B;
            bool live = false;
            A p_i = 0, p_o = 0, p_z = 0;
            if (row_ok) {
                live = t < row_steps(lengths, b, steps);
                load_projection(t, b, p_i, p_o, p_z);
            }
            chunk_step(t, lb0, b, row_ok, live, p_i, p_o, p_z);
        }
        __syncthreads(); /* h_t complete; every read of h_{t-1} done */
    };
    for (int64_t t = 0; t < steps; t += 3) {
        step(t, pa, pc);
        if (t + 1 < steps)
            step(t + 1, pb, pa);
        if (t + 2 < steps)
            step(t + 2, pc, pb);
    }
    /* The final state after the last step (not in the step, where its test
     * cost 0.1 us of a 0.5 us step at H = 64): c_n from cs (a row past its
     * length kept its state), h_n from buffer T & 1, or with lengths from
     * the output at the row's last step (written by this block; the step's
     * __syncthreads made it visible) */
    const A *h_last = hs + (steps & 1) * BPL * LD;
    for (int64_t e = tid; e < BPL * U; e += THREADS) {
        const int64_t lb = e / U, k = e % U, b = global_row(lb);
        if (b >= B || k >= H)
            continue;
        if (c_n)
            c_n[b * H + k] = from_acc<T>(cs[e]);
        if (h_n)
            h_n[b * H + k] = lengths ? output[row_last_step(lengths, b, steps) * B * H + b * H + k]
                                     : from_acc<T>(h_last[lb * LD + k]);
    }
}

/*
 * Backward recurrence, reverse time, block family. Lane s of unit u holds,
 * for column r = q*U + k of a dG row, W_h[q*H + k, u] (0 for k >= H), at
 * r = (rv*KS + s)*VEC + e. The bias sums of the block's rows go to
 * grad_bias (one block) or to bias_work [groups][3H] (several; the launcher
 * adds them in group order).
 */
template <typename T, int CH>
__global__ void __launch_bounds__(block_threads<T>(CH), 1)
sequence_backward_block_kernel(int64_t steps, int64_t B, int64_t H, int64_t K,
                               const T *__restrict__ grad_output, const T *__restrict__ grad_h_n,
                               const T *__restrict__ grad_c_n, const T *__restrict__ weights,
                               const T *__restrict__ cells, const T *__restrict__ gates,
                               T *__restrict__ grad_gates, T *__restrict__ grad_bias,
                               T *__restrict__ grad_h0, T *__restrict__ grad_c0,
                               typename acc_of<T>::type *__restrict__ bias_work,
                               const int64_t *__restrict__ lengths)
{
    typedef typename acc_of<T>::type A;
    typedef typename vec_of<A>::type V;
    constexpr int KS = lltm_seq::block_lanes(sizeof(A), CH), U = BLOCK_UNITS, THREADS = KS * U,
                  RR = 3 * U / KS, VEC = vec_of<A>::n, LD = 3 * U + VEC, P = CH == 1 ? 4 : 1;
    static_assert(RR % VEC == 0 && CH <= KS && (CH & (CH - 1)) == 0, "configuration");
    LLTM_DYNAMIC_SMEM(smem_raw);
    const int groups = (int)gridDim.x, group = (int)blockIdx.x;
    const int64_t group_chunks = ((B + CH - 1) / CH - group + groups - 1) / groups;
    const int64_t BPL = group_chunks * CH;
    A *ds = reinterpret_cast<A *>(smem_raw);
    A *dcs = ds + 2 * BPL * LD;

    const int tid = threadIdx.x, s = tid % KS, j = tid / KS;
    const int64_t u = j;
    const bool unit_ok = u < H;
    const bool owner = s < CH;
    const int r = s & (CH - 1);
    const int64_t G = 3 * H;
    auto global_row = [&](int64_t lb) { return (lb / CH * groups + group) * CH + lb % CH; };

    for (int64_t e = tid; e < 2 * BPL * LD; e += THREADS)
        ds[e] = 0;
    A w[RR];
#pragma unroll
    for (int rv = 0; rv < RR / VEC; ++rv)
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
            const int64_t col = (int64_t)(rv * KS + s) * VEC + e, q = col / U, k = col % U;
            w[rv * VEC + e] = (unit_ok && k < H) ? to_acc(weights[(q * H + k) * K + u]) : A(0);
        }

    /* this lane's share of dG W_h over rows [lb0, lb0+CH) of `buffer`,
     * summed to acc[0] = row r of the chunk (P partial sums a row: one row
     * has too few chains of multiply-adds to hide their latency) */
    auto dh_from = [&](const A *buffer, int64_t lb0, A(&acc)[CH]) {
        const A *rows = buffer + lb0 * LD;
        A part[CH][P];
#pragma unroll
        for (int bb = 0; bb < CH; ++bb)
#pragma unroll
            for (int p = 0; p < P; ++p)
                part[bb][p] = 0;
#pragma unroll
        for (int bb = 0; bb < CH; ++bb) {
#pragma unroll
            for (int rv = 0; rv < RR / VEC; ++rv) {
                const V dv = *reinterpret_cast<const V *>(&rows[bb * LD + (rv * KS + s) * VEC]);
#pragma unroll
                for (int e = 0; e < VEC; ++e)
                    part[bb][rv % P] += w[rv * VEC + e] * component(dv, e);
            }
        }
#pragma unroll
        for (int bb = 0; bb < CH; ++bb) {
            acc[bb] = part[bb][0];
#pragma unroll
            for (int p = 1; p < P; ++p)
                acc[bb] += part[bb][p];
        }
        reduce_rows<KS, CH, 1>(acc, s);
    };
    auto load_inputs = [&](int64_t t, int64_t b, A(&in)[8]) {
        load_backward_inputs(gates, cells, grad_output, grad_h_n, grad_c_n, lengths, steps, B, H,
                             t, b, u, in);
    };
    auto store_gradients = [&](int64_t t, int64_t b, const A(&d)[3]) {
        store_grad_gates(grad_gates, B, H, t, b, u, d);
    };
    /* chunk 0's inputs two steps ahead, in three register sets (as the
     * forward's) */
    const int64_t first_row = (int64_t)group * CH + r;
    const bool first_row_ok = owner && unit_ok && first_row < B;
    A ia[8] = {0, 0, 0, 0, 0, 0, 0, 0}, ib[8] = {0, 0, 0, 0, 0, 0, 0, 0},
      ic[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (first_row_ok) {
        load_inputs(steps - 1, first_row, ia);
        if (steps > 1)
            load_inputs(steps - 2, first_row, ib);
    }
    __syncthreads();

    A bias_sum[3] = {0, 0, 0};
    /* step t of the chunk of rows [lb0, lb0 + CH), this lane's row b given
     * with its inputs */
    auto chunk_step = [&](int64_t t, int64_t lb0, int64_t b, bool row_ok, const A(&in)[8]) {
        const bool last = t == steps - 1;
        const A *d_next = ds + ((t + 1) & 1) * BPL * LD; /* dG_{t+1} */
        A *d_this = ds + (t & 1) * BPL * LD;
        /* read by the owner alone (as the forward's c_prev) */
        const A dc_next = last ? in[5] : owner ? dcs[(lb0 + r) * U + j] : A(0);
        A acc[CH];
        acc[0] = 0;
        if (!last) /* uniform over the block */
            dh_from(d_next, lb0, acc);
        A d[3] = {0, 0, 0};
        if (row_ok) {
            A dc;
            backward_step_math<A>(in[7] != A(0), in[0], in[1], in[2], in[3],
                                  in[4] + in[6] + acc[0], dc_next, d, &dc);
            dcs[(lb0 + r) * U + j] = dc;
            bias_sum[0] += d[0];
            bias_sum[1] += d[1];
            bias_sum[2] += d[2];
            store_gradients(t, b, d);
        }
        if (owner) {
            A *drow = d_this + (lb0 + r) * LD + j; /* 0 for padding rows and units */
            drow[0] = d[0];
            drow[U] = d[1];
            drow[2 * U] = d[2];
        }
    };
    auto step = [&](int64_t t, const A(&now)[8], A(&later)[8]) {
        chunk_step(t, 0, first_row, first_row_ok, now);
        if (t >= 2 && first_row_ok)
            load_inputs(t - 2, first_row, later);
        for (int64_t lb0 = CH; lb0 < BPL; lb0 += CH) {
            const int64_t b = global_row(lb0) + r;
            const bool row_ok = owner && unit_ok && b < B;
            A in[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            if (row_ok)
                load_inputs(t, b, in);
            chunk_step(t, lb0, b, row_ok, in);
        }
        __syncthreads(); /* dG_t complete; every read of dG_{t+1} done */
    };
    for (int64_t t = steps - 1; t >= 0; t -= 3) {
        step(t, ia, ic);
        if (t >= 1)
            step(t - 1, ib, ia);
        if (t >= 2)
            step(t - 2, ic, ib);
    }

    /* grad_h0 = dG_0 W_h (buffer 0), grad_c0 = dL/dc_0 */
    for (int64_t lb0 = 0; lb0 < BPL; lb0 += CH) {
        const int64_t b = global_row(lb0) + r;
        const bool row_ok = owner && unit_ok && b < B;
        A acc[CH];
        dh_from(ds, lb0, acc);
        if (row_ok) {
            grad_h0[b * H + u] = from_acc<T>(acc[0]);
            grad_c0[b * H + u] = from_acc<T>(dcs[(lb0 + r) * U + j]);
        }
    }
    /* bias: the lanes' row sums (fixed order), then this block's line */
#pragma unroll
    for (int mask = KS / 2; mask >= 1; mask /= 2)
#pragma unroll
        for (int q = 0; q < 3; ++q)
            bias_sum[q] += __shfl_xor_sync(0xffffffffu, bias_sum[q], mask);
    if (s == 0 && unit_ok) {
        if (groups == 1)
            store_gates<T>(grad_bias, H, u, bias_sum[0], bias_sum[1], bias_sum[2]);
        else
            store_gates<A>(bias_work + (int64_t)group * G, H, u, bias_sum[0], bias_sum[1],
                           bias_sum[2]);
    }
}

/* One launch of `groups` blocks (every block a batch group), smem bytes
 * each. Past the default limit the kernel's dynamic shared-memory limit is
 * raised to the device's most, never lowered: layers of other sizes may
 * launch the same kernel with more at the same time. */
template <typename... P, typename... Args>
cudaError_t launch_blocks(void (*kernel)(P...), int64_t groups, int threads, size_t smem,
                          cudaStream_t stream, Args... args)
{
    if (smem > 48 * 1024) {
        int device = 0, most = 0;
        cudaError_t e = cudaGetDevice(&device);
        if (e == cudaSuccess)
            e = cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
        if (e == cudaSuccess)
            e = cudaFuncSetAttribute((const void *)kernel,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, most);
        if (e != cudaSuccess)
            return e;
    }
    LLTM_LAUNCH((unsigned)groups, threads, smem, stream, kernel)(args...);
    return cudaGetLastError();
}

template <typename T, int CH>
int run_block(const lltm_sequence_launch &l, const lltm_seq::forward_args &a,
              cudaStream_t stream)
{
    typedef typename acc_of<T>::type A;
    if (l.blocks != 1 || l.groups < 1 || a.H > BLOCK_UNITS)
        return LLTM_ERR_ARGUMENT;
    const size_t smem =
        lltm_seq::block_forward_smem(sizeof(A), lltm_seq::group_rows(a.B, CH, l.groups));
    return launch_status(launch_blocks(
        sequence_forward_block_kernel<T, CH>, l.groups, block_threads<T>(CH), smem, stream,
        a.steps, a.B, a.H, a.I + a.H, (const T *)a.h0, (const T *)a.c0, (const T *)a.weights,
        (const T *)a.bias, (T *)a.gates, (T *)a.output, (T *)a.cells, a.lengths, (T *)a.h_n,
        (T *)a.c_n));
}

/* With groups > 1 the blocks' bias sums go through the workspace (after the
 * float32 state of the half types, as the other families lay it out) and are
 * added in group order. */
template <typename T, int CH>
int run_block(const lltm_sequence_launch &l, const lltm_seq::backward_args &a,
              cudaStream_t stream)
{
    typedef typename acc_of<T>::type A;
    if (l.blocks != 1 || l.groups < 1 || a.H > BLOCK_UNITS)
        return LLTM_ERR_ARGUMENT;
    A *bias_work = NULL;
    const int work_status = bias_groups_work<T>(a, l.groups, &bias_work);
    if (work_status != LLTM_OK)
        return work_status;
    const size_t smem =
        lltm_seq::block_backward_smem(sizeof(A), lltm_seq::group_rows(a.B, CH, l.groups));
    const int status = launch_status(launch_blocks(
        sequence_backward_block_kernel<T, CH>, l.groups, block_threads<T>(CH), smem, stream,
        a.steps, a.B, a.H, a.I + a.H, (const T *)a.grad_output, (const T *)a.grad_h_n,
        (const T *)a.grad_c_n, (const T *)a.weights, (const T *)a.cells, (const T *)a.gates,
        (T *)a.grad_gates, (T *)a.grad_bias, (T *)a.grad_h0, (T *)a.grad_c0, bias_work,
        a.lengths));
    return status != LLTM_OK ? status : sum_bias_groups<T>(a, l.groups, bias_work, stream);
}

/* The chunk rows of the library's block kernels (lltm_seq::BLOCK_CHUNKS) */
#define LLTM_SEQ_BLOCK_CHUNKS(X) X(1) X(4)

} // namespace

/* The unit's functions (lltm_cuda_sequence.cuh) */
template <typename T> const void *lltm_seq::block_kernel(bool forward, int chunk)
{
#define LLTM_SEQ_CASE(CH)                                                                    \
    if (chunk == CH)                                                                         \
        return forward ? (const void *)sequence_forward_block_kernel<T, CH>                  \
                       : (const void *)sequence_backward_block_kernel<T, CH>;
    LLTM_SEQ_BLOCK_CHUNKS(LLTM_SEQ_CASE)
#undef LLTM_SEQ_CASE
    return NULL;
}

/* run_block of the launch's chunk rows (Args: forward_args or backward_args) */
template <typename T, typename Args>
int lltm_seq::block_run(const lltm_sequence_launch &l, const Args &a, cudaStream_t stream)
{
#define LLTM_SEQ_CASE(CH)                                                                    \
    if (l.chunk == CH)                                                                       \
        return run_block<T, CH>(l, a, stream);
    LLTM_SEQ_BLOCK_CHUNKS(LLTM_SEQ_CASE)
#undef LLTM_SEQ_CASE
    return LLTM_ERR_ARGUMENT;
}

#define LLTM_SEQ_BLOCK_UNIT(T)                                                               \
    template const void *lltm_seq::block_kernel<T>(bool, int);                               \
    template int lltm_seq::block_run<T>(const lltm_sequence_launch &,                        \
                                        const lltm_seq::forward_args &, cudaStream_t);       \
    template int lltm_seq::block_run<T>(const lltm_sequence_launch &,                        \
                                        const lltm_seq::backward_args &, cudaStream_t);

#endif /* LLTM_CORE_CUDA_SEQUENCE_BLOCK_CUH */
