/*
 * cell_tiles.cu - GPU time of the fused cell kernels per tile configuration,
 * from CUDA-graph replay (the bench's "graph fwd" / "graph bwd" columns), with
 * every configuration's outputs compared to the shipped one's.
 *
 *   nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 -Icsrc/core \
 *        dev/timing/cell_tiles.cu -o /tmp/cell_tiles && /tmp/cell_tiles [B I H]
 *
 * A development tool (C++ only because it includes the .cu to reach its
 * kernel templates); the library never builds it.
 */
#include "../../csrc/core/lltm_cuda_cell_backward.cu"
#include "../../csrc/core/lltm_cuda_cell_forward.cu"
#include "../../csrc/core/lltm_cuda_cell_pointwise.cu"
#include "../cuda/lab.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

constexpr int UNROLL = 20, REPLAYS = 60;

struct Buffers {
    int64_t B, I, H;
    float *x, *h, *W, *b, *c, *h_out, *c_out, *g_out;
};

float *device_random(size_t n, float scale, unsigned seed)
{
    std::vector<float> v(n);
    srand(seed);
    for (auto &e : v)
        e = scale * (2.0f * (float)rand() / (float)RAND_MAX - 1.0f);
    float *d;
    CHECK(cudaMalloc(&d, n * sizeof(float)));
    CHECK(cudaMemcpy(d, v.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    return d;
}

std::vector<float> to_host(const float *d, size_t n)
{
    std::vector<float> v(n);
    CHECK(cudaMemcpy(v.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    return v;
}

/* Median GPU microseconds per launch of `launch` (UNROLL launches per graph). */
template <typename F> double graph_us(F launch, cudaStream_t s)
{
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int r = 0; r < UNROLL; ++r)
        launch(s);
    CHECK(cudaStreamEndCapture(s, &graph));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    cudaEvent_t start, end;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&end));
    for (int r = 0; r < 10; ++r)
        CHECK(cudaGraphLaunch(exec, s));
    std::vector<double> us;
    for (int r = 0; r < REPLAYS; ++r) {
        CHECK(cudaEventRecord(start, s));
        CHECK(cudaGraphLaunch(exec, s));
        CHECK(cudaEventRecord(end, s));
        CHECK(cudaEventSynchronize(end));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, start, end));
        us.push_back(ms * 1e3 / UNROLL);
    }
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
    CHECK(cudaEventDestroy(start));
    CHECK(cudaEventDestroy(end));
    std::sort(us.begin(), us.end());
    return us[us.size() / 2];
}

double max_diff(const float *d, const std::vector<float> *want)
{
    if (!want)
        return 0;
    const std::vector<float> got = to_host(d, want->size());
    double err = 0;
    for (size_t k = 0; k < got.size(); ++k)
        err = std::max(err, std::isnan(got[k]) ? (double)INFINITY
                                               : (double)std::fabs(got[k] - (*want)[k]));
    return err;
}

/* Poison `out` (n floats, NaN), launch once, compare with `want` (when
 * given), then time by graph replay; one line: label, launch shape, time. */
template <typename F>
void measure(const char *label, dim3 grid, int threads, F launch, float *out, size_t n,
             const std::vector<float> *want, cudaStream_t s)
{
    CHECK(cudaMemset(out, 0xff, n * sizeof(float)));
    launch(s);
    CHECK(cudaGetLastError());
    CHECK(cudaStreamSynchronize(s));
    const double err = max_diff(out, want);
    const double us = graph_us(launch, s);
    std::printf("%-52s blocks=%-4u threads=%-4d %7.2f us  max|diff|=%.1e\n", label,
                grid.x * grid.y, threads, us, err);
}

template <int TB, int TU, int RB, int RU, int KC, int KS>
void forward_config(const Buffers &d, cudaStream_t s, const std::vector<float> *want)
{
    const dim3 grid((unsigned)ceil_div(d.B, TB), (unsigned)ceil_div(d.H, TU));
    const int threads = (TB / RB) * (TU / RU) * KS;
    auto launch = [&](cudaStream_t st) {
        forward_fused_kernel<float, TB, TU, RB, RU, KC, KS><<<grid, threads, 0, st>>>(
            d.B, d.I, d.H, d.x, d.h, d.W, d.b, d.c, d.h_out, d.c_out, d.g_out);
    };
    char label[96];
    std::snprintf(label, sizeof label, "forward TB=%d TU=%d RB=%d RU=%d KC=%d KS=%d", TB, TU, RB,
                  RU, KC, KS);
    measure(label, grid, threads, launch, d.h_out, d.B * d.H, want, s);
}

struct BackwardBuffers {
    float *gh, *gc, *gates, *dg, *dc, *db, *dW, *dx, *dh;
};

template <int TU, int TK, int RR, int RC, int BC>
void weights_config(const Buffers &d, const BackwardBuffers &g, cudaStream_t s,
                    const std::vector<float> *want)
{
    const int64_t K = d.I + d.H;
    const dim3 grid((unsigned)ceil_div(K, TK), (unsigned)ceil_div(d.H, TU));
    const int threads = (3 * TU / RR) * (TK / RC);
    auto launch = [&](cudaStream_t st) {
        backward_weights_kernel<float, TU, TK, RR, RC, BC><<<grid, threads, 0, st>>>(
            d.B, d.I, d.H, g.gh, g.gc, d.c_out, g.gates, d.x, d.h, g.dg, g.dc, g.db, g.dW);
    };
    char label[96];
    std::snprintf(label, sizeof label, "bwd_weights TU=%d TK=%d RR=%d RC=%d BC=%d", TU, TK, RR, RC,
                  BC);
    measure(label, grid, threads, launch, g.dW, 3 * d.H * K, want, s);
}

template <int TB, int TK, int RB, int RC, int GC, int KS>
void inputs_config(const Buffers &d, const BackwardBuffers &g, cudaStream_t s,
                   const std::vector<float> *want)
{
    const int64_t K = d.I + d.H;
    const dim3 grid((unsigned)ceil_div(d.B, TB), (unsigned)ceil_div(K, TK));
    const int threads = (TB / RB) * (TK / RC) * KS;
    auto launch = [&](cudaStream_t st) {
        backward_inputs_kernel<float, TB, TK, RB, RC, GC, KS><<<grid, threads, 0, st>>>(
            d.B, d.I, d.H, g.dg, d.W, g.dx, g.dh);
    };
    char label[96];
    std::snprintf(label, sizeof label, "bwd_inputs TB=%d TK=%d RB=%d RC=%d GC=%d KS=%d", TB, TK, RB,
                  RC, GC, KS);
    measure(label, grid, threads, launch, g.dh, d.B * d.H, want, s);
}

void backward_configs(const Buffers &d, cudaStream_t s)
{
    const int64_t K = d.I + d.H, G = 3 * d.H;
    BackwardBuffers g;
    g.gh = device_random(d.B * d.H, 1.0f, 6);
    g.gc = device_random(d.B * d.H, 1.0f, 7);
    g.gates = d.g_out; /* the forward's activations */
    CHECK(cudaMalloc(&g.dg, d.B * G * sizeof(float)));
    CHECK(cudaMalloc(&g.dc, d.B * d.H * sizeof(float)));
    CHECK(cudaMalloc(&g.db, G * sizeof(float)));
    CHECK(cudaMalloc(&g.dW, G * K * sizeof(float)));
    CHECK(cudaMalloc(&g.dx, d.B * d.I * sizeof(float)));
    CHECK(cudaMalloc(&g.dh, d.B * d.H * sizeof(float)));

    weights_config<8, 16, 3, 1, 16>(d, g, s, nullptr); /* shipped */
    const std::vector<float> want_dW = to_host(g.dW, G * K);
    weights_config<8, 16, 3, 1, 16>(d, g, s, &want_dW);
    weights_config<8, 32, 3, 2, 16>(d, g, s, &want_dW);
    weights_config<4, 32, 3, 2, 16>(d, g, s, &want_dW);
    weights_config<4, 16, 3, 1, 16>(d, g, s, &want_dW);
    weights_config<8, 32, 3, 2, 8>(d, g, s, &want_dW);
    weights_config<4, 16, 3, 2, 16>(d, g, s, &want_dW);
    weights_config<2, 32, 3, 2, 16>(d, g, s, &want_dW);
    weights_config<8, 64, 3, 4, 16>(d, g, s, &want_dW);
    weights_config<16, 32, 6, 2, 16>(d, g, s, &want_dW);
    weights_config<16, 64, 6, 4, 16>(d, g, s, &want_dW);
    weights_config<8, 64, 3, 2, 16>(d, g, s, &want_dW);
    weights_config<16, 64, 3, 4, 16>(d, g, s, &want_dW);
    weights_config<32, 128, 6, 8, 16>(d, g, s, &want_dW); /* the large tiles */

    inputs_config<8, 4, 1, 1, 384, 8>(d, g, s, nullptr); /* shipped */
    const std::vector<float> want_dh = to_host(g.dh, d.B * d.H);
    inputs_config<8, 4, 1, 1, 384, 8>(d, g, s, &want_dh);
    inputs_config<16, 8, 2, 1, 384, 4>(d, g, s, &want_dh);
    inputs_config<16, 8, 2, 1, 384, 8>(d, g, s, &want_dh);
    inputs_config<8, 8, 1, 1, 384, 4>(d, g, s, &want_dh);
    inputs_config<16, 4, 2, 1, 384, 8>(d, g, s, &want_dh);
    inputs_config<8, 8, 2, 1, 384, 8>(d, g, s, &want_dh);
    inputs_config<16, 8, 2, 1, 192, 8>(d, g, s, &want_dh);
    inputs_config<8, 4, 2, 1, 384, 16>(d, g, s, &want_dh);
    /* the whole batch of a mid-size step in one tile row (B <= 16) */
    inputs_config<16, 16, 2, 2, 192, 8>(d, g, s, &want_dh);
    inputs_config<16, 16, 2, 1, 192, 4>(d, g, s, &want_dh);
    inputs_config<16, 32, 2, 2, 128, 4>(d, g, s, &want_dh);
    inputs_config<16, 8, 4, 1, 384, 8>(d, g, s, &want_dh);
    inputs_config<32, 64, 2, 4, 32, 1>(d, g, s, &want_dh); /* the large tiles */

    for (float *p : {g.gh, g.gc, g.dg, g.dc, g.db, g.dW, g.dx, g.dh})
        CHECK(cudaFree(p));
}

} // namespace

int main(int argc, char **argv)
{
    Buffers d;
    d.B = argc > 3 ? atoll(argv[1]) : 16;
    d.I = argc > 3 ? atoll(argv[2]) : 32;
    d.H = argc > 3 ? atoll(argv[3]) : 128;
    const int64_t K = d.I + d.H, G = 3 * d.H;
    d.x = device_random(d.B * d.I, 1.0f, 1);
    d.h = device_random(d.B * d.H, 0.5f, 2);
    d.W = device_random(G * K, 1.0f / std::sqrt((float)d.H), 3);
    d.b = device_random(G, 1.0f / std::sqrt((float)d.H), 4);
    d.c = device_random(d.B * d.H, 0.5f, 5);
    CHECK(cudaMalloc(&d.h_out, d.B * d.H * sizeof(float)));
    CHECK(cudaMalloc(&d.c_out, d.B * d.H * sizeof(float)));
    CHECK(cudaMalloc(&d.g_out, d.B * G * sizeof(float)));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    std::printf("B=%lld I=%lld H=%lld, float32, %d launches per graph, median of %d replays\n",
                (long long)d.B, (long long)d.I, (long long)d.H, UNROLL, REPLAYS);

    /* the shipped small-problem configuration first: its output is the reference */
    forward_config<8, 2, 1, 1, 192, 16>(d, s, nullptr);
    const std::vector<float> want = to_host(d.h_out, d.B * d.H);
    forward_config<8, 2, 1, 1, 192, 16>(d, s, &want);
    forward_config<16, 4, 1, 1, 192, 4>(d, s, &want); /* the earlier shipped one */
    forward_config<16, 4, 1, 1, 192, 2>(d, s, &want);
    forward_config<16, 4, 1, 1, 192, 8>(d, s, &want);
    forward_config<16, 2, 1, 1, 192, 4>(d, s, &want);
    forward_config<16, 2, 1, 1, 192, 8>(d, s, &want);
    forward_config<16, 1, 1, 1, 192, 8>(d, s, &want);
    forward_config<16, 1, 1, 1, 192, 16>(d, s, &want);
    forward_config<8, 4, 1, 1, 192, 8>(d, s, &want);
    forward_config<4, 2, 1, 1, 192, 32>(d, s, &want);
    forward_config<8, 1, 1, 1, 192, 32>(d, s, &want);
    forward_config<16, 8, 1, 1, 96, 2>(d, s, &want);
    forward_config<16, 4, 1, 1, 64, 4>(d, s, &want);
    forward_config<16, 4, 1, 1, 96, 4>(d, s, &want);
    forward_config<16, 8, 1, 1, 96, 4>(d, s, &want);
    forward_config<16, 8, 2, 1, 96, 8>(d, s, &want);
    forward_config<16, 16, 2, 2, 64, 4>(d, s, &want);
    forward_config<16, 8, 2, 2, 128, 8>(d, s, &want);
    forward_config<16, 4, 2, 1, 192, 8>(d, s, &want);
    forward_config<64, 32, 4, 2, 32, 1>(d, s, &want); /* the large tiles */
    backward_configs(d, s);
    /* an empty kernel: the floor of one graph kernel node */
    auto empty = [&](cudaStream_t st) {
        concat_kernel<float><<<1, 32, 0, st>>>(0, 0, 0, nullptr, nullptr, nullptr);
    };
    std::printf("%-80s %7.2f us\n", "empty kernel node", graph_us(empty, s));
    CHECK(cudaStreamDestroy(s));
    return 0;
}
