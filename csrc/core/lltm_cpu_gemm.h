/*
 * lltm_cpu_gemm.h - the core's own float32 matrix products on the CPU
 * (lltm_cpu_gemm.c), by a right operand packed once or a block at a time.
 * The float32 sequence runs all its products on them: no library call per
 * step, and the weights laid out once per call for the whole sequence.
 *
 * Packed layout of b [K,N]: panels of LLTM_PANEL columns, panel p holding
 * b[k, p*16 + j] at packed[(p*K + k)*16 + j], lanes past N zero.
 *
 * The kernels exist for AVX-512, AVX2 + FMA and the baseline, chosen at the
 * first call by the CPU's features; lltm_cpu_set_isa forces one (for tests
 * and measurements). Each sum runs in k order in float32: the result does
 * not depend on the thread count, but the ISAs differ in rounding (FMA).
 */
#ifndef LLTM_CORE_CPU_GEMM_H
#define LLTM_CORE_CPU_GEMM_H

#include "lltm.h"

#define LLTM_PANEL 16

/* floats of the packed form of b [K,N] */
static inline size_t lltm_packed_floats(int64_t N, int64_t K)
{
    return (size_t)((N + LLTM_PANEL - 1) / LLTM_PANEL) * LLTM_PANEL * (size_t)K;
}

/* packed = b [K,N], element (k,n) at b[k*b_rs + n*b_cs]. */
void lltm_pack_f32(int64_t N, int64_t K, const float *b, int64_t b_rs, int64_t b_cs,
                   float *packed);

/* c [M,N] (row stride ldc) = a [M,K] (row stride lda) times the packed b;
 * M, N, K >= 1, split over blocks of rows and columns with pfor. LLTM_OK
 * or LLTM_ERR_PARALLEL. */
int lltm_packed_mm_f32(int64_t M, int64_t N, int64_t K, const float *a, int64_t lda,
                       const float *packed, float *c, int64_t ldc, lltm_parallel_for pfor);

/* c [M,N] = a [M,K] b [K,N], element (m,k) of a at a[m*a_rs + k*a_cs],
 * (k,n) of b at b[k*b_rs + n*b_cs], for long K (the weight gradients, K =
 * T*B): b packed a block of rows at a time into work, of
 * lltm_mm_workspace_f32(M, N) floats, and a's block laid out along k there
 * too where a's steps along k are far apart. M, N, K >= 1. */
size_t lltm_mm_workspace_f32(int64_t M, int64_t N);
int lltm_mm_f32(int64_t M, int64_t N, int64_t K, const float *a, int64_t a_rs, int64_t a_cs,
                const float *b, int64_t b_rs, int64_t b_cs, float *c, int64_t ldc, float *work,
                lltm_parallel_for pfor);

/* c [M,N] (row stride ldc) = a^T b for row-major a [K,M] and b [K,N], long
 * K (the weight gradients dG^T x over T*B rows), through lltm_mm_f32 in
 * work, of lltm_mm_tn_workspace_f32(M, N) floats (which serve any N' <= N
 * too). M, N, K >= 1. */
size_t lltm_mm_tn_workspace_f32(int64_t M, int64_t N);
int lltm_mm_tn_f32(int64_t M, int64_t N, int64_t K, const float *a, const float *b, float *c,
                   int64_t ldc, float *work, lltm_parallel_for pfor);

/* One product for lltm_packed_mm_panels_f32: c [M,N] = a [M,K] packed. */
typedef struct lltm_mm {
    int64_t M, N, K, lda, a_cs, ldc; /* a (m,k) at a[m*lda + k*a_cs] */
    int64_t ldp;                     /* K of the packing: panel p at packed + p*ldp*16 */
    int accumulate;                  /* c += a b instead of c = a b */
    const float *a, *packed;
    float *c;
} lltm_mm;

/* Panels [lo, hi) of c (columns 16 lo .. 16 hi - 1, those < N) on the
 * calling thread: for callers that split the work themselves. */
void lltm_packed_mm_panels_f32(const lltm_mm *x, int64_t lo, int64_t hi);

/* float32's forward step for one row on AVX-512 (lltm_cpu_step.c; only
 * where lltm_cpu_isa() is LLTM_ISA_AVX512): units [0, n) of gate blocks H
 * apart in r (the recurrent product), bias and g (in: the input
 * projection; out: the activations [i | o | z] where c_out is not NULL);
 * c [n] the cell state, in and out; h_out [n] h_t; c_out [n] c_t, or NULL
 * (inference: neither it nor the activations are written). The math of
 * lltm_cpu_math.h with fused multiply-adds: within a few ulp of it. */
void lltm_step_forward_avx512_f32(int64_t n, int64_t H, const float *r, const float *bias,
                                  float *g, float *c, float *h_out, float *c_out);

#endif /* LLTM_CORE_CPU_GEMM_H */
