/*
 * cell_cuda.c - the CUDA kernels of the lltm::cell_forward and
 * lltm::cell_backward operators: validate, guard the tensors' device, take
 * torch's current stream, allocate, launch (csrc/core/lltm_cuda_cell.cu).
 *
 * Two routes, one result (see lltm.h, section "CUDA, cell"):
 * - fused: the core's own matrix products; forward 1 launch, backward 2.
 *   Host overhead dominates small steps, so fewer launches win there.
 * - cuBLAS: the matrix products through aten::mm.out (tensor cores for the
 *   half types), around the core's pointwise kernels; forward 3 launches
 *   (X = [h, x], mm, pointwise), backward 4 (pointwise + X, three mm), 5
 *   where the batch is large enough to split the bias gradient's sum.
 * The automatic choice is the core's rule (lltm_cell_route_cuda,
 * csrc/core/lltm_cuda_rules.c: cuBLAS where the step's products are large,
 * from the sizes and the device's properties); the call's settings
 * may force one (lltm.overrides.matmul, for tests and benchmarks).
 */
#include "../core/lltm_cuda_rules.h"
#include "ops.h"
#include "sequence_cuda.h"

/* The route (LLTM_MATMUL_FUSED or LLTM_MATMUL_CUBLAS) of a step of these
 * sizes on `device` under settings `s`: the route they force, else the
 * core's rule (lltm_cell_route_cuda); < 0: an
 * lltm_status (the device query failed). */
static int cell_route(int device, const lltm_call_settings *s, lltm_dtype dtype, int64_t B,
                      int64_t I, int64_t H)
{
    if (s->cell_matmul != LLTM_MATMUL_AUTO)
        return s->cell_matmul;
    lltm_cuda_device dev;
    const int status = lltm_cuda_device_for(device, s, &dev);
    if (status != LLTM_OK)
        return status;
    return lltm_cell_route_cuda(&dev, dtype, B, I, H) == LLTM_CELL_CUBLAS ? LLTM_MATMUL_CUBLAS
                                                                          : LLTM_MATMUL_FUSED;
}

/* cell_route for an operator whose settings argument is `packed`: *cublas,
 * or an error in err. */
static int choose_route(int device, int64_t packed, const lltm_cell_dims *d, bool *cublas,
                        lltm_error *err)
{
    lltm_call_settings s;
    if (lltm_call_settings_decode(packed, &s, err))
        return -1;
    const int route = cell_route(device, &s, d->dtype, d->B, d->I, d->H);
    if (route < 0)
        return lltm_core_failed(err, "lltm_cuda_device_query", route);
    *cublas = route == LLTM_MATMUL_CUBLAS;
    return 0;
}

/* The route the cell operators would take for a step of these sizes on
 * device `device` with settings `packed` (lltm._settings.current()); for
 * measurements that record what they timed. < 0: an unknown dtype or
 * settings value, negative sizes, or an lltm_status of the device query. */
__attribute__((visibility("default"))) int
lltm_cuda_cell_route_in_force(int device, int dtype, int64_t packed, int64_t B, int64_t I,
                              int64_t H)
{
    lltm_call_settings s;
    if (dtype < LLTM_FLOAT32 || dtype > LLTM_BFLOAT16 || B < 0 || I < 0 || H < 0 ||
        lltm_call_settings_query(packed, &s) != LLTM_OK)
        return LLTM_ERR_ARGUMENT;
    return cell_route(device, &s, (lltm_dtype)dtype, B, I, H);
}

/* A view of the columns [col, col + ncols) of the row-major [rows, ld]
 * matrix `self` (no copy): sizes [rows, ncols], strides [ld, 1]. */
static int column_slice(AtenTensorHandle self, int64_t rows, int64_t ld, int64_t col,
                        int64_t ncols, lltm_owned *owned, AtenTensorHandle *out,
                        lltm_error *err)
{
    const int64_t sizes[2] = {rows, ncols}, strides[2] = {ld, 1};
    if (aoti_torch__reinterpret_tensor(self, 2, sizes, strides, col, out) != 0)
        return lltm_fail(err, "aoti_torch__reinterpret_tensor failed");
    return lltm_own(owned, *out, err);
}

/* cell_forward(input, weights, bias, old_h, old_cell) -> (new_h, new_cell, gates) */
void lltm_cell_forward_cuda(StableIValue *stack, uint64_t num_args, uint64_t num_outputs)
{
    static const char *const names[5] = {"input", "weights", "bias", "old_h", "old_cell"};
    lltm_owned owned = {.count = 0};
    lltm_error err;
    CUDAGuardHandle guard = NULL;
    void *stream = NULL;
    AtenTensorHandle gates, new_h, new_cell;
    void *gates_data, *new_h_data, *new_cell_data;
    lltm_tensor a[5];
    lltm_cell_dims d;
    bool cublas = false;
    int status;
    const int64_t settings = lltm_take_settings(stack, &num_args);

    if (lltm_open_op(stack, num_args, num_outputs, 5, 3, names, a, &owned, &err) ||
        lltm_check_cell_forward(a, aoti_torch_device_type_cuda(), true, &d, &err) ||
        lltm_cuda_enter_device(a[0].device_index, &guard, &stream, &err) ||
        choose_route(a[0].device_index, settings, &d, &cublas, &err))
        goto fail;

    const int64_t G = 3 * d.H, K = d.I + d.H;
    const int64_t G_sizes[2] = {d.B, G}, H_sizes[2] = {d.B, d.H};
    if (lltm_empty(2, H_sizes, &a[0], &owned, &new_h, &new_h_data, &err) ||
        lltm_empty(2, H_sizes, &a[0], &owned, &new_cell, &new_cell_data, &err) ||
        lltm_empty(2, G_sizes, &a[0], &owned, &gates, &gates_data, &err))
        goto fail;

    if (!cublas) {
        status = lltm_cell_forward_fused_cuda(d.dtype, d.B, d.I, d.H, a[0].data, a[3].data,
                                              a[1].data, a[2].data, a[4].data, new_h_data,
                                              new_cell_data, gates_data, stream);
        if (status != LLTM_OK) {
            lltm_core_failed(&err, "lltm_cell_forward_fused_cuda", status);
            goto fail;
        }
    } else {
        /* gates = [h, x] W^T (cuBLAS), then bias + activations + state. */
        AtenTensorHandle X, W_t;
        void *X_data;
        const int64_t X_sizes[2] = {d.B, K}, Wt_sizes[2] = {K, G}, Wt_strides[2] = {1, K};
        if (lltm_empty(2, X_sizes, &a[0], &owned, &X, &X_data, &err) ||
            lltm_view(a[1].handle, 2, Wt_sizes, Wt_strides, &owned, &W_t, &err))
            goto fail;
        status = lltm_concat_state_input_cuda(d.dtype, d.B, d.I, d.H, a[3].data, a[0].data,
                                              X_data, stream);
        if (status != LLTM_OK) {
            lltm_core_failed(&err, "lltm_concat_state_input_cuda", status);
            goto fail;
        }
        if (lltm_mm_out(X, W_t, gates, &err))
            goto fail;
        status = lltm_cell_forward_pointwise_cuda(d.dtype, d.B, d.H, gates_data, a[2].data,
                                                  a[4].data, new_h_data, new_cell_data, stream);
        if (status != LLTM_OK) {
            lltm_core_failed(&err, "lltm_cell_forward_pointwise_cuda", status);
            goto fail;
        }
    }
    lltm_return(&owned, new_h, &stack[0]);
    lltm_return(&owned, new_cell, &stack[1]);
    lltm_return(&owned, gates, &stack[2]);
    lltm_free_owned(&owned);
    lltm_cuda_leave_device(guard);
    return;
fail:
    lltm_cuda_leave_device(guard);
    lltm_raise("lltm::cell_forward", &owned, &err);
}

/* cell_backward(grad_h, grad_cell, new_cell, gates, input, old_h, weights,
 *               output_mask)
 *   -> (grad_input, grad_weights, grad_bias, grad_old_h, grad_old_cell);
 * what output_mask leaves out is not computed (the bias and old_cell
 * gradients excepted: the gate-gradient pass writes them anyway). */
void lltm_cell_backward_cuda(StableIValue *stack, uint64_t num_args, uint64_t num_outputs)
{
    static const char *const names[7] = {"grad_h", "grad_cell", "new_cell", "gates",
                                         "input",  "old_h",     "weights"};
    enum { D_INPUT, D_WEIGHTS, D_BIAS, D_OLD_H, D_OLD_CELL };
    lltm_owned owned = {.count = 0};
    lltm_error err;
    CUDAGuardHandle guard = NULL;
    void *stream = NULL;
    AtenTensorHandle d_gates, out[5] = {NULL, NULL, NULL, NULL, NULL};
    void *d_gates_data, *data[5] = {NULL, NULL, NULL, NULL, NULL};
    bool mask[5];
    lltm_tensor a[7];
    lltm_cell_dims d;
    bool cublas = false;
    int status;
    const int64_t settings = lltm_take_settings(stack, &num_args);

    if (lltm_open_backward_op(stack, num_args, num_outputs, 7, 5, names, a, mask, &owned,
                              &err) ||
        lltm_check_cell_backward(a, aoti_torch_device_type_cuda(), true, &d, &err) ||
        lltm_cuda_enter_device(a[0].device_index, &guard, &stream, &err) ||
        choose_route(a[0].device_index, settings, &d, &cublas, &err))
        goto fail;

    const int64_t G = 3 * d.H, K = d.I + d.H;
    const int64_t G_sizes[2] = {d.B, G}, H_sizes[2] = {d.B, d.H}, I_sizes[2] = {d.B, d.I};
    const int64_t W_sizes[2] = {G, K}, bias_size[1] = {G};
    if (lltm_empty(2, G_sizes, &a[0], &owned, &d_gates, &d_gates_data, &err) ||
        lltm_empty(1, bias_size, &a[0], &owned, &out[D_BIAS], &data[D_BIAS], &err) ||
        lltm_empty(2, H_sizes, &a[0], &owned, &out[D_OLD_CELL], &data[D_OLD_CELL], &err) ||
        (mask[D_INPUT] &&
         lltm_empty(2, I_sizes, &a[0], &owned, &out[D_INPUT], &data[D_INPUT], &err)) ||
        (mask[D_WEIGHTS] &&
         lltm_empty(2, W_sizes, &a[0], &owned, &out[D_WEIGHTS], &data[D_WEIGHTS], &err)) ||
        (mask[D_OLD_H] &&
         lltm_empty(2, H_sizes, &a[0], &owned, &out[D_OLD_H], &data[D_OLD_H], &err)))
        goto fail;

    if (!cublas) {
        status = lltm_cell_backward_fused_cuda(
            d.dtype, d.B, d.I, d.H, a[0].data, a[1].data, a[2].data, a[3].data, a[4].data,
            a[5].data, a[6].data, d_gates_data, data[D_INPUT], data[D_WEIGHTS], data[D_BIAS],
            data[D_OLD_H], data[D_OLD_CELL], stream);
        if (status != LLTM_OK) {
            lltm_core_failed(&err, "lltm_cell_backward_fused_cuda", status);
            goto fail;
        }
    } else {
        /* Pointwise (+ X = [h, x] where dW is wanted), then dW = dG^T X, and
         * dX = dG W as two products on column slices of W, straight into
         * grad_old_h and grad_input. */
        AtenTensorHandle X = NULL, d_gates_t = NULL, W_h = NULL, W_x = NULL;
        void *X_data = NULL, *workspace = NULL;
        const size_t workspace_bytes =
            lltm_cell_backward_pointwise_workspace_cuda(d.dtype, d.B, d.H);
        const int64_t X_sizes[2] = {d.B, K}, Gt_sizes[2] = {G, d.B}, Gt_strides[2] = {1, G};
        if ((mask[D_WEIGHTS] &&
             (lltm_empty(2, X_sizes, &a[0], &owned, &X, &X_data, &err) ||
              lltm_view(d_gates, 2, Gt_sizes, Gt_strides, &owned, &d_gates_t, &err))) ||
            (mask[D_OLD_H] && column_slice(a[6].handle, G, K, 0, d.H, &owned, &W_h, &err)) ||
            (mask[D_INPUT] && column_slice(a[6].handle, G, K, d.H, d.I, &owned, &W_x, &err)) ||
            (workspace_bytes > 0 &&
             lltm_workspace(workspace_bytes, &a[0], &owned, &workspace, &err)))
            goto fail;
        status = lltm_cell_backward_pointwise_cuda(
            d.dtype, d.B, d.I, d.H, a[0].data, a[1].data, a[2].data, a[3].data, a[5].data,
            a[4].data, d_gates_data, data[D_OLD_CELL], data[D_BIAS], X_data, workspace, stream);
        if (status != LLTM_OK) {
            lltm_core_failed(&err, "lltm_cell_backward_pointwise_cuda", status);
            goto fail;
        }
        if ((mask[D_WEIGHTS] && lltm_mm_out(d_gates_t, X, out[D_WEIGHTS], &err)) ||
            (mask[D_OLD_H] && lltm_mm_out(d_gates, W_h, out[D_OLD_H], &err)) ||
            (mask[D_INPUT] && lltm_mm_out(d_gates, W_x, out[D_INPUT], &err)))
            goto fail;
    }
    if (lltm_return_masked(&owned, out, mask, 5, stack, &err))
        goto fail;
    lltm_cuda_leave_device(guard);
    return;
fail:
    lltm_cuda_leave_device(guard);
    lltm_raise("lltm::cell_backward", &owned, &err);
}
