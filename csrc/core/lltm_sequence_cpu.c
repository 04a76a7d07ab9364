/*
 * lltm_sequence_cpu.c - one LLTM layer over a whole sequence on the CPU: the
 * time loop, forward and backward (lltm_sequence_forward_cpu /
 * lltm_sequence_backward_cpu), the products and the workspaces; one step's
 * pointwise work is in lltm_sequence_cpu_steps.c. float32's products run on
 * the core's own kernel (lltm_cpu_gemm.h) on AVX2 and AVX-512 CPUs, W packed
 * once per call, the forward step's product fused with its pointwise pass;
 * the other dtypes' go through the caller's lltm_gemm callback (the
 * binding: aten::mm). lltm.h documents the algorithm, the shapes and the
 * workspaces.
 *
 * The recurrent cell state c and its running gradient dL/dc are carried in
 * the accumulation type (float for float16 / bfloat16) between steps; the
 * saved cells are those values rounded to the dtype.
 */
#include "lltm_sequence_cpu_steps.h"
#include "lltm_cpu_math.h"

#include <stdbool.h>
#include <string.h>

/* Byte address of element `index` of an array of `elem`-byte items. */
static inline void *at(const void *base, int64_t index, size_t elem)
{
    return (char *)base + (size_t)index * elem;
}

/* dst [cols, rows] = the transpose of the [rows, cols] block of src whose
 * rows are `ld` elements apart (row r, column c at src[r*ld + c]). */
#define LLTM_DEFINE_TRANSPOSE(T, SUFFIX)                                              \
    static void transpose_##SUFFIX(int64_t rows, int64_t cols, const T *src,          \
                                   int64_t ld, T *dst)                                \
    {                                                                                 \
        for (int64_t r = 0; r < rows; ++r)                                            \
            for (int64_t c = 0; c < cols; ++c)                                        \
                dst[c * rows + r] = src[r * ld + c];                                  \
    }
LLTM_DEFINE_TRANSPOSE(uint16_t, 16)
LLTM_DEFINE_TRANSPOSE(uint32_t, 32)
LLTM_DEFINE_TRANSPOSE(uint64_t, 64)

/* Elements are moved as bits of their size. */
static void transpose(size_t elem, int64_t rows, int64_t cols, const void *src, int64_t ld,
                      void *dst)
{
    if (elem == 2)
        transpose_16(rows, cols, (const uint16_t *)src, ld, (uint16_t *)dst);
    else if (elem == 4)
        transpose_32(rows, cols, (const uint32_t *)src, ld, (uint32_t *)dst);
    else
        transpose_64(rows, cols, (const uint64_t *)src, ld, (uint64_t *)dst);
}

/* Workspace pieces start on 64-byte boundaries. */
static size_t round_up(size_t bytes) { return (bytes + 63) & ~(size_t)63; }

/* Carve `bytes` off the workspace cursor. */
static void *take(char **cursor, size_t bytes)
{
    void *p = *cursor;
    *cursor += round_up(bytes);
    return p;
}

/* Whether the product c [M,N] (row stride ldc) = a [M,K] b [K,N] is empty:
 * nothing to do, or zeros where K == 0 (0.0 in every dtype) */
static bool empty_product(int64_t M, int64_t N, int64_t K, void *c, int64_t ldc, size_t elem)
{
    if (M == 0 || N == 0)
        return true;
    for (int64_t m = 0; K == 0 && m < M; ++m)
        memset(at(c, m * ldc, elem), 0, (size_t)N * elem);
    return K == 0;
}

/* c [M,N] (row stride ldc) = a [M,K] b [K,N] through the caller's callback;
 * no call where the product is empty. */
static int product(lltm_gemm gemm, void *ctx, lltm_dtype dtype, size_t elem, int64_t M,
                   int64_t N, int64_t K, const void *a, int64_t a_rs, int64_t a_cs,
                   const void *b, int64_t b_rs, int64_t b_cs, void *c, int64_t ldc)
{
    if (empty_product(M, N, K, c, ldc, elem))
        return LLTM_OK;
    return gemm(ctx, dtype, M, N, K, a, a_rs, a_cs, b, b_rs, b_cs, c, ldc) == 0 ? LLTM_OK
                                                                                : LLTM_ERR_GEMM;
}

/* c [M,N] = a [M,K] (row stride lda) times the packed b, on the core's
 * kernel: as product(), which runs the other dtypes' products. */
static int packed_product(lltm_parallel_for pfor, int64_t M, int64_t N, int64_t K,
                          const void *a, int64_t lda, const float *packed, void *c, int64_t ldc)
{
    if (empty_product(M, N, K, c, ldc, sizeof(float)))
        return LLTM_OK;
    return lltm_packed_mm_f32(M, N, K, (const float *)a, lda, packed, (float *)c, ldc, pfor);
}

static int run(lltm_parallel_for pfor, int64_t B, int64_t H, lltm_range_body body, void *args)
{
    if (B == 0 || H == 0)
        return LLTM_OK;
    return pfor(0, H, lltm_grain_for_batch(B), body, args) == 0 ? LLTM_OK : LLTM_ERR_PARALLEL;
}

static bool sizes_ok(int64_t T, int64_t B, int64_t I, int64_t H)
{
    return T >= 0 && B >= 0 && I >= 0 && H >= 1;
}

/* The checks both directions start with; k: the dtype's functions. */
static int check_call(lltm_dtype dtype, int64_t T, int64_t B, int64_t I, int64_t H,
                      const void *tensors, void *workspace, size_t workspace_bytes,
                      lltm_gemm gemm, lltm_parallel_for pfor, lltm_seq_kernels *k)
{
    const int status = lltm_seq_kernels_for(dtype, k);
    if (status != LLTM_OK)
        return status;
    if (!sizes_ok(T, B, I, H) || tensors == NULL || gemm == NULL || pfor == NULL ||
        (workspace == NULL && workspace_bytes > 0) || (uintptr_t)workspace % 8 != 0)
        return LLTM_ERR_ARGUMENT;
    return LLTM_OK;
}

/* Rows 0 .. m-1 at step t hold every row still running (t < lengths[b];
 * lengths NULL: all B): the per-step products leave out the rows after the
 * last running one. A packed batch is sorted longest first, so there every
 * row that has stopped is left out. */
static int64_t running_rows(int64_t B, const int64_t *lengths, int64_t t)
{
    if (lengths == NULL)
        return B;
    int64_t m = B;
    while (m > 0 && lengths[m - 1] <= t)
        --m;
    return m;
}

/* The steps to run: T, or the longest row's length (each in [1, T]; -1 if
 * one is not). */
static int64_t run_steps(int64_t T, int64_t B, const int64_t *lengths)
{
    if (lengths == NULL)
        return T;
    int64_t steps = 0;
    for (int64_t b = 0; b < B; ++b) {
        if (lengths[b] < 1 || lengths[b] > T)
            return -1;
        steps = lengths[b] > steps ? lengths[b] : steps;
    }
    return steps;
}

/* Bytes of W's blocks as the products take them: float32 packed for the
 * core's kernel (forward W_h^T, W_x^T; backward W_h, W_x), the other dtypes
 * W_h^T dense for the forward, nothing for the backward. */
static size_t weight_bytes(lltm_dtype dtype, size_t elem, int64_t I, int64_t H, bool backward)
{
    const int64_t G = 3 * H;
    const size_t callback = backward ? 0 : round_up((size_t)(H * G) * elem);
    if (dtype != LLTM_FLOAT32)
        return callback;
    const size_t own = backward ? round_up(lltm_packed_floats(H, G) * 4) +
                                      round_up(lltm_packed_floats(I, G) * 4) +
                                      round_up(lltm_mm_tn_workspace_f32(G, I + H) * 4)
                                : round_up(3 * lltm_packed_floats(H, H) * 4) +
                                      round_up(lltm_packed_floats(G, I) * 4);
    return own > callback ? own : callback; /* either route fits, whatever the ISA */
}

/* float32 on the core's kernel where the CPU has AVX2 or AVX-512; on the
 * baseline the callback's library is faster (SSE2 code 6-8x slower than
 * torch's products on the machine of docs/performance.md). */
static bool own_products(lltm_dtype dtype)
{
    return dtype == LLTM_FLOAT32 && lltm_cpu_isa() >= LLTM_ISA_AVX2;
}

size_t lltm_sequence_forward_workspace_cpu(lltm_dtype dtype, int64_t I, int64_t B, int64_t H)
{
    lltm_seq_kernels k;
    if (lltm_seq_kernels_for(dtype, &k) != LLTM_OK || !sizes_ok(0, B, I, H))
        return 0;
    const size_t G = (size_t)(3 * H);
    return weight_bytes(dtype, k.elem, I, H, false) + round_up((size_t)B * G * k.elem) +
           round_up((size_t)(B * H) * k.acc);
}

/* Steps of input projection the forward forms at once: ~512 KB,
 * which stays in cache between the product that writes them and the steps
 * that read them, but at least 256 rows, so that reading W_x once a chunk
 * costs little beside the product (at least one step, at most T). */
static int64_t infer_chunk(int64_t T, int64_t B, int64_t H, size_t elem)
{
    const int64_t step = B * 3 * H * (int64_t)elem, fit = step > 0 ? (512 << 10) / step : T;
    const int64_t rows = B > 0 ? (256 + B - 1) / B : T;
    const int64_t want = fit > rows ? fit : rows, chunk = want < T ? want : T;
    return chunk > 1 ? chunk : 1;
}

size_t lltm_sequence_infer_workspace_cpu(lltm_dtype dtype, int64_t T, int64_t I, int64_t B,
                                         int64_t H)
{
    lltm_seq_kernels k;
    if (lltm_seq_kernels_for(dtype, &k) != LLTM_OK || !sizes_ok(T, B, I, H))
        return 0;
    const size_t step = (size_t)(B * 3 * H) * k.elem;
    return lltm_sequence_forward_workspace_cpu(dtype, I, B, H) +
           round_up((size_t)infer_chunk(T, B, H, k.elem) * step) +
           round_up((size_t)(B * H) * k.elem);
}

size_t lltm_sequence_backward_workspace_cpu(lltm_dtype dtype, int64_t T, int64_t B, int64_t I,
                                            int64_t H)
{
    lltm_seq_kernels k;
    if (lltm_seq_kernels_for(dtype, &k) != LLTM_OK || !sizes_ok(T, B, I, H))
        return 0;
    const size_t G = (size_t)(3 * H), TB = (size_t)(T * B);
    return weight_bytes(dtype, k.elem, I, H, true) + round_up(TB * G * k.elem) +
           round_up(TB * (size_t)(I + H) * k.elem) + round_up((size_t)(B * H) * k.elem) +
           round_up((size_t)(B * H) * k.acc) + round_up(G * k.acc);
}

int lltm_sequence_forward_cpu(lltm_dtype dtype, int64_t T, int64_t B, int64_t I, int64_t H,
                              const lltm_sequence_forward_tensors *tensors, void *workspace,
                              lltm_gemm gemm, void *gemm_ctx, lltm_parallel_for pfor)
{
    lltm_seq_kernels k;
    /* inference: cells and gates both NULL (one alone is an error) */
    const bool infer = tensors != NULL && tensors->cells == NULL && tensors->gates == NULL;
    int status = check_call(dtype, T, B, I, H, tensors, workspace,
                            infer ? lltm_sequence_infer_workspace_cpu(dtype, T, I, B, H)
                                  : lltm_sequence_forward_workspace_cpu(dtype, I, B, H),
                            gemm, pfor, &k);
    if (status != LLTM_OK)
        return status;
    if (!infer && T * B * H > 0 && (tensors->cells == NULL || tensors->gates == NULL))
        return LLTM_ERR_ARGUMENT;
    const void *input = tensors->input, *weights = tensors->weights, *bias = tensors->bias;
    const void *h0 = tensors->h0;
    void *output = tensors->output;
    const int64_t *lengths = tensors->lengths;
    const int64_t steps = run_steps(T, B, lengths);
    if (steps < 0)
        return LLTM_ERR_ARGUMENT;
    const int64_t G = 3 * H, K = I + H;
    const size_t elem = k.elem;
    const bool own = own_products(dtype);
    char *cursor = (char *)workspace;
    const size_t gate_floats = lltm_packed_floats(H, H); /* one gate block of W_h^T, packed */
    void *W_h_t = take(&cursor, own ? 3 * gate_floats * 4 : (size_t)(H * G) * elem);
    float *W_x_t = own ? take(&cursor, lltm_packed_floats(G, I) * 4) : NULL;
    void *recurrent = take(&cursor, (size_t)(B * G) * elem);  /* [B,G] */
    void *cell_state = take(&cursor, (size_t)(B * H) * k.acc); /* [B,H] acc */
    /* The input projection a chunk of steps at a time, just before the
     * steps that read it, while it is in cache: into gates when training;
     * into the workspace, with one step's cells, for inference. */
    const int64_t chunk = infer_chunk(T, B, H, elem);
    void *gates = infer ? take(&cursor, (size_t)(chunk * B * G) * elem) : tensors->gates;
    void *cells = infer ? take(&cursor, (size_t)(B * H) * elem) : tensors->cells;

    /* W_h^T [H,G] (W_h^T (h, g) = W[g, h]): each gate's block packed on its
     * own (a step's range of units takes the same panels of all three), or
     * as a dense copy, which BLAS multiplies by ~1.7x faster than by the
     * strided view of W. */
    if (own) {
        for (int64_t q = 0; q < 3; ++q)
            lltm_pack_f32(H, H, (const float *)weights + q * H * K, 1, K,
                          (float *)W_h_t + q * gate_floats);
        lltm_pack_f32(G, I, (const float *)weights + H, 1, K, W_x_t);
    } else {
        transpose(elem, G, H, weights, K, W_h_t);
    }
    k.load(B * H, tensors->c0, cell_state);

    for (int64_t t = 0; t < T && B > 0 && status == LLTM_OK; ++t) {
        /* gates [n*B,G] = x [n*B,I] W_x^T: the input projection of the next
         * n steps that run; W_x^T (i, g) = W[g, H + i]. */
        const int64_t n = steps - t < chunk ? steps - t : chunk;
        void *gates_t = at(gates, (infer ? t % chunk : t) * B * G, elem);
        if (t % chunk == 0 && n > 0)
            status = own ? packed_product(pfor, n * B, G, I, at(input, t * B * I, elem), I,
                                          W_x_t, gates_t, G)
                         : product(gemm, gemm_ctx, dtype, elem, n * B, G, I,
                                   at(input, t * B * I, elem), I, 1, at(weights, H, elem), 1,
                                   K, gates_t, G);
        if (status != LLTM_OK)
            break;
        /* h_{t-1}: h0, or the previous step's row block of the output. No
         * product past the longest row (every row has stopped: nothing
         * reads it). */
        const void *h_prev = t == 0 ? h0 : at(output, (t - 1) * B * H, elem);
        if (t < steps && !own)
            status = product(gemm, gemm_ctx, dtype, elem, running_rows(B, lengths, t), G, H,
                             h_prev, H, 1, W_h_t, G, 1, recurrent, G);
        if (status != LLTM_OK)
            break;
        lltm_seq_forward_args args = {.B = B,
                                      .H = H,
                                      .t = t,
                                      .lengths = lengths,
                                      .recurrent = recurrent,
                                      .gates = gates_t,
                                      .bias = bias,
                                      .cell_state = cell_state,
                                      .new_h = at(output, t * B * H, elem),
                                      .new_cell = infer ? cells : at(cells, t * B * H, elem)};
        if (t < steps && own) {
            const lltm_mm mm = {.M = running_rows(B, lengths, t), .N = H, .K = H, .lda = H,
                                .a_cs = 1, .ldc = G, .ldp = H, .a = h_prev,
                                .packed = W_h_t, .c = recurrent};
            lltm_seq_fused_step f = {&args, mm, gate_floats, infer};
            status = lltm_seq_fused_step_f32(pfor, &f);
        } else {
            status = run(pfor, B, H, k.forward, &args);
        }
    }
    if (status != LLTM_OK)
        return status;
    /* h_n, c_n: the last step's state (h0, c0 for an empty sequence); with
     * lengths, each row's h at its own last step (its c stayed there). */
    if (B * H > 0) {
        if (lengths) {
            for (int64_t b = 0; b < B; ++b)
                memcpy(at(tensors->h_n, b * H, elem),
                       at(output, ((lengths[b] - 1) * B + b) * H, elem), (size_t)H * elem);
        } else {
            memcpy(tensors->h_n, T > 0 ? at(output, (T - 1) * B * H, elem) : h0,
                   (size_t)(B * H) * elem);
        }
        k.store(B * H, cell_state, tensors->c_n);
    }
    return LLTM_OK;
}

/* Rows of the backward's X [SB,K] = [h_{t-1} | x_t], h_{t-1} from h0 (t =
 * 0) or the output, a range of rows an item. */
typedef struct inputs_rows {
    int64_t B, H, I;
    size_t elem;
    const void *h0, *output, *input;
    void *X;
} inputs_rows;

static void inputs_range(int64_t lo, int64_t hi, void *vctx)
{
    const inputs_rows *r = (const inputs_rows *)vctx;
    const size_t elem = r->elem;
    for (int64_t row = lo; row < hi; ++row) {
        char *dst = at(r->X, row * (r->H + r->I), elem);
        const void *h = row < r->B ? at(r->h0, row * r->H, elem)
                                   : at(r->output, (row - r->B) * r->H, elem);
        memcpy(dst, h, (size_t)r->H * elem);
        memcpy(dst + (size_t)r->H * elem, at(r->input, row * r->I, elem), (size_t)r->I * elem);
    }
}

int lltm_sequence_backward_cpu(lltm_dtype dtype, int64_t T, int64_t B, int64_t I, int64_t H,
                               const lltm_sequence_backward_tensors *tensors, void *workspace,
                               lltm_gemm gemm, void *gemm_ctx, lltm_parallel_for pfor)
{
    lltm_seq_kernels k;
    int status = check_call(dtype, T, B, I, H, tensors, workspace,
                            lltm_sequence_backward_workspace_cpu(dtype, T, B, I, H), gemm, pfor,
                            &k);
    if (status != LLTM_OK)
        return status;
    const lltm_sequence_backward_tensors *a = tensors;
    const void *weights = a->weights;
    void *grad_h0 = a->grad_h0, *grad_weights = a->grad_weights;
    const int64_t steps = run_steps(T, B, a->lengths);
    if (steps < 0)
        return LLTM_ERR_ARGUMENT;
    const int64_t G = 3 * H, K = I + H, TB = T * B;
    const size_t elem = k.elem;
    const bool own = own_products(dtype);
    char *cursor = (char *)workspace;
    float *W_h = own ? take(&cursor, lltm_packed_floats(H, G) * 4) : NULL;
    float *W_x = own ? take(&cursor, lltm_packed_floats(I, G) * 4) : NULL;
    float *mm_work = own ? take(&cursor, lltm_mm_tn_workspace_f32(G, K) * 4) : NULL;
    void *d_gates = take(&cursor, (size_t)(TB * G) * elem); /* [T,B,G] */
    if (a->grad_gates != NULL)
        d_gates = a->grad_gates;
    void *X = take(&cursor, (size_t)(TB * K) * elem);       /* [T,B,K] */
    void *dh = take(&cursor, (size_t)(B * H) * elem);       /* [B,H] */
    void *dc = take(&cursor, (size_t)(B * H) * k.acc);      /* [B,H] acc */
    void *bias_acc = take(&cursor, (size_t)G * k.acc);      /* [G] acc */

    /* Running gradients: dc = dL/dc_t; dL/dh_t through the recurrence in dh
     * (each step's product overwrites it), except at each row's last step,
     * where it is grad_h_n; the first step's product goes to grad_h0, and is
     * not run where grad_h0 is not wanted. */
    memset(bias_acc, 0, (size_t)G * k.acc); /* 0.0 in float and double */
    if (own) { /* W_h [G,H], W_x [G,I]: (g, n) at W[g*K + n], W[g*K + H + n] */
        lltm_pack_f32(H, G, (const float *)weights, K, 1, W_h);
        if (a->grad_input != NULL)
            lltm_pack_f32(I, G, (const float *)weights + H, K, 1, W_x);
    }
    k.load(B * H, a->grad_c_n, dc);
    const void *dh_next = a->grad_h_n;
    for (int64_t t = T - 1; t >= 0 && B > 0; --t) {
        lltm_seq_backward_args args = {.B = B,
                                       .H = H,
                                       .t = t,
                                       .T = T,
                                       .lengths = a->lengths,
                                       .grad_output = at(a->grad_output, t * B * H, elem),
                                       .grad_h = dh_next,
                                       .grad_h_n = a->grad_h_n,
                                       .grad_cell = dc,
                                       .cell = at(a->cells, t * B * H, elem),
                                       .gates = at(a->gates, t * B * G, elem),
                                       .grad_gates = at(d_gates, t * B * G, elem),
                                       .grad_bias = bias_acc};
        status = run(pfor, B, H, k.backward, &args);
        if (status != LLTM_OK)
            return status;
        if (t >= steps) /* every row has stopped: dG[t] is 0 */
            continue;
        /* dL/dh_{t-1} [B,H] = dG[t] [B,G] W_h [G,H], for the rows running at
         * t: a row that stopped reads no dh again (grad_h_n at its last step),
         * and at t = 0 every row runs, so all of grad_h0 is written. */
        void *dh_prev = t > 0 ? dh : grad_h0;
        if (dh_prev == NULL)
            break;
        const int64_t m = running_rows(B, a->lengths, t);
        const void *dG_t = at(d_gates, t * B * G, elem);
        status = own ? packed_product(pfor, m, H, G, dG_t, G, W_h, dh_prev, H)
                     : product(gemm, gemm_ctx, dtype, elem, m, H, G, dG_t, G, 1, weights, K, 1,
                               dh_prev, H);
        if (status != LLTM_OK)
            return status;
        dh_next = dh;
    }
    if ((T == 0 || B == 0) && B * H > 0 && grad_h0 != NULL)
        memcpy(grad_h0, a->grad_h_n, (size_t)(B * H) * elem);
    if (a->grad_c0 != NULL)
        k.store(B * H, dc, a->grad_c0);
    if (a->grad_bias != NULL)
        k.store(G, bias_acc, a->grad_bias);

    if (grad_weights != NULL && TB == 0)
        memset(grad_weights, 0, (size_t)(G * K) * elem);
    if (TB == 0)
        return LLTM_OK;
    /* Over the steps that ran (SB = steps*B rows; dG is 0 past them), all at
     * once, dG^T (g, r) = dG[r, g]:
     *   dW [G,K] = dG^T X, X [SB,K] = [h_{t-1} | x_t] (the cell's X)
     *   dx [SB,I] = dG W_x         W_x (g, i) = W[g, H + i]; 0 past SB
     * (dW on the core's kernel: lltm_mm_tn_f32) */
    const int64_t SB = steps * B;
    if (grad_weights != NULL) {
        /* h_{t-1}: h0, then output[0 .. steps-2] */
        const inputs_rows rows = {B, H, I, elem, a->h0, a->output, a->input, X};
        if (pfor(0, SB, 64, inputs_range, (void *)&rows) != 0)
            return LLTM_ERR_PARALLEL;
        status = own ? lltm_mm_tn_f32(G, K, SB, d_gates, X, grad_weights, K, mm_work, pfor)
                     : product(gemm, gemm_ctx, dtype, elem, G, K, SB, d_gates, 1, G, X, K, 1,
                               grad_weights, K);
    }
    if (status == LLTM_OK && a->grad_input != NULL)
        status = own ? packed_product(pfor, SB, I, G, d_gates, G, W_x, a->grad_input, I)
                     : product(gemm, gemm_ctx, dtype, elem, SB, I, G, d_gates, G, 1,
                               at(weights, H, elem), K, 1, a->grad_input, I);
    if (status == LLTM_OK && a->grad_input != NULL && SB < TB)
        memset(at(a->grad_input, SB * I, elem), 0, (size_t)((TB - SB) * I) * elem);
    return status;
}
