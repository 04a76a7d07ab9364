/*
 * sequence_cluster.cu - the cluster kernels of the LLTM sequence (sm_90+),
 * every layout side by side: each version is checked against a float64
 * CPU reference of the recurrence, then timed (CUDA events, median of
 * repetitions). The library keeps the versions its plan chooser picks
 * (docs/cuda-plans.md); the others live only here.
 *
 *   nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 -I../../csrc/core \
 *        sequence_cluster.cu -o sequence_cluster
 *   ./sequence_cluster forward 1 [B H T]      (B <= 64, H <= 128; 256 for 5 - 8)
 *   ./sequence_cluster backward 2 [B H T]
 *
 * forward versions (16 blocks of 8 units; 5 - 8: of 16 units, H <= 256):
 *   1  32 lanes a unit x 4 values, all 16 rows of a chunk (float32: lab only;
 *      the library runs it for float64)
 *   2  4 lanes x 32 values on 2 rows of each 16-row chunk (library, B > 16)
 *   3  8 lanes x 16 values on 1 row, a cluster per 4-row chunk (library, B <= 16)
 *   4  4 lanes x 32 values on 1 row, a cluster per 8-row chunk (library, where
 *      the clusters of version 3 do not fit)
 *   5  8 lanes x 32 values on 2 rows, a cluster per 4-row chunk (library,
 *      128 < H <= 256)
 *   6  16 lanes x 16 values on all 8 rows, a cluster per 8-row chunk (library,
 *      where the clusters of version 5 do not fit)
 *   7  16 x 16 on all 16 rows, one cluster (lab only)
 *   8  16 x 16 on all 4 rows, a cluster per 4-row chunk (lab only)
 * backward versions (reduce-scatter: 8 units a block; 5 - 7: 16, H <= 256):
 *   1  broadcast: every block gets all of dG_t, 16 blocks of 8 units (lab only)
 *   2  reduce-scatter on 16-row chunks, one cluster (library, B > 16)
 *   3  reduce-scatter, a cluster per 4-row chunk (library, B <= 16)
 *   4  reduce-scatter, a cluster per 8-row chunk (library)
 *   5  reduce-scatter, a cluster per 4-row chunk (library, 128 < H <= 256)
 *   6  reduce-scatter, a cluster per 8-row chunk (library, 128 < H <= 256)
 *   7  reduce-scatter on 16-row chunks, one cluster (lab only)
 *   8  broadcast, 16 blocks of 16 units (lab only)
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

/* the launch of a layout for B rows of H units in `groups` clusters */
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
        std::fprintf(stderr, "B in 1..64, H in 1..256 (versions 1 - 4: 128), T >= 1\n");
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
                layout(32, 4, 16, 16, 0, B, H, false), fa, stream);
        case 2:
            return run_cluster_forward<float, 4, 32, 2, 16>(layout(4, 32, 2, 16, 0, B, H, false),
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
            return run_cluster_backward_rs<float, 8, 16>(layout(32, 4, 16, 16, RS, B, H, false),
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
        }
        return -100;
    };
    /* the forward of the library's layout for B feeds every backward */
    int status = forward    ? run_forward()
                 : H > 128  ? run_cluster_forward<float, 8, 32, 2, 4>(
                                 layout(8, 32, 2, 4, 0, B, H, true), fa, stream)
                            : (B > 16 ? run_cluster_forward<float, 4, 32, 2, 16>(
                                                          layout(4, 32, 2, 16, 0, B, H, false),
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
