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

#include <math.h>

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

/* One body pair per dtype; EXP, EXPM1, TANH are the dtype's own libm
 * functions, so float64 never passes through float. */
#define LLTM_DEFINE_SEQUENCE_BODIES(T, SUFFIX, EXP, EXPM1, TANH)               \
    static inline T seq_sigmoid_##SUFFIX(T x) { return (T)1 / ((T)1 + EXP(-x)); } \
                                                                               \
    static void seq_forward_body_##SUFFIX(int64_t lo, int64_t hi, void *vctx)  \
    {                                                                          \
        const sequence_forward_args *a = (const sequence_forward_args *)vctx;  \
        const int64_t H = a->H, G = 3 * a->H;                                  \
        const T *bias = (const T *)a->bias;                                    \
        for (int64_t b = 0; b < a->B; ++b) {                                   \
            const T *r = (const T *)a->recurrent + b * G;                      \
            T *g = (T *)a->gates + b * G;                                      \
            const T *c = (const T *)a->old_cell + b * H;                       \
            T *h_out = (T *)a->new_h + b * H;                                  \
            T *c_out = (T *)a->new_cell + b * H;                               \
            for (int64_t k = lo; k < hi; ++k) {                                \
                const T gi = g[k] + r[k] + bias[k];                            \
                const T go = g[H + k] + r[H + k] + bias[H + k];                \
                const T gz = g[2 * H + k] + r[2 * H + k] + bias[2 * H + k];    \
                const T i = seq_sigmoid_##SUFFIX(gi);                          \
                const T o = seq_sigmoid_##SUFFIX(go);                          \
                const T z = gz > (T)0 ? gz : EXPM1(gz);                        \
                const T c_new = c[k] + i * z;                                  \
                g[k] = i;                                                      \
                g[H + k] = o;                                                  \
                g[2 * H + k] = z;                                              \
                c_out[k] = c_new;                                              \
                h_out[k] = TANH(c_new) * o;                                    \
            }                                                                  \
        }                                                                      \
    }                                                                          \
                                                                               \
    static void seq_backward_body_##SUFFIX(int64_t lo, int64_t hi, void *vctx) \
    {                                                                          \
        const sequence_backward_args *a = (const sequence_backward_args *)vctx; \
        const int64_t H = a->H, G = 3 * a->H;                                  \
        T *d_bias = (T *)a->grad_bias;                                         \
        for (int64_t b = 0; b < a->B; ++b) {                                   \
            const T *dy = (const T *)a->grad_output + b * H;                   \
            const T *dh = (const T *)a->grad_h + b * H;                        \
            T *dc = (T *)a->grad_cell + b * H;                                 \
            const T *c_new = (const T *)a->cell + b * H;                       \
            const T *act = (const T *)a->gates + b * G;                        \
            T *d_g = (T *)a->grad_gates + b * G;                               \
            for (int64_t k = lo; k < hi; ++k) {                                \
                const T i = act[k], o = act[H + k], z = act[2 * H + k];        \
                const T gh = dy[k] + dh[k];                                    \
                const T tc = TANH(c_new[k]);                                   \
                const T d_o = gh * tc;                                         \
                const T d_cell = dc[k] + gh * o * ((T)1 - tc * tc);            \
                /* elu'(x) = 1 for x > 0, else exp(x) = z + 1 */               \
                const T d_elu = z > (T)0 ? (T)1 : z + (T)1;                    \
                const T d_gi = d_cell * z * i * ((T)1 - i);                    \
                const T d_go = d_o * o * ((T)1 - o);                           \
                const T d_gz = d_cell * i * d_elu;                             \
                d_g[k] = d_gi;                                                 \
                d_g[H + k] = d_go;                                             \
                d_g[2 * H + k] = d_gz;                                         \
                dc[k] = d_cell; /* c = c_prev + i z: dL/dc_prev = dL/dc */     \
                d_bias[k] += d_gi;                                             \
                d_bias[H + k] += d_go;                                         \
                d_bias[2 * H + k] += d_gz;                                     \
            }                                                                  \
        }                                                                      \
    }

LLTM_DEFINE_SEQUENCE_BODIES(float, f32, expf, expm1f, tanhf)
LLTM_DEFINE_SEQUENCE_BODIES(double, f64, exp, expm1, tanh)

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
