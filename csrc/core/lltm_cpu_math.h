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

/* The grain of the kernels' parallel-for over hidden units: ranges below
 * this many elements (units x batch) run on one thread, as waking the pool
 * would cost more than the arithmetic. */
static inline int64_t lltm_grain_for_batch(int64_t B)
{
    const int64_t g = 16384 / (B > 0 ? B : 1);
    return g > 0 ? g : 1;
}

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

/* float16 and bfloat16 are stored as their bit patterns (uint16_t); kernels
 * load them into float, compute in float and store with round-to-nearest-
 * even. Branch-free bit arithmetic (no _Float16 or F16C needed), exact for
 * every value including subnormals, infinities and NaN (tests/c checks all
 * 65536 patterns); the compiler vectorises it. */
static inline float lltm_f32_from_bits(uint32_t bits)
{
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint32_t lltm_bits_from_f32(float f)
{
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    return bits;
}

static inline float lltm_bf16_to_f32(uint16_t h) { return lltm_f32_from_bits((uint32_t)h << 16); }

static inline uint16_t lltm_f32_to_bf16(float f)
{
    const uint32_t bits = lltm_bits_from_f32(f);
    const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
    /* NaN stays a (quiet) NaN of the same sign instead of rounding to inf */
    const uint32_t nan = (bits >> 16) | 0x40u;
    return (uint16_t)((bits & 0x7FFFFFFFu) > 0x7F800000u ? nan : rounded);
}

/* float16 <-> float: the method of Maratyszcza's FP16 library. The exponent
 * is rebased by one float multiplication (normal values) or by subtracting
 * a magic number (subnormals); the rounding of float16 from float is done
 * by the float adder itself, in the current (nearest-even) rounding mode. */
static inline float lltm_f16_to_f32(uint16_t h)
{
    const uint32_t w = (uint32_t)h << 16;
    const uint32_t sign = w & 0x80000000u;
    const uint32_t two_w = w + w;
    const float normalized = lltm_f32_from_bits((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
    const float denormalized = lltm_f32_from_bits((two_w >> 17) | (126u << 23)) - 0.5f;
    const uint32_t magnitude = two_w < (1u << 27) ? lltm_bits_from_f32(denormalized)
                                                  : lltm_bits_from_f32(normalized);
    return lltm_f32_from_bits(sign | magnitude);
}

static inline uint16_t lltm_f32_to_f16(float f)
{
    float base = (fabsf(f) * 0x1.0p+112f) * 0x1.0p-110f;
    const uint32_t w = lltm_bits_from_f32(f);
    const uint32_t shl1_w = w + w;
    const uint32_t sign = w & 0x80000000u;
    uint32_t bias = shl1_w & 0xFF000000u;
    bias = bias < 0x71000000u ? 0x71000000u : bias;
    base = lltm_f32_from_bits((bias >> 1) + 0x07800000u) + base;
    const uint32_t bits = lltm_bits_from_f32(base);
    const uint32_t nonsign = ((bits >> 13) & 0x00007C00u) + (bits & 0x00000FFFu);
    return (uint16_t)((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
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

/* Loading an element of each storage type into its compute type, and
 * storing back: SUFFIX f32, f64 (identity), f16, bf16 (uint16_t bits,
 * computed in float). Kernels are generated per SUFFIX around these. */
static inline float lltm_load_f32(float x) { return x; }
static inline float lltm_store_f32(float x) { return x; }
static inline double lltm_load_f64(double x) { return x; }
static inline double lltm_store_f64(double x) { return x; }
static inline float lltm_load_f16(uint16_t x) { return lltm_f16_to_f32(x); }
static inline uint16_t lltm_store_f16(float x) { return lltm_f32_to_f16(x); }
static inline float lltm_load_bf16(uint16_t x) { return lltm_bf16_to_f32(x); }
static inline uint16_t lltm_store_bf16(float x) { return lltm_f32_to_bf16(x); }

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
