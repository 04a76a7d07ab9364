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
#include "lltm_cpu_math.h"

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

/* One body pair per dtype, generated from one template around the shared
 * per-element math of lltm_cpu_math.h. Each row's loop over hidden units is
 * its own function: GCC trusts `restrict` only on parameters, and needs it to
 * vectorise (the three gate blocks of a row are disjoint slices). */
#define LLTM_DEFINE_CPU_BODIES(T, SUFFIX)                                          \
    static inline void forward_row_##SUFFIX(                                       \
        int64_t lo, int64_t hi, T *restrict g_i, T *restrict g_o, T *restrict g_z, \
        const T *restrict b_i, const T *restrict b_o, const T *restrict b_z,       \
        const T *restrict c, T *restrict h_out, T *restrict c_out)                 \
    {                                                                              \
        for (int64_t k = lo; k < hi; ++k) {                                        \
            T i, o, z, c_new, h_new;                                               \
            lltm_step_forward_##SUFFIX(g_i[k] + b_i[k], g_o[k] + b_o[k],           \
                                       g_z[k] + b_z[k], c[k], &i, &o, &z, &c_new,  \
                                       &h_new);                                    \
            g_i[k] = i;                                                            \
            g_o[k] = o;                                                            \
            g_z[k] = z;                                                            \
            c_out[k] = c_new;                                                      \
            h_out[k] = h_new;                                                      \
        }                                                                          \
    }                                                                              \
                                                                                   \
    LLTM_CPU_CLONES                                                                \
    static void forward_body_##SUFFIX(int64_t lo, int64_t hi, void *vctx)          \
    {                                                                              \
        const forward_args *a = (const forward_args *)vctx;                        \
        const int64_t H = a->H, G = 3 * a->H;                                      \
        const T *bias = (const T *)a->bias;                                        \
        for (int64_t b = 0; b < a->B; ++b) {                                       \
            T *g = (T *)a->gates + b * G;                                          \
            forward_row_##SUFFIX(lo, hi, g, g + H, g + 2 * H, bias, bias + H,      \
                                 bias + 2 * H, (const T *)a->old_cell + b * H,     \
                                 (T *)a->new_h + b * H, (T *)a->new_cell + b * H); \
        }                                                                          \
    }                                                                              \
                                                                                   \
    static inline void backward_row_##SUFFIX(                                      \
        int64_t lo, int64_t hi, const T *restrict act_i, const T *restrict act_o,  \
        const T *restrict act_z, const T *restrict c_new, const T *restrict gh,    \
        const T *restrict gc, T *restrict dg_i, T *restrict dg_o,                  \
        T *restrict dg_z, T *restrict d_c, T *restrict db_i, T *restrict db_o,     \
        T *restrict db_z)                                                          \
    {                                                                              \
        for (int64_t k = lo; k < hi; ++k) {                                        \
            T d_gi, d_go, d_gz, d_cell;                                            \
            lltm_step_backward_##SUFFIX(act_i[k], act_o[k], act_z[k], c_new[k],    \
                                        gh[k], gc[k], &d_gi, &d_go, &d_gz,         \
                                        &d_cell);                                  \
            dg_i[k] = d_gi;                                                        \
            dg_o[k] = d_go;                                                        \
            dg_z[k] = d_gz;                                                        \
            d_c[k] = d_cell;                                                       \
            db_i[k] += d_gi;                                                       \
            db_o[k] += d_go;                                                       \
            db_z[k] += d_gz;                                                       \
        }                                                                          \
    }                                                                              \
                                                                                   \
    LLTM_CPU_CLONES                                                                \
    static void backward_body_##SUFFIX(int64_t lo, int64_t hi, void *vctx)         \
    {                                                                              \
        const backward_args *a = (const backward_args *)vctx;                      \
        const int64_t H = a->H, G = 3 * a->H;                                      \
        T *d_bias = (T *)a->grad_bias;                                             \
        for (int64_t k = lo; k < hi; ++k)                                          \
            d_bias[k] = d_bias[H + k] = d_bias[2 * H + k] = (T)0;                  \
        for (int64_t b = 0; b < a->B; ++b) {                                       \
            const T *act = (const T *)a->gates + b * G;                            \
            T *d_g = (T *)a->grad_gates + b * G;                                   \
            backward_row_##SUFFIX(lo, hi, act, act + H, act + 2 * H,               \
                                  (const T *)a->new_cell + b * H,                  \
                                  (const T *)a->grad_h + b * H,                    \
                                  (const T *)a->grad_cell + b * H, d_g, d_g + H,   \
                                  d_g + 2 * H, (T *)a->grad_old_cell + b * H,      \
                                  d_bias, d_bias + H, d_bias + 2 * H);             \
        }                                                                          \
    }

LLTM_DEFINE_CPU_BODIES(float, f32)
LLTM_DEFINE_CPU_BODIES(double, f64)

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
