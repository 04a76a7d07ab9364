/*
 * lltm_cpu.c - CPU kernels of the LLTM cell: the pointwise parts of the
 * forward and backward, fused into one pass each. The matrix products are
 * the caller's (the binding runs them through aten::mm).
 *
 * Work is split over hidden units k: a range [lo, hi) of k owns columns
 * k, H+k, 2H+k of every gate row, so it can also own the bias-gradient
 * entries of those columns and sum them over the batch without atomics,
 * in a fixed order (deterministic for any thread count).
 *
 * float16 and bfloat16 load into float, compute in float (the float32 math)
 * and store in their own type; the bias gradient sums in float.
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

/* Bias-gradient entries summed at once on the stack, per gate: a range of
 * units is reduced chunk by chunk, each chunk over the whole batch, in the
 * compute type (float for float16 / bfloat16), then stored once. */
#define LLTM_CPU_BIAS_CHUNK 256

/* One body pair per dtype, generated from one template around the shared
 * per-element math of lltm_cpu_math.h: S the storage type, C the compute
 * type, MATH the math's suffix (f32 / f64). Each row's loop over hidden units
 * is its own function: GCC trusts `restrict` only on parameters, and needs it
 * to vectorise (the three gate blocks of a row are disjoint slices). Rows
 * take n units from pointers already offset to the range's first unit. */
#define LLTM_DEFINE_CPU_BODIES(S, C, SUFFIX, MATH)                                 \
    static inline void forward_row_##SUFFIX(                                       \
        int64_t n, S *restrict g_i, S *restrict g_o, S *restrict g_z,              \
        const S *restrict b_i, const S *restrict b_o, const S *restrict b_z,       \
        const S *restrict c, S *restrict h_out, S *restrict c_out)                 \
    {                                                                              \
        for (int64_t k = 0; k < n; ++k) {                                          \
            C i, o, z, c_new, h_new;                                               \
            lltm_step_forward_##MATH(                                              \
                lltm_load_##SUFFIX(g_i[k]) + lltm_load_##SUFFIX(b_i[k]),           \
                lltm_load_##SUFFIX(g_o[k]) + lltm_load_##SUFFIX(b_o[k]),           \
                lltm_load_##SUFFIX(g_z[k]) + lltm_load_##SUFFIX(b_z[k]),           \
                lltm_load_##SUFFIX(c[k]), &i, &o, &z, &c_new, &h_new);             \
            g_i[k] = lltm_store_##SUFFIX(i);                                       \
            g_o[k] = lltm_store_##SUFFIX(o);                                       \
            g_z[k] = lltm_store_##SUFFIX(z);                                       \
            c_out[k] = lltm_store_##SUFFIX(c_new);                                 \
            h_out[k] = lltm_store_##SUFFIX(h_new);                                 \
        }                                                                          \
    }                                                                              \
                                                                                   \
    LLTM_CPU_CLONES                                                                \
    static void forward_body_##SUFFIX(int64_t lo, int64_t hi, void *vctx)          \
    {                                                                              \
        const forward_args *a = (const forward_args *)vctx;                        \
        const int64_t H = a->H, G = 3 * a->H;                                      \
        const S *bias = (const S *)a->bias + lo;                                   \
        for (int64_t b = 0; b < a->B; ++b) {                                       \
            S *g = (S *)a->gates + b * G + lo;                                     \
            forward_row_##SUFFIX(hi - lo, g, g + H, g + 2 * H, bias, bias + H,     \
                                 bias + 2 * H, (const S *)a->old_cell + b * H + lo, \
                                 (S *)a->new_h + b * H + lo,                       \
                                 (S *)a->new_cell + b * H + lo);                   \
        }                                                                          \
    }                                                                              \
                                                                                   \
    static inline void backward_row_##SUFFIX(                                      \
        int64_t n, const S *restrict act_i, const S *restrict act_o,               \
        const S *restrict act_z, const S *restrict c_new, const S *restrict gh,    \
        const S *restrict gc, S *restrict dg_i, S *restrict dg_o,                  \
        S *restrict dg_z, S *restrict d_c, C *restrict db_i, C *restrict db_o,     \
        C *restrict db_z)                                                          \
    {                                                                              \
        for (int64_t k = 0; k < n; ++k) {                                          \
            C d_gi, d_go, d_gz, d_cell;                                            \
            lltm_step_backward_##MATH(                                             \
                lltm_load_##SUFFIX(act_i[k]), lltm_load_##SUFFIX(act_o[k]),        \
                lltm_load_##SUFFIX(act_z[k]), lltm_load_##SUFFIX(c_new[k]),        \
                lltm_load_##SUFFIX(gh[k]), lltm_load_##SUFFIX(gc[k]), &d_gi,       \
                &d_go, &d_gz, &d_cell);                                            \
            dg_i[k] = lltm_store_##SUFFIX(d_gi);                                   \
            dg_o[k] = lltm_store_##SUFFIX(d_go);                                   \
            dg_z[k] = lltm_store_##SUFFIX(d_gz);                                   \
            d_c[k] = lltm_store_##SUFFIX(d_cell);                                  \
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
        S *d_bias = (S *)a->grad_bias;                                             \
        C acc[3][LLTM_CPU_BIAS_CHUNK];                                             \
        for (int64_t k0 = lo; k0 < hi; k0 += LLTM_CPU_BIAS_CHUNK) {                \
            const int64_t n = hi - k0 < LLTM_CPU_BIAS_CHUNK ? hi - k0                \
                                                            : LLTM_CPU_BIAS_CHUNK; \
            for (int64_t k = 0; k < n; ++k)                                        \
                acc[0][k] = acc[1][k] = acc[2][k] = (C)0;                          \
            for (int64_t b = 0; b < a->B; ++b) {                                   \
                const S *act = (const S *)a->gates + b * G + k0;                   \
                S *d_g = (S *)a->grad_gates + b * G + k0;                          \
                backward_row_##SUFFIX(n, act, act + H, act + 2 * H,                \
                                      (const S *)a->new_cell + b * H + k0,         \
                                      (const S *)a->grad_h + b * H + k0,           \
                                      (const S *)a->grad_cell + b * H + k0, d_g,   \
                                      d_g + H, d_g + 2 * H,                        \
                                      (S *)a->grad_old_cell + b * H + k0, acc[0],  \
                                      acc[1], acc[2]);                             \
            }                                                                      \
            for (int64_t k = 0; k < n; ++k) {                                      \
                d_bias[k0 + k] = lltm_store_##SUFFIX(acc[0][k]);                   \
                d_bias[H + k0 + k] = lltm_store_##SUFFIX(acc[1][k]);               \
                d_bias[2 * H + k0 + k] = lltm_store_##SUFFIX(acc[2][k]);           \
            }                                                                      \
        }                                                                          \
    }

LLTM_DEFINE_CPU_BODIES(float, float, f32, f32)
LLTM_DEFINE_CPU_BODIES(double, double, f64, f64)
LLTM_DEFINE_CPU_BODIES(uint16_t, float, f16, f32)
LLTM_DEFINE_CPU_BODIES(uint16_t, float, bf16, f32)

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
    case LLTM_FLOAT16: body = forward_body_f16; break;
    case LLTM_BFLOAT16: body = forward_body_bf16; break;
    default: return LLTM_ERR_DTYPE;
    }
    if (B == 0 || H == 0)
        return LLTM_OK;
    return pfor(0, H, lltm_grain_for_batch(B), body, &args) == 0 ? LLTM_OK
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
    case LLTM_FLOAT16: body = backward_body_f16; break;
    case LLTM_BFLOAT16: body = backward_body_bf16; break;
    default: return LLTM_ERR_DTYPE;
    }
    if (H == 0)
        return LLTM_OK;
    /* With B == 0 the body still runs once per range to zero grad_bias. */
    return pfor(0, H, lltm_grain_for_batch(B), body, &args) == 0 ? LLTM_OK
                                                                  : LLTM_ERR_PARALLEL;
}
