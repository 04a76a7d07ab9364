/*
 * sequence_cpu.c - the CPU kernels of lltm::sequence_forward and
 * lltm::sequence_backward: validate and allocate (lltm_sequence_open), add
 * the core's workspace, and run one LLTM layer over the whole sequence in the
 * core (lltm_sequence_forward_cpu / lltm_sequence_backward_cpu, csrc/core/
 * lltm_sequence_cpu.c), which calls back for the matrix products (aten::mm
 * through lltm_torch_gemm, MKL / OpenBLAS underneath) and the thread pool.
 * lltm.h documents the algorithm and what is kept for the backward.
 */
#include "ops.h"
#include "sequence_args.h"

/* Either operator: sequence_forward(input, weights, bias, h0, c0)
 *   -> (output [T,B,H], h_n [B,H], c_n [B,H], cells [T,B,H], gates [T,B,3H]);
 * sequence_backward(grad_output, grad_h_n, grad_c_n, input, weights, h0,
 *                   output, cells, gates)
 *   -> (grad_input [T,B,I], grad_weights [3H,I+H], grad_bias [3H],
 *       grad_h0 [B,H], grad_c0 [B,H]) */
static void sequence_cpu(lltm_sequence_op op, StableIValue *stack, uint64_t num_args,
                         uint64_t num_outputs)
{
    lltm_sequence_call c;
    void *workspace;
    const bool backward = op != LLTM_SEQ_FORWARD;
    if (lltm_sequence_open(&c, op, stack, num_args, num_outputs,
                           aoti_torch_device_type_cpu()))
        goto fail;
    const lltm_sequence_dims *d = &c.d;
    const size_t bytes = backward
                             ? lltm_sequence_backward_workspace_cpu(d->dtype, d->T, d->B, d->I,
                                                                    d->H)
                             : lltm_sequence_forward_workspace_cpu(d->dtype, d->I, d->B, d->H);
    if (lltm_workspace(bytes, &c.args[0], &c.owned, &workspace, &c.err))
        goto fail;
    const int status =
        backward ? lltm_sequence_backward_cpu(d->dtype, d->T, d->B, d->I, d->H,
                                              &c.backward_tensors, workspace, lltm_torch_gemm,
                                              &c.gemm, lltm_torch_parallel_for)
                 : lltm_sequence_forward_cpu(d->dtype, d->T, d->B, d->I, d->H,
                                             &c.forward_tensors, workspace, lltm_torch_gemm,
                                             &c.gemm, lltm_torch_parallel_for);
    if (lltm_sequence_close(&c, status,
                            backward ? "lltm_sequence_backward_cpu" : "lltm_sequence_forward_cpu",
                            stack))
        goto fail;
    return;
fail:
    lltm_raise(lltm_sequence_op_name(&c), &c.owned, &c.err);
}

/* the operators' boxed kernels (ops.h) */
void lltm_sequence_forward_cpu_boxed(StableIValue *s, uint64_t n_args, uint64_t n_out)
{ sequence_cpu(LLTM_SEQ_FORWARD, s, n_args, n_out); }
void lltm_sequence_backward_cpu_boxed(StableIValue *s, uint64_t n_args, uint64_t n_out)
{ sequence_cpu(LLTM_SEQ_BACKWARD, s, n_args, n_out); }
void lltm_sequence_backward_gates_cpu_boxed(StableIValue *s, uint64_t n_args, uint64_t n_out)
{ sequence_cpu(LLTM_SEQ_BACKWARD_GATES, s, n_args, n_out); }
