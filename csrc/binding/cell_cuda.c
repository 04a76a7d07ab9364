/*
 * cell_cuda.c - the CUDA kernels of the lltm::cell_forward and
 * lltm::cell_backward operators: on the device and stream lltm_open makes
 * current, choose the route and launch (csrc/core/lltm_cuda_cell_*.cu).
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

/* The route of the call's step: 0 (*cublas set), or an error in c->err. */
static int choose_route(lltm_call *c, bool *cublas)
{
    const int route = cell_route(c->args[0].device_index, &c->settings, c->d.dtype, c->d.B,
                                 c->d.I, c->d.H);
    *cublas = route == LLTM_MATMUL_CUBLAS;
    return route < 0 ? lltm_core_status(c, route, "lltm_cuda_device_query") : 0;
}

/* cell_forward(input, weights, bias, old_h, old_cell) -> (new_h, new_cell, gates) */
void lltm_cell_forward_cuda(StableIValue *stack, uint64_t num_args, uint64_t num_outputs)
{
    lltm_call c;
    bool cublas = false;
    int status;
    if (lltm_open(&c, &lltm_cell_forward_op, stack, num_args, num_outputs) ||
        choose_route(&c, &cublas))
        goto fail;
    const lltm_tensor *a = c.args;
    const lltm_dims d = c.d;
    if (!cublas) {
        status = lltm_cell_forward_fused_cuda(d.dtype, d.B, d.I, d.H, a[0].data, a[3].data,
                                              a[1].data, a[2].data, a[4].data, c.data[0],
                                              c.data[1], c.data[2], c.stream);
        if (lltm_core_status(&c, status, "lltm_cell_forward_fused_cuda"))
            goto fail;
    } else {
        /* gates = [h, x] W^T (cuBLAS), then bias + activations + state. */
        AtenTensorHandle X, W_t;
        void *X_data;
        const int64_t G = 3 * d.H, K = d.I + d.H;
        const int64_t X_sizes[2] = {d.B, K}, Wt_sizes[2] = {K, G}, Wt_strides[2] = {1, K};
        if (lltm_empty(2, X_sizes, &a[0], &c.owned, &X, &X_data, &c.err) ||
            lltm_view(a[1].handle, 2, Wt_sizes, Wt_strides, 0, &c.owned, &W_t, &c.err))
            goto fail;
        status = lltm_concat_state_input_cuda(d.dtype, d.B, d.I, d.H, a[3].data, a[0].data,
                                              X_data, c.stream);
        if (lltm_core_status(&c, status, "lltm_concat_state_input_cuda") ||
            lltm_mm_out(X, W_t, c.results[2], &c.err))
            goto fail;
        status = lltm_cell_forward_pointwise_cuda(d.dtype, d.B, d.H, c.data[2], a[2].data,
                                                  a[4].data, c.data[0], c.data[1], c.stream);
        if (lltm_core_status(&c, status, "lltm_cell_forward_pointwise_cuda"))
            goto fail;
    }
    if (lltm_close(&c, stack))
        goto fail;
    return;
fail:
    lltm_call_raise(&c);
}

/* cell_backward(grad_h, grad_cell, new_cell, gates, input, old_h, weights,
 *               output_mask)
 *   -> (grad_input, grad_weights, grad_bias, grad_old_h, grad_old_cell);
 * what output_mask leaves out is not computed (the bias and old_cell
 * gradients excepted: the gate-gradient pass writes them anyway). */
void lltm_cell_backward_cuda(StableIValue *stack, uint64_t num_args, uint64_t num_outputs)
{
    enum { D_INPUT, D_WEIGHTS, D_BIAS, D_OLD_H, D_OLD_CELL };
    lltm_call c;
    AtenTensorHandle d_gates;
    void *d_gates_data;
    bool cublas = false;
    int status;
    if (lltm_open(&c, &lltm_cell_backward_op, stack, num_args, num_outputs) ||
        choose_route(&c, &cublas))
        goto fail;
    const lltm_tensor *a = c.args;
    const lltm_dims d = c.d;
    const bool *mask = c.mask;
    AtenTensorHandle *out = c.results;
    void *const *data = c.data;
    const int64_t G = 3 * d.H, K = d.I + d.H;
    const int64_t G_sizes[2] = {d.B, G};
    if (lltm_empty(2, G_sizes, &a[0], &c.owned, &d_gates, &d_gates_data, &c.err))
        goto fail;

    if (!cublas) {
        status = lltm_cell_backward_fused_cuda(
            d.dtype, d.B, d.I, d.H, a[0].data, a[1].data, a[2].data, a[3].data, a[4].data,
            a[5].data, a[6].data, d_gates_data, data[D_INPUT], data[D_WEIGHTS], data[D_BIAS],
            data[D_OLD_H], data[D_OLD_CELL], c.stream);
        if (lltm_core_status(&c, status, "lltm_cell_backward_fused_cuda"))
            goto fail;
    } else {
        /* Pointwise (+ X = [h, x] where dW is wanted), then dW = dG^T X, and
         * dX = dG W as two products on column slices of W, straight into
         * grad_old_h and grad_input. */
        AtenTensorHandle X = NULL, d_gates_t = NULL, W_h = NULL, W_x = NULL;
        void *X_data = NULL, *workspace = NULL;
        const size_t workspace_bytes =
            lltm_cell_backward_pointwise_workspace_cuda(d.dtype, d.B, d.H);
        const int64_t X_sizes[2] = {d.B, K}, Gt_sizes[2] = {G, d.B}, Gt_strides[2] = {1, G};
        const int64_t W_strides[2] = {K, 1}, Wh_sizes[2] = {G, d.H}, Wx_sizes[2] = {G, d.I};
        if ((mask[D_WEIGHTS] &&
             (lltm_empty(2, X_sizes, &a[0], &c.owned, &X, &X_data, &c.err) ||
              lltm_view(d_gates, 2, Gt_sizes, Gt_strides, 0, &c.owned, &d_gates_t, &c.err))) ||
            (mask[D_OLD_H] &&
             lltm_view(a[6].handle, 2, Wh_sizes, W_strides, 0, &c.owned, &W_h, &c.err)) ||
            (mask[D_INPUT] &&
             lltm_view(a[6].handle, 2, Wx_sizes, W_strides, d.H, &c.owned, &W_x, &c.err)) ||
            (workspace_bytes > 0 && lltm_workspace(&c, workspace_bytes, &workspace)))
            goto fail;
        status = lltm_cell_backward_pointwise_cuda(
            d.dtype, d.B, d.I, d.H, a[0].data, a[1].data, a[2].data, a[3].data, a[5].data,
            a[4].data, d_gates_data, data[D_OLD_CELL], data[D_BIAS], X_data, workspace, c.stream);
        if (lltm_core_status(&c, status, "lltm_cell_backward_pointwise_cuda") ||
            (mask[D_WEIGHTS] && lltm_mm_out(d_gates_t, X, out[D_WEIGHTS], &c.err)) ||
            (mask[D_OLD_H] && lltm_mm_out(d_gates, W_h, out[D_OLD_H], &c.err)) ||
            (mask[D_INPUT] && lltm_mm_out(d_gates, W_x, out[D_INPUT], &c.err)))
            goto fail;
    }
    if (lltm_close(&c, stack))
        goto fail;
    return;
fail:
    lltm_call_raise(&c);
}
