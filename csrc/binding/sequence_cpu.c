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

/* sequence_forward(input, weights, bias, h0, c0)
 *   -> (output [T,B,H], h_n [B,H], c_n [B,H], cells [T,B,H], gates [T,B,3H]) */
void lltm_sequence_forward_cpu_boxed(StableIValue *stack, uint64_t num_args,
                                     uint64_t num_outputs)
{
    lltm_owned owned = {.count = 0};
    lltm_error err, gemm_err = {.msg = ""};
    lltm_sequence_results r;
    void *workspace;
    lltm_tensor a[LLTM_SEQ_FWD_NARGS + 1]; /* the lengths overload: lengths last */
    const int n_in = num_args == LLTM_SEQ_FWD_NARGS + 1 ? LLTM_SEQ_FWD_NARGS + 1 : LLTM_SEQ_FWD_NARGS;
    lltm_sequence_dims d;

    if (lltm_open_op(stack, num_args, num_outputs, n_in, 5,
                     lltm_sequence_forward_names, a, &owned, &err) ||
        lltm_check_sequence_forward(a, aoti_torch_device_type_cpu(), true, &d, &err) ||
        (n_in > LLTM_SEQ_FWD_NARGS && lltm_check_lengths(&a[LLTM_SEQ_FWD_NARGS], &a[0], &d, true, &err)))
        goto fail;

    if (lltm_sequence_results_new(false, &d, &a[0], &owned, &r, &err) ||
        lltm_workspace(lltm_sequence_forward_workspace_cpu(d.dtype, d.B, d.H), &a[0],
                       &owned, &workspace, &err))
        goto fail;

    lltm_torch_gemm_ctx gemm = {a[0].device_type, a[0].device_index, &gemm_err};
    int status = lltm_sequence_forward_cpu(
        d.dtype, d.T, d.B, d.I, d.H, a[LLTM_SEQ_FWD_INPUT].data, a[LLTM_SEQ_FWD_WEIGHTS].data,
        a[LLTM_SEQ_FWD_BIAS].data, a[LLTM_SEQ_FWD_H0].data, a[LLTM_SEQ_FWD_C0].data,
        r.data[0], r.data[1], r.data[2], r.data[3], r.data[4],
        n_in > LLTM_SEQ_FWD_NARGS ? (const int64_t *)a[LLTM_SEQ_FWD_NARGS].data : NULL,
        workspace, lltm_torch_gemm, &gemm, lltm_torch_parallel_for);
    if (status != LLTM_OK) {
        lltm_sequence_core_failed(&err, &gemm_err, "lltm_sequence_forward_cpu", status);
        goto fail;
    }
    lltm_sequence_results_return(&owned, &r, stack);
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
    lltm_sequence_results r;
    void *workspace;
    lltm_tensor a[LLTM_SEQ_BWD_NARGS + 1]; /* the lengths overload: lengths last */
    const int n_in = num_args == LLTM_SEQ_BWD_NARGS + 1 ? LLTM_SEQ_BWD_NARGS + 1 : LLTM_SEQ_BWD_NARGS;
    lltm_sequence_dims d;

    if (lltm_open_op(stack, num_args, num_outputs, n_in, 5,
                     lltm_sequence_backward_names, a, &owned, &err) ||
        lltm_check_sequence_backward(a, aoti_torch_device_type_cpu(), true, &d, &err) ||
        (n_in > LLTM_SEQ_BWD_NARGS && lltm_check_lengths(&a[LLTM_SEQ_BWD_NARGS], &a[0], &d, true, &err)))
        goto fail;

    if (lltm_sequence_results_new(true, &d, &a[0], &owned, &r, &err) ||
        lltm_workspace(lltm_sequence_backward_workspace_cpu(d.dtype, d.T, d.B, d.H), &a[0],
                       &owned, &workspace, &err))
        goto fail;

    lltm_torch_gemm_ctx gemm = {a[0].device_type, a[0].device_index, &gemm_err};
    int status = lltm_sequence_backward_cpu(
        d.dtype, d.T, d.B, d.I, d.H, a[LLTM_SEQ_BWD_GRAD_OUTPUT].data,
        a[LLTM_SEQ_BWD_GRAD_H_N].data, a[LLTM_SEQ_BWD_GRAD_C_N].data,
        a[LLTM_SEQ_BWD_INPUT].data, a[LLTM_SEQ_BWD_WEIGHTS].data, a[LLTM_SEQ_BWD_H0].data,
        a[LLTM_SEQ_BWD_OUTPUT].data, a[LLTM_SEQ_BWD_CELLS].data, a[LLTM_SEQ_BWD_GATES].data,
        r.data[0], r.data[1], r.data[2], r.data[3], r.data[4],
        n_in > LLTM_SEQ_BWD_NARGS ? (const int64_t *)a[LLTM_SEQ_BWD_NARGS].data : NULL,
        workspace, lltm_torch_gemm, &gemm, lltm_torch_parallel_for);
    if (status != LLTM_OK) {
        lltm_sequence_core_failed(&err, &gemm_err, "lltm_sequence_backward_cpu", status);
        goto fail;
    }
    lltm_sequence_results_return(&owned, &r, stack);
    return;
fail:
    lltm_raise("lltm::sequence_backward", &owned, &err);
}
