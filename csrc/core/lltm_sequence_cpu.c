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
 * lltm_cpu_math.h (float32: branch-free, vectorisable; float64: libm). Each
 * row's loop over hidden units is its own function whose arrays are
 * restrict-qualified parameters (the gate blocks of a row are disjoint, and
 * so are the arrays: lltm.h's aliasing rule); GCC needs that to vectorise. */
#define LLTM_DEFINE_SEQUENCE_BODIES(T, SUFFIX)                                      \
    static inline void seq_forward_row_##SUFFIX(                                    \
        int64_t lo, int64_t hi, const T *restrict r_i, const T *restrict r_o,       \
        const T *restrict r_z, T *restrict g_i, T *restrict g_o, T *restrict g_z,   \
        const T *restrict b_i, const T *restrict b_o, const T *restrict b_z,        \
        const T *restrict c, T *restrict h_out, T *restrict c_out)                  \
    {                                                                               \
        for (int64_t k = lo; k < hi; ++k) {                                         \
            T i, o, z, c_new, h_new;                                                \
            lltm_step_forward_##SUFFIX(g_i[k] + r_i[k] + b_i[k],                    \
                                       g_o[k] + r_o[k] + b_o[k],                    \
                                       g_z[k] + r_z[k] + b_z[k], c[k], &i, &o, &z,  \
                                       &c_new, &h_new);                             \
            g_i[k] = i;                                                             \
            g_o[k] = o;                                                             \
            g_z[k] = z;                                                             \
            c_out[k] = c_new;                                                       \
            h_out[k] = h_new;                                                       \
        }                                                                           \
    }                                                                               \
                                                                                    \
    LLTM_SEQUENCE_CLONES                                                            \
    static void seq_forward_body_##SUFFIX(int64_t lo, int64_t hi, void *vctx)       \
    {                                                                               \
        const sequence_forward_args *a = (const sequence_forward_args *)vctx;       \
        const int64_t H = a->H, G = 3 * a->H;                                       \
        const T *bias = (const T *)a->bias;                                         \
        for (int64_t b = 0; b < a->B; ++b) {                                        \
            const T *r = (const T *)a->recurrent + b * G;                           \
            T *g = (T *)a->gates + b * G;                                           \
            seq_forward_row_##SUFFIX(lo, hi, r, r + H, r + 2 * H, g, g + H,         \
                                     g + 2 * H, bias, bias + H, bias + 2 * H,       \
                                     (const T *)a->old_cell + b * H,                \
                                     (T *)a->new_h + b * H,                         \
                                     (T *)a->new_cell + b * H);                     \
        }                                                                           \
    }                                                                               \
                                                                                    \
    static inline void seq_backward_row_##SUFFIX(                                   \
        int64_t lo, int64_t hi, const T *restrict dy, const T *restrict dh,         \
        T *restrict dc, const T *restrict c_new, const T *restrict a_i,             \
        const T *restrict a_o, const T *restrict a_z, T *restrict dg_i,             \
        T *restrict dg_o, T *restrict dg_z, T *restrict db_i, T *restrict db_o,     \
        T *restrict db_z)                                                           \
    {                                                                               \
        for (int64_t k = lo; k < hi; ++k) {                                         \
            T d_gi, d_go, d_gz, d_cell;                                             \
            /* dL/dh_t: from the output at t plus through step t+1 */              \
            lltm_step_backward_##SUFFIX(a_i[k], a_o[k], a_z[k], c_new[k],           \
                                        dy[k] + dh[k], dc[k], &d_gi, &d_go, &d_gz,  \
                                        &d_cell);                                   \
            dg_i[k] = d_gi;                                                         \
            dg_o[k] = d_go;                                                         \
            dg_z[k] = d_gz;                                                         \
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
        const sequence_backward_args *a = (const sequence_backward_args *)vctx;     \
        const int64_t H = a->H, G = 3 * a->H;                                       \
        T *db = (T *)a->grad_bias;                                                  \
        for (int64_t b = 0; b < a->B; ++b) {                                        \
            const T *act = (const T *)a->gates + b * G;                             \
            T *dg = (T *)a->grad_gates + b * G;                                     \
            seq_backward_row_##SUFFIX(                                              \
                lo, hi, (const T *)a->grad_output + b * H,                          \
                (const T *)a->grad_h + b * H, (T *)a->grad_cell + b * H,            \
                (const T *)a->cell + b * H, act, act + H, act + 2 * H, dg, dg + H,  \
                dg + 2 * H, db, db + H, db + 2 * H);                                \
        }                                                                           \
    }

LLTM_DEFINE_SEQUENCE_BODIES(float, f32)
LLTM_DEFINE_SEQUENCE_BODIES(double, f64)

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
    default: return LLTM_ERR_DTYPE;
    }
    if (B == 0 || H == 0)
        return LLTM_OK;
    sequence_backward_args args = {B,     H,     grad_output, grad_h,   grad_cell,
                                   cell,  gates, grad_gates,  grad_bias};
    return pfor(0, H, sequence_grain(B), body, &args) == 0 ? LLTM_OK : LLTM_ERR_PARALLEL;
}
