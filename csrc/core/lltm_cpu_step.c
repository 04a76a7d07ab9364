/*
 * lltm_cpu_step.c - float32's forward step for one row of hidden units in
 * AVX-512 intrinsics (lltm_cpu_gemm.h): the math of lltm_cpu_math.h on 16
 * lanes with fused multiply-adds and vscalefps for 2^n. GCC's vectorisation
 * of the plain C runs both sides of every select as separate multiplies and
 * adds, ~2.5 ns an element on the machine of docs/performance.md; the
 * pointwise pass is then a third of a step at H 64 - 128.
 */
#include "lltm_cpu_gemm.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define AVX512 __attribute__((target("avx512f")))

AVX512 static inline __m512 splat(float v) { return _mm512_set1_ps(v); }

/* exp(x) = 2^n exp(r), n = round(x / ln 2), r = x - n ln 2 in two parts,
 * exp(r) by lltm_exp_f32's polynomial. x is first clamped to [-104, 89]
 * (NaN passes: min / max return their second operand then), past which
 * vscalefps gives 0 and inf. */
AVX512 static inline __m512 exp16(__m512 x)
{
    x = _mm512_max_ps(splat(-104.0f), _mm512_min_ps(splat(89.0f), x));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, splat(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, splat(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, splat(-2.12194440e-4f), r);
    __m512 p = _mm512_fmadd_ps(splat(1.9875691500e-4f), r, splat(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, splat(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, splat(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, splat(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, splat(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, splat(1.0f)));
    return _mm512_scalef_ps(p, n);
}

AVX512 static inline __m512 sigmoid16(__m512 x)
{
    return _mm512_div_ps(splat(1.0f), _mm512_add_ps(splat(1.0f), exp16(_mm512_sub_ps(splat(0.0f), x))));
}

/* x > 0: x; else expm1(x): Taylor to x^8 above -0.5, exp(x) - 1 below */
AVX512 static inline __m512 elu16(__m512 x)
{
    __m512 p = _mm512_fmadd_ps(splat(1.0f / 40320.0f), x, splat(1.0f / 5040.0f));
    p = _mm512_fmadd_ps(p, x, splat(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, x, splat(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, x, splat(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, x, splat(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, x, splat(0.5f));
    p = _mm512_mul_ps(_mm512_fmadd_ps(p, x, splat(1.0f)), x);
    const __m512 big = _mm512_sub_ps(exp16(x), splat(1.0f));
    const __mmask16 small = _mm512_cmp_ps_mask(x, splat(-0.5f), _CMP_GT_OQ);
    const __mmask16 positive = _mm512_cmp_ps_mask(x, splat(0.0f), _CMP_GT_OQ);
    return _mm512_mask_blend_ps(positive, _mm512_mask_blend_ps(small, big, p), x);
}

/* |x| < 0.625: Cephes' odd polynomial; else 1 - 2 / (exp(2|x|) + 1), with
 * the sign of x */
AVX512 static inline __m512 tanh16(__m512 x)
{
    const __m512 ax = _mm512_abs_ps(x), z = _mm512_mul_ps(x, x);
    __m512 p = _mm512_fmadd_ps(splat(-5.70498872745e-3f), z, splat(2.06390887954e-2f));
    p = _mm512_fmadd_ps(p, z, splat(-5.37397155531e-2f));
    p = _mm512_fmadd_ps(p, z, splat(1.33314422036e-1f));
    p = _mm512_fmadd_ps(p, z, splat(-3.33332819422e-1f));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, z), x, x);
    const __m512 e = exp16(_mm512_add_ps(ax, ax));
    const __m512 large = _mm512_sub_ps(splat(1.0f), _mm512_div_ps(splat(2.0f), _mm512_add_ps(e, splat(1.0f))));
    const __m512i sign = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN));
    const __m512 signed_large = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(large), sign));
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(ax, splat(0.625f), _CMP_LT_OQ), signed_large, p);
}

AVX512 void lltm_step_forward_avx512_f32(int64_t n, int64_t H, const float *r, const float *bias,
                                        float *g, float *c, float *h_out, float *c_out)
{
    for (int64_t k = 0; k < n; k += 16) {
        const __mmask16 m = n - k >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - k)) - 1);
        __m512 pre[3];
        for (int q = 0; q < 3; ++q) /* (g + r) + b, as the C pass adds them */
            pre[q] = _mm512_add_ps(_mm512_add_ps(_mm512_maskz_loadu_ps(m, g + q * H + k),
                                                 _mm512_maskz_loadu_ps(m, r + q * H + k)),
                                   _mm512_maskz_loadu_ps(m, bias + q * H + k));
        const __m512 i = sigmoid16(pre[0]), o = sigmoid16(pre[1]), z = elu16(pre[2]);
        const __m512 c_new = _mm512_fmadd_ps(i, z, _mm512_maskz_loadu_ps(m, c + k));
        _mm512_mask_storeu_ps(c + k, m, c_new);
        _mm512_mask_storeu_ps(h_out + k, m, _mm512_mul_ps(tanh16(c_new), o));
        if (c_out != NULL) {
            _mm512_mask_storeu_ps(c_out + k, m, c_new);
            _mm512_mask_storeu_ps(g + k, m, i);
            _mm512_mask_storeu_ps(g + H + k, m, o);
            _mm512_mask_storeu_ps(g + 2 * H + k, m, z);
        }
    }
}
#else
void lltm_step_forward_avx512_f32(int64_t n, int64_t H, const float *r, const float *bias,
                                 float *g, float *c, float *h_out, float *c_out)
{
    (void)n, (void)H, (void)r, (void)bias, (void)g, (void)c, (void)h_out, (void)c_out;
}
#endif
