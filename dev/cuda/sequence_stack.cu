/*
 * sequence_stack.cu - the library's stacked layers in one launch
 * (csrc/core/lltm_stack.h, lltm_cuda_sequence_stack.cuh) on a GPU: checked
 * against a float64 CPU reference of the stack (forward: every layer's
 * outputs and cells; backward: every layer's gate gradients and dL/dh0),
 * then timed against the library's grid kernels run once a layer (32 lanes
 * x 16 values in 4-row chunks, as the chooser takes them at these shapes;
 * L launches, the products between layers not counted). CUDA events,
 * median of 50 launches; float32 and bfloat16 (the reference fed the
 * bfloat16-rounded inputs; the stack's layers pass bfloat16 outputs on).
 *
 *   nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 -I../../csrc/core \
 *        sequence_stack.cu ../../csrc/core/lltm_cuda_seq*.cu ../../csrc/core/lltm_cuda_util.cu \
 *        ../../csrc/core/lltm_cuda_rules.c -o sequence_stack
 *   ./sequence_stack [B H T L]   (H <= 256, L = 2 or 3; default 16 256 100 3)
 */
#include "lltm_cuda_sequence_grid_launch.cuh"
#include "lltm_stack.h"
#include "lab.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#define OK(call)                                                                             \
    do {                                                                                     \
        const int s_ = (call);                                                               \
        if (s_ != LLTM_OK) {                                                                 \
            std::fprintf(stderr, "%s:%d %s: status %d\n", __FILE__, __LINE__, #call, s_);    \
            std::exit(1);                                                                    \
        }                                                                                    \
    } while (0)

namespace {

struct layer_data {
    std::vector<float> W, bias, h0, c0;
};

/* float64 reference of L stacked layers: outputs and cells of each */
void reference(int64_t T, int64_t B, int64_t H, int L, const std::vector<layer_data> &layers,
               const std::vector<float> &gin, std::vector<std::vector<double>> &out,
               std::vector<std::vector<double>> &cells, std::vector<std::vector<double>> &acts)
{
    const int64_t G = 3 * H;
    out.assign(L, std::vector<double>(T * B * H));
    cells.assign(L, std::vector<double>(T * B * H));
    acts.assign(L, std::vector<double>(T * B * G));
    for (int l = 0; l < L; ++l) {
        const int64_t K = 2 * H; /* layer 0: W_x unused (its input product comes in gin) */
        const auto &W = layers[l].W;
        for (int64_t t = 0; t < T; ++t)
            for (int64_t b = 0; b < B; ++b)
                for (int64_t u = 0; u < H; ++u) {
                    double g[3];
                    for (int q = 0; q < 3; ++q) {
                        double acc = layers[l].bias[q * H + u];
                        if (l == 0)
                            acc += gin[(t * B + b) * G + q * H + u];
                        for (int64_t k = 0; k < H; ++k) {
                            const double hp = t == 0 ? layers[l].h0[b * H + k]
                                                     : out[l][(t - 1) * B * H + b * H + k];
                            acc += W[(q * H + u) * K + k] * hp;
                            if (l > 0)
                                acc += W[(q * H + u) * K + H + k] *
                                       out[l - 1][t * B * H + b * H + k];
                        }
                        g[q] = acc;
                    }
                    const double i = 1 / (1 + std::exp(-g[0])), o = 1 / (1 + std::exp(-g[1]));
                    const double z = g[2] > 0 ? g[2] : std::expm1(g[2]);
                    const double cp = t == 0 ? layers[l].c0[b * H + u]
                                             : cells[l][(t - 1) * B * H + b * H + u];
                    const double c = cp + i * z;
                    acts[l][(t * B + b) * G + u] = i;
                    acts[l][(t * B + b) * G + H + u] = o;
                    acts[l][(t * B + b) * G + 2 * H + u] = z;
                    cells[l][t * B * H + b * H + u] = c;
                    out[l][t * B * H + b * H + u] = std::tanh(c) * o;
                }
    }
}

/* float64 reference of the stack's backward: dG of each layer and dL/dh0
 * (layer l's dL/d output: the top layer's grad_output, below it dG^{l+1}
 * W_x^{l+1}) */
void reference_backward(int64_t T, int64_t B, int64_t H, int L,
                        const std::vector<layer_data> &layers,
                        const std::vector<std::vector<double>> &cells,
                        const std::vector<std::vector<double>> &acts,
                        const std::vector<float> &grad_output,
                        const std::vector<std::vector<float>> &ghn,
                        const std::vector<std::vector<float>> &gcn,
                        std::vector<std::vector<double>> &dG, std::vector<std::vector<double>> &dh0)
{
    const int64_t G = 3 * H;
    dG.assign(L, std::vector<double>(T * B * G));
    dh0.assign(L, std::vector<double>(B * H));
    std::vector<double> dout(grad_output.begin(), grad_output.end());
    for (int l = L - 1; l >= 0; --l) {
        const int64_t K = 2 * H; /* layer 0: W_x unused (its input product comes in gin) */
        const auto &W = layers[l].W;
        std::vector<double> dc(gcn[l].begin(), gcn[l].end());
        for (int64_t t = T - 1; t >= 0; --t)
            for (int64_t b = 0; b < B; ++b)
                for (int64_t u = 0; u < H; ++u) {
                    double dh = dout[t * B * H + b * H + u];
                    if (t == T - 1)
                        dh += ghn[l][b * H + u];
                    else
                        for (int64_t r = 0; r < G; ++r)
                            dh += dG[l][((t + 1) * B + b) * G + r] * W[r * K + u];
                    const double *a = &acts[l][(t * B + b) * G];
                    const double i = a[u], o = a[H + u], z = a[2 * H + u];
                    const double tc = std::tanh(cells[l][t * B * H + b * H + u]);
                    const double dct = dc[b * H + u] + dh * o * (1 - tc * tc);
                    const double d_elu = z > 0 ? 1 : z + 1;
                    double *d = &dG[l][(t * B + b) * G];
                    d[u] = dct * z * i * (1 - i);
                    d[H + u] = dh * tc * o * (1 - o);
                    d[2 * H + u] = dct * i * d_elu;
                    dc[b * H + u] = dct;
                }
        for (int64_t b = 0; b < B; ++b)
            for (int64_t u = 0; u < H; ++u) {
                double v = 0;
                for (int64_t r = 0; r < G; ++r)
                    v += dG[l][b * G + r] * W[r * K + u];
                dh0[l][b * H + u] = v;
            }
        if (l > 0) /* the layer below's dL/d output: dG^l W_x^l */
            for (int64_t t = 0; t < T; ++t)
                for (int64_t b = 0; b < B; ++b)
                    for (int64_t k = 0; k < H; ++k) {
                        double v = 0;
                        for (int64_t r = 0; r < G; ++r)
                            v += dG[l][(t * B + b) * G + r] * W[r * K + H + k];
                        dout[t * B * H + b * H + k] = v;
                    }
    }
}

template <typename T> T to_t(float v) { return (T)v; }
template <> __nv_bfloat16 to_t<__nv_bfloat16>(float v) { return __float2bfloat16(v); }
float to_f(float v) { return v; }
float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }

/* the values as T, and back (what the reference sees: the rounded inputs) */
template <typename T> std::vector<T> as_t(const std::vector<float> &v)
{
    std::vector<T> out(v.size());
    for (size_t n = 0; n < v.size(); ++n)
        out[n] = to_t<T>(v[n]);
    return out;
}
template <typename T> std::vector<float> rounded(const std::vector<float> &v)
{
    std::vector<float> out(v.size());
    for (size_t n = 0; n < v.size(); ++n)
        out[n] = to_f(to_t<T>(v[n]));
    return out;
}

template <typename T> T *upload(const std::vector<T> &v)
{
    T *d = nullptr;
    CHECK(cudaMalloc(&d, std::max<size_t>(v.size(), 1) * sizeof(T)));
    CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}
template <typename T> T *zeros(size_t n) { return upload(std::vector<T>(n)); }

template <typename T> double max_error(const T *d, const std::vector<double> &want)
{
    std::vector<T> got(want.size());
    CHECK(cudaMemcpy(got.data(), d, got.size() * sizeof(T), cudaMemcpyDeviceToHost));
    double e = 0, scale = 1e-30;
    for (double w : want)
        scale = std::max(scale, std::fabs(w));
    for (size_t n = 0; n < want.size(); ++n)
        e = std::max(e, std::fabs(to_f(got[n]) - want[n]) / scale);
    return e;
}

template <typename F> float time_us(F run, int reps)
{
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    run();
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
    CHECK(cudaEventDestroy(start));
    CHECK(cudaEventDestroy(stop));
    std::sort(times.begin(), times.end());
    return times[times.size() / 2] * 1e3f;
}

/* one dtype: check the stack and the per-layer kernels, then time both */
template <typename T>
int run(const char *name, double tolerance, int64_t T_, int64_t B, int64_t H, int L,
        const std::vector<layer_data> &data, const std::vector<float> &gin,
        const std::vector<float> &grad_output, const std::vector<std::vector<float>> &ghn,
        const std::vector<std::vector<float>> &gcn)
{
    const int64_t G = 3 * H;
    /* the reference on the rounded inputs */
    std::vector<layer_data> rdata(L);
    std::vector<std::vector<float>> rghn(L), rgcn(L);
    for (int l = 0; l < L; ++l) {
        rdata[l] = {rounded<T>(data[l].W), rounded<T>(data[l].bias), rounded<T>(data[l].h0),
                    rounded<T>(data[l].c0)};
        rghn[l] = rounded<T>(ghn[l]);
        rgcn[l] = rounded<T>(gcn[l]);
    }
    std::vector<std::vector<double>> out_r, cells_r, acts_r, dG_r, dh0_r;
    reference(T_, B, H, L, rdata, rounded<T>(gin), out_r, cells_r, acts_r);
    reference_backward(T_, B, H, L, rdata, cells_r, acts_r, rounded<T>(grad_output), rghn, rgcn,
                       dG_r, dh0_r);

    lltm_cuda_device dev = {};
    CHECK(cudaGetDevice(&dev.device));
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, dev.device));
    dev.major = prop.major, dev.minor = prop.minor, dev.sm_count = prop.multiProcessorCount;
    dev.smem_optin = (int)prop.sharedMemPerBlockOptin;
    dev.cooperative_launch = prop.cooperativeLaunch;
    const lltm_dtype dtype = sizeof(T) == 4 ? LLTM_FLOAT32 : LLTM_BFLOAT16;
    lltm_stack_plan plan;
    OK(lltm_stack_plan_cuda(&dev, dtype, L, T_, B, H, H, &plan));
    void *workspace = nullptr;
    if (plan.workspace_bytes)
        CHECK(cudaMalloc(&workspace, plan.workspace_bytes));

    T *gin_d = upload(as_t<T>(gin)), *go_d = upload(as_t<T>(grad_output));
    std::vector<lltm_stack_forward_layer> fl(L);
    std::vector<lltm_stack_backward_layer> bl(L);
    for (int l = 0; l < L; ++l) {
        T *W = upload(as_t<T>(data[l].W)), *cells = zeros<T>(T_ * B * H);
        T *gates = zeros<T>(T_ * B * G);
        /* the recurrence alone: no h_n, c_n (forward), h0, output, dW (backward) */
        fl[l] = {W, upload(as_t<T>(data[l].bias)), upload(as_t<T>(data[l].h0)),
                 upload(as_t<T>(data[l].c0)), gates, zeros<T>(T_ * B * H), cells, nullptr,
                 nullptr};
        bl[l] = {W, cells, gates, upload(as_t<T>(ghn[l])), upload(as_t<T>(gcn[l])),
                 zeros<T>(T_ * B * G), zeros<T>(G), zeros<T>(B * H), zeros<T>(B * H), nullptr,
                 nullptr, nullptr};
    }
    auto forward = [&] {
        CHECK(cudaMemcpyAsync(fl[0].gates, gin_d, T_ * B * G * sizeof(T),
                              cudaMemcpyDeviceToDevice));
        OK(lltm_stack_forward_persistent_cuda(&plan, T_, B, H, H, fl.data(), workspace, nullptr,
                                              0));
    };
    auto backward = [&] {
        OK(lltm_stack_backward_persistent_cuda(&plan, T_, B, H, H, go_d, bl.data(), workspace,
                                               nullptr, 0));
    };
    forward();
    backward();
    CHECK(cudaDeviceSynchronize());
    double ef = 0, eb = 0;
    for (int l = 0; l < L; ++l) {
        ef = std::max({ef, max_error((const T *)fl[l].output, out_r[l]),
                       max_error((const T *)fl[l].cells, cells_r[l])});
        eb = std::max({eb, max_error((const T *)bl[l].grad_gates, dG_r[l]),
                       max_error((const T *)bl[l].grad_h0, dh0_r[l])});
    }
    const bool good = ef < tolerance && eb < tolerance;
    std::printf("%s B=%lld H=%lld T=%lld L=%d: stack %lldx%lld blocks, max error forward %.2e, "
                "backward %.2e%s\n",
                name, (long long)B, (long long)H, (long long)T_, L, (long long)plan.forward.blocks,
                (long long)plan.forward.groups, ef, eb, good ? "" : "  MISMATCH: not timed");
    if (!good)
        return 1;
    const float stack_f = time_us(forward, 50), stack_b = time_us(backward, 50);

    /* the library's grid kernels once a layer: the top layer's (its dL/dh:
     * grad_output and its own recurrence, as in the stack; its forward
     * reading the stack's activations as input projection: the time, not
     * the values, is what is compared) */
    lltm_sequence_launch g = {};
    g.lanes = 32, g.values = 16, g.rows = 4, g.chunk = 4, g.blocks = (H + 7) / 8;
    g.groups = std::min<int64_t>((B + 3) / 4, dev.sm_count / g.blocks);
    void *work = nullptr;
    CHECK(cudaMalloc(&work, lltm_seq::half_state_bytes(B, H) + g.groups * G * sizeof(float)));
    const lltm_stack_forward_layer &top = fl[L - 1];
    const lltm_stack_backward_layer &topb = bl[L - 1];
    T *scratch_gates = zeros<T>(T_ * B * G), *scratch_out = zeros<T>(T_ * B * H),
      *scratch_cells = zeros<T>(T_ * B * H), *scratch_dg = zeros<T>(T_ * B * G),
      *scratch_db = zeros<T>(G), *scratch_dh0 = zeros<T>(B * H), *scratch_dc0 = zeros<T>(B * H);
    const lltm_seq::forward_args fa = {T_, B, H, H, top.h0, top.c0, top.weights, top.bias,
                                       scratch_gates, scratch_out, scratch_cells, work, nullptr};
    const lltm_seq::backward_args ba = {T_, B, H, H, go_d, topb.grad_h_n, topb.grad_c_n,
                                        topb.weights, topb.cells, topb.gates, scratch_dg,
                                        scratch_db, scratch_dh0, scratch_dc0, work, nullptr};
    const float layer_f = time_us([&] { OK((run_grid<T, 32, 16, 4, false>(g, fa, 0))); }, 50);
    const float layer_b = time_us([&] { OK((run_grid<T, 32, 16, 4, false>(g, ba, 0))); }, 50);
    std::printf("  forward:  stack %.1f us, one layer %.1f us (x%d %.1f)\n", stack_f, layer_f, L,
                L * layer_f);
    std::printf("  backward: stack %.1f us, one layer %.1f us (x%d %.1f)\n", stack_b, layer_b, L,
                L * layer_b);
    std::printf("  both:     stack / %d layers %.2f\n", L,
                (stack_f + stack_b) / (L * (layer_f + layer_b)));
    return 0;
}

} // namespace

int main(int argc, char **argv)
{
    const int64_t B = argc > 1 ? std::atoll(argv[1]) : 16, H = argc > 2 ? std::atoll(argv[2]) : 256,
                  T = argc > 3 ? std::atoll(argv[3]) : 100;
    const int L = argc > 4 ? std::atoi(argv[4]) : 3;
    if (B < 1 || H < 1 || H > 256 || T < 1 || L < 2 || L > LLTM_STACK_MAX_LAYERS) {
        std::fprintf(stderr, "B >= 1, H in 1..256, T >= 1, L in 2..%d\n", LLTM_STACK_MAX_LAYERS);
        return 2;
    }
    const int64_t G = 3 * H;
    std::mt19937 rng(1234);
    std::vector<layer_data> layers(L);
    for (int l = 0; l < L; ++l) {
        const int64_t K = 2 * H; /* layer 0 too: I = H here */
        layers[l].W = random_vector(G * K, 1.0f / std::sqrt((float)K), rng);
        layers[l].bias = random_vector(G, 0.5f, rng);
        layers[l].h0 = random_vector(B * H, 1, rng);
        layers[l].c0 = random_vector(B * H, 1, rng);
    }
    const std::vector<float> gin = random_vector(T * B * G, 1, rng);
    const std::vector<float> grad_output = random_vector(T * B * H, 1, rng);
    std::vector<std::vector<float>> ghn(L), gcn(L);
    for (int l = 0; l < L; ++l) {
        ghn[l] = random_vector(B * H, 1, rng);
        gcn[l] = random_vector(B * H, 1, rng);
    }
    int status = run<float>("float32", 1e-4, T, B, H, L, layers, gin, grad_output, ghn, gcn);
    status |= run<__nv_bfloat16>("bfloat16", 5e-2, T, B, H, L, layers, gin, grad_output, ghn, gcn);
    return status;
}
