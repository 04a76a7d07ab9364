/*
 * cell_cpu.c - the CPU kernels of the lltm::cell_forward and
 * lltm::cell_backward operators: the matrix products through aten::mm, the
 * fused pointwise parts in the C core. The CPU kernels follow none of the
 * call's settings (lltm_open checks them).
 */
#include "ops.h"

#include <string.h>

/* X [B, H+I] = [old_h, input]: row b is old_h[b, :] followed by input[b, :] */
static void fill_X(char *X, const void *old_h, const void *input, int64_t B, int64_t H,
                   int64_t I, size_t elem)
{
    const size_t h_bytes = (size_t)H * elem, x_bytes = (size_t)I * elem;
    for (int64_t b = 0; b < B; ++b) {
        memcpy(X + b * (h_bytes + x_bytes), (const char *)old_h + b * h_bytes, h_bytes);
        memcpy(X + b * (h_bytes + x_bytes) + h_bytes, (const char *)input + b * x_bytes, x_bytes);
    }
}

/* cell_forward(input, weights, bias, old_h, old_cell) -> (new_h, new_cell, gates) */
void lltm_cell_forward_cpu(StableIValue *stack, uint64_t num_args, uint64_t num_outputs)
{
    lltm_call c;
    AtenTensorHandle X, W_t;
    char *X_data;
    if (lltm_open(&c, &lltm_cell_forward_op, stack, num_args, num_outputs))
        goto fail;
    const lltm_tensor *a = c.args;
    const int64_t B = c.d.B, I = c.d.I, H = c.d.H, G = 3 * H, K = I + H;
    const int64_t X_sizes[2] = {B, K}, Wt_sizes[2] = {K, G}, Wt_strides[2] = {1, K};
    if (lltm_empty(2, X_sizes, &a[0], &c.owned, &X, (void **)&X_data, &c.err) ||
        lltm_view(a[1].handle, 2, Wt_sizes, Wt_strides, 0, &c.owned, &W_t, &c.err))
        goto fail;
    fill_X(X_data, a[3].data, a[0].data, B, H, I, lltm_dtype_size(c.d.dtype));
    if (lltm_mm_out(X, W_t, c.results[2], &c.err) ||
        lltm_core_status(&c,
                         lltm_cell_forward_pointwise_cpu(c.d.dtype, B, H, c.data[2], a[2].data,
                                                         a[4].data, c.data[0], c.data[1],
                                                         lltm_torch_parallel_for),
                         "lltm_cell_forward_pointwise_cpu") ||
        lltm_close(&c, stack))
        goto fail;
    return;
fail:
    lltm_call_raise(&c);
}

/* cell_backward(grad_h, grad_cell, new_cell, gates, input, old_h, weights,
 *               output_mask)
 *   -> (grad_input, grad_weights, grad_bias, grad_old_h, grad_old_cell);
 * the products of the results output_mask leaves out are not run. */
void lltm_cell_backward_cpu(StableIValue *stack, uint64_t num_args, uint64_t num_outputs)
{
    enum { D_INPUT, D_WEIGHTS, D_BIAS, D_OLD_H, D_OLD_CELL };
    lltm_call c;
    AtenTensorHandle d_gates, d_gates_t = NULL, W_h = NULL, W_x = NULL, X = NULL;
    void *d_gates_data, *X_data;
    if (lltm_open(&c, &lltm_cell_backward_op, stack, num_args, num_outputs))
        goto fail;
    const lltm_tensor *a = c.args;
    const bool *mask = c.mask;
    AtenTensorHandle *out = c.results;
    /* Column blocks of W [3H, H+I]: state columns 0..H-1, input columns
     * H..H+I-1, each a [3H, n] view with row stride H+I, which the products
     * read in place (no split dX). dW is written whole, from X = [old_h,
     * input]: aten::mm into a column block of dW runs through a copy (B1/H1024:
     * 1.6 ms against 0.42 for the whole product, EPYC Zen 4). */
    const int64_t B = c.d.B, I = c.d.I, H = c.d.H, G = 3 * H, K = I + H;
    const int64_t G_sizes[2] = {B, G}, Gt_sizes[2] = {G, B}, Gt_strides[2] = {1, G};
    const int64_t X_sizes[2] = {B, K};
    const int64_t block_h[2] = {G, H}, block_x[2] = {G, I}, block_strides[2] = {K, 1};
    if (lltm_empty(2, G_sizes, &a[0], &c.owned, &d_gates, &d_gates_data, &c.err) ||
        (mask[D_WEIGHTS] &&
         (lltm_view(d_gates, 2, Gt_sizes, Gt_strides, 0, &c.owned, &d_gates_t, &c.err) ||
          lltm_empty(2, X_sizes, &a[0], &c.owned, &X, &X_data, &c.err))) ||
        (mask[D_OLD_H] &&
         lltm_view(a[6].handle, 2, block_h, block_strides, 0, &c.owned, &W_h, &c.err)) ||
        (mask[D_INPUT] &&
         lltm_view(a[6].handle, 2, block_x, block_strides, H, &c.owned, &W_x, &c.err)))
        goto fail;
    const int status = lltm_cell_backward_pointwise_cpu(
        c.d.dtype, B, H, a[0].data, a[1].data, a[2].data, a[3].data, d_gates_data,
        c.data[D_OLD_CELL], c.data[D_BIAS], lltm_torch_parallel_for);
    /* [d_old_h | d_input] = dG W;  dW = dG^T [old_h | input] */
    if (mask[D_WEIGHTS])
        fill_X(X_data, a[5].data, a[4].data, B, H, I, lltm_dtype_size(c.d.dtype));
    if (lltm_core_status(&c, status, "lltm_cell_backward_pointwise_cpu") ||
        (mask[D_OLD_H] && lltm_mm_out(d_gates, W_h, out[D_OLD_H], &c.err)) ||
        (mask[D_INPUT] && lltm_mm_out(d_gates, W_x, out[D_INPUT], &c.err)) ||
        (mask[D_WEIGHTS] && lltm_mm_out(d_gates_t, X, out[D_WEIGHTS], &c.err)) ||
        lltm_close(&c, stack))
        goto fail;
    return;
fail:
    lltm_call_raise(&c);
}
