/*
 * cell_cpu.c - the CPU kernels of the lltm::cell_forward and
 * lltm::cell_backward operators: validate, allocate, run the matrix products
 * through aten::mm and the fused pointwise parts in the C core.
 */
#include "ops.h"
#include "tensor_args.h"

#include <string.h>

/* X = [h, x]: row b is old_h[b, :] followed by input[b, :]. */
static void concat_state_input(const lltm_cell_dims *d, size_t elem,
                               const void *old_h, const void *input, void *X)
{
    const size_t h_bytes = (size_t)d->H * elem, x_bytes = (size_t)d->I * elem;
    for (int64_t b = 0; b < d->B; ++b) {
        char *row = (char *)X + (size_t)b * (h_bytes + x_bytes);
        memcpy(row, (const char *)old_h + (size_t)b * h_bytes, h_bytes);
        memcpy(row + h_bytes, (const char *)input + (size_t)b * x_bytes, x_bytes);
    }
}

/* cell_forward(input, weights, bias, old_h, old_cell) -> (new_h, new_cell, gates) */
void lltm_cell_forward_cpu(StableIValue *stack, uint64_t num_args, uint64_t num_outputs)
{
    static const char *const names[5] = {"input", "weights", "bias", "old_h", "old_cell"};
    lltm_owned owned = {.count = 0};
    lltm_error err;
    AtenTensorHandle X, W_t, gates, new_h, new_cell;
    void *X_data, *gates_data, *new_h_data, *new_cell_data;
    lltm_tensor a[5];
    lltm_cell_dims d;
    lltm_call_settings settings; /* checked; the CPU kernels follow none of them */
    const int64_t packed = lltm_take_settings(stack, &num_args);

    if (lltm_open_op(stack, num_args, num_outputs, 5, 3, names, a, &owned, &err) ||
        lltm_call_settings_decode(packed, &settings, &err) ||
        lltm_check_cell_forward(a, aoti_torch_device_type_cpu(), true, &d, &err))
        goto fail;

    const int64_t G = 3 * d.H, K = d.I + d.H;
    const int64_t X_sizes[2] = {d.B, K}, G_sizes[2] = {d.B, G}, H_sizes[2] = {d.B, d.H};
    const int64_t Wt_sizes[2] = {K, G}, Wt_strides[2] = {1, K};
    if (lltm_empty(2, X_sizes, &a[0], &owned, &X, &X_data, &err) ||
        lltm_empty(2, G_sizes, &a[0], &owned, &gates, &gates_data, &err) ||
        lltm_empty(2, H_sizes, &a[0], &owned, &new_h, &new_h_data, &err) ||
        lltm_empty(2, H_sizes, &a[0], &owned, &new_cell, &new_cell_data, &err) ||
        lltm_view(a[1].handle, 2, Wt_sizes, Wt_strides, &owned, &W_t, &err))
        goto fail;

    concat_state_input(&d, lltm_dtype_size(d.dtype), a[3].data, a[0].data, X_data);
    if (lltm_mm_out(X, W_t, gates, &err))
        goto fail;
    int status = lltm_cell_forward_pointwise_cpu(d.dtype, d.B, d.H, gates_data, a[2].data,
                                                 a[4].data, new_h_data, new_cell_data,
                                                 lltm_torch_parallel_for);
    if (status != LLTM_OK) {
        lltm_core_failed(&err, "lltm_cell_forward_pointwise_cpu", status);
        goto fail;
    }
    lltm_return(&owned, new_h, &stack[0]);
    lltm_return(&owned, new_cell, &stack[1]);
    lltm_return(&owned, gates, &stack[2]);
    lltm_free_owned(&owned);
    return;
fail:
    lltm_raise("lltm::cell_forward", &owned, &err);
}

/* cell_backward(grad_h, grad_cell, new_cell, gates, input, old_h, weights,
 *               output_mask)
 *   -> (grad_input, grad_weights, grad_bias, grad_old_h, grad_old_cell);
 * the products of the results output_mask leaves out are not run. */
void lltm_cell_backward_cpu(StableIValue *stack, uint64_t num_args, uint64_t num_outputs)
{
    static const char *const names[7] = {"grad_h", "grad_cell", "new_cell", "gates",
                                         "input",  "old_h",     "weights"};
    enum { D_INPUT, D_WEIGHTS, D_BIAS, D_OLD_H, D_OLD_CELL };
    lltm_owned owned = {.count = 0};
    lltm_error err;
    AtenTensorHandle d_gates, d_gates_t = NULL, W_h = NULL, W_x = NULL, dW_h = NULL, dW_x = NULL;
    AtenTensorHandle out[5] = {NULL, NULL, NULL, NULL, NULL};
    void *d_gates_data, *d_bias_data, *d_old_cell_data;
    bool mask[5];
    lltm_tensor a[7];
    lltm_cell_dims d;
    lltm_call_settings settings; /* checked; the CPU kernels follow none of them */
    const int64_t packed = lltm_take_settings(stack, &num_args);

    if (lltm_open_backward_op(stack, num_args, num_outputs, 7, 5, names, a, mask, &owned,
                              &err) ||
        lltm_call_settings_decode(packed, &settings, &err) ||
        lltm_check_cell_backward(a, aoti_torch_device_type_cpu(), true, &d, &err))
        goto fail;

    /* Column blocks of W [3H, H+I] and dW: state columns 0..H-1, input
     * columns H..H+I-1, each a [3H, n] view with row stride H+I. The matrix
     * products read and write them in place: no concatenated X, no split dX.
     * The pointwise pass writes the bias and old_cell gradients whether or
     * not they are wanted (no product to save there). */
    const int64_t G = 3 * d.H, K = d.I + d.H;
    const int64_t G_sizes[2] = {d.B, G}, H_sizes[2] = {d.B, d.H}, I_sizes[2] = {d.B, d.I};
    const int64_t W_sizes[2] = {G, K}, bias_size[1] = {G};
    const int64_t Gt_sizes[2] = {G, d.B}, Gt_strides[2] = {1, G};
    const int64_t block_h[2] = {G, d.H}, block_x[2] = {G, d.I}, block_strides[2] = {K, 1};
    if (lltm_empty(2, G_sizes, &a[0], &owned, &d_gates, &d_gates_data, &err) ||
        lltm_empty(2, H_sizes, &a[0], &owned, &out[D_OLD_CELL], &d_old_cell_data, &err) ||
        lltm_empty(1, bias_size, &a[0], &owned, &out[D_BIAS], &d_bias_data, &err))
        goto fail;
    if (mask[D_WEIGHTS] &&
        (lltm_empty(2, W_sizes, &a[0], &owned, &out[D_WEIGHTS], NULL, &err) ||
         lltm_view(d_gates, 2, Gt_sizes, Gt_strides, &owned, &d_gates_t, &err) ||
         lltm_view_at(out[D_WEIGHTS], 2, block_h, block_strides, 0, &owned, &dW_h, &err) ||
         lltm_view_at(out[D_WEIGHTS], 2, block_x, block_strides, d.H, &owned, &dW_x, &err)))
        goto fail;
    if (mask[D_OLD_H] &&
        (lltm_empty(2, H_sizes, &a[0], &owned, &out[D_OLD_H], NULL, &err) ||
         lltm_view_at(a[6].handle, 2, block_h, block_strides, 0, &owned, &W_h, &err)))
        goto fail;
    if (mask[D_INPUT] &&
        (lltm_empty(2, I_sizes, &a[0], &owned, &out[D_INPUT], NULL, &err) ||
         lltm_view_at(a[6].handle, 2, block_x, block_strides, d.H, &owned, &W_x, &err)))
        goto fail;

    int status = lltm_cell_backward_pointwise_cpu(
        d.dtype, d.B, d.H, a[0].data, a[1].data, a[2].data, a[3].data, d_gates_data,
        d_old_cell_data, d_bias_data, lltm_torch_parallel_for);
    if (status != LLTM_OK) {
        lltm_core_failed(&err, "lltm_cell_backward_pointwise_cpu", status);
        goto fail;
    }
    /* [d_old_h | d_input] = dG W;  [dW_h | dW_x] = dG^T [old_h | input] */
    if ((mask[D_OLD_H] && lltm_mm_out(d_gates, W_h, out[D_OLD_H], &err)) ||
        (mask[D_INPUT] && lltm_mm_out(d_gates, W_x, out[D_INPUT], &err)) ||
        (mask[D_WEIGHTS] && (lltm_mm_out(d_gates_t, a[5].handle, dW_h, &err) ||
                             lltm_mm_out(d_gates_t, a[4].handle, dW_x, &err))))
        goto fail;
    if (lltm_return_masked(&owned, out, mask, 5, stack, &err))
        goto fail;
    return;
fail:
    lltm_raise("lltm::cell_backward", &owned, &err);
}
