/*
 * lltm_cpu.c - CPU kernels of the LLTM cell: the pointwise parts of the
 * forward and backward, fused into one pass each. The matrix products are
 * the caller's (the binding runs them through aten::mm).
 *
 * Work is split over hidden units k: a range [lo, hi) of k owns columns
 * k, H+k, 2H+k of every gate row, so it can also own the bias-gradient
 * entries of those columns and sum them over the batch without atomics,
 * in a fixed order (deterministic for any thread count).
 */
#include "lltm.h"

#include <math.h>
#include <string.h>

const char *lltm_status_string(int status)
{
    switch (status) {
    case LLTM_OK: return "ok";
    case LLTM_ERR_DTYPE: return "dtype not supported by this kernel";
    case LLTM_ERR_ARGUMENT: return "invalid size or pointer";
    case LLTM_ERR_PARALLEL: return "parallel-for failed";
    case LLTM_ERR_CUDA: return "CUDA error";
    case LLTM_ERR_GEMM: return "matrix product failed";
    case LLTM_ERR_NO_MEMORY: return "out of memory";
    default: return "unknown status";
    }
}

size_t lltm_dtype_size(lltm_dtype dtype)
{
    switch (dtype) {
    case LLTM_FLOAT32: return 4;
    case LLTM_FLOAT64: return 8;
    case LLTM_FLOAT16: return 2;
    case LLTM_BFLOAT16: return 2;
    }
    return 0;
}

int lltm_serial_for(int64_t begin, int64_t end, int64_t grain,
                    lltm_range_body body, void *ctx)
{
    (void)grain;
    if (begin < end)
        body(begin, end, ctx);
    return 0;
}

/* Ranges of hidden units below this many elements (units x batch) run on one
 * thread: waking the pool costs more than the arithmetic. */
#define LLTM_CPU_GRAIN_ELEMENTS 16384

static int64_t grain_for_batch(int64_t B)
{
    int64_t g = LLTM_CPU_GRAIN_ELEMENTS / (B > 0 ? B : 1);
    return g > 0 ? g : 1;
}

typedef struct forward_args {
    int64_t B, H;
    void *gates;
    const void *bias, *old_cell;
    void *new_h, *new_cell;
} forward_args;

typedef struct backward_args {
    int64_t B, H;
    const void *grad_h, *grad_cell, *new_cell, *gates;
    void *grad_gates, *grad_old_cell, *grad_bias;
} backward_args;

/*
 * One body per dtype, generated from one template. T is the element type;
 * EXP, EXPM1 and TANH its libm functions, so float64 never passes through
 * float (the bug that broke float64 gradcheck in the tutorial's kernel).
 */
#define LLTM_DEFINE_CPU_BODIES(T, SUFFIX, EXP, EXPM1, TANH)                    \
    static inline T sigmoid_##SUFFIX(T x) { return (T)1 / ((T)1 + EXP(-x)); }  \
                                                                               \
    static void forward_body_##SUFFIX(int64_t lo, int64_t hi, void *vctx)      \
    {                                                                          \
        const forward_args *a = (const forward_args *)vctx;                    \
        const int64_t H = a->H, G = 3 * a->H;                                  \
        const T *bias = (const T *)a->bias;                                    \
        for (int64_t b = 0; b < a->B; ++b) {                                   \
            T *g = (T *)a->gates + b * G;                                      \
            const T *c = (const T *)a->old_cell + b * H;                       \
            T *h_out = (T *)a->new_h + b * H;                                  \
            T *c_out = (T *)a->new_cell + b * H;                               \
            for (int64_t k = lo; k < hi; ++k) {                                \
                const T i = sigmoid_##SUFFIX(g[k] + bias[k]);                  \
                const T o = sigmoid_##SUFFIX(g[H + k] + bias[H + k]);          \
                const T gz = g[2 * H + k] + bias[2 * H + k];                   \
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
    static void backward_body_##SUFFIX(int64_t lo, int64_t hi, void *vctx)     \
    {                                                                          \
        const backward_args *a = (const backward_args *)vctx;                  \
        const int64_t H = a->H, G = 3 * a->H;                                  \
        T *d_bias = (T *)a->grad_bias;                                         \
        for (int64_t k = lo; k < hi; ++k)                                      \
            d_bias[k] = d_bias[H + k] = d_bias[2 * H + k] = (T)0;              \
        for (int64_t b = 0; b < a->B; ++b) {                                   \
            const T *gh = (const T *)a->grad_h + b * H;                        \
            const T *gc = (const T *)a->grad_cell + b * H;                     \
            const T *c_new = (const T *)a->new_cell + b * H;                   \
            const T *act = (const T *)a->gates + b * G;                        \
            T *d_g = (T *)a->grad_gates + b * G;                               \
            T *d_c = (T *)a->grad_old_cell + b * H;                            \
            for (int64_t k = lo; k < hi; ++k) {                                \
                const T i = act[k], o = act[H + k], z = act[2 * H + k];        \
                const T tc = TANH(c_new[k]);                                   \
                const T d_o = gh[k] * tc;                                      \
                const T d_cell = gc[k] + gh[k] * o * ((T)1 - tc * tc);         \
                /* elu'(x) = 1 for x > 0, else exp(x) = z + 1 */               \
                const T d_elu = z > (T)0 ? (T)1 : z + (T)1;                    \
                const T d_gi = d_cell * z * i * ((T)1 - i);                    \
                const T d_go = d_o * o * ((T)1 - o);                           \
                const T d_gz = d_cell * i * d_elu;                             \
                d_g[k] = d_gi;                                                 \
                d_g[H + k] = d_go;                                             \
                d_g[2 * H + k] = d_gz;                                         \
                d_c[k] = d_cell;                                               \
                d_bias[k] += d_gi;                                             \
                d_bias[H + k] += d_go;                                         \
                d_bias[2 * H + k] += d_gz;                                     \
            }                                                                  \
        }                                                                      \
    }

LLTM_DEFINE_CPU_BODIES(float, f32, expf, expm1f, tanhf)
LLTM_DEFINE_CPU_BODIES(double, f64, exp, expm1, tanh)

static int check_sizes(int64_t B, int64_t H, lltm_parallel_for pfor)
{
    return (B < 0 || H < 0 || pfor == NULL) ? LLTM_ERR_ARGUMENT : LLTM_OK;
}

int lltm_cell_forward_pointwise_cpu(lltm_dtype dtype, int64_t B, int64_t H,
                                    void *gates, const void *bias,
                                    const void *old_cell, void *new_h,
                                    void *new_cell, lltm_parallel_for pfor)
{
    int status = check_sizes(B, H, pfor);
    if (status != LLTM_OK)
        return status;
    forward_args args = {B, H, gates, bias, old_cell, new_h, new_cell};
    lltm_range_body body;
    switch (dtype) {
    case LLTM_FLOAT32: body = forward_body_f32; break;
    case LLTM_FLOAT64: body = forward_body_f64; break;
    default: return LLTM_ERR_DTYPE;
    }
    if (B == 0 || H == 0)
        return LLTM_OK;
    return pfor(0, H, grain_for_batch(B), body, &args) == 0 ? LLTM_OK
                                                             : LLTM_ERR_PARALLEL;
}

int lltm_cell_backward_pointwise_cpu(lltm_dtype dtype, int64_t B, int64_t H,
                                     const void *grad_h, const void *grad_cell,
                                     const void *new_cell, const void *gates,
                                     void *grad_gates, void *grad_old_cell,
                                     void *grad_bias, lltm_parallel_for pfor)
{
    int status = check_sizes(B, H, pfor);
    if (status != LLTM_OK)
        return status;
    backward_args args = {B,          H,         grad_h,        grad_cell,
                          new_cell,   gates,     grad_gates,    grad_old_cell,
                          grad_bias};
    lltm_range_body body;
    switch (dtype) {
    case LLTM_FLOAT32: body = backward_body_f32; break;
    case LLTM_FLOAT64: body = backward_body_f64; break;
    default: return LLTM_ERR_DTYPE;
    }
    if (H == 0)
        return LLTM_OK;
    /* With B == 0 the body still runs once per range to zero grad_bias. */
    return pfor(0, H, grain_for_batch(B), body, &args) == 0 ? LLTM_OK
                                                             : LLTM_ERR_PARALLEL;
}
