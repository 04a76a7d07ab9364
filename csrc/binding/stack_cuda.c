/*
 * stack_cuda.c - the CUDA kernels of lltm::stack_forward and
 * lltm::stack_backward: validate, guard the device, take torch's current
 * stream, then run the stack in one stacked launch a direction
 * (lltm_stack_forward_cuda / _backward_cuda, csrc/core/lltm_stack.h) where
 * one fits these sizes and the call's settings force no plan of one layer;
 * else as one-layer calls (stack_args.h), each planned as
 * lltm::sequence_forward plans it.
 */
#include "ops.h"
#include "cublas_gemm.h"
#include "sequence_cuda.h"
#include "stack_args.h"

#include "../core/lltm_cuda_rules.h"
#include "../core/lltm_stack.h"

/* Whether the settings constrain the plan of a layer in any way
 * (lltm.overrides): the stack then runs as one-layer calls, which honour it. */
static bool plan_forced(const lltm_sequence_plan_options *o)
{
    return o->family || o->grid_lanes || o->grid_values || o->grid_groups_max ||
           o->cluster_blocks || o->cluster_chunk || o->grid_chunk || o->block_chunk ||
           o->grid_tf32;
}

/* The stacked launch's plan for L layers of these sizes on `device` under
 * settings `s`: LLTM_OK, or an lltm_status saying why none runs them. */
static int stacked_plan(int device, const lltm_call_settings *s, lltm_dtype dtype, int64_t L,
                        int64_t T, int64_t B, int64_t I, int64_t H, lltm_stack_plan *plan)
{
    lltm_cuda_device dev;
    if (plan_forced(&s->plan) || L < 2 || L > LLTM_STACK_MAX_LAYERS)
        return LLTM_ERR_ARGUMENT;
    const int status = lltm_cuda_device_for(device, s, &dev);
    if (status != LLTM_OK)
        return status;
    return lltm_stack_plan_cuda(&dev, dtype, (int)L, T, B, I, H, plan);
}

/* Whether lltm::stack_forward with settings `packed` (lltm._settings) runs
 * L layers of these sizes on device `device` in one stacked launch, and its
 * plan: an lltm_status, LLTM_OK when it does (lltm.LLTM asks before it calls
 * the operator; tests). */
__attribute__((visibility("default"))) int
lltm_cuda_stack_plan_in_force(int device, int dtype, int64_t packed, int64_t L, int64_t T,
                              int64_t B, int64_t I, int64_t H, lltm_stack_plan *plan)
{
    lltm_call_settings s;
    if (!plan || lltm_call_settings_query(packed, &s) != LLTM_OK)
        return LLTM_ERR_ARGUMENT;
    return stacked_plan(device, &s, (lltm_dtype)dtype, L, T, B, I, H, plan);
}

/* Whether lltm.LLTM runs L layers of these sizes through one stacked launch
 * under settings `packed`: one fits and the rules find it the faster route
 * (lltm_stack_rule_cuda, from the plan a layer above the first runs alone;
 * a call on the current stream as it is): 1 or 0 in *stacked. */
__attribute__((visibility("default"))) int
lltm_cuda_stack_route_in_force(int device, int dtype, int64_t packed, int64_t L, int64_t T,
                               int64_t B, int64_t I, int64_t H, int *stacked)
{
    lltm_call_settings s;
    lltm_stack_plan stack;
    lltm_sequence_plan layer;
    lltm_cuda_device dev;
    int eager;
    if (!stacked || lltm_call_settings_query(packed, &s) != LLTM_OK)
        return LLTM_ERR_ARGUMENT;
    *stacked = 0;
    if (stacked_plan(device, &s, (lltm_dtype)dtype, L, T, B, I, H, &stack) != LLTM_OK)
        return LLTM_OK;
    /* a layer above the first: inputs of width H */
    const int have_layer = lltm_cuda_layer_plan(&s, device, NULL, (lltm_dtype)dtype, T, B, H,
                                                H, &dev, &layer, &eager) == LLTM_OK;
    *stacked = lltm_stack_rule_cuda(&dev, (lltm_dtype)dtype, (int)L, B, H, eager,
                                    have_layer ? &layer : NULL);
    return LLTM_OK;
}

/* --- the stack as one-layer calls ---------------------------------------------------- */

typedef struct cuda_layers {
    lltm_stack_call *call;
    lltm_sequence_plan plans[2]; /* the bottom layer's, the others' */
    void *workspace, *stream;
} cuda_layers;

static int forward_layer(void *vctx, int64_t l, const lltm_sequence_forward_tensors *t)
{
    cuda_layers *ctx = (cuda_layers *)vctx;
    const lltm_sequence_dims *d = &ctx->call->d.seq;
    return lltm_sequence_forward_cuda(&ctx->plans[l > 0], d->T, d->B,
                                      lltm_stack_layer_inputs(&ctx->call->d, l), d->H, t,
                                      ctx->workspace, lltm_cuda_gemm, &ctx->call->gemm,
                                      ctx->stream);
}

static int backward_layer(void *vctx, int64_t l, const lltm_sequence_backward_tensors *t)
{
    cuda_layers *ctx = (cuda_layers *)vctx;
    const lltm_sequence_dims *d = &ctx->call->d.seq;
    return lltm_sequence_backward_cuda(&ctx->plans[l > 0], d->T, d->B,
                                       lltm_stack_layer_inputs(&ctx->call->d, l), d->H, t,
                                       ctx->workspace, lltm_cuda_gemm, &ctx->call->gemm,
                                       ctx->stream);
}

static int by_layers(lltm_stack_call *c, int device, void *stream, int *status)
{
    cuda_layers ctx = {c, {{0}}, NULL, stream};
    void *scratch = NULL;
    size_t bytes = 0;
    for (int k = 0; k < 2 && k < c->d.L; ++k) {
        lltm_sequence_dims d = c->d.seq;
        d.I = lltm_stack_layer_inputs(&c->d, k);
        if (lltm_cuda_choose_plan(&d, &c->settings, device, stream, &ctx.plans[k], &c->err))
            return -1;
        const size_t need =
            c->backward ? lltm_sequence_backward_workspace_cuda(&ctx.plans[k], d.T, d.B, d.I, d.H)
                        : lltm_sequence_forward_workspace_cuda(&ctx.plans[k], d.T, d.B, d.I, d.H);
        bytes = need > bytes ? need : bytes;
    }
    if (lltm_workspace(bytes, &c->args[0], &c->owned, &ctx.workspace, &c->err) ||
        lltm_workspace(lltm_stack_scratch_bytes(c), &c->args[0], &c->owned, &scratch, &c->err))
        return -1;
    *status = c->backward ? lltm_stack_backward_by_layers(c, scratch, backward_layer, &ctx)
                          : lltm_stack_forward_by_layers(c, forward_layer, &ctx);
    return 0;
}

/* --- the stack in one launch a direction --------------------------------------------- */

static int stacked(lltm_stack_call *c, const lltm_stack_plan *plan, void *stream, int *status)
{
    const lltm_sequence_dims *d = &c->d.seq;
    const lltm_tensor *a = c->args;
    lltm_stack_forward_layer fwd[LLTM_STACK_MAX_LAYERS];
    lltm_stack_backward_layer bwd[LLTM_STACK_MAX_LAYERS];
    void *workspace = NULL;
    const size_t bytes = c->backward
                             ? lltm_stack_backward_workspace_cuda(plan, d->T, d->B, d->I, d->H)
                             : plan->workspace_bytes;
    if (lltm_workspace(bytes, &a[0], &c->owned, &workspace, &c->err))
        return -1;
    if (!c->backward) {
        for (int64_t l = 0; l < c->d.L; ++l) {
            lltm_sequence_forward_tensors t;
            lltm_stack_layer_forward(c, l, &t);
            fwd[l] = (lltm_stack_forward_layer){t.weights, t.bias,  t.h0,  t.c0, t.gates,
                                                t.output,  t.cells, t.h_n, t.c_n};
        }
        *status = lltm_stack_forward_cuda(plan, d->T, d->B, d->I, d->H,
                                          a[LLTM_STACK_FWD_INPUT].data, fwd, workspace,
                                          c->lengths, lltm_cuda_gemm, &c->gemm, stream);
        return 0;
    }
    for (int64_t l = 0; l < c->d.L; ++l) {
        lltm_sequence_backward_tensors t;
        lltm_stack_layer_backward(c, l, NULL, NULL, &t);
        /* grad_gates NULL: the whole call keeps dG in its workspace */
        bwd[l] = (lltm_stack_backward_layer){t.weights,   t.cells,   t.gates,     t.grad_h_n,
                                             t.grad_c_n,  NULL,      t.grad_bias, t.grad_h0,
                                             t.grad_c0,   t.h0,      t.output,    t.grad_weights};
    }
    *status = lltm_stack_backward_cuda(plan, d->T, d->B, d->I, d->H,
                                       a[LLTM_STACK_BWD_INPUT].data,
                                       a[LLTM_STACK_BWD_GRAD_OUTPUT].data, bwd, c->data[0],
                                       workspace, c->lengths, lltm_cuda_gemm, &c->gemm, stream);
    return 0;
}

static void stack_cuda(bool backward, StableIValue *stack, uint64_t num_args,
                       uint64_t num_outputs)
{
    lltm_stack_call c;
    CUDAGuardHandle guard = NULL;
    void *stream = NULL;
    lltm_stack_plan plan;
    int status = LLTM_OK;
    if (lltm_stack_open(&c, backward, stack, num_args, num_outputs,
                        aoti_torch_device_type_cuda()) ||
        lltm_cuda_enter_device(c.args[0].device_index, &guard, &stream, &c.err))
        goto fail;
    const lltm_sequence_dims *d = &c.d.seq;
    const bool one_launch = stacked_plan(c.args[0].device_index, &c.settings, d->dtype, c.d.L,
                                         d->T, d->B, d->I, d->H, &plan) == LLTM_OK;
    if (one_launch ? stacked(&c, &plan, stream, &status)
                   : by_layers(&c, c.args[0].device_index, stream, &status))
        goto fail;
    const char *core_fn = one_launch ? (backward ? "lltm_stack_backward_cuda"
                                                 : "lltm_stack_forward_cuda")
                                     : (backward ? "lltm_sequence_backward_cuda"
                                                 : "lltm_sequence_forward_cuda");
    if (lltm_stack_close(&c, status, core_fn, stack))
        goto fail;
    lltm_cuda_leave_device(guard);
    return;
fail:
    lltm_cuda_leave_device(guard);
    lltm_raise(lltm_stack_op_name(&c), &c.owned, &c.err);
}

/* the two operators' boxed kernels (ops.h) */
void lltm_stack_forward_cuda_boxed(StableIValue *s, uint64_t n_args, uint64_t n_out)
{ stack_cuda(false, s, n_args, n_out); }
void lltm_stack_backward_cuda_boxed(StableIValue *s, uint64_t n_args, uint64_t n_out)
{ stack_cuda(true, s, n_args, n_out); }
