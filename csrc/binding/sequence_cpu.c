/*
 * sequence_cpu.c - the CPU kernels of the sequence and stack operators: one
 * LLTM layer over the whole sequence in the core (lltm_sequence_forward_cpu /
 * _backward_cpu, csrc/core/lltm_sequence_cpu.c), once or a layer at a time
 * (layers.h), which calls back for the matrix products (aten::mm through
 * lltm_torch_gemm, MKL / OpenBLAS underneath) and the thread pool. lltm.h
 * documents the algorithm and what is kept for the backward.
 */
#include "layers.h"

typedef struct cpu_layers {
    lltm_call *call;
    void *workspace;
} cpu_layers;

static int layer(void *vctx, int64_t l, const lltm_sequence_forward_tensors *f,
                 const lltm_sequence_backward_tensors *b)
{
    const cpu_layers *ctx = (const cpu_layers *)vctx;
    const lltm_dims *d = &ctx->call->d;
    const int64_t I = l == 0 ? d->I : d->H;
    if (b != NULL)
        return lltm_sequence_backward_cpu(d->dtype, d->T, d->B, I, d->H, b, ctx->workspace,
                                          lltm_torch_gemm, &ctx->call->gemm,
                                          lltm_torch_parallel_for);
    return lltm_sequence_forward_cpu(d->dtype, d->T, d->B, I, d->H, f, ctx->workspace,
                                     lltm_torch_gemm, &ctx->call->gemm, lltm_torch_parallel_for);
}

/* Any of the operators (ops.h has their signatures). */
static void layers_cpu(const lltm_op *op, StableIValue *stack, uint64_t num_args,
                       uint64_t num_outputs)
{
    lltm_call c;
    cpu_layers ctx = {&c, NULL};
    void *scratch = NULL;
    if (lltm_open(&c, op, stack, num_args, num_outputs))
        goto fail;
    const lltm_dims *d = &c.d;
    /* one layer's workspace, for the widest input, serves each in turn */
    const int64_t I = d->L > 1 && d->H > d->I ? d->H : d->I;
    const size_t bytes =
        op->backward         ? lltm_sequence_backward_workspace_cpu(d->dtype, d->T, d->B, I, d->H)
        : c.settings.inference ? lltm_sequence_infer_workspace_cpu(d->dtype, d->T, I, d->B, d->H)
                               : lltm_sequence_forward_workspace_cpu(d->dtype, I, d->B, d->H);
    const size_t scratch_bytes = lltm_stack_scratch_bytes(&c);
    if (lltm_workspace(&c, bytes, &ctx.workspace) ||
        (scratch_bytes > 0 && lltm_workspace(&c, scratch_bytes, &scratch)) ||
        lltm_core_status(&c, lltm_run_layers(&c, scratch, layer, &ctx),
                         op->backward ? "lltm_sequence_backward_cpu"
                                      : "lltm_sequence_forward_cpu") ||
        lltm_close(&c, stack))
        goto fail;
    return;
fail:
    lltm_call_raise(&c);
}

/* the operators' boxed kernels (ops.h) */
void lltm_sequence_forward_cpu_boxed(StableIValue *s, uint64_t n_args, uint64_t n_out)
{ layers_cpu(&lltm_sequence_forward_op, s, n_args, n_out); }
void lltm_sequence_backward_cpu_boxed(StableIValue *s, uint64_t n_args, uint64_t n_out)
{ layers_cpu(&lltm_sequence_backward_op, s, n_args, n_out); }
void lltm_sequence_backward_gates_cpu_boxed(StableIValue *s, uint64_t n_args, uint64_t n_out)
{ layers_cpu(&lltm_sequence_backward_gates_op, s, n_args, n_out); }
void lltm_stack_forward_cpu_boxed(StableIValue *s, uint64_t n_args, uint64_t n_out)
{ layers_cpu(&lltm_stack_forward_op, s, n_args, n_out); }
void lltm_stack_backward_cpu_boxed(StableIValue *s, uint64_t n_args, uint64_t n_out)
{ layers_cpu(&lltm_stack_backward_op, s, n_args, n_out); }
