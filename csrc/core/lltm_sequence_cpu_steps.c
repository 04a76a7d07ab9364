/*
 * lltm_sequence_cpu_steps.c - one time step of the CPU sequence
 * (lltm_sequence_cpu_steps.h): each dtype's pointwise passes, forward and
 * backward, one row of hidden units at a time, and float32's forward step
 * with its recurrent product fused in.
 *
 * As in lltm_cpu.c, the pointwise work is split over hidden units k: a range
 * [lo, hi) owns columns k, H+k, 2H+k of every gate row, so it also owns those
 * entries of the bias gradient and accumulates them without atomics, in a
 * fixed order (deterministic for any thread count).
 */
#include "lltm_sequence_cpu_steps.h"
#include "lltm_cpu_math.h"

#include <string.h>

/* The step bodies are compiled for AVX-512 too (16 floats a vector): on
 * machines that have it they run ~2x faster than the AVX2 clone; the loader
 * picks one per machine (GNU ifunc), as for LLTM_CPU_CLONES. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(LLTM_NO_CLONES)
#define LLTM_SEQUENCE_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define LLTM_SEQUENCE_CLONES
#endif

/* One set of functions per dtype around the shared per-element math of
 * lltm_cpu_math.h (float32: branch-free, vectorisable; float64: libm;
 * float16 / bfloat16: loaded into float, the float32 math, stored back): S
 * the storage type, C the compute and accumulation type, MATH the math's
 * suffix. Each row's loop over hidden units is its own function whose
 * arrays are restrict-qualified parameters (the gate blocks of a row are
 * disjoint, and so are the arrays); GCC needs that to vectorise. Rows take
 * n units from pointers already offset to the range's first unit. */
#define LLTM_DEFINE_SEQUENCE_BODIES(S, C, SUFFIX, MATH)                             \
    static inline void seq_forward_row_##SUFFIX(                                    \
        int64_t n, const S *restrict r_i, const S *restrict r_o,                    \
        const S *restrict r_z, S *restrict g_i, S *restrict g_o, S *restrict g_z,   \
        const S *restrict b_i, const S *restrict b_o, const S *restrict b_z,        \
        C *restrict c, S *restrict h_out, S *restrict c_out)                        \
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
                                     c[k], &i, &o, &z, &c_new, &h_new);             \
            g_i[k] = lltm_store_##SUFFIX(i);                                        \
            g_o[k] = lltm_store_##SUFFIX(o);                                        \
            g_z[k] = lltm_store_##SUFFIX(z);                                        \
            c[k] = c_new;                                                           \
            c_out[k] = lltm_store_##SUFFIX(c_new);                                  \
            h_out[k] = lltm_store_##SUFFIX(h_new);                                  \
        }                                                                           \
    }                                                                               \
                                                                                    \
    /* a row past its length: gates 0, h 0, the cell state kept */              \
    static inline void seq_stopped_row_##SUFFIX(                                    \
        int64_t n, S *restrict g_i, S *restrict g_o, S *restrict g_z,               \
        const C *restrict c, S *restrict h_out, S *restrict c_out)                  \
    {                                                                               \
        for (int64_t k = 0; k < n; ++k) {                                           \
            g_i[k] = g_o[k] = g_z[k] = h_out[k] = lltm_store_##SUFFIX(0);           \
            c_out[k] = lltm_store_##SUFFIX(c[k]);                                   \
        }                                                                           \
    }                                                                               \
                                                                                    \
    LLTM_SEQUENCE_CLONES                                                            \
    static void seq_forward_body_##SUFFIX(int64_t lo, int64_t hi, void *vctx)       \
    {                                                                               \
        const lltm_seq_forward_args *a = (const lltm_seq_forward_args *)vctx;       \
        const int64_t H = a->H, G = 3 * a->H;                                       \
        const S *bias = (const S *)a->bias + lo;                                    \
        for (int64_t b = 0; b < a->B; ++b) {                                        \
            const S *r = (const S *)a->recurrent + b * G + lo;                      \
            S *g = (S *)a->gates + b * G + lo;                                      \
            if (a->lengths && a->t >= a->lengths[b]) {                              \
                seq_stopped_row_##SUFFIX(hi - lo, g, g + H, g + 2 * H,              \
                                         (const C *)a->cell_state + b * H + lo,     \
                                         (S *)a->new_h + b * H + lo,                \
                                         (S *)a->new_cell + b * H + lo);            \
                continue;                                                           \
            }                                                                       \
            seq_forward_row_##SUFFIX(hi - lo, r, r + H, r + 2 * H, g, g + H,        \
                                     g + 2 * H, bias, bias + H, bias + 2 * H,       \
                                     (C *)a->cell_state + b * H + lo,               \
                                     (S *)a->new_h + b * H + lo,                    \
                                     (S *)a->new_cell + b * H + lo);                \
        }                                                                           \
    }                                                                               \
                                                                                    \
    static inline void seq_backward_row_##SUFFIX(                                   \
        int64_t n, const S *restrict dy, const S *restrict dh, C *restrict dc,      \
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
                lltm_load_##SUFFIX(dy[k]) + lltm_load_##SUFFIX(dh[k]), dc[k],       \
                &d_gi, &d_go, &d_gz, &d_cell);                                      \
            dg_i[k] = lltm_store_##SUFFIX(d_gi);                                    \
            dg_o[k] = lltm_store_##SUFFIX(d_go);                                    \
            dg_z[k] = lltm_store_##SUFFIX(d_gz);                                    \
            dc[k] = d_cell; /* c_t = c_{t-1} + i z: dL/dc_{t-1} = dL/dc_t */        \
            db_i[k] += d_gi;                                                        \
            db_o[k] += d_go;                                                        \
            db_z[k] += d_gz;                                                        \
        }                                                                           \
    }                                                                               \
                                                                                    \
    LLTM_SEQUENCE_CLONES                                                            \
    static void seq_backward_body_##SUFFIX(int64_t lo, int64_t hi, void *vctx)      \
    {                                                                               \
        const lltm_seq_backward_args *a = (const lltm_seq_backward_args *)vctx;     \
        const int64_t H = a->H, G = 3 * a->H;                                       \
        C *db = (C *)a->grad_bias + lo;                                             \
        for (int64_t b = 0; b < a->B; ++b) {                                        \
            const S *act = (const S *)a->gates + b * G + lo;                        \
            S *dg = (S *)a->grad_gates + b * G + lo;                                \
            const int64_t steps = a->lengths ? a->lengths[b] : a->T;                \
            if (a->t >= steps) { /* past the row's end */                           \
                memset(dg, 0, (size_t)(hi - lo) * sizeof(S));                       \
                memset(dg + H, 0, (size_t)(hi - lo) * sizeof(S));                   \
                memset(dg + 2 * H, 0, (size_t)(hi - lo) * sizeof(S));               \
                continue;                                                           \
            }                                                                       \
            const S *dh = a->t == steps - 1 ? a->grad_h_n : a->grad_h;              \
            seq_backward_row_##SUFFIX(                                              \
                hi - lo, (const S *)a->grad_output + b * H + lo,                    \
                dh + b * H + lo, (C *)a->grad_cell + b * H + lo,                    \
                (const S *)a->cell + b * H + lo, act, act + H, act + 2 * H, dg,     \
                dg + H, dg + 2 * H, db, db + H, db + 2 * H);                        \
        }                                                                           \
    }                                                                               \
                                                                                    \
    /* dst [n] (C) = src [n] (S), and back */                                       \
    static void seq_load_##SUFFIX(int64_t n, const void *src, void *dst)            \
    {                                                                               \
        for (int64_t k = 0; k < n; ++k)                                             \
            ((C *)dst)[k] = lltm_load_##SUFFIX(((const S *)src)[k]);                \
    }                                                                               \
    static void seq_store_##SUFFIX(int64_t n, const void *src, void *dst)           \
    {                                                                               \
        for (int64_t k = 0; k < n; ++k)                                             \
            ((S *)dst)[k] = lltm_store_##SUFFIX(((const C *)src)[k]);               \
    }

LLTM_DEFINE_SEQUENCE_BODIES(float, float, f32, f32)
LLTM_DEFINE_SEQUENCE_BODIES(double, double, f64, f64)
LLTM_DEFINE_SEQUENCE_BODIES(uint16_t, float, f16, f32)
LLTM_DEFINE_SEQUENCE_BODIES(uint16_t, float, bf16, f32)

int lltm_seq_kernels_for(lltm_dtype dtype, lltm_seq_kernels *k)
{
#define LLTM_SEQUENCE_KERNELS(ELEM, ACC, SUFFIX)                                       \
    (lltm_seq_kernels){ELEM, ACC, seq_forward_body_##SUFFIX, seq_backward_body_##SUFFIX, \
                       seq_load_##SUFFIX, seq_store_##SUFFIX}
    switch (dtype) {
    case LLTM_FLOAT32: *k = LLTM_SEQUENCE_KERNELS(4, 4, f32); return LLTM_OK;
    case LLTM_FLOAT64: *k = LLTM_SEQUENCE_KERNELS(8, 8, f64); return LLTM_OK;
    case LLTM_FLOAT16: *k = LLTM_SEQUENCE_KERNELS(2, 4, f16); return LLTM_OK;
    case LLTM_BFLOAT16: *k = LLTM_SEQUENCE_KERNELS(2, 4, bf16); return LLTM_OK;
    }
#undef LLTM_SEQUENCE_KERNELS
    return LLTM_ERR_DTYPE;
}


/* The pointwise part of a step, units [lo, hi), on AVX-512 */
static void forward_body_avx512(int64_t lo, int64_t hi, const lltm_seq_forward_args *a,
                                bool infer)
{
    const int64_t H = a->H, G = 3 * H;
    for (int64_t b = 0; b < a->B; ++b) {
        float *g = (float *)a->gates + b * G + lo, *c = (float *)a->cell_state + b * H + lo;
        float *h = (float *)a->new_h + b * H + lo, *c_out = (float *)a->new_cell + b * H + lo;
        if (a->lengths && a->t >= a->lengths[b])
            seq_stopped_row_f32(hi - lo, g, g + H, g + 2 * H, c, h, c_out);
        else
            lltm_step_forward_avx512_f32(hi - lo, H, (const float *)a->recurrent + b * G + lo,
                                         (const float *)a->bias + lo, g, c, h,
                                         infer ? NULL : c_out);
    }
}

static void fused_step_body(int64_t lo, int64_t hi, void *vctx)
{
    const lltm_seq_fused_step *f = (const lltm_seq_fused_step *)vctx;
    for (int q = 0; q < 3; ++q) {
        lltm_mm mm = f->mm;
        mm.packed += (size_t)q * f->gate_floats;
        mm.c += q * mm.N;
        lltm_packed_mm_panels_f32(&mm, lo, hi);
    }
    const int64_t H = f->mm.N, end = hi * LLTM_PANEL;
    if (lltm_cpu_isa() == LLTM_ISA_AVX512)
        forward_body_avx512(lo * LLTM_PANEL, end < H ? end : H, f->step, f->infer);
    else
        seq_forward_body_f32(lo * LLTM_PANEL, end < H ? end : H, f->step);
}

int lltm_seq_fused_step_f32(lltm_parallel_for pfor, lltm_seq_fused_step *f)
{
    /* a range of at least ~64k multiply-adds and the grain of the
     * pointwise pass (fewer would not pay for waking a thread; at B = 1 each
     * core then streams its half of W_h from its own L2) */
    const int64_t H = f->mm.N, panels = (H + LLTM_PANEL - 1) / LLTM_PANEL;
    const int64_t by_mm = (1 << 16) / (3 * LLTM_PANEL * f->mm.M * H) + 1;
    const int64_t by_pointwise = lltm_grain_for_batch(f->step->B) / LLTM_PANEL + 1;
    const int64_t grain = by_mm < by_pointwise ? by_mm : by_pointwise;
    return pfor(0, panels, grain, fused_step_body, f) == 0 ? LLTM_OK : LLTM_ERR_PARALLEL;
}

