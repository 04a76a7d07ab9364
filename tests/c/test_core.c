/*
 * test_core.c - unit tests of the C core's CPU kernels against a naive C
 * reference written straight from the formulas, in long double. Built with
 * AddressSanitizer and UndefinedBehaviorSanitizer by `make test-c`.
 *
 * Each case draws fresh random inputs, poisons every output with NaN first
 * (so an unwritten element fails), and runs the kernel both serially and
 * through a parallel-for that cuts the range into small uneven chunks.
 * Prints "N passed, N failed" last; exits nonzero on any failure.
 */
#include "test_util.h"

#include <time.h>

/* Naive reference of one step's pointwise parts (bias included). */
static void reference_forward(long long B, long long H, const double *pre, const double *bias,
                              const double *c, double *gates, double *h_out, double *c_out)
{
    for (long long b = 0; b < B; ++b)
        for (long long k = 0; k < H; ++k) {
            real gi = (real)pre[b * 3 * H + k] + bias[k];
            real go = (real)pre[b * 3 * H + H + k] + bias[H + k];
            real gz = (real)pre[b * 3 * H + 2 * H + k] + bias[2 * H + k];
            real i = 1 / (1 + expl(-gi)), o = 1 / (1 + expl(-go));
            real z = gz > 0 ? gz : expm1l(gz);
            real cn = c[b * H + k] + i * z;
            gates[b * 3 * H + k] = (double)i;
            gates[b * 3 * H + H + k] = (double)o;
            gates[b * 3 * H + 2 * H + k] = (double)z;
            c_out[b * H + k] = (double)cn;
            h_out[b * H + k] = (double)(tanhl(cn) * o);
        }
}

static void reference_backward(long long B, long long H, const double *gh, const double *gc,
                               const double *cn, const double *gates, double *dg, double *dc,
                               double *dbias)
{
    for (long long j = 0; j < 3 * H; ++j)
        dbias[j] = 0;
    for (long long b = 0; b < B; ++b)
        for (long long k = 0; k < H; ++k) {
            real i = gates[b * 3 * H + k], o = gates[b * 3 * H + H + k];
            real z = gates[b * 3 * H + 2 * H + k];
            real t = tanhl(cn[b * H + k]);
            real dcell = gc[b * H + k] + gh[b * H + k] * o * (1 - t * t);
            real dgi = dcell * z * i * (1 - i);
            real dgo = gh[b * H + k] * t * o * (1 - o);
            real dgz = dcell * i * (z > 0 ? 1 : z + 1);
            dg[b * 3 * H + k] = (double)dgi;
            dg[b * 3 * H + H + k] = (double)dgo;
            dg[b * 3 * H + 2 * H + k] = (double)dgz;
            dc[b * H + k] = (double)dcell;
            dbias[k] += (double)dgi;
            dbias[H + k] += (double)dgo;
            dbias[2 * H + k] += (double)dgz;
        }
}

static void test_case(long long B, long long H, lltm_dtype dt, lltm_parallel_for pfor)
{
    const char *name = dtype_name(dt);
    const size_t nG = (size_t)(B * 3 * H), nH = (size_t)(B * H);
    double *pre = random_array(nG, 3.0), *bias = random_array((size_t)(3 * H), 1.0);
    double *c = random_array(nH, 2.0), *gh = random_array(nH, 1.0), *gc = random_array(nH, 1.0);
    double *r_gates = malloc(nG * sizeof(double) + 1), *r_h = malloc(nH * sizeof(double) + 1);
    double *r_c = malloc(nH * sizeof(double) + 1), *r_dg = malloc(nG * sizeof(double) + 1);
    double *r_dc = malloc(nH * sizeof(double) + 1), *r_db = malloc((size_t)(3 * H) * sizeof(double) + 1);
    if (!r_gates || !r_h || !r_c || !r_dg || !r_dc || !r_db) { perror("malloc"); exit(2); }

    /* The kernel's inputs are rounded to its dtype: feed the reference the same values. */
    void *gates = to_dtype(pre, nG, dt), *b_in = to_dtype(bias, (size_t)(3 * H), dt);
    void *c_in = to_dtype(c, nH, dt);
    for (size_t k = 0; k < nG; ++k) pre[k] = at(gates, k, dt);
    for (long long k = 0; k < 3 * H; ++k) bias[k] = at(b_in, (size_t)k, dt);
    for (size_t k = 0; k < nH; ++k) c[k] = at(c_in, k, dt);
    void *h_out = poisoned(nH, dt), *c_out = poisoned(nH, dt);

    reference_forward(B, H, pre, bias, c, r_gates, r_h, r_c);
    int status = lltm_cell_forward_pointwise_cpu(dt, B, H, gates, b_in, c_in, h_out, c_out, pfor);
    check(status == LLTM_OK, "forward status", B, H, name);
    check(close_to(gates, r_gates, nG, dt), "forward gates", B, H, name);
    check(close_to(h_out, r_h, nH, dt), "forward new_h", B, H, name);
    check(close_to(c_out, r_c, nH, dt), "forward new_cell", B, H, name);

    /* Backward from the kernel's own forward results (rounded to dtype). */
    for (size_t k = 0; k < nG; ++k) r_gates[k] = at(gates, k, dt);
    for (size_t k = 0; k < nH; ++k) r_c[k] = at(c_out, k, dt);
    void *gh_in = to_dtype(gh, nH, dt), *gc_in = to_dtype(gc, nH, dt);
    for (size_t k = 0; k < nH; ++k) gh[k] = at(gh_in, k, dt), gc[k] = at(gc_in, k, dt);
    void *dg = poisoned(nG, dt), *dc = poisoned(nH, dt), *db = poisoned((size_t)(3 * H), dt);
    reference_backward(B, H, gh, gc, r_c, r_gates, r_dg, r_dc, r_db);
    status = lltm_cell_backward_pointwise_cpu(dt, B, H, gh_in, gc_in, c_out, gates, dg, dc, db, pfor);
    check(status == LLTM_OK, "backward status", B, H, name);
    check(close_to(dg, r_dg, nG, dt), "backward grad_gates", B, H, name);
    check(close_to(dc, r_dc, nH, dt), "backward grad_old_cell", B, H, name);
    check(close_to(db, r_db, (size_t)(3 * H), dt), "backward grad_bias", B, H, name);

    void *owned[] = {pre, bias, c, gh, gc, r_gates, r_h, r_c, r_dg, r_dc, r_db, gates, b_in,
                     c_in, h_out, c_out, gh_in, gc_in, dg, dc, db};
    for (size_t k = 0; k < sizeof owned / sizeof owned[0]; ++k)
        free(owned[k]);
}

static void test_errors(void)
{
    float x[3] = {0};
    check(lltm_cell_forward_pointwise_cpu((lltm_dtype)7, 1, 1, x, x, x, x, x, lltm_serial_for) ==
              LLTM_ERR_DTYPE, "unknown dtype rejected", 1, 1, "7");
    check(lltm_cell_forward_pointwise_cpu(LLTM_FLOAT32, -1, 1, x, x, x, x, x, lltm_serial_for) ==
              LLTM_ERR_ARGUMENT, "negative batch rejected", -1, 1, "float32");
    check(lltm_cell_backward_pointwise_cpu(LLTM_FLOAT32, 1, 1, x, x, x, x, x, x, x, NULL) ==
              LLTM_ERR_ARGUMENT, "missing parallel-for rejected", 1, 1, "float32");
    check(lltm_cell_forward_pointwise_cpu(LLTM_FLOAT32, 1, 1, x, x, x, x, x, failing_for) ==
              LLTM_ERR_PARALLEL, "parallel-for failure reported", 1, 1, "float32");
    check(strcmp(lltm_status_string(LLTM_ERR_DTYPE), "unknown status") != 0,
          "status strings", 0, 0, "-");
    /* B = 0: nothing to compute, but the bias gradient must be zeroed. */
    float db[3] = {NAN, NAN, NAN};
    check(lltm_cell_backward_pointwise_cpu(LLTM_FLOAT32, 0, 1, x, x, x, x, x, x, db,
                                           lltm_serial_for) == LLTM_OK &&
              db[0] == 0 && db[1] == 0 && db[2] == 0,
          "empty batch zeroes grad_bias", 0, 1, "float32");
}

/* The float32 exp / expm1 / tanh / sigmoid of lltm_cpu_math.h against libm in
 * double: relative error within a few float32 ulp (absolute near zero), and
 * IEEE behaviour at NaN and the infinities. */
static void test_fast_math(void)
{
    double worst[4] = {0, 0, 0, 0};
    for (int k = -2000000; k <= 2000000; ++k) {
        const float x = (float)k * 5e-5f; /* [-100, 100] in steps of 5e-5 */
        const double e = exp((double)x), em1 = expm1((double)x), t = tanh((double)x);
        const double s = 1.0 / (1.0 + exp(-(double)x));
        if (x < 88.3f && x > -87.3f) {
            const double err = fabs(lltm_exp_f32(x) - e) / e;
            worst[0] = err > worst[0] ? err : worst[0];
        }
        if (x < 88.3f) {
            const double err = fabs(lltm_expm1_f32(x) - em1) / fmax(fabs(em1), 1e-30);
            worst[1] = err > worst[1] ? err : worst[1];
        }
        const double err_t = fabs(lltm_tanh_f32(x) - t) / fmax(fabs(t), 1e-6);
        const double err_s = fabs(lltm_sigmoid_f32(x) - s) / fmax(s, 1e-30);
        worst[2] = err_t > worst[2] ? err_t : worst[2];
        worst[3] = x > -87.0f && err_s > worst[3] ? err_s : worst[3];
    }
    const char *names[4] = {"exp", "expm1", "tanh", "sigmoid"};
    for (int f = 0; f < 4; ++f) {
        /* 4 ulp of float32 = 4 * 2^-23 ~ 4.8e-7 */
        int ok = worst[f] < 4.8e-7;
        if (!ok)
            printf("fast %s: worst relative error %.3g\n", names[f], worst[f]);
        check(ok, names[f], 0, 0, "float32 fast math");
    }
    const float inf = INFINITY, nan = NAN;
    check(isnan(lltm_exp_f32(nan)) && isnan(lltm_expm1_f32(nan)) && isnan(lltm_tanh_f32(nan)) &&
              isnan(lltm_sigmoid_f32(nan)),
          "NaN propagates", 0, 0, "float32 fast math");
    check(lltm_exp_f32(inf) == inf && lltm_exp_f32(-inf) == 0.0f && lltm_expm1_f32(-inf) == -1.0f &&
              lltm_tanh_f32(inf) == 1.0f && lltm_tanh_f32(-inf) == -1.0f &&
              lltm_sigmoid_f32(inf) == 1.0f && lltm_sigmoid_f32(-inf) == 0.0f &&
              lltm_exp_f32(0.0f) == 1.0f && lltm_tanh_f32(0.0f) == 0.0f,
          "infinities and zero", 0, 0, "float32 fast math");
}

/* The value of float16 bits h, straight from the format's definition. */
static double f16_value(uint16_t h)
{
    const int e = (h >> 10) & 31, m = h & 1023;
    const double sign = (h & 0x8000) ? -1.0 : 1.0;
    if (e == 31)
        return m ? NAN : sign * INFINITY;
    return sign * (e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25));
}

/* r is a correct round-to-nearest-even of x among the finite neighbours of
 * r (same sign): no neighbour is nearer, and on a tie r is even. */
static int nearest_even(float x, uint16_t r, float (*value)(uint16_t))
{
    const double v = value(r), d = fabs((double)x - v);
    for (int step = -1; step <= 1; step += 2) {
        const uint16_t n = (uint16_t)(r + step);
        if ((n & 0x7FFF) == 0x7FFF || ((r & 0x7FFF) == 0 && step < 0))
            continue; /* no neighbour below zero magnitude / past NaN patterns */
        const double vn = value(n);
        if (isnan(vn) || isinf(vn))
            continue;
        const double dn = fabs((double)x - vn);
        if (dn < d || (dn == d && (r & 1)))
            return 0;
    }
    return 1;
}

/* The half conversions of lltm_cpu_math.h: every bit pattern exactly, round
 * trips, ties to even, overflow, NaN, and random floats against the
 * definition of round-to-nearest-even. */
static void test_conversions(void)
{
    int ok_f16 = 1, ok_bf16 = 1, ok_trip = 1, ok_ties = 1, ok_random = 1;
    for (uint32_t u = 0; u < 65536; ++u) {
        const uint16_t h = (uint16_t)u;
        const double want = f16_value(h);
        const float got = lltm_f16_to_f32(h);
        if (isnan(want) ? !isnan(got) : (double)got != want || !signbit(got) != !signbit(want))
            ok_f16 = 0;
        uint32_t bits;
        const float b = lltm_bf16_to_f32(h);
        memcpy(&bits, &b, sizeof bits);
        if (bits != u << 16)
            ok_bf16 = 0;
        /* float -> half -> the same bits (NaN: still a NaN) */
        const uint16_t back16 = lltm_f32_to_f16(got), back_b = lltm_f32_to_bf16(b);
        if (isnan(want) ? !isnan(lltm_f16_to_f32(back16)) : back16 != h)
            ok_trip = 0;
        if (isnan(b) ? !isnan(lltm_bf16_to_f32(back_b)) : back_b != h)
            ok_trip = 0;
        /* the midpoint to the next pattern of larger magnitude rounds to the
         * even one of the two; just off it, to the nearer */
        const uint16_t n = (uint16_t)(h + 1);
        if ((h & 0x7FFF) < 0x7BFF) { /* float16: both finite */
            const float lo = lltm_f16_to_f32(h), hi = lltm_f16_to_f32(n);
            const float mid = (float)(((double)lo + (double)hi) / 2);
            if (lltm_f32_to_f16(mid) != ((h & 1) ? n : h) ||
                lltm_f32_to_f16(nextafterf(mid, hi)) != n ||
                lltm_f32_to_f16(nextafterf(mid, lo)) != h)
                ok_ties = 0;
        }
        if ((h & 0x7FFF) < 0x7F7F) { /* bfloat16: both finite */
            const float lo = lltm_bf16_to_f32(h), hi = lltm_bf16_to_f32(n);
            const float mid = (float)(((double)lo + (double)hi) / 2);
            if (lltm_f32_to_bf16(mid) != ((h & 1) ? n : h) ||
                lltm_f32_to_bf16(nextafterf(mid, hi)) != n ||
                lltm_f32_to_bf16(nextafterf(mid, lo)) != h)
                ok_ties = 0;
        }
    }
    /* float16 overflow: 65504 is the largest finite; ties from 65520 up go to inf */
    ok_ties &= lltm_f32_to_f16(65519.99f) == 0x7BFF && lltm_f32_to_f16(65520.0f) == 0x7C00 &&
               lltm_f32_to_f16(-1e10f) == 0xFC00 && lltm_f32_to_f16(INFINITY) == 0x7C00;
    ok_ties &= lltm_f32_to_bf16(INFINITY) == 0x7F80 && lltm_f32_to_bf16(3.4028235e38f) == 0x7F80;
    ok_ties &= isnan(lltm_bf16_to_f32(lltm_f32_to_bf16(NAN))) &&
               isnan(lltm_f16_to_f32(lltm_f32_to_f16(NAN)));
    for (int k = 0; k < 1000000; ++k) {
        /* random float bit patterns within the finite range of each type */
        const uint32_t bits = ((uint32_t)rand() << 16) ^ (uint32_t)rand();
        float x;
        memcpy(&x, &bits, sizeof x);
        if (!isfinite(x))
            continue;
        if (fabsf(x) < 65504.0f && !nearest_even(x, lltm_f32_to_f16(x), lltm_f16_to_f32))
            ok_random = 0;
        if (fabsf(x) < 3.38e38f && !nearest_even(x, lltm_f32_to_bf16(x), lltm_bf16_to_f32))
            ok_random = 0;
    }
    check(ok_f16, "float16 -> float32 of every pattern", 0, 0, "float16");
    check(ok_bf16, "bfloat16 -> float32 of every pattern", 0, 0, "bfloat16");
    check(ok_trip, "half -> float32 -> half round trips", 0, 0, "half");
    check(ok_ties, "ties to even, overflow, NaN", 0, 0, "half");
    check(ok_random, "random floats round to nearest even", 0, 0, "half");
}

int main(void)
{
    unsigned seed = (unsigned)time(NULL);
    srand(seed);
    printf("seed %u\n", seed);
    const long long shapes[][2] = {{1, 1}, {1, 7}, {3, 5}, {2, 33}, {16, 128}, {5, 257}, {64, 65}};
    const lltm_dtype dtypes[] = {LLTM_FLOAT32, LLTM_FLOAT64, LLTM_FLOAT16, LLTM_BFLOAT16};
    const lltm_parallel_for runners[] = {lltm_serial_for, chunked_for};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; ++s)
        for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; ++d)
            for (size_t r = 0; r < 2; ++r)
                test_case(shapes[s][0], shapes[s][1], dtypes[d], runners[r]);
    test_errors();
    test_fast_math();
    test_conversions();
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
