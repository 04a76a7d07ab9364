/*
 * test_sequence.c - unit tests of the CPU sequence core
 * (lltm_sequence_forward_cpu / lltm_sequence_backward_cpu) against a naive C
 * reference of the whole layer over T steps, forward and backward, written
 * straight from the formulas in long double; the matrix products through a
 * naive gemm callback. Built with AddressSanitizer and UndefinedBehavior-
 * Sanitizer by `make test-c`.
 *
 * Each case draws fresh random inputs, poisons every output and the
 * workspace with NaN (so an unwritten or uninitialised element fails), and
 * runs serially and through a parallel-for of small uneven chunks. Prints
 * "N passed, N failed" last; exits nonzero on any failure.
 */
#include "test_util.h"
#include "../../csrc/core/lltm_cpu_gemm.h"

#include <float.h>
#include <time.h>

/* The naive gemm: each sum in long double, stored in the dtype. */
typedef struct gemm_log {
    int calls;
    int fail_at;    /* fail the call with this index (0-based); -1: never */
    long long rows; /* M summed over the calls */
} gemm_log;

static void put(void *p, size_t k, lltm_dtype dt, double v)
{
    switch (dt) {
    case LLTM_FLOAT32: ((float *)p)[k] = (float)v; break;
    case LLTM_FLOAT64: ((double *)p)[k] = v; break;
    case LLTM_FLOAT16: ((uint16_t *)p)[k] = lltm_f32_to_f16((float)v); break;
    case LLTM_BFLOAT16: ((uint16_t *)p)[k] = lltm_f32_to_bf16((float)v); break;
    }
}

static int naive_gemm(void *ctx, lltm_dtype dtype, int64_t M, int64_t N, int64_t K,
                      const void *a, int64_t a_rs, int64_t a_cs, const void *b, int64_t b_rs,
                      int64_t b_cs, void *c, int64_t ldc)
{
    gemm_log *log = (gemm_log *)ctx;
    if (log->calls++ == log->fail_at)
        return 1;
    log->rows += M;
    if (M < 1 || N < 1 || K < 1 || ldc < N)
        return 2; /* the contract: the core never asks for an empty product */
    for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
            real sum = 0;
            for (int64_t k = 0; k < K; ++k)
                sum += (real)at(a, (size_t)(m * a_rs + k * a_cs), dtype) *
                       at(b, (size_t)(k * b_rs + n * b_cs), dtype);
            put(c, (size_t)(m * ldc + n), dtype, (double)sum);
        }
    return 0;
}

/* The whole layer in long double: forward, then backward from the
 * reference's own forward. Arrays as in lltm.h, in double. */
typedef struct layer {
    long long T, B, I, H;
    double *x, *W, *b, *h0, *c0;                 /* inputs */
    double *out, *h_n, *c_n, *cells, *gates;     /* forward */
    double *g_out, *g_hn, *g_cn;                 /* upstream gradients */
    double *d_x, *d_W, *d_b, *d_h0, *d_c0;       /* backward */
    const int64_t *len; /* row lengths, or NULL: every row T steps */
} layer;

static void reference_layer(layer *L)
{
    const long long T = L->T, B = L->B, I = L->I, H = L->H, G = 3 * H, K = I + H;
    real *h = calloc((size_t)(B * H) + 1, sizeof(real)), *c = calloc((size_t)(B * H) + 1, sizeof(real));
    real *dh = calloc((size_t)(B * H) + 1, sizeof(real)), *dc = calloc((size_t)(B * H) + 1, sizeof(real));
    real *dg = calloc((size_t)(B * G) + 1, sizeof(real));
    real *dW = calloc((size_t)(G * K) + 1, sizeof(real)), *db = calloc((size_t)G + 1, sizeof(real));
    if (!h || !c || !dh || !dc || !dg || !dW || !db) { perror("calloc"); exit(2); }
    for (long long k = 0; k < B * H; ++k) h[k] = L->h0[k], c[k] = L->c0[k];
    for (long long t = 0; t < T; ++t) {
        for (long long r = 0; r < B; ++r) {
            real pre[3];
            const int live = t < (L->len ? L->len[r] : T); /* else the row has stopped */
            for (long long u = 0; u < H; ++u) {
                if (!live) { /* state kept; output and gates 0 */
                    const long long s = (t * B + r) * H + u, a = (t * B + r) * G;
                    L->cells[s] = (double)c[r * H + u];
                    L->gates[a + u] = L->gates[a + H + u] = L->gates[a + 2 * H + u] = 0;
                    L->out[s] = 0;
                    continue;
                }
                for (int q = 0; q < 3; ++q) {
                    const long long g = q * H + u;
                    real s = L->b[g];
                    for (long long j = 0; j < H; ++j) s += (real)L->W[g * K + j] * h[r * H + j];
                    for (long long j = 0; j < I; ++j)
                        s += (real)L->W[g * K + H + j] * L->x[(t * B + r) * I + j];
                    pre[q] = s;
                }
                const real i = 1 / (1 + expl(-pre[0])), o = 1 / (1 + expl(-pre[1]));
                const real z = pre[2] > 0 ? pre[2] : expm1l(pre[2]);
                const long long s = (t * B + r) * H + u;
                c[r * H + u] += i * z;
                L->cells[s] = (double)c[r * H + u];
                L->gates[(t * B + r) * G + u] = (double)i;
                L->gates[(t * B + r) * G + H + u] = (double)o;
                L->gates[(t * B + r) * G + 2 * H + u] = (double)z;
                L->out[s] = (double)(tanhl(c[r * H + u]) * o);
            }
        }
        /* the step's h only after every row used h_{t-1} (a stopped row keeps its h) */
        for (long long k = 0; k < B * H; ++k)
            if (t < (L->len ? L->len[k / H] : T)) h[k] = L->out[t * B * H + k];
    }
    for (long long k = 0; k < B * H; ++k) {
        L->h_n[k] = (double)h[k];
        L->c_n[k] = (double)c[k];
        dh[k] = L->g_hn[k];
        dc[k] = L->g_cn[k];
    }
    for (long long t = T - 1; t >= 0; --t) {
        for (long long r = 0; r < B; ++r)
            for (long long u = 0; u < H; ++u) {
                const long long s = (t * B + r) * H + u, a = (t * B + r) * G;
                if (t >= (L->len ? L->len[r] : T)) { /* stopped: dL/dh, dL/dc pass through */
                    dg[r * G + u] = dg[r * G + H + u] = dg[r * G + 2 * H + u] = 0;
                    continue;
                }
                const real i = L->gates[a + u], o = L->gates[a + H + u], z = L->gates[a + 2 * H + u];
                const real th = tanhl((real)L->cells[s]), gh = L->g_out[s] + dh[r * H + u];
                const real dcell = dc[r * H + u] + gh * o * (1 - th * th);
                dg[r * G + u] = dcell * z * i * (1 - i);
                dg[r * G + H + u] = gh * th * o * (1 - o);
                dg[r * G + 2 * H + u] = dcell * i * (z > 0 ? 1 : z + 1);
                dc[r * H + u] = dcell;
            }
        for (long long r = 0; r < B; ++r) {
            const double *h_prev = t == 0 ? L->h0 + r * H : L->out + ((t - 1) * B + r) * H;
            for (long long g = 0; g < G; ++g) {
                db[g] += dg[r * G + g];
                for (long long j = 0; j < H; ++j) dW[g * K + j] += dg[r * G + g] * h_prev[j];
                for (long long j = 0; j < I; ++j)
                    dW[g * K + H + j] += dg[r * G + g] * L->x[(t * B + r) * I + j];
            }
            for (long long j = 0; j < H && t < (L->len ? L->len[r] : T); ++j) {
                real s = 0;
                for (long long g = 0; g < G; ++g) s += dg[r * G + g] * L->W[g * K + j];
                dh[r * H + j] = s;
            }
            for (long long j = 0; j < I; ++j) {
                real s = 0;
                for (long long g = 0; g < G; ++g) s += dg[r * G + g] * L->W[g * K + H + j];
                L->d_x[(t * B + r) * I + j] = (double)s;
            }
        }
    }
    for (long long k = 0; k < B * H; ++k) L->d_h0[k] = (double)dh[k], L->d_c0[k] = (double)dc[k];
    for (long long k = 0; k < G * K; ++k) L->d_W[k] = (double)dW[k];
    for (long long k = 0; k < G; ++k) L->d_b[k] = (double)db[k];
    free(h), free(c), free(dh), free(dc), free(dg), free(dW), free(db);
}

/* got within the dtype's tolerance of want: relative, plus absolute scaled
 * by max(1, max|want|) (sums over many rows round with their terms), and
 * every element finite. */
static int matches(const void *got, const double *want, size_t n, lltm_dtype dt)
{
    double tol = 1e-10;
    switch (dt) {
    case LLTM_FLOAT64: tol = 1e-10; break;
    case LLTM_FLOAT32: tol = 1e-4; break;
    case LLTM_FLOAT16: tol = 1e-2; break;
    case LLTM_BFLOAT16: tol = 4e-2; break;
    }
    double scale = 1;
    for (size_t k = 0; k < n; ++k) scale = fmax(scale, fabs(want[k]));
    for (size_t k = 0; k < n; ++k) {
        const double v = at(got, k, dt);
        if (!isfinite(v) || fabs(v - want[k]) > tol * fabs(want[k]) + tol * scale)
            return 0;
    }
    return 1;
}

/* float32 results of two computations of the same math: within 8 ulp of
 * the larger, or 2e-5 where c_t cancels (c up to ~80 here, its ulp ~1e-5),
 * or both NaN / the same infinity */
static int close_f32(float got, float want)
{
    if (isnan(want) || isinf(want))
        return isnan(want) ? isnan(got) : got == want;
    return fabsf(got - want) <= 8 * FLT_EPSILON * fmaxf(fabsf(got), fabsf(want)) + 2e-5f;
}

static double *array_of(size_t n)
{
    double *p = malloc(n * sizeof(double) + 1);
    if (!p) { perror("malloc"); exit(2); }
    return p;
}

/* Round the double inputs to the dtype, in place: both sides then see the
 * same values. */
static void *rounded(double *x, size_t n, lltm_dtype dt)
{
    void *p = to_dtype(x, n, dt);
    for (size_t k = 0; k < n; ++k) x[k] = at(p, k, dt);
    return p;
}

/* Workspace poisoned with all-ones bytes: NaN in every dtype. */
static void *poisoned_bytes(size_t n)
{
    void *p = malloc(n + 1);
    if (!p) { perror("malloc"); exit(2); }
    memset(p, 0xFF, n + 1);
    return p;
}

/* The backward with only some gradients wanted (the others NULL), for all
 * 32 choices: each wanted one bitwise equal to the full backward's `full`
 * (grad_input, grad_weights, grad_bias, grad_h0, grad_c0), the products of
 * the others not run. */
static void test_wanted_subsets(long long T, long long B, long long I, long long H,
                                long long steps, lltm_dtype dt, lltm_parallel_for pfor,
                                const lltm_sequence_backward_tensors *all, void *const full[5])
{
    const char *name = dtype_name(dt);
    const size_t e = lltm_dtype_size(dt);
    const size_t n[5] = {(size_t)(T * B * I), (size_t)(3 * H * (I + H)), (size_t)(3 * H),
                         (size_t)(B * H), (size_t)(B * H)};
    const size_t ws = lltm_sequence_backward_workspace_cpu(dt, T, B, I, H);
    for (int mask = 0; mask < 32; ++mask) {
        void *got[5];
        for (int k = 0; k < 5; ++k)
            got[k] = mask & (1 << k) ? poisoned(n[k], dt) : NULL;
        lltm_sequence_backward_tensors t = *all;
        t.grad_input = got[0], t.grad_weights = got[1], t.grad_bias = got[2];
        t.grad_h0 = got[3], t.grad_c0 = got[4];
        /* odd masks also take dG out (grad_gates), which the dW products
         * then read: grad_weights still bitwise the full backward's */
        const size_t n_dG = (size_t)(T * B * 3 * H);
        void *dG = mask & 1 ? poisoned(n_dG, dt) : NULL;
        t.grad_gates = dG;
        void *work = poisoned_bytes(ws);
        gemm_log log = {0, -1, 0};
        const int status = lltm_sequence_backward_cpu(dt, T, B, I, H, &t, work, naive_gemm, &log,
                                                      pfor);
        check(status == LLTM_OK, "backward status, some gradients", B, H, name);
        int same = 1;
        for (int k = 0; k < 5; ++k)
            if (got[k] != NULL && n[k] > 0 && memcmp(got[k], full[k], n[k] * e) != 0)
                same = 0;
        check(same, "wanted gradients bitwise equal to the full backward's", B, H, name);
        int written = 1;
        for (size_t k = 0; dG != NULL && k < n_dG; ++k)
            written &= !isnan(at(dG, k, dt));
        check(written, "grad_gates written at every step", B, H, name);
        free(dG);
        /* products through the callback: one recurrent one a step that runs
         * (the first step's only for grad_h0; steps: T, or up to the longest
         * row), dW (one product over [h | x]) for grad_weights, dx (if I > 0) for
         * grad_input; float32 runs them all on the core's kernel (AVX2 and up) */
        const long long want_calls =
            T * B == 0 || (dt == LLTM_FLOAT32 && lltm_cpu_isa() >= LLTM_ISA_AVX2)
                ? 0
                : steps - 1 + !!(mask & 8) + !!(mask & 2) +
                      (mask & 1 ? (I > 0) : 0);
        check(log.calls == want_calls, "products run for some gradients", B, H, name);
        for (int k = 0; k < 5; ++k)
            free(got[k]);
        free(work);
    }
}


/* with_lengths: rows of random lengths in [1, T] (needs T >= 1); 2: sorted
 * longest first, as a packed batch is (the per-step products then leave out
 * the rows that have stopped) */
static void test_case(long long T, long long B, long long I, long long H, lltm_dtype dt,
                      lltm_parallel_for pfor, int with_lengths)
{
    const char *name = with_lengths == 2 ? "sorted lengths" : with_lengths ? "lengths"
                                                                           : dtype_name(dt);
    const long long G = 3 * H, K = I + H;
    const size_t nx = (size_t)(T * B * I), nW = (size_t)(G * K), nS = (size_t)(B * H);
    const size_t nTH = (size_t)(T * B * H), nTG = (size_t)(T * B * G);
    layer L = {T, B, I, H,
               random_array(nx, 1.0), random_array(nW, 2.0 / sqrt((double)K)),
               random_array((size_t)G, 1.0), random_array(nS, 1.0), random_array(nS, 1.0),
               array_of(nTH), array_of(nS), array_of(nS), array_of(nTH), array_of(nTG),
               random_array(nTH, 1.0), random_array(nS, 1.0), random_array(nS, 1.0),
               array_of(nx), array_of(nW), array_of((size_t)G), array_of(nS), array_of(nS),
               NULL};
    int64_t *len = malloc((size_t)B * sizeof(int64_t) + 1), steps = with_lengths ? 0 : T;
    if (!len) { perror("malloc"); exit(2); }
    for (long long r = 0; r < B && with_lengths; ++r) {
        len[r] = 1 + rand() % T;
        steps = len[r] > steps ? len[r] : steps;
    }
    for (long long r = 1; r < B && with_lengths == 2; ++r) /* insertion sort, descending */
        for (long long q = r; q > 0 && len[q - 1] < len[q]; --q) {
            const int64_t l = len[q];
            len[q] = len[q - 1];
            len[q - 1] = l;
        }
    L.len = with_lengths ? len : NULL;
    void *x = rounded(L.x, nx, dt), *W = rounded(L.W, nW, dt), *b = rounded(L.b, (size_t)G, dt);
    void *h0 = rounded(L.h0, nS, dt), *c0 = rounded(L.c0, nS, dt);
    void *g_out = rounded(L.g_out, nTH, dt), *g_hn = rounded(L.g_hn, nS, dt);
    void *g_cn = rounded(L.g_cn, nS, dt);
    reference_layer(&L);

    void *out = poisoned(nTH, dt), *h_n = poisoned(nS, dt), *c_n = poisoned(nS, dt);
    void *cells = poisoned(nTH, dt), *gates = poisoned(nTG, dt);
    const size_t ws_f = lltm_sequence_forward_workspace_cpu(dt, I, B, H);
    void *work_f = poisoned_bytes(ws_f);
    gemm_log log = {0, -1, 0};
    const lltm_sequence_forward_tensors fwd = {x,   W,   b,     h0,    c0,   out,
                                               h_n, c_n, cells, gates, L.len};
    int status = lltm_sequence_forward_cpu(dt, T, B, I, H, &fwd, work_f, naive_gemm, &log, pfor);
    check(status == LLTM_OK && ws_f > 0, "forward status", B, H, name);
    check(matches(out, L.out, nTH, dt), "forward output", B, H, name);
    check(matches(h_n, L.h_n, nS, dt), "forward h_n", B, H, name);
    check(matches(c_n, L.c_n, nS, dt), "forward c_n", B, H, name);
    check(matches(cells, L.cells, nTH, dt), "forward cells", B, H, name);
    check(matches(gates, L.gates, nTG, dt), "forward gates", B, H, name);
    /* h_n / c_n are the last step's state (h0, c0 when T == 0) */
    if (nS > 0 && !with_lengths) {
        const size_t e = lltm_dtype_size(dt);
        check(memcmp(h_n, T > 0 ? (char *)out + (size_t)(T - 1) * nS * e : h0, nS * e) == 0,
              "h_n is h_T", B, H, name);
        check(memcmp(c_n, T > 0 ? (char *)cells + (size_t)(T - 1) * nS * e : c0, nS * e) == 0,
              "c_n is c_T", B, H, name);
    }

    /* inference (cells, gates NULL): the same output, h_n, c_n, bit for bit,
     * the input projection a chunk of steps at a time in the workspace */
    void *i_out = poisoned(nTH, dt), *i_h_n = poisoned(nS, dt), *i_c_n = poisoned(nS, dt);
    const size_t ws_i = lltm_sequence_infer_workspace_cpu(dt, T, I, B, H);
    void *work_i = poisoned_bytes(ws_i);
    gemm_log i_log = {0, -1, 0};
    const lltm_sequence_forward_tensors inf = {x, W, b, h0, c0, i_out, i_h_n, i_c_n, NULL, NULL,
                                               L.len};
    status = lltm_sequence_forward_cpu(dt, T, B, I, H, &inf, work_i, naive_gemm, &i_log, pfor);
    const size_t e = lltm_dtype_size(dt);
    check(status == LLTM_OK && ws_i >= ws_f, "inference status", B, H, name);
    check(memcmp(i_out, out, nTH * e) == 0 && memcmp(i_h_n, h_n, nS * e) == 0 &&
              memcmp(i_c_n, c_n, nS * e) == 0,
          "inference = forward", B, H, name);
    const lltm_sequence_forward_tensors half = {x, W, b, h0, c0, i_out, i_h_n, i_c_n, cells,
                                                NULL, L.len};
    check(lltm_sequence_forward_cpu(dt, T, B, I, H, &half, work_i, naive_gemm, &i_log, pfor) ==
              (T * B > 0 ? LLTM_ERR_ARGUMENT : LLTM_OK),
          "cells without gates refused", B, H, name);
    free(i_out), free(i_h_n), free(i_c_n), free(work_i);

    void *d_x = poisoned(nx, dt), *d_W = poisoned(nW, dt), *d_b = poisoned((size_t)G, dt);
    void *d_h0 = poisoned(nS, dt), *d_c0 = poisoned(nS, dt);
    const size_t ws_b = lltm_sequence_backward_workspace_cpu(dt, T, B, I, H);
    void *work_b = poisoned_bytes(ws_b);
    const lltm_sequence_backward_tensors bwd = {g_out, g_hn, g_cn, x,    W,    h0,
                                                out,   cells, gates, d_x, d_W, d_b,
                                                d_h0,  d_c0, L.len, NULL};
    status = lltm_sequence_backward_cpu(dt, T, B, I, H, &bwd, work_b, naive_gemm, &log, pfor);
    check(status == LLTM_OK && ws_b > 0, "backward status", B, H, name);
    check(matches(d_x, L.d_x, nx, dt), "backward grad_input", B, H, name);
    check(matches(d_W, L.d_W, nW, dt), "backward grad_weights", B, H, name);
    check(matches(d_b, L.d_b, (size_t)G, dt), "backward grad_bias", B, H, name);
    check(matches(d_h0, L.d_h0, nS, dt), "backward grad_h0", B, H, name);
    check(matches(d_c0, L.d_c0, nS, dt), "backward grad_c0", B, H, name);
    /* products through the callback, when T*B > 0: x W_x^T (if I > 0) and
     * one recurrent one a step forward; one a step, dW, and dx (if I > 0)
     * backward; the steps: T, or up to the longest row. float32:
     * none on AVX2 and up (all on the core's kernel). */
    const int own = dt == LLTM_FLOAT32 && lltm_cpu_isa() >= LLTM_ISA_AVX2;
    /* x W_x^T a chunk of steps at a time: ~512 KB of gates, at least 256
     * rows (lltm_sequence_cpu.c) */
    const long long fit = (512 << 10) / (B * G * (long long)lltm_dtype_size(dt) + !B);
    const long long rows = B > 0 ? (256 + B - 1) / B : T, want = fit > rows ? fit : rows;
    const long long chunk = want < T ? (want > 1 ? want : 1) : (T > 1 ? T : 1);
    const long long projections = (steps + chunk - 1) / chunk;
    const long long want_calls = T * B == 0 || own ? 0
                                                   : (I > 0) * projections + steps + steps + 1 +
                                                         (I > 0);
    check(log.calls == want_calls, "number of matrix products", B, H, name);
    /* their rows: the per-step products take rows 0 .. m_t - 1, m_t = 1 + the
     * last row still running at step t (B without lengths); x W_x^T and dx
     * take steps*B, dW G (its M) */
    long long step_rows = 0;
    for (long long t = 0; t < steps; ++t) {
        long long m = B;
        while (L.len && m > 0 && L.len[m - 1] <= t)
            --m;
        step_rows += m;
    }
    const long long want_rows = T * B == 0 || own ? 0
                                           : 2 * step_rows + G + (I > 0) * 2 * steps * B;
    check(log.rows == want_rows, "rows of the matrix products", B, H, name);
    void *const full[5] = {d_x, d_W, d_b, d_h0, d_c0};
    if (pfor == lltm_serial_for)
        test_wanted_subsets(T, B, I, H, steps, dt, pfor, &bwd, full);

    double *owned[] = {L.x, L.W, L.b, L.h0, L.c0, L.out, L.h_n, L.c_n, L.cells, L.gates,
                       L.g_out, L.g_hn, L.g_cn, L.d_x, L.d_W, L.d_b, L.d_h0, L.d_c0};
    for (size_t k = 0; k < sizeof owned / sizeof owned[0]; ++k) free(owned[k]);
    void *more[] = {x, W, b, h0, c0, g_out, g_hn, g_cn, out, h_n, c_n, cells, gates, work_f,
                    d_x, d_W, d_b, d_h0, d_c0, work_b, len};
    for (size_t k = 0; k < sizeof more / sizeof more[0]; ++k) free(more[k]);
}

/* Failures are reported, never ignored: the callbacks', bad sizes, dtypes
 * and workspaces. */
static void test_errors(void)
{
    const long long T = 3, B = 2, I = 4, H = 5;
    double *buf = calloc(1024, sizeof(double));
    if (!buf) { perror("calloc"); exit(2); }
    for (int k = 0; k < 1024; ++k) buf[k] = 0.25 * (k % 7) - 0.5;
    const size_t ws_f = lltm_sequence_forward_workspace_cpu(LLTM_FLOAT64, I, B, H);
    const size_t ws_b = lltm_sequence_backward_workspace_cpu(LLTM_FLOAT64, T, B, I, H);
    void *work = calloc(ws_f > ws_b ? ws_f : ws_b, 1);
    if (!work) { perror("calloc"); exit(2); }
    /* inputs read from buf, outputs written after it, apart */
    const lltm_sequence_forward_tensors fwd = {buf, buf, buf, buf, buf, buf + 100, buf + 200,
                                               buf + 220, buf + 240, buf + 300, NULL};
    const lltm_sequence_backward_tensors bwd = {buf, buf, buf, buf, buf, buf, buf, buf, buf,
                                                buf + 400, buf + 500, buf + 700, buf + 720,
                                                buf + 740, NULL, NULL};
    /* every product of both directions fails in turn: the failure comes back */
    for (int fail_at = 0; fail_at < 1 + (int)T; ++fail_at) {
        gemm_log log = {0, fail_at, 0};
        check(lltm_sequence_forward_cpu(LLTM_FLOAT64, T, B, I, H, &fwd, work, naive_gemm, &log,
                                        lltm_serial_for) == LLTM_ERR_GEMM,
              "forward reports a failed product", B, H, "float64");
    }
    for (int fail_at = 0; fail_at < (int)T + 2; ++fail_at) {
        gemm_log log = {0, fail_at, 0};
        check(lltm_sequence_backward_cpu(LLTM_FLOAT64, T, B, I, H, &bwd, work, naive_gemm, &log,
                                         lltm_serial_for) == LLTM_ERR_GEMM,
              "backward reports a failed product", B, H, "float64");
    }
    gemm_log log = {0, -1, 0};
    check(lltm_sequence_forward_cpu(LLTM_FLOAT64, T, B, I, H, &fwd, work, naive_gemm, &log,
                                    failing_for) == LLTM_ERR_PARALLEL,
          "forward reports a failed parallel-for", B, H, "float64");
    check(lltm_sequence_backward_cpu(LLTM_FLOAT64, T, B, I, H, &bwd, work, naive_gemm, &log,
                                     failing_for) == LLTM_ERR_PARALLEL,
          "backward reports a failed parallel-for", B, H, "float64");
    check(lltm_sequence_forward_cpu((lltm_dtype)9, T, B, I, H, &fwd, work, naive_gemm, &log,
                                    lltm_serial_for) == LLTM_ERR_DTYPE,
          "unknown dtype rejected", B, H, "9");
    check(lltm_sequence_forward_cpu(LLTM_FLOAT64, T, B, I, 0, &fwd, work, naive_gemm, &log,
                                    lltm_serial_for) == LLTM_ERR_ARGUMENT,
          "H = 0 rejected", B, 0, "float64");
    check(lltm_sequence_backward_cpu(LLTM_FLOAT64, -1, B, I, H, &bwd, work, naive_gemm, &log,
                                     lltm_serial_for) == LLTM_ERR_ARGUMENT,
          "negative T rejected", B, H, "float64");
    check(lltm_sequence_forward_cpu(LLTM_FLOAT64, T, B, I, H, NULL, work, naive_gemm, &log,
                                    lltm_serial_for) == LLTM_ERR_ARGUMENT &&
              lltm_sequence_backward_cpu(LLTM_FLOAT64, T, B, I, H, NULL, work, naive_gemm,
                                         &log, lltm_serial_for) == LLTM_ERR_ARGUMENT,
          "missing tensors rejected", B, H, "float64");
    check(lltm_sequence_forward_cpu(LLTM_FLOAT64, T, B, I, H, &fwd, NULL, naive_gemm, &log,
                                    lltm_serial_for) == LLTM_ERR_ARGUMENT,
          "missing workspace rejected", B, H, "float64");
    check(lltm_sequence_forward_cpu(LLTM_FLOAT64, T, B, I, H, &fwd, (char *)work + 4,
                                    naive_gemm, &log, lltm_serial_for) == LLTM_ERR_ARGUMENT,
          "misaligned workspace rejected", B, H, "float64");
    check(lltm_sequence_forward_cpu(LLTM_FLOAT64, T, B, I, H, &fwd, work, NULL, &log,
                                    lltm_serial_for) == LLTM_ERR_ARGUMENT,
          "missing gemm rejected", B, H, "float64");
    const int64_t bad_lengths[][2] = {{3, 0}, {4, 1}, {-1, 2}}; /* each in [1, T = 3] */
    for (int k = 0; k < 3; ++k) {
        lltm_sequence_forward_tensors f = fwd;
        lltm_sequence_backward_tensors g = bwd;
        f.lengths = g.lengths = bad_lengths[k];
        check(lltm_sequence_forward_cpu(LLTM_FLOAT64, T, B, I, H, &f, work, naive_gemm, &log,
                                        lltm_serial_for) == LLTM_ERR_ARGUMENT &&
                  lltm_sequence_backward_cpu(LLTM_FLOAT64, T, B, I, H, &g, work, naive_gemm,
                                             &log, lltm_serial_for) == LLTM_ERR_ARGUMENT,
              "lengths out of [1, T] rejected", B, H, "float64");
    }
    check(lltm_sequence_forward_workspace_cpu((lltm_dtype)9, I, B, H) == 0 &&
              lltm_sequence_backward_workspace_cpu(LLTM_FLOAT32, -1, B, I, H) == 0 &&
              lltm_sequence_forward_workspace_cpu(LLTM_FLOAT32, -1, B, H) == 0,
          "workspace of bad arguments is 0", B, H, "-");
    free(work);
    free(buf);
}

/* The core's products against long double sums, at odd sizes (tails of
 * rows and panels, more rows than a block, strided a and c), b read both
 * ways (contiguous along k, and along n), on the ISA in use: b packed
 * first (lltm_packed_mm_f32), and packed a block of K at a time with a read
 * transposed (lltm_mm_f32; K past one block; a's steps along k close, and
 * far enough apart to be laid out first). */
static void test_packed_mm(lltm_parallel_for pfor)
{
    static const long long sizes[][3] = {{1, 1, 1},    {3, 17, 5},  {9, 33, 40}, {8, 48, 7},
                                         {13, 50, 64}, {130, 35, 9}, {2, 1, 70},  {11, 20, 600},
                                         {300, 19, 270}};
    char name[32];
    snprintf(name, sizeof name, "float32 isa %d", lltm_cpu_isa());
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; ++s) {
        const long long M = sizes[s][0], N = sizes[s][1], K = sizes[s][2];
        const long long lda = K + 3, ldc = N + 2;
        float *a = malloc(sizeof(float) * (size_t)(M * lda)), *b = malloc(sizeof(float) * (size_t)(N * K));
        float *c = malloc(sizeof(float) * (size_t)(M * ldc));
        float *pk = malloc(sizeof(float) * (lltm_packed_floats(N, K) + lltm_mm_workspace_f32(M, N)));
        if (!a || !b || !c || !pk) { perror("malloc"); exit(2); }
        for (long long k = 0; k < M * lda; ++k) a[k] = (float)uniform();
        for (long long k = 0; k < N * K; ++k) b[k] = (float)uniform();
        for (int way = 0; way < 4; ++way) { /* b [K,N] row-major, or its transpose stored */
            const int by_n = way & 1, unpacked = way & 2;
            const long long b_rs = by_n ? 1 : N, b_cs = by_n ? K : 1;
            /* lltm_mm_f32 reads a as a^T: (m,k) at a[k*M + m] (M*K <= M*lda) */
            const long long a_rs = unpacked ? 1 : lda, a_cs = unpacked ? M : 1;
            for (long long k = 0; k < M * ldc; ++k) c[k] = NAN;
            int ok;
            if (unpacked) {
                ok = lltm_mm_f32(M, N, K, a, a_rs, a_cs, b, b_rs, b_cs, c, ldc, pk, pfor) == LLTM_OK;
            } else {
                lltm_pack_f32(N, K, b, b_rs, b_cs, pk);
                ok = lltm_packed_mm_f32(M, N, K, a, lda, pk, c, ldc, pfor) == LLTM_OK;
            }
            for (long long m = 0; m < M; ++m)
                for (long long n = 0; n < ldc; ++n) {
                    real want = 0;
                    for (long long k = 0; k < K && n < N; ++k)
                        want += (real)a[m * a_rs + k * a_cs] * b[k * b_rs + n * b_cs];
                    const float got = c[m * ldc + n];
                    ok &= n < N ? fabsl(got - want) <= 1e-5L * (1 + K) : isnan(got);
                }
            check(ok, "packed product (only c's columns written)", M, N, name);
        }
        free(a), free(b), free(c), free(pk);
    }
}

/* c = a^T b over long K (lltm_mm_tn_f32: the weight gradients) against long
 * double sums, into a wider c: narrow c (transposed), wide c with a's
 * blocks in place (M <= 256) and laid out (M > 256). */
static void test_mm_tn(lltm_parallel_for pfor)
{
    static const long long sizes[][3] = {{1, 1, 1}, {7, 3, 5}, {50, 17, 300}, {33, 270, 260},
                                         {270, 300, 9}};
    char name[32];
    snprintf(name, sizeof name, "float32 isa %d", lltm_cpu_isa());
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; ++s) {
        const long long M = sizes[s][0], N = sizes[s][1], K = sizes[s][2], ldc = N + 3;
        float *a = malloc(sizeof(float) * (size_t)(K * M)), *b = malloc(sizeof(float) * (size_t)(K * N));
        float *c = malloc(sizeof(float) * (size_t)(M * ldc));
        float *work = malloc(sizeof(float) * lltm_mm_tn_workspace_f32(M, N));
        if (!a || !b || !c || !work) { perror("malloc"); exit(2); }
        for (long long k = 0; k < K * M; ++k) a[k] = (float)uniform();
        for (long long k = 0; k < K * N; ++k) b[k] = (float)uniform();
        for (long long k = 0; k < M * ldc; ++k) c[k] = NAN;
        int ok = lltm_mm_tn_f32(M, N, K, a, b, c, ldc, work, pfor) == LLTM_OK;
        for (long long m = 0; m < M; ++m)
            for (long long n = 0; n < ldc; ++n) {
                real want = 0;
                for (long long k = 0; k < K && n < N; ++k)
                    want += (real)a[k * M + m] * b[k * N + n];
                const float got = c[m * ldc + n];
                ok &= n < N ? fabsl(got - want) <= 1e-5L * (1 + K) : isnan(got);
            }
        check(ok, "a^T b (only c's columns written)", M, N, name);
        free(a), free(b), free(c), free(work);
    }
}

/* The AVX-512 forward step against the C math, element by element, over
 * pre-activations from the linear to the saturated range, the branch points
 * of expm1 (-0.5) and tanh (0.625), infinities and NaN; with c_out (the
 * activations written) and without (inference: neither written). */
static void test_step_avx512(void)
{
    const int64_t n = 37, H = 41; /* a tail of 5 lanes; gate blocks H apart */
    static const float special[] = {0.0f, -0.0f, 0.5f, -0.5f, -0.49999f, 0.625f, -0.625f,
                                    88.0f, -88.0f, 89.5f, -104.5f, 1e-30f, -1e-30f,
                                    INFINITY, -INFINITY, NAN};
    const int n_special = (int)(sizeof special / sizeof special[0]);
    float r[3 * 41], bias[3 * 41], g[3 * 41], c[41], h[41], c_out[41];
    for (int pass = 0; pass < 2; ++pass)
        for (int trial = 0; trial < 200; ++trial) {
            for (int k = 0; k < 3 * H; ++k) {
                const float v = (float)(rand() % 20001 - 10000) / 10000.0f;
                r[k] = trial < 100 ? 3.0f * v : 40.0f * v * v * v;
                bias[k] = 0.1f * v;
                g[k] = rand() % 9 == 0 ? special[rand() % n_special] : 2.0f * v;
            }
            for (int k = 0; k < H; ++k) {
                c[k] = rand() % 11 == 0 ? special[rand() % n_special] : 2.0f * r[k];
                h[k] = c_out[k] = 7.0f; /* past n: untouched */
            }
            float want_h[41], want_c[41], want_g[3 * 41], g0[3 * 41], c0[41];
            memcpy(g0, g, sizeof g), memcpy(c0, c, sizeof c);
            for (int64_t k = 0; k < n; ++k)
                lltm_step_forward_f32(g[k] + r[k] + bias[k], g[H + k] + r[H + k] + bias[H + k],
                                      g[2 * H + k] + r[2 * H + k] + bias[2 * H + k], c[k],
                                      &want_g[k], &want_g[H + k], &want_g[2 * H + k],
                                      &want_c[k], &want_h[k]);
            lltm_step_forward_avx512_f32(n, H, r, bias, g, c, h, pass ? c_out : NULL);
            int ok = 1;
            for (int64_t k = 0; k < H; ++k) {
                const int in = k < n;
                /* i * z with z infinite and i under FLT_MIN: the C math's
                 * exp saturates there (i = 0, c NaN), the vector one keeps
                 * i's denormal (c infinite): both round the exact sigmoid,
                 * so c, c_out and h are not compared */
                const int edge = in && isinf(want_g[2 * H + k]) && want_g[k] < FLT_MIN;
                ok &= in ? edge || (close_f32(h[k], want_h[k]) && close_f32(c[k], want_c[k]))
                         : h[k] == 7.0f && memcmp(&c[k], &c0[k], 4) == 0;
                ok &= pass && in ? edge || close_f32(c_out[k], want_c[k]) : c_out[k] == 7.0f;
                for (int q = 0; q < 3; ++q)
                    ok &= pass && in ? close_f32(g[q * H + k], want_g[q * H + k])
                                     : memcmp(&g[q * H + k], &g0[q * H + k], 4) == 0;
            }
            check(ok, pass ? "AVX-512 step" : "AVX-512 step, inference", 1, H, "float32");
        }
}

int main(void)
{
    unsigned seed = (unsigned)time(NULL);
    srand(seed);
    printf("seed %u\n", seed);
    /* T, B, I, H: T = 1, batch 1, odd sizes, I > H, I < H, I = 0, T = 0, B = 0 */
    const long long shapes[][4] = {{1, 1, 1, 1}, {3, 2, 5, 7}, {5, 3, 0, 4}, {0, 3, 4, 5},
                                   {4, 0, 3, 5}, {4, 5, 40, 17}, {2, 16, 32, 33}, {7, 3, 2, 9}};
    const lltm_dtype dtypes[] = {LLTM_FLOAT32, LLTM_FLOAT64, LLTM_FLOAT16, LLTM_BFLOAT16};
    const lltm_parallel_for runners[] = {lltm_serial_for, chunked_for};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; ++s)
        for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; ++d)
            for (size_t r = 0; r < 2; ++r)
                for (int with_lengths = 0; with_lengths <= 2 * (shapes[s][0] > 0); ++with_lengths)
                    test_case(shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3],
                              dtypes[d], runners[r], with_lengths);
    /* float32's own products on every instruction set this CPU has */
    const int best = lltm_cpu_isa();
    printf("instruction set: %d (1 baseline, 2 AVX2, 3 AVX-512)\n", best);
    for (int isa = LLTM_ISA_BASELINE; isa <= best; ++isa) {
        check(lltm_cpu_set_isa(isa) == isa && lltm_cpu_isa() == isa, "ISA forced", 0, 0, "-");
        for (size_t r = 0; r < 2; ++r) {
            test_packed_mm(runners[r]);
            test_mm_tn(runners[r]);
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; ++s)
                test_case(shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], LLTM_FLOAT32,
                          runners[r], shapes[s][0] > 0);
        }
    }
    /* one weight gradient wide, the other narrow (lltm_mm_tn_f32's two
     * routes in one workspace) */
    for (int isa = LLTM_ISA_AVX2; isa <= best; ++isa) {
        check(lltm_cpu_set_isa(isa) == isa, "ISA forced", 0, 0, "-");
        test_case(3, 2, 100, 256, LLTM_FLOAT32, chunked_for, 0);
        test_case(3, 2, 300, 40, LLTM_FLOAT32, chunked_for, 1);
    }
    if (best >= LLTM_ISA_AVX512)
        test_step_avx512();
    /* inference in several chunks of steps (~512 KB of projections each) */
    for (int isa = LLTM_ISA_BASELINE; isa <= best; ++isa) {
        check(lltm_cpu_set_isa(isa) == isa, "ISA forced", 0, 0, "-");
        test_case(7, 64, 10, 200, LLTM_FLOAT32, chunked_for, 2);
    }
    test_case(5, 40, 10, 200, LLTM_FLOAT64, chunked_for, 0);
    check(lltm_cpu_set_isa(LLTM_ISA_AVX512 + 1) == LLTM_ERR_ARGUMENT &&
              lltm_cpu_set_isa(LLTM_ISA_AUTO) == best,
          "ISA out of range refused, AUTO the best", 0, 0, "-");
    test_errors();
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
