/*
 * test_util.h - what the C unit tests share: pass/fail counting, parallel-for
 * runners, random inputs, arrays in each dtype (poisoned with NaN to catch
 * unwritten elements) and tolerance checks against a double reference.
 */
#ifndef LLTM_TESTS_C_TEST_UTIL_H
#define LLTM_TESTS_C_TEST_UTIL_H

#include "../../csrc/core/lltm.h"
#include "../../csrc/core/lltm_cpu_math.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int passed, failed;

static inline void check(int ok, const char *what, long long B, long long H, const char *dtype)
{
    if (ok) {
        ++passed;
    } else {
        ++failed;
        printf("FAIL %s (B=%lld H=%lld %s)\n", what, B, H, dtype);
    }
}

/* A parallel-for that splits [begin, end) into chunks of 1, 2, 3, ... to
 * exercise range boundaries the way a thread pool would. */
static inline int chunked_for(int64_t begin, int64_t end, int64_t grain, lltm_range_body body,
                       void *ctx)
{
    (void)grain;
    int64_t step = 1;
    for (int64_t lo = begin; lo < end; lo += step++)
        body(lo, lo + step < end ? lo + step : end, ctx);
    return 0;
}

static inline int failing_for(int64_t begin, int64_t end, int64_t grain, lltm_range_body body,
                       void *ctx)
{
    (void)begin, (void)end, (void)grain, (void)body, (void)ctx;
    return 1;
}

static inline double uniform(void) { return 2.0 * rand() / (double)RAND_MAX - 1.0; }

typedef long double real;

static inline const char *dtype_name(lltm_dtype dt)
{
    switch (dt) {
    case LLTM_FLOAT32: return "float32";
    case LLTM_FLOAT64: return "float64";
    case LLTM_FLOAT16: return "float16";
    case LLTM_BFLOAT16: return "bfloat16";
    }
    return "?";
}

/* Arrays of doubles converted to the kernel's dtype and back (the half types
 * through the core's conversions, which test_conversions checks on every
 * bit pattern). */
static inline void *to_dtype(const double *x, size_t n, lltm_dtype dt)
{
    void *out = malloc(n * lltm_dtype_size(dt) + 1);
    if (!out) { perror("malloc"); exit(2); }
    for (size_t k = 0; k < n; ++k) {
        switch (dt) {
        case LLTM_FLOAT32: ((float *)out)[k] = (float)x[k]; break;
        case LLTM_FLOAT64: ((double *)out)[k] = x[k]; break;
        case LLTM_FLOAT16: ((uint16_t *)out)[k] = lltm_f32_to_f16((float)x[k]); break;
        case LLTM_BFLOAT16: ((uint16_t *)out)[k] = lltm_f32_to_bf16((float)x[k]); break;
        }
    }
    return out;
}

static inline void *poisoned(size_t n, lltm_dtype dt)
{
    double *nan_values = malloc(n * sizeof(double) + 1);
    if (!nan_values) { perror("malloc"); exit(2); }
    for (size_t k = 0; k < n; ++k) nan_values[k] = NAN;
    void *out = to_dtype(nan_values, n, dt);
    free(nan_values);
    return out;
}

static inline double at(const void *p, size_t k, lltm_dtype dt)
{
    switch (dt) {
    case LLTM_FLOAT32: return (double)((const float *)p)[k];
    case LLTM_FLOAT64: return ((const double *)p)[k];
    case LLTM_FLOAT16: return (double)lltm_f16_to_f32(((const uint16_t *)p)[k]);
    case LLTM_BFLOAT16: return (double)lltm_bf16_to_f32(((const uint16_t *)p)[k]);
    }
    return NAN;
}

/* max |x - ref| / (atol + rtol |ref|) <= 1, and every element finite. The
 * half types compute in float32 from inputs in the dtype and round each
 * result once: within two units of roundoff (2^-8 bfloat16, 2^-11 float16)
 * of the exact value, plus float32's error near zero. */
static inline int close_to(const void *x, const double *ref, size_t n, lltm_dtype dt)
{
    double rtol = 1e-12, atol = 1e-13;
    switch (dt) {
    case LLTM_FLOAT32: rtol = 1e-5, atol = 1e-5; break;
    case LLTM_FLOAT64: break;
    case LLTM_FLOAT16: rtol = 2 * 0x1p-11, atol = 1e-4; break;
    case LLTM_BFLOAT16: rtol = 2 * 0x1p-8, atol = 1e-4; break;
    }
    for (size_t k = 0; k < n; ++k) {
        double v = at(x, k, dt);
        if (!isfinite(v) || fabs(v - ref[k]) > atol + rtol * fabs(ref[k]))
            return 0;
    }
    return 1;
}

static inline double *random_array(size_t n, double scale)
{
    double *x = malloc(n * sizeof(double) + 1);
    if (!x) { perror("malloc"); exit(2); }
    for (size_t k = 0; k < n; ++k) x[k] = scale * uniform();
    return x;
}

#endif /* LLTM_TESTS_C_TEST_UTIL_H */
