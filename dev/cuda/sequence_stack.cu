/*
 * sequence_stack.cu - stacked layers in one persistent launch, forward and
 * backward, against the library's grid kernels run once a layer. Float32.
 *
 * L layers of H units, skewed in time: at global step s, layer l runs its
 * step t = s - l. Its inputs are h^l_{t-1} (its own state, written at step
 * s - 1) and h^{l-1}_t (layer l-1's output, also written at step s - 1),
 * so the layers of one global step are independent and share its grid
 * barrier: L layers take T + L - 1 steps of one launch instead of L launches
 * of T steps with a product between them. Block n owns the same units of
 * every layer and keeps, in registers, W_h of each layer and W_x of each
 * layer above the first (2L - 1 matrices of [3U, H]); layer 0's x W_x^T
 * comes in `gates` as in the library (one product over all steps), the
 * layers above form their input product in the step. Each step a block
 * stages the 2L - 1 state rows it needs at once (one L2 round trip), forms
 * all the products, reduces them in one pass of warp shuffles, and runs the
 * pointwise math of every layer. The backward runs skewed the other way
 * (stack_backward_kernel).
 *
 *   nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 -I../../csrc/core \
 *        sequence_stack.cu -o sequence_stack
 *   ./sequence_stack [B H T GROUPS]   (H <= 256; GROUPS: batch groups, 0 = one a chunk)
 *
 * Prints, each checked against a float64 CPU reference of the stack before
 * it is timed (CUDA events, median of 50 launches): the library's grid
 * forward and backward (32 lanes x 16 values, 4-row chunks) once a layer
 * (L launches; the products between them not counted), and the stacked
 * kernels (forward at L = 1 and L = 3, backward at L = 3) on several
 * layouts. Not here: the half types, variable lengths, the bias gradient
 * (a sum of dG over rows and steps), the weight gradients and layer 0's
 * dL/dx (products over all steps, as in the library).
 */
#include "lltm_cuda_sequence_grid.cuh"
#include "sequence_stack.cuh"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#define CHECK(call)                                                                          \
    do {                                                                                     \
        cudaError_t e_ = (call);                                                             \
        if (e_ != cudaSuccess) {                                                             \
            std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call,                \
                         cudaGetErrorString(e_));                                            \
            std::exit(1);                                                                    \
        }                                                                                    \
    } while (0)

namespace {

std::vector<float> random_vector(size_t n, float scale, std::mt19937 &rng)
{
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (auto &x : v)
        x = d(rng);
    return v;
}

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
        const int64_t K = l == 0 ? H : 2 * H;
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
                                acc += W[(q * H + u) * K + H + k] * out[l - 1][t * B * H + b * H + k];
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
        const int64_t K = l == 0 ? H : 2 * H;
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

double max_error(const std::vector<float> &got, const std::vector<double> &want)
{
    double e = 0, scale = 1e-30;
    for (double w : want)
        scale = std::max(scale, std::fabs(w));
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

template <typename F> float time_ms(F run, int reps)
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
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
}

/* one stacked launch of L layers on the KS x KR layout in CH-row chunks */
template <int KS, int KR, int CH, int L>
cudaError_t run_stack(int64_t T, int64_t B, int64_t H, int64_t groups, const stack_arrays &a,
                      int64_t *blocks_out)
{
    auto kernel = stack_forward_kernel<KS, KR, CH, L>;
    const size_t smem = (size_t)(2 * L - 1) * CH * KS * KR * sizeof(float);
    if (smem > 48 * 1024)
        CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    int per_sm = 0, sms = 0, dev = 0;
    CHECK(cudaGetDevice(&dev));
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, NT, smem));
    const int64_t unit_blocks = (H + NT / KS - 1) / (NT / KS), chunks = (B + CH - 1) / CH;
    int64_t g = groups > 0 ? std::min(groups, chunks) : chunks;
    while (g > 1 && unit_blocks * g > (int64_t)per_sm * sms)
        --g;
    *blocks_out = unit_blocks * g;
    void *args[] = {(void *)&T, (void *)&B, (void *)&H, (void *)&a};
    return cudaLaunchCooperativeKernel((const void *)kernel, dim3((unsigned)(unit_blocks * g)),
                                       dim3(NT), args, smem, 0);
}

/* one stacked backward launch */
template <int KS, int KR, int CH, int L>
cudaError_t run_stack_backward(int64_t T, int64_t B, int64_t H, int64_t groups,
                               const stack_grads &g, int64_t *blocks_out)
{
    auto kernel = stack_backward_kernel<KS, KR, CH, L>;
    constexpr int U = NT / KS;
    const size_t smem = (size_t)L * CH * (KS * 3 * KR + KS * U + U) * sizeof(float);
    if (smem > 48 * 1024)
        CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    int per_sm = 0, sms = 0, dev = 0;
    CHECK(cudaGetDevice(&dev));
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, NT, smem));
    const int64_t unit_blocks = (H + U - 1) / U, chunks = (B + CH - 1) / CH;
    int64_t gr = groups > 0 ? std::min(groups, chunks) : chunks;
    while (gr > 1 && unit_blocks * gr > (int64_t)per_sm * sms)
        --gr;
    *blocks_out = unit_blocks * gr;
    void *args[] = {(void *)&T, (void *)&B, (void *)&H, (void *)&g};
    return cudaLaunchCooperativeKernel((const void *)kernel, dim3((unsigned)(unit_blocks * gr)),
                                       dim3(NT), args, smem, 0);
}

} // namespace

int main(int argc, char **argv)
{
    const int64_t B = argc > 1 ? std::atoll(argv[1]) : 16, H = argc > 2 ? std::atoll(argv[2]) : 256,
                  T = argc > 3 ? std::atoll(argv[3]) : 100, groups = argc > 4 ? std::atoll(argv[4]) : 0;
    if (B < 1 || H < 1 || H > 256 || T < 1) {
        std::fprintf(stderr, "B >= 1, H in 1..256, T >= 1\n");
        return 2;
    }
    constexpr int L = 3;
    const int64_t G = 3 * H;
    std::mt19937 rng(1234);
    std::vector<layer_data> layers(L);
    for (int l = 0; l < L; ++l) {
        const int64_t K = l == 0 ? H : 2 * H;
        layers[l].W = random_vector(G * K, 1.0f / std::sqrt((float)K), rng);
        layers[l].bias = random_vector(G, 0.5f, rng);
        layers[l].h0 = random_vector(B * H, 1, rng);
        layers[l].c0 = random_vector(B * H, 1, rng);
    }
    const std::vector<float> gin = random_vector(T * B * G, 1, rng);
    std::vector<std::vector<double>> ref_out, ref_cells, ref_acts, ref_dG, ref_dh0;
    reference(T, B, H, L, layers, gin, ref_out, ref_cells, ref_acts);
    const std::vector<float> grad_output = random_vector(T * B * H, 1, rng);
    std::vector<std::vector<float>> ghn(L), gcn(L);
    for (int l = 0; l < L; ++l) {
        ghn[l] = random_vector(B * H, 1, rng);
        gcn[l] = random_vector(B * H, 1, rng);
    }
    reference_backward(T, B, H, L, layers, ref_cells, ref_acts, grad_output, ghn, gcn, ref_dG,
                       ref_dh0);

    stack_arrays a = {};
    float *gin_d = upload(gin);
    for (int l = 0; l < L; ++l) {
        a.weights[l] = upload(layers[l].W);
        a.bias[l] = upload(layers[l].bias);
        a.h0[l] = upload(layers[l].h0);
        a.c0[l] = upload(layers[l].c0);
        a.gates[l] = upload(std::vector<float>(T * B * G));
        a.output[l] = upload(std::vector<float>(T * B * H));
        a.cells[l] = upload(std::vector<float>(T * B * H));
    }
    auto reset = [&] {
        CHECK(cudaMemcpyAsync(a.gates[0], gin_d, T * B * G * sizeof(float), cudaMemcpyDeviceToDevice));
    };
    auto check = [&](const char *what, int layers_run) {
        CHECK(cudaDeviceSynchronize());
        double e = 0;
        for (int l = 0; l < layers_run; ++l)
            e = std::max({e, max_error(download(a.output[l], T * B * H), ref_out[l]),
                          max_error(download(a.cells[l], T * B * H), ref_cells[l])});
        std::printf("%-44s max error %.2e%s\n", what, e, e < 1e-4 ? "" : "  MISMATCH");
        return e < 1e-4;
    };
    int64_t blocks = 0;
    std::printf("B=%lld H=%lld T=%lld\n", (long long)B, (long long)H, (long long)T);

    /* the library's grid forward, layer 0 only (its input product in gates);
     * timed once a layer: L x this is the layers' recurrences run one after
     * another, without the products between them */
    {
        lltm_sequence_launch l = {};
        l.lanes = 32, l.values = 16, l.rows = 4, l.chunk = 4;
        l.blocks = (H + 7) / 8;
        l.groups = std::min<int64_t>((B + 3) / 4, 132 / l.blocks);
        const lltm_seq::forward_args fa = {T, B, 0, H, a.h0[0], a.c0[0], a.weights[0], a.bias[0],
                                           a.gates[0], a.output[0], a.cells[0], nullptr, nullptr};
        auto run = [&] {
            reset();
            if (run_grid_forward<float, 32, 16, 4>(l, fa, 0) != LLTM_OK)
                std::exit(1);
        };
        run();
        if (check("library grid 32x16, 4-row chunks, 1 layer", 1)) {
            const float ms = time_ms(run, 50);
            std::printf("  %lld blocks: %.1f us a layer (%.2f us a step); x%d layers %.1f us\n",
                        (long long)(l.blocks * l.groups), ms * 1e3, ms * 1e3 / T, L, L * ms * 1e3);
        }
    }
#define STACK(KS, KR, CH, LL, NAME)                                                          \
    {                                                                                        \
        auto run = [&] {                                                                     \
            reset();                                                                         \
            CHECK((run_stack<KS, KR, CH, LL>(T, B, H, groups, a, &blocks)));                 \
        };                                                                                   \
        run();                                                                               \
        if (check(NAME, LL)) {                                                               \
            const float ms = time_ms(run, 50);                                               \
            std::printf("  %lld blocks: %.1f us (%.2f us a global step)\n", (long long)blocks, \
                        ms * 1e3, ms * 1e3 / (T + LL - 1));                                  \
        }                                                                                    \
    }
    if (H <= 128) {
        STACK(16, 8, 4, 1, "stack 16x8, 4-row chunks, L=1")
        STACK(16, 8, 4, 3, "stack 16x8, 4-row chunks, L=3")
        STACK(32, 4, 4, 3, "stack 32x4, 4-row chunks, L=3")
    }
    STACK(32, 8, 4, 1, "stack 32x8, 4-row chunks, L=1")
    STACK(32, 8, 4, 3, "stack 32x8, 4-row chunks, L=3")
    STACK(16, 16, 4, 3, "stack 16x16, 4-row chunks, L=3")
    /* the backward, on the forward's activations and cells of all L layers
     * (the last stacked forward above left them) */
    stack_grads g = {};
    float *go_d = upload(grad_output);
    g.grad_output = go_d;
    for (int l = 0; l < L; ++l) {
        g.weights[l] = a.weights[l];
        g.gates[l] = a.gates[l];
        g.cells[l] = a.cells[l];
        g.grad_h_n[l] = upload(ghn[l]);
        g.grad_c_n[l] = upload(gcn[l]);
        g.grad_gates[l] = upload(std::vector<float>(T * B * G));
        g.grad_h0[l] = upload(std::vector<float>(B * H));
        g.grad_c0[l] = upload(std::vector<float>(B * H));
    }
    auto check_backward = [&](const char *what, int first_layer) {
        CHECK(cudaDeviceSynchronize());
        double e = 0;
        for (int l = first_layer; l < L; ++l) {
            e = std::max(e, max_error(download(g.grad_gates[l], T * B * G), ref_dG[l]));
            if (first_layer == 0)
                e = std::max(e, max_error(download(g.grad_h0[l], B * H), ref_dh0[l]));
        }
        std::printf("%-44s max error %.2e%s\n", what, e, e < 1e-4 ? "" : "  MISMATCH");
        return e < 1e-4;
    };
    {
        /* the library's grid backward of the top layer (its dL/dh: grad_output
         * and its own recurrence, as in the stack): L x this is the layers'
         * backward recurrences one after another, without the products
         * (dX) between them */
        lltm_sequence_launch l = {};
        l.lanes = 32, l.values = 16, l.rows = 4, l.chunk = 4;
        l.blocks = (H + 7) / 8;
        l.groups = std::min<int64_t>((B + 3) / 4, 132 / l.blocks);
        float *bias_d = upload(std::vector<float>(G)), *work = upload(std::vector<float>(l.groups * G));
        const lltm_seq::backward_args ba = {T, B, H, H, go_d, g.grad_h_n[L - 1], g.grad_c_n[L - 1],
                                            g.weights[L - 1], g.cells[L - 1], g.gates[L - 1],
                                            g.grad_gates[L - 1], bias_d, g.grad_h0[L - 1],
                                            g.grad_c0[L - 1], work, nullptr};
        auto run = [&] {
            if (run_grid_backward<float, 32, 16, 4>(l, ba, 0) != LLTM_OK)
                std::exit(1);
        };
        run();
        if (check_backward("library grid backward, top layer", L - 1)) {
            const float ms = time_ms(run, 50);
            std::printf("  %lld blocks: %.1f us a layer (%.2f us a step); x%d layers %.1f us\n",
                        (long long)(l.blocks * l.groups), ms * 1e3, ms * 1e3 / T, L, L * ms * 1e3);
        }
    }
#define STACK_BACKWARD(KS, KR, CH, NAME)                                                     \
    {                                                                                        \
        auto run = [&] { CHECK((run_stack_backward<KS, KR, CH, L>(T, B, H, groups, g, &blocks))); }; \
        run();                                                                               \
        if (check_backward(NAME, 0)) {                                                       \
            const float ms = time_ms(run, 50);                                               \
            std::printf("  %lld blocks: %.1f us (%.2f us a global step)\n", (long long)blocks, \
                        ms * 1e3, ms * 1e3 / (T + L - 1));                                   \
        }                                                                                    \
    }
    if (H <= 128) {
        STACK_BACKWARD(16, 8, 4, "stack backward 16x8, 4-row chunks, L=3")
        STACK_BACKWARD(32, 4, 4, "stack backward 32x4, 4-row chunks, L=3")
    }
    STACK_BACKWARD(32, 8, 4, "stack backward 32x8, 4-row chunks, L=3")
    return 0;
}
