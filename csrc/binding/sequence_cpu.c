/*
 * sequence_cpu.c - the CPU kernels of lltm::sequence_forward and
 * lltm::sequence_backward: validate, allocate the results and the core's
 * workspace, and run one LLTM layer over the whole sequence in the core
 * (lltm_sequence_forward_cpu / lltm_sequence_backward_cpu, csrc/core/
 * lltm_sequence_cpu.c), which calls back for the matrix products (aten::mm
 * through lltm_torch_gemm, MKL / OpenBLAS underneath) and the thread pool.
 * lltm.h documents the algorithm and what is kept for the backward.
 */
#include "ops.h"
#include "sequence_args.h"

/* A core call failed: with the matrix product's own message where it was
 * that, else the core's status. */
static void sequence_core_failed(lltm_error *err, const lltm_error *gemm_err,
                                 const char *what, int status)
{
    if (status == LLTM_ERR_GEMM && gemm_err->msg[0] != '\0')
        lltm_fail(err, "%s: %s", what, gemm_err->msg);
    else
        lltm_core_failed(err, what, status);
}

/* sequence_forward(input, weights, bias, h0, c0)
 *   -> (output [T,B,H], h_n [B,H], c_n [B,H], cells [T,B,H], gates [T,B,3H]) */
void lltm_sequence_forward_cpu_boxed(StableIValue *stack, uint64_t num_args,
                                     uint64_t num_outputs)
{
    lltm_owned owned = {.count = 0};
    lltm_error err, gemm_err = {.msg = ""};
    AtenTensorHandle output, h_n, c_n, cells, gates;
    void *output_data, *h_n_data, *c_n_data, *cells_data, *gates_data, *workspace;
    lltm_tensor a[LLTM_SEQ_FWD_NARGS];
    lltm_sequence_dims d;

    if (lltm_open_op(stack, num_args, num_outputs, LLTM_SEQ_FWD_NARGS, 5,
                     lltm_sequence_forward_names, a, &owned, &err) ||
        lltm_check_sequence_forward(a, aoti_torch_device_type_cpu(), true, &d, &err))
        goto fail;

    const int64_t steps_H[3] = {d.T, d.B, d.H}, steps_G[3] = {d.T, d.B, 3 * d.H};
    const int64_t state[2] = {d.B, d.H};
    if (lltm_empty(3, steps_H, &a[0], &owned, &output, &output_data, &err) ||
        lltm_empty(2, state, &a[0], &owned, &h_n, &h_n_data, &err) ||
        lltm_empty(2, state, &a[0], &owned, &c_n, &c_n_data, &err) ||
        lltm_empty(3, steps_H, &a[0], &owned, &cells, &cells_data, &err) ||
        lltm_empty(3, steps_G, &a[0], &owned, &gates, &gates_data, &err) ||
        lltm_workspace(lltm_sequence_forward_workspace_cpu(d.dtype, d.B, d.H), &a[0],
                       &owned, &workspace, &err))
        goto fail;

    lltm_torch_gemm_ctx gemm = {a[0].device_type, a[0].device_index, &gemm_err};
    int status = lltm_sequence_forward_cpu(
        d.dtype, d.T, d.B, d.I, d.H, a[LLTM_SEQ_FWD_INPUT].data, a[LLTM_SEQ_FWD_WEIGHTS].data,
        a[LLTM_SEQ_FWD_BIAS].data, a[LLTM_SEQ_FWD_H0].data, a[LLTM_SEQ_FWD_C0].data,
        output_data, h_n_data, c_n_data, cells_data, gates_data, workspace, lltm_torch_gemm,
        &gemm, lltm_torch_parallel_for);
    if (status != LLTM_OK) {
        sequence_core_failed(&err, &gemm_err, "lltm_sequence_forward_cpu", status);
        goto fail;
    }
    lltm_return(&owned, output, &stack[0]);
    lltm_return(&owned, h_n, &stack[1]);
    lltm_return(&owned, c_n, &stack[2]);
    lltm_return(&owned, cells, &stack[3]);
    lltm_return(&owned, gates, &stack[4]);
    lltm_free_owned(&owned);
    return;
fail:
    lltm_raise("lltm::sequence_forward", &owned, &err);
}

/* sequence_backward(grad_output, grad_h_n, grad_c_n, input, weights, h0,
 *                   output, cells, gates)
 *   -> (grad_input [T,B,I], grad_weights [3H,I+H], grad_bias [3H],
 *       grad_h0 [B,H], grad_c0 [B,H]) */
void lltm_sequence_backward_cpu_boxed(StableIValue *stack, uint64_t num_args,
                                      uint64_t num_outputs)
{
    lltm_owned owned = {.count = 0};
    lltm_error err, gemm_err = {.msg = ""};
    AtenTensorHandle d_input, d_weights, d_bias, d_h0, d_c0;
    void *d_input_data, *d_weights_data, *d_bias_data, *d_h0_data, *d_c0_data, *workspace;
    lltm_tensor a[LLTM_SEQ_BWD_NARGS];
    lltm_sequence_dims d;

    if (lltm_open_op(stack, num_args, num_outputs, LLTM_SEQ_BWD_NARGS, 5,
                     lltm_sequence_backward_names, a, &owned, &err) ||
        lltm_check_sequence_backward(a, aoti_torch_device_type_cpu(), true, &d, &err))
        goto fail;

    const int64_t G = 3 * d.H;
    const int64_t steps_I[3] = {d.T, d.B, d.I}, W_sizes[2] = {G, d.I + d.H};
    const int64_t bias_size[1] = {G}, state[2] = {d.B, d.H};
    if (lltm_empty(3, steps_I, &a[0], &owned, &d_input, &d_input_data, &err) ||
        lltm_empty(2, W_sizes, &a[0], &owned, &d_weights, &d_weights_data, &err) ||
        lltm_empty(1, bias_size, &a[0], &owned, &d_bias, &d_bias_data, &err) ||
        lltm_empty(2, state, &a[0], &owned, &d_h0, &d_h0_data, &err) ||
        lltm_empty(2, state, &a[0], &owned, &d_c0, &d_c0_data, &err) ||
        lltm_workspace(lltm_sequence_backward_workspace_cpu(d.dtype, d.T, d.B, d.H), &a[0],
                       &owned, &workspace, &err))
        goto fail;

    lltm_torch_gemm_ctx gemm = {a[0].device_type, a[0].device_index, &gemm_err};
    int status = lltm_sequence_backward_cpu(
        d.dtype, d.T, d.B, d.I, d.H, a[LLTM_SEQ_BWD_GRAD_OUTPUT].data,
        a[LLTM_SEQ_BWD_GRAD_H_N].data, a[LLTM_SEQ_BWD_GRAD_C_N].data,
        a[LLTM_SEQ_BWD_INPUT].data, a[LLTM_SEQ_BWD_WEIGHTS].data, a[LLTM_SEQ_BWD_H0].data,
        a[LLTM_SEQ_BWD_OUTPUT].data, a[LLTM_SEQ_BWD_CELLS].data, a[LLTM_SEQ_BWD_GATES].data,
        d_input_data, d_weights_data, d_bias_data, d_h0_data, d_c0_data, workspace,
        lltm_torch_gemm, &gemm, lltm_torch_parallel_for);
    if (status != LLTM_OK) {
        sequence_core_failed(&err, &gemm_err, "lltm_sequence_backward_cpu", status);
        goto fail;
    }
    lltm_return(&owned, d_input, &stack[0]);
    lltm_return(&owned, d_weights, &stack[1]);
    lltm_return(&owned, d_bias, &stack[2]);
    lltm_return(&owned, d_h0, &stack[3]);
    lltm_return(&owned, d_c0, &stack[4]);
    lltm_free_owned(&owned);
    return;
fail:
    lltm_raise("lltm::sequence_backward", &owned, &err);
}
