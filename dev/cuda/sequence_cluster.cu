/*
 * sequence_cluster.cu - the cluster kernels of the LLTM sequence (sm_90+),
 * every layout side by side: each version is checked against a float64
 * CPU reference of the recurrence, then timed (CUDA events, median of
 * repetitions). The library keeps the versions its plan chooser picks
 * (docs/cuda-plans.md); the others live only here (the broadcast backward
 * with its kernel, below).
 *
 *   nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 -I../../csrc/core \
 *        sequence_cluster.cu -o sequence_cluster
 *   ./sequence_cluster forward 1 [B H T]      (B <= 64, H <= 128; 256 for 5 - 8)
 *   ./sequence_cluster backward 2 [B H T]
 *
 * forward versions (16 blocks of 8 units; 5 - 8: of 16 units, H <= 256):
 *   1  32 lanes a unit x 4 values, all 16 rows of a chunk, a cluster a
 *      16-row chunk (float32: lab only; the library runs it for float64)
 *   2  4 lanes x 32 values on 2 rows of 16, a cluster a 16-row chunk
 *      (library, B > 16)
 *   3  8 lanes x 16 values on 1 row, a cluster per 4-row chunk (library, B <= 16)
 *   4  4 lanes x 32 values on 1 row, a cluster per 8-row chunk (library, where
 *      the clusters of version 3 do not fit)
 *   5  8 lanes x 32 values on 2 rows, a cluster per 4-row chunk (library,
 *      128 < H <= 256)
 *   6  16 lanes x 16 values on all 8 rows, a cluster per 8-row chunk (library,
 *      where the clusters of version 5 do not fit)
 *   7  16 x 16 on all 16 rows, one cluster (lab only)
 *   8  16 x 16 on all 4 rows, a cluster per 4-row chunk (lab only)
 *   9  version 2 in one cluster walking every 16-row chunk (lab only: 1.7x -
 *      3.2x the time of a cluster a chunk at B 32 - 64, H200, 2026-12-03;
 *      at B <= 16, one chunk, it is version 2)
 * backward versions (reduce-scatter: 8 units a block; 5 - 7: 16, H <= 256):
 *   1  broadcast: every block gets all of dG_t, 16 blocks of 8 units (lab only)
 *   2  reduce-scatter on 16-row chunks, a cluster a chunk (library, B > 16)
 *   3  reduce-scatter, a cluster per 4-row chunk (library, B <= 16)
 *   4  reduce-scatter, a cluster per 8-row chunk (library)
 *   5  reduce-scatter, a cluster per 4-row chunk (library, 128 < H <= 256)
 *   6  reduce-scatter, a cluster per 8-row chunk (library, 128 < H <= 256)
 *   7  reduce-scatter on 16-row chunks, one cluster (lab only)
 *   8  broadcast, 16 blocks of 16 units (lab only)
 *   9  version 2 in one cluster walking every 16-row chunk (lab only)
 */
#include "lltm_cuda_sequence_cluster_backward.cuh"
#include "lltm_cuda_sequence_cluster_forward.cuh"
#include "lab.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

namespace {

/*
 * Backward versions 1 and 8: the BROADCAST form (lab only; as the backward
 * of clusters of 8 blocks of 16 units it took, forward included, 2.1x -
 * 7.9x the time of the 16-block clusters of the library at every shape
 * where both ran: H200, float32 and bfloat16, 2026-12-03). Every block gets
 * all of dG_t and forms dh_{t-1} of its own units. Same register layout as
 * the grid family's sequence_backward_kernel, over the state's columns: lane s holds, for
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
                                 T *__restrict__ grad_c0, const int64_t *__restrict__ lengths)
{
#if LLTM_CUDA_HAS_CLUSTERS
    typedef typename acc_of<T>::type A;
    typedef typename vec_of<A>::type V;
    constexpr int U = NT / KS, VEC = vec_of<A>::n, RR = 3 * KR, RP = KS * RR, LD = RP + VEC;
    static_assert(RR % VEC == 0 && KS >= BC && KS <= 32 && NT % KS == 0, "configuration");
    LLTM_DYNAMIC_SMEM(smem_raw);
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
    auto load_inputs = [&](int64_t t, int64_t b, A(&in)[8]) {
        load_backward_inputs(gates, cells, grad_output, grad_h_n, grad_c_n, lengths, steps, B, H,
                             t, b, u, in);
    };
    auto store_gradients = [&](int64_t t, int64_t b, const A(&d)[3]) {
        store_grad_gates(grad_gates, B, H, t, b, u, d);
    };
    const bool first_row_ok = owner && unit_ok && s < B;
    A next[8] = {0, 0, 0, 0, 0, 0, 0, 0}; /* chunk 0's inputs of the coming step */
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
                store_gradients(t, b, d);
            b = b0 + (s & (BC - 1));
            row_ok = owner && unit_ok && b < B;
            A in[8];
#pragma unroll
            for (int q = 0; q < 8; ++q)
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
                backward_step_math<A>(in[7] != A(0), in[0], in[1], in[2], in[3],
                                      in[4] + in[6] + acc[0], in[5], d, &dc);
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
            store_gradients(t, b, d);
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
#else
    __trap(); /* code built without clusters: the chooser never plans this kernel */
#endif
}

/* its dynamic shared memory (acc: bytes of the accumulation type; rows:
 * the batch rows, padded to whole chunks) */
inline size_t cluster_backward_broadcast_smem(size_t acc, int ks, int kr, int64_t rows)
{
    const int64_t vec = 16 / (int64_t)acc, U = NT / ks;
    return 16 + acc * (size_t)(2 * rows * (3 * ks * kr + vec) + 2 * BC * 3 * U + rows * U);
}

template <typename T, int KS, int KR>
int run_cluster_backward_broadcast(const lltm_sequence_launch &l,
                                   const lltm_seq::backward_args &a, cudaStream_t stream)
{
    typedef typename acc_of<T>::type A;
    if (l.blocks != ceil_div(a.H, NT / KS) || l.groups != 1)
        return LLTM_ERR_ARGUMENT;
    const size_t smem =
        cluster_backward_broadcast_smem(sizeof(A), KS, KR, ceil_div(a.B, BC) * BC);
    return launch_status(launch_cluster(
        sequence_backward_cluster_kernel<T, KS, KR>, l.blocks, 1, smem, stream, NT, a.steps, a.B,
        a.H, a.I + a.H, (const T *)a.grad_output, (const T *)a.grad_h_n, (const T *)a.grad_c_n,
        (const T *)a.weights, (const T *)a.cells, (const T *)a.gates, (T *)a.grad_gates,
        (T *)a.grad_bias, (T *)a.grad_h0, (T *)a.grad_c0, a.lengths));
}

struct problem {
    int64_t T, B, H;
    std::vector<float> h0, c0, W, bias, gates_in, grad_output, grad_h_n, grad_c_n;
};

/* float64 reference: forward outputs (h_t, c_t, activations) and the
 * backward's dG, grad_bias, grad_h0, grad_c0 (I = 0: W is [3H, H]) */
struct reference {
    std::vector<double> output, cells, acts, dG, dbias, dh0, dc0;
};

reference run_reference(const problem &p)
{
    const int64_t T = p.T, B = p.B, H = p.H, G = 3 * H;
    reference r;
    r.output.assign(T * B * H, 0);
    r.cells.assign(T * B * H, 0);
    r.acts.assign(T * B * G, 0);
    for (int64_t t = 0; t < T; ++t)
        for (int64_t b = 0; b < B; ++b)
            for (int64_t u = 0; u < H; ++u) {
                double g[3];
                for (int q = 0; q < 3; ++q) {
                    double s = p.gates_in[(t * B + b) * G + q * H + u] + p.bias[q * H + u];
                    for (int64_t k = 0; k < H; ++k)
                        s += (t ? r.output[((t - 1) * B + b) * H + k] : p.h0[b * H + k]) *
                             p.W[(q * H + u) * H + k];
                    g[q] = s;
                }
                const double i = 1 / (1 + std::exp(-g[0])), o = 1 / (1 + std::exp(-g[1]));
                const double z = g[2] > 0 ? g[2] : std::expm1(g[2]);
                const double c = (t ? r.cells[((t - 1) * B + b) * H + u] : p.c0[b * H + u]) + i * z;
                r.cells[(t * B + b) * H + u] = c;
                r.output[(t * B + b) * H + u] = std::tanh(c) * o;
                double *a = &r.acts[(t * B + b) * G];
                a[u] = i, a[H + u] = o, a[2 * H + u] = z;
            }
    r.dG.assign(T * B * G, 0);
    r.dbias.assign(G, 0);
    std::vector<double> dh(p.grad_h_n.begin(), p.grad_h_n.end()),
        dc(p.grad_c_n.begin(), p.grad_c_n.end());
    for (int64_t t = T - 1; t >= 0; --t) {
        for (int64_t b = 0; b < B; ++b)
            for (int64_t u = 0; u < H; ++u) {
                const double *a = &r.acts[(t * B + b) * G];
                const double i = a[u], o = a[H + u], z = a[2 * H + u];
                const double tc = std::tanh(r.cells[(t * B + b) * H + u]);
                const double h_grad = dh[b * H + u] + p.grad_output[(t * B + b) * H + u];
                const double c_grad = dc[b * H + u] + h_grad * o * (1 - tc * tc);
                double *d = &r.dG[(t * B + b) * G];
                d[u] = c_grad * z * i * (1 - i);
                d[H + u] = h_grad * tc * o * (1 - o);
                d[2 * H + u] = c_grad * i * (z > 0 ? 1 : z + 1);
                dc[b * H + u] = c_grad;
            }
        for (int64_t b = 0; b < B; ++b)
            for (int64_t k = 0; k < H; ++k) {
                double s = 0;
                for (int64_t g = 0; g < G; ++g)
                    s += r.dG[(t * B + b) * G + g] * p.W[g * H + k];
                dh[b * H + k] = s;
            }
        for (int64_t b = 0; b < B; ++b)
            for (int64_t g = 0; g < G; ++g)
                r.dbias[g] += r.dG[(t * B + b) * G + g];
    }
    r.dh0 = dh;
    r.dc0 = dc;
    return r;
}

double max_error(const std::vector<float> &got, const std::vector<double> &want)
{
    double e = 0, scale = 1;
    for (size_t n = 0; n < want.size(); ++n)
        scale = std::max(scale, std::fabs(want[n]));
    for (size_t n = 0; n < want.size(); ++n)
        e = std::max(e, std::fabs(got[n] - want[n]) / scale);
    return e;
}

float *upload(const std::vector<float> &v)
{
    float *d = nullptr;
    CHECK(cudaMalloc(&d, std::max<size_t>(v.size(), 1) * sizeof(float)));
    CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice));
    return d;
}

std::vector<float> download(const float *d, size_t n)
{
    std::vector<float> v(n);
    CHECK(cudaMemcpy(v.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    return v;
}

/* the launch of a layout for B rows of H units: a cluster a chunk (split),
 * or one cluster walking every chunk */
lltm_sequence_launch layout(int lanes, int values, int rows, int chunk, int exchange,
                            int64_t B, int64_t H, bool split)
{
    /* reduce-scatter: NT / lanes units a block (8 at lanes 32, 16 at 16) */
    lltm_sequence_launch l = {};
    l.lanes = lanes, l.values = values, l.rows = rows, l.chunk = chunk, l.exchange = exchange;
    l.groups = split ? ceil_div(B, chunk) : 1;
    const int units = exchange == LLTM_SEQ_EXCHANGE_REDUCE_SCATTER ? 256 / lanes
                                                                   : 256 / lanes / (chunk / rows);
    l.blocks = ceil_div(H, units);
    return l;
}

template <typename F> float time_ms(F run, int reps)
{
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    std::vector<float> times;
    for (int r = 0; r < reps; ++r) {
        CHECK(cudaEventRecord(start));
        run();
        CHECK(cudaEventRecord(stop));
        CHECK(cudaEventSynchronize(stop));
        float ms = 0;
        CHECK(cudaEventElapsedTime(&ms, start, stop));
        times.push_back(ms);
    }
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
}

} // namespace

int main(int argc, char **argv)
{
    if (argc < 3) {
        std::fprintf(stderr, "usage: %s forward|backward VERSION [B H T]\n", argv[0]);
        return 2;
    }
    const bool forward = !std::strcmp(argv[1], "forward");
    const int version = std::atoi(argv[2]);
    problem p;
    p.B = argc > 3 ? std::atoll(argv[3]) : 16;
    p.H = argc > 4 ? std::atoll(argv[4]) : 128;
    p.T = argc > 5 ? std::atoll(argv[5]) : 100;
    if (p.B < 1 || p.B > 64 || p.H < 1 || p.H > 256 || p.T < 1) {
        std::fprintf(stderr, "B in 1..64, H in 1..256 (versions 1 - 4, 9: 128), T >= 1\n");
        return 2;
    }
    const int64_t T = p.T, B = p.B, H = p.H, G = 3 * H;
    std::mt19937 rng(1234);
    p.h0 = random_vector(B * H, 1, rng);
    p.c0 = random_vector(B * H, 1, rng);
    p.W = random_vector(G * H, 1.0f / std::sqrt((float)H), rng);
    p.bias = random_vector(G, 0.5f, rng);
    p.gates_in = random_vector(T * B * G, 1, rng);
    p.grad_output = random_vector(T * B * H, 1, rng);
    p.grad_h_n = random_vector(B * H, 1, rng);
    p.grad_c_n = random_vector(B * H, 1, rng);
    const reference ref = run_reference(p);

    float *h0 = upload(p.h0), *c0 = upload(p.c0), *W = upload(p.W), *bias = upload(p.bias);
    float *gates = upload(p.gates_in), *gin = upload(p.gates_in);
    float *output = upload(std::vector<float>(T * B * H)), *cells = upload(std::vector<float>(T * B * H));
    float *go = upload(p.grad_output), *ghn = upload(p.grad_h_n), *gcn = upload(p.grad_c_n);
    float *dG = upload(std::vector<float>(T * B * G)), *db = upload(std::vector<float>(G));
    float *dh0 = upload(std::vector<float>(B * H)), *dc0 = upload(std::vector<float>(B * H));
    float *work = upload(std::vector<float>(ceil_div(B, 4) * G));
    const lltm_seq::forward_args fa = {T, B, 0, H, h0, c0, W, bias, gates, output, cells, work};
    const lltm_seq::backward_args ba = {T, B, 0, H, go, ghn, gcn, W, cells, gates, dG, db, dh0,
                                        dc0, work};
    const cudaStream_t stream = 0;
    auto run_forward = [&]() -> int {
        CHECK(cudaMemcpyAsync(gates, gin, T * B * G * sizeof(float), cudaMemcpyDeviceToDevice));
        switch (version) {
        case 1:
            return run_cluster_forward<float, 32, 4, 16, 16>(
                layout(32, 4, 16, 16, 0, B, H, true), fa, stream);
        case 2:
            return run_cluster_forward<float, 4, 32, 2, 16>(layout(4, 32, 2, 16, 0, B, H, true),
                                                             fa, stream);
        case 3:
            return run_cluster_forward<float, 8, 16, 1, 4>(layout(8, 16, 1, 4, 0, B, H, true), fa,
                                                            stream);
        case 4:
            return run_cluster_forward<float, 4, 32, 1, 8>(layout(4, 32, 1, 8, 0, B, H, true), fa,
                                                            stream);
        case 5:
            return run_cluster_forward<float, 8, 32, 2, 4>(layout(8, 32, 2, 4, 0, B, H, true), fa,
                                                            stream);
        case 6:
            return run_cluster_forward<float, 16, 16, 8, 8>(layout(16, 16, 8, 8, 0, B, H, true),
                                                             fa, stream);
        case 7:
            return run_cluster_forward<float, 16, 16, 16, 16>(
                layout(16, 16, 16, 16, 0, B, H, false), fa, stream);
        case 8:
            return run_cluster_forward<float, 16, 16, 4, 4>(layout(16, 16, 4, 4, 0, B, H, true),
                                                             fa, stream);
        case 9:
            return run_cluster_forward<float, 4, 32, 2, 16>(layout(4, 32, 2, 16, 0, B, H, false),
                                                             fa, stream);
        }
        return -100;
    };
    auto run_backward = [&]() -> int {
        const int RS = LLTM_SEQ_EXCHANGE_REDUCE_SCATTER;
        switch (version) {
        case 1:
            return run_cluster_backward_broadcast<float, 32, 4>(
                layout(32, 4, 16, 16, LLTM_SEQ_EXCHANGE_BROADCAST, B, H, false), ba, stream);
        case 2:
            return run_cluster_backward_rs<float, 8, 16>(layout(32, 4, 16, 16, RS, B, H, true),
                                                         ba, stream);
        case 3:
            return run_cluster_backward_rs<float, 8, 4>(layout(32, 4, 4, 4, RS, B, H, true), ba,
                                                        stream);
        case 4:
            return run_cluster_backward_rs<float, 8, 8>(layout(32, 4, 8, 8, RS, B, H, true), ba,
                                                        stream);
        case 5:
            return run_cluster_backward_rs<float, 16, 4>(layout(16, 16, 4, 4, RS, B, H, true), ba,
                                                         stream);
        case 6:
            return run_cluster_backward_rs<float, 16, 8>(layout(16, 16, 8, 8, RS, B, H, true), ba,
                                                         stream);
        case 7:
            return run_cluster_backward_rs<float, 16, 16>(
                layout(16, 16, 16, 16, RS, B, H, false), ba, stream);
        case 8:
            return run_cluster_backward_broadcast<float, 16, 16>(
                layout(16, 16, 16, 16, LLTM_SEQ_EXCHANGE_BROADCAST, B, H, false), ba, stream);
        case 9:
            return run_cluster_backward_rs<float, 8, 16>(layout(32, 4, 16, 16, RS, B, H, false),
                                                         ba, stream);
        }
        return -100;
    };
    /* the forward of the library's layout for B feeds every backward */
    int status = forward    ? run_forward()
                 : H > 128  ? run_cluster_forward<float, 8, 32, 2, 4>(
                                 layout(8, 32, 2, 4, 0, B, H, true), fa, stream)
                            : (B > 16 ? run_cluster_forward<float, 4, 32, 2, 16>(
                                                          layout(4, 32, 2, 16, 0, B, H, true),
                                                          fa, stream)
                                                    : run_cluster_forward<float, 8, 16, 1, 4>(
                                                          layout(8, 16, 1, 4, 0, B, H, true), fa,
                                                          stream));
    if (status == -100 || status != LLTM_OK) {
        std::fprintf(stderr, "version %d: %s\n", version,
                     status == -100 ? "no such version" : "launch failed");
        return 1;
    }
    CHECK(cudaDeviceSynchronize());
    double err = std::max({max_error(download(output, T * B * H), ref.output),
                           max_error(download(cells, T * B * H), ref.cells),
                           max_error(download(gates, T * B * G), ref.acts)});
    if (!forward) {
        if ((status = run_backward()) != LLTM_OK) {
            std::fprintf(stderr, "version %d: launch failed\n", version);
            return 1;
        }
        CHECK(cudaDeviceSynchronize());
        err = std::max({err, max_error(download(dG, T * B * G), ref.dG),
                        max_error(download(db, G), ref.dbias),
                        max_error(download(dh0, B * H), ref.dh0),
                        max_error(download(dc0, B * H), ref.dc0)});
    }
    std::printf("%s version %d B=%lld H=%lld T=%lld: max error %.2e (relative to the largest)\n",
                argv[1], version, (long long)B, (long long)H, (long long)T, err);
    if (!(err < 1e-4)) {
        std::printf("MISMATCH: not timed\n");
        return 1;
    }
    const float ms = time_ms([&] { (void)(forward ? run_forward() : run_backward()); }, 50);
    std::printf("median %.1f us per launch (%.2f us per step)\n", ms * 1e3, ms * 1e3 / T);
    return 0;
}
