/*
 * stack_cpu.c - the CPU kernels of lltm::stack_forward and
 * lltm::stack_backward: the stack as one-layer calls of the core
 * (lltm_sequence_forward_cpu / _backward_cpu), the layer below's output the
 * input of the layer above (stack_args.h).
 */
#include "ops.h"
#include "stack_args.h"

typedef struct cpu_layers {
    lltm_stack_call *call;
    void *workspace;
} cpu_layers;

static int forward_layer(void *vctx, int64_t l, const lltm_sequence_forward_tensors *t)
{
    cpu_layers *ctx = (cpu_layers *)vctx;
    const lltm_sequence_dims *d = &ctx->call->d.seq;
    return lltm_sequence_forward_cpu(d->dtype, d->T, d->B,
                                     lltm_stack_layer_inputs(&ctx->call->d, l), d->H, t,
                                     ctx->workspace, lltm_torch_gemm, &ctx->call->gemm,
                                     lltm_torch_parallel_for);
}

static int backward_layer(void *vctx, int64_t l, const lltm_sequence_backward_tensors *t)
{
    cpu_layers *ctx = (cpu_layers *)vctx;
    const lltm_sequence_dims *d = &ctx->call->d.seq;
    return lltm_sequence_backward_cpu(d->dtype, d->T, d->B,
                                      lltm_stack_layer_inputs(&ctx->call->d, l), d->H, t,
                                      ctx->workspace, lltm_torch_gemm, &ctx->call->gemm,
                                      lltm_torch_parallel_for);
}

static void stack_cpu(bool backward, StableIValue *stack, uint64_t num_args,
                      uint64_t num_outputs)
{
    lltm_stack_call c;
    cpu_layers ctx = {&c, NULL};
    void *scratch = NULL;
    if (lltm_stack_open(&c, backward, stack, num_args, num_outputs,
                        aoti_torch_device_type_cpu()))
        goto fail;
    const lltm_sequence_dims *d = &c.d.seq;
    /* one layer's workspace, for the widest input, serves each in turn */
    const int64_t I = c.d.L > 1 && d->H > d->I ? d->H : d->I;
    const size_t bytes = backward
                             ? lltm_sequence_backward_workspace_cpu(d->dtype, d->T, d->B, I, d->H)
                             : lltm_sequence_forward_workspace_cpu(d->dtype, I, d->B, d->H);
    if (lltm_workspace(bytes, &c.args[0], &c.owned, &ctx.workspace, &c.err) ||
        lltm_workspace(lltm_stack_scratch_bytes(&c), &c.args[0], &c.owned, &scratch, &c.err))
        goto fail;
    const int status = backward ? lltm_stack_backward_by_layers(&c, scratch, backward_layer, &ctx)
                                : lltm_stack_forward_by_layers(&c, forward_layer, &ctx);
    if (lltm_stack_close(&c, status,
                         backward ? "lltm_sequence_backward_cpu" : "lltm_sequence_forward_cpu",
                         stack))
        goto fail;
    return;
fail:
    lltm_raise(lltm_stack_op_name(&c), &c.owned, &c.err);
}

/* the two operators' boxed kernels (ops.h) */
void lltm_stack_forward_cpu_boxed(StableIValue *s, uint64_t n_args, uint64_t n_out)
{ stack_cpu(false, s, n_args, n_out); }
void lltm_stack_backward_cpu_boxed(StableIValue *s, uint64_t n_args, uint64_t n_out)
{ stack_cpu(true, s, n_args, n_out); }
