/*
 * lltm_cpu_math.h - the per-element math of an LLTM step, defined once for
 * every CPU kernel (the cell here, the sequence in lltm_sequence_cpu.c).
 *
 * float32 uses the branch-free exp / expm1 / tanh below, which the compiler
 * vectorises (libm's scalar calls cost ~4x the rest of the step); they are
 * accurate to a few float32 ulp (tests/c/test_core.c bounds them against
 * libm). float64 calls libm's double functions, so no double ever passes
 * through float. NaN propagates through every function.
 */
#ifndef LLTM_CORE_CPU_MATH_H
#define LLTM_CORE_CPU_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* exp(x) = 2^n exp(r), n = round(x / ln 2), |r| <= ln2 / 2, exp(r) by
 * Cephes' degree-6 polynomial. Returns +inf from x > 88.376 (true overflow is
 * at 88.72) and 0 below -87.34 (where the true value is subnormal). */
static inline float lltm_exp_f32(float x)
{
    const float hi = 88.3762626647949f, lo = -87.3365478515625f;
    float xs = x > hi ? hi : x;
    xs = xs < lo ? lo : xs;
    xs = xs == xs ? xs : 0.0f; /* NaN: compute on 0, restore below */
    const float shifter = 12582912.0f; /* 1.5 * 2^23: x + shifter rounds x */
    const float n = (xs * 1.44269504088896341f + shifter) - shifter;
    float r = xs - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const int32_t bits = ((int32_t)n + 127) * (1 << 23);
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    float y = p * scale;
    y = x > hi ? INFINITY : y;
    y = x < lo ? 0.0f : y;
    return x == x ? y : x;
}

/* expm1 without cancellation near 0: Taylor to x^8 for |x| < 0.5
 * (remainder < 2e-8 relative), exp(x) - 1 beyond. */
static inline float lltm_expm1_f32(float x)
{
    float p = 1.0f / 40320.0f;
    p = p * x + 1.0f / 5040.0f;
    p = p * x + 1.0f / 720.0f;
    p = p * x + 1.0f / 120.0f;
    p = p * x + 1.0f / 24.0f;
    p = p * x + 1.0f / 6.0f;
    p = p * x + 0.5f;
    p = (p * x + 1.0f) * x;
    return fabsf(x) < 0.5f ? p : lltm_exp_f32(x) - 1.0f;
}

/* tanh: Cephes' odd polynomial for |x| < 0.625, 1 - 2 / (exp(2|x|) + 1) with
 * the sign of x beyond. */
static inline float lltm_tanh_f32(float x)
{
    const float ax = fabsf(x), z = x * x;
    const float small = ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z -
                           5.37397155531e-2f) * z + 1.33314422036e-1f) * z -
                         3.33332819422e-1f) * z * x + x;
    const float large = copysignf(1.0f - 2.0f / (lltm_exp_f32(2.0f * ax) + 1.0f), x);
    return ax < 0.625f ? small : large;
}

static inline float lltm_sigmoid_f32(float x) { return 1.0f / (1.0f + lltm_exp_f32(-x)); }
static inline float lltm_elu_f32(float x) { return x > 0.0f ? x : lltm_expm1_f32(x); }

static inline double lltm_tanh_f64(double x) { return tanh(x); }
static inline double lltm_sigmoid_f64(double x) { return 1.0 / (1.0 + exp(-x)); }
static inline double lltm_elu_f64(double x) { return x > 0.0 ? x : expm1(x); }

/*
 * One step for one hidden unit, per dtype (SUFFIX f32 / f64):
 *
 * lltm_step_forward_SUFFIX(gi, go, gz, c, &act_i, &act_o, &act_z, &c_new, &h_new)
 *   from the pre-activations (bias included) and the old cell.
 *
 * lltm_step_backward_SUFFIX(i, o, z, c_new, grad_h, grad_c, &d_gi, &d_go, &d_gz, &d_c)
 *   from the saved activations, the new cell and the incoming gradients
 *   dL/dh' and dL/dc': the pre-activation gradients and dL/dc (= dL/dc' total,
 *   since c' = c + i z).
 */
#define LLTM_DEFINE_STEP_MATH(T, SUFFIX)                                              \
    static inline void lltm_step_forward_##SUFFIX(T gi, T go, T gz, T c, T *i, T *o,  \
                                                  T *z, T *c_new, T *h_new)           \
    {                                                                                 \
        *i = lltm_sigmoid_##SUFFIX(gi);                                               \
        *o = lltm_sigmoid_##SUFFIX(go);                                               \
        *z = lltm_elu_##SUFFIX(gz);                                                   \
        *c_new = c + *i * *z;                                                         \
        *h_new = lltm_tanh_##SUFFIX(*c_new) * *o;                                     \
    }                                                                                 \
                                                                                      \
    static inline void lltm_step_backward_##SUFFIX(T i, T o, T z, T c_new, T grad_h,  \
                                                   T grad_c, T *d_gi, T *d_go,        \
                                                   T *d_gz, T *d_c)                   \
    {                                                                                 \
        const T tc = lltm_tanh_##SUFFIX(c_new);                                       \
        const T d_cell = grad_c + grad_h * o * ((T)1 - tc * tc);                      \
        /* elu'(x) = 1 for x > 0, else exp(x) = z + 1 */                              \
        const T d_elu = z > (T)0 ? (T)1 : z + (T)1;                                   \
        *d_gi = d_cell * z * i * ((T)1 - i);                                          \
        *d_go = grad_h * tc * o * ((T)1 - o);                                         \
        *d_gz = d_cell * i * d_elu;                                                   \
        *d_c = d_cell;                                                                \
    }

LLTM_DEFINE_STEP_MATH(float, f32)
LLTM_DEFINE_STEP_MATH(double, f64)

/* Hot loops are compiled for x86-64-v4 (AVX-512), v3 (AVX2 + FMA) and the
 * baseline, and the loader picks one per machine (GNU ifunc). Measured at
 * B16/H128 forward: 27.6 us baseline, 11.6 us v3, 5.6 us v4. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(LLTM_NO_CLONES)
#define LLTM_CPU_CLONES                                                               \
    __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define LLTM_CPU_CLONES
#endif

#endif /* LLTM_CORE_CPU_MATH_H */
