/*
 * lltm_sequence_cpu.c - CPU kernels of one LLTM layer run over a whole
 * sequence: the fused pointwise part of one forward step and of one backward
 * step. The caller (csrc/binding/sequence_cpu.c) runs the time loop and the
 * matrix products; see lltm.h for the algorithm and the shapes.
 *
 * As in lltm_cpu.c, work is split over hidden units k: a range [lo, hi) owns
 * columns k, H+k, 2H+k of every gate row, so it also owns those entries of
 * the bias gradient and accumulates them without atomics, in a fixed order
 * (deterministic for any thread count).
 */
#include "lltm.h"
#include "lltm_cpu_math.h"

/* The step bodies are compiled for AVX-512 too (16 floats a vector): on
 * machines that have it they run ~2x faster than the AVX2 clone; the loader
 * picks one per machine (GNU ifunc), as for LLTM_CPU_CLONES. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(LLTM_NO_CLONES)
#define LLTM_SEQUENCE_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define LLTM_SEQUENCE_CLONES
#endif

/* Same grain as the cell: below this many elements (units x batch) one
 * thread does the step, waking the pool would cost more. */
#define LLTM_SEQUENCE_GRAIN_ELEMENTS 16384

static int64_t sequence_grain(int64_t B)
{
    int64_t g = LLTM_SEQUENCE_GRAIN_ELEMENTS / (B > 0 ? B : 1);
    return g > 0 ? g : 1;
}

typedef struct sequence_forward_args {
    int64_t B, H;
    const void *recurrent;
    void *gates;
    const void *bias, *old_cell;
    void *new_h, *new_cell;
} sequence_forward_args;

typedef struct sequence_backward_args {
    int64_t B, H;
    const void *grad_output, *grad_h;
    void *grad_cell;
    const void *cell, *gates;
    void *grad_gates, *grad_bias;
} sequence_backward_args;

/* One set of functions per dtype around the shared per-element math of
 * lltm_cpu_math.h (float32: branch-free, vectorisable; float64: libm;
 * float16 / bfloat16: loaded into float, the float32 math, stored back): S
 * the storage type, C the compute type (also the bias gradient's), MATH the
 * math's suffix. Each row's loop over hidden units is its own function
 * whose arrays are restrict-qualified parameters (the gate blocks of a row
 * are disjoint, and so are the arrays: lltm.h's aliasing rule); GCC needs
 * that to vectorise. Rows take n units from pointers already offset to the
 * range's first unit. */
#define LLTM_DEFINE_SEQUENCE_BODIES(S, C, SUFFIX, MATH)                             \
    static inline void seq_forward_row_##SUFFIX(                                    \
        int64_t n, const S *restrict r_i, const S *restrict r_o,                    \
        const S *restrict r_z, S *restrict g_i, S *restrict g_o, S *restrict g_z,   \
        const S *restrict b_i, const S *restrict b_o, const S *restrict b_z,        \
        const S *restrict c, S *restrict h_out, S *restrict c_out)                  \
    {                                                                               \
        for (int64_t k = 0; k < n; ++k) {                                           \
            C i, o, z, c_new, h_new;                                                \
            lltm_step_forward_##MATH(lltm_load_##SUFFIX(g_i[k]) +                   \
                                         lltm_load_##SUFFIX(r_i[k]) +               \
                                         lltm_load_##SUFFIX(b_i[k]),                \
                                     lltm_load_##SUFFIX(g_o[k]) +                   \
                                         lltm_load_##SUFFIX(r_o[k]) +               \
                                         lltm_load_##SUFFIX(b_o[k]),                \
                                     lltm_load_##SUFFIX(g_z[k]) +                   \
                                         lltm_load_##SUFFIX(r_z[k]) +               \
                                         lltm_load_##SUFFIX(b_z[k]),                \
                                     lltm_load_##SUFFIX(c[k]), &i, &o, &z, &c_new,  \
                                     &h_new);                                       \
            g_i[k] = lltm_store_##SUFFIX(i);                                        \
            g_o[k] = lltm_store_##SUFFIX(o);                                        \
            g_z[k] = lltm_store_##SUFFIX(z);                                        \
            c_out[k] = lltm_store_##SUFFIX(c_new);                                  \
            h_out[k] = lltm_store_##SUFFIX(h_new);                                  \
        }                                                                           \
    }                                                                               \
                                                                                    \
    LLTM_SEQUENCE_CLONES                                                            \
    static void seq_forward_body_##SUFFIX(int64_t lo, int64_t hi, void *vctx)       \
    {                                                                               \
        const sequence_forward_args *a = (const sequence_forward_args *)vctx;       \
        const int64_t H = a->H, G = 3 * a->H;                                       \
        const S *bias = (const S *)a->bias + lo;                                    \
        for (int64_t b = 0; b < a->B; ++b) {                                        \
            const S *r = (const S *)a->recurrent + b * G + lo;                      \
            S *g = (S *)a->gates + b * G + lo;                                      \
            seq_forward_row_##SUFFIX(hi - lo, r, r + H, r + 2 * H, g, g + H,        \
                                     g + 2 * H, bias, bias + H, bias + 2 * H,       \
                                     (const S *)a->old_cell + b * H + lo,           \
                                     (S *)a->new_h + b * H + lo,                    \
                                     (S *)a->new_cell + b * H + lo);                \
        }                                                                           \
    }                                                                               \
                                                                                    \
    static inline void seq_backward_row_##SUFFIX(                                   \
        int64_t n, const S *restrict dy, const S *restrict dh, S *restrict dc,      \
        const S *restrict c_new, const S *restrict a_i, const S *restrict a_o,      \
        const S *restrict a_z, S *restrict dg_i, S *restrict dg_o,                  \
        S *restrict dg_z, C *restrict db_i, C *restrict db_o, C *restrict db_z)     \
    {                                                                               \
        for (int64_t k = 0; k < n; ++k) {                                           \
            C d_gi, d_go, d_gz, d_cell;                                             \
            /* dL/dh_t: from the output at t plus through step t+1 */               \
            lltm_step_backward_##MATH(                                              \
                lltm_load_##SUFFIX(a_i[k]), lltm_load_##SUFFIX(a_o[k]),             \
                lltm_load_##SUFFIX(a_z[k]), lltm_load_##SUFFIX(c_new[k]),           \
                lltm_load_##SUFFIX(dy[k]) + lltm_load_##SUFFIX(dh[k]),              \
                lltm_load_##SUFFIX(dc[k]), &d_gi, &d_go, &d_gz, &d_cell);           \
            dg_i[k] = lltm_store_##SUFFIX(d_gi);                                    \
            dg_o[k] = lltm_store_##SUFFIX(d_go);                                    \
            dg_z[k] = lltm_store_##SUFFIX(d_gz);                                    \
            /* c_t = c_{t-1} + i z: dL/dc_{t-1} = dL/dc_t */                        \
            dc[k] = lltm_store_##SUFFIX(d_cell);                                    \
            db_i[k] += d_gi;                                                        \
            db_o[k] += d_go;                                                        \
            db_z[k] += d_gz;                                                        \
        }                                                                           \
    }                                                                               \
                                                                                    \
    LLTM_SEQUENCE_CLONES                                                            \
    static void seq_backward_body_##SUFFIX(int64_t lo, int64_t hi, void *vctx)      \
    {                                                                               \
        const sequence_backward_args *a = (const sequence_backward_args *)vctx;     \
        const int64_t H = a->H, G = 3 * a->H;                                       \
        C *db = (C *)a->grad_bias + lo;                                             \
        for (int64_t b = 0; b < a->B; ++b) {                                        \
            const S *act = (const S *)a->gates + b * G + lo;                        \
            S *dg = (S *)a->grad_gates + b * G + lo;                                \
            seq_backward_row_##SUFFIX(                                              \
                hi - lo, (const S *)a->grad_output + b * H + lo,                    \
                (const S *)a->grad_h + b * H + lo, (S *)a->grad_cell + b * H + lo,  \
                (const S *)a->cell + b * H + lo, act, act + H, act + 2 * H, dg,     \
                dg + H, dg + 2 * H, db, db + H, db + 2 * H);                        \
        }                                                                           \
    }

LLTM_DEFINE_SEQUENCE_BODIES(float, float, f32, f32)
LLTM_DEFINE_SEQUENCE_BODIES(double, double, f64, f64)
LLTM_DEFINE_SEQUENCE_BODIES(uint16_t, float, f16, f32)
LLTM_DEFINE_SEQUENCE_BODIES(uint16_t, float, bf16, f32)

int lltm_sequence_forward_step_cpu(lltm_dtype dtype, int64_t B, int64_t H,
                                   const void *recurrent, void *gates,
                                   const void *bias, const void *old_cell,
                                   void *new_h, void *new_cell,
                                   lltm_parallel_for pfor)
{
    if (B < 0 || H < 0 || pfor == NULL)
        return LLTM_ERR_ARGUMENT;
    lltm_range_body body;
    switch (dtype) {
    case LLTM_FLOAT32: body = seq_forward_body_f32; break;
    case LLTM_FLOAT64: body = seq_forward_body_f64; break;
    case LLTM_FLOAT16: body = seq_forward_body_f16; break;
    case LLTM_BFLOAT16: body = seq_forward_body_bf16; break;
    default: return LLTM_ERR_DTYPE;
    }
    if (B == 0 || H == 0)
        return LLTM_OK;
    sequence_forward_args args = {B, H, recurrent, gates, bias, old_cell, new_h, new_cell};
    return pfor(0, H, sequence_grain(B), body, &args) == 0 ? LLTM_OK : LLTM_ERR_PARALLEL;
}

int lltm_sequence_backward_step_cpu(lltm_dtype dtype, int64_t B, int64_t H,
                                    const void *grad_output, const void *grad_h,
                                    void *grad_cell, const void *cell,
                                    const void *gates, void *grad_gates,
                                    void *grad_bias, lltm_parallel_for pfor)
{
    if (B < 0 || H < 0 || pfor == NULL)
        return LLTM_ERR_ARGUMENT;
    lltm_range_body body;
    switch (dtype) {
    case LLTM_FLOAT32: body = seq_backward_body_f32; break;
    case LLTM_FLOAT64: body = seq_backward_body_f64; break;
    case LLTM_FLOAT16: body = seq_backward_body_f16; break;
    case LLTM_BFLOAT16: body = seq_backward_body_bf16; break;
    default: return LLTM_ERR_DTYPE;
    }
    if (B == 0 || H == 0)
        return LLTM_OK;
    sequence_backward_args args = {B,     H,     grad_output, grad_h,   grad_cell,
                                   cell,  gates, grad_gates,  grad_bias};
    return pfor(0, H, sequence_grain(B), body, &args) == 0 ? LLTM_OK : LLTM_ERR_PARALLEL;
}
