/*
 * sequence_cuda.c - the CUDA kernels of the sequence and stack operators
 * (on the stream and device lltm_open makes current): one layer over the
 * whole sequence in the core (lltm_sequence_forward_cuda / _backward_cuda,
 * csrc/core/lltm_cuda_sequence.cu), once or a layer at a time (layers.h),
 * each layer planned once per call; or the stack in one launch a direction
 * (lltm_stack_forward_cuda / _backward_cuda, csrc/core/lltm_stack.h) where
 * one fits these sizes and the call's settings force no plan of one layer.
 * The core calls back for the large matrix products (cuBLAS on the current
 * stream: lltm_cuda_gemm, cublas_gemm.h).
 *
 * The plans follow the call's settings (call_settings.h): the device to
 * itself or shared with a concurrent layer, and what lltm.overrides forces
 * for tests and measurements (docs/cuda-plans.md).
 */
#include "../core/lltm_cuda_rules.h"
#include "../core/lltm_stack.h"
#include "cublas_gemm.h"
#include "layers.h"

#include <stdatomic.h>

/* Each device's properties, asked once. */
enum { MAX_DEVICES = 64 };
static lltm_cuda_device device_cache[MAX_DEVICES];
static atomic_int device_state[MAX_DEVICES]; /* 0 not asked, 1 being written, 2 known */

int lltm_cuda_device_for(int device, const lltm_call_settings *s, lltm_cuda_device *dev)
{
    const bool cacheable = device >= 0 && device < MAX_DEVICES;
    int status = LLTM_OK;
    if (cacheable && atomic_load(&device_state[device]) == 2) {
        *dev = device_cache[device];
    } else {
        status = lltm_cuda_device_query(device, dev);
        int expected = 0;
        if (status == LLTM_OK && cacheable &&
            atomic_compare_exchange_strong(&device_state[device], &expected, 1)) {
            device_cache[device] = *dev;
            atomic_store(&device_state[device], 2);
        }
    }
    dev->tf32 = s->float32_tf32;
    return status;
}

/* The plan of one layer of these sizes on `device` for a call with
 * settings `s` on `stream` (NULL: torch's current stream), with the device's
 * properties in *dev and, unless NULL, whether the call is eager (the stream
 * not captured: the host's time to issue a plan counts, lltm.h) in *eager:
 * an lltm_status (LLTM_ERR_ARGUMENT: no plan of a forced family fits). */
static int layer_plan(const lltm_call_settings *s, int device, void *stream, lltm_dtype dtype,
                      int64_t T, int64_t B, int64_t I, int64_t H, lltm_cuda_device *dev,
                      lltm_sequence_plan *plan, int *eager)
{
    lltm_sequence_plan_options options = s->plan;
    if (!stream && aoti_torch_get_current_cuda_stream(device, &stream) != 0)
        stream = NULL;
    options.eager = stream ? !lltm_cuda_stream_capturing(stream) : 1;
    if (eager)
        *eager = options.eager;
    const int status = lltm_cuda_device_for(device, s, dev);
    if (status != LLTM_OK)
        return status;
    return lltm_sequence_plan_cuda(dev, dtype, T, B, I, H, &options, plan);
}

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

/* The queries below answer for a call of settings `packed`
 * (lltm._settings.current(): torch's settings and lltm.overrides) on the
 * current stream of device `device` as it is, captured or eager; for
 * lltm.LLTM's choices of routes (lltm/_stack.py, lltm/_wavefront.py) and
 * for measurements that record what they timed (lltm/bench/variants.py).
 * Each returns an lltm_status (LLTM_ERR_ARGUMENT: no plan of a forced
 * family fits, or a settings value lltm does not pack). */

/* The plan the sequence operators would run for one layer of these sizes. */
__attribute__((visibility("default"))) int
lltm_cuda_sequence_plan_in_force(int device, int dtype, int64_t packed, int64_t T, int64_t B,
                                 int64_t I, int64_t H, lltm_sequence_plan *plan)
{
    lltm_call_settings s;
    lltm_cuda_device dev;
    if (!plan || lltm_call_settings_query(packed, &s) != LLTM_OK)
        return LLTM_ERR_ARGUMENT;
    return layer_plan(&s, device, NULL, (lltm_dtype)dtype, T, B, I, H, &dev, plan, NULL);
}

/* The time chunks over which lltm.LLTM overlaps stacked layers of these
 * sizes (lltm_wavefront_rule_cuda, from the plan a layer above the first
 * runs alone and its residency): *chunks, each chunk call planned for
 * *sharing layers at once. */
__attribute__((visibility("default"))) int
lltm_cuda_wavefront_in_force(int device, int dtype, int64_t packed, int64_t T, int64_t B,
                             int64_t H, int *chunks, int *sharing)
{
    lltm_call_settings s;
    lltm_sequence_plan plan;
    lltm_cuda_device dev;
    int64_t resident[2], parts[2];
    int eager;
    if (!chunks || !sharing || lltm_call_settings_query(packed, &s) != LLTM_OK)
        return LLTM_ERR_ARGUMENT;
    int status = layer_plan(&s, device, NULL, (lltm_dtype)dtype, T, B, H, H, &dev, &plan, &eager);
    if (status == LLTM_OK)
        status = lltm_sequence_plan_residency_cuda(&dev, &plan, resident, parts);
    if (status != LLTM_OK)
        return status;
    lltm_wavefront_rule_cuda(&dev, &plan, resident, parts, T, eager, chunks, sharing);
    return LLTM_OK;
}

/* Whether the grid family's kernels of `dtype` run their products on tensor
 * cores (lltm_cuda_grid_tensor_cores; float32: where the settings allow
 * TF32): 1 or 0 in *tensor_cores. */
__attribute__((visibility("default"))) int
lltm_cuda_grid_tensor_cores_in_force(int device, int dtype, int64_t packed, int *tensor_cores)
{
    lltm_call_settings s;
    lltm_cuda_device dev;
    if (!tensor_cores || lltm_call_settings_query(packed, &s) != LLTM_OK)
        return LLTM_ERR_ARGUMENT;
    const int status = lltm_cuda_device_for(device, &s, &dev);
    if (status != LLTM_OK)
        return status;
    *tensor_cores = lltm_cuda_grid_tensor_cores(&dev, (lltm_dtype)dtype);
    return LLTM_OK;
}

/* Whether lltm::stack_forward runs L layers of these sizes in one stacked
 * launch, and its plan: LLTM_OK when it does (lltm.LLTM asks before it calls
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

/* Whether lltm.LLTM runs L layers of these sizes through one stacked launch:
 * one fits and the rules find it the faster route (lltm_stack_rule_cuda,
 * from the plan a layer above the first runs alone): 1 or 0 in *stacked. */
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
    const int have_layer = layer_plan(&s, device, NULL, (lltm_dtype)dtype, T, B, H, H, &dev,
                                      &layer, &eager) == LLTM_OK;
    *stacked = lltm_stack_rule_cuda(&dev, (lltm_dtype)dtype, (int)L, B, H, eager,
                                    have_layer ? &layer : NULL);
    return LLTM_OK;
}

/* --- one-layer calls ------------------------------------------------------------------- */

typedef struct cuda_layers {
    lltm_call *call;
    lltm_sequence_plan plans[2]; /* the bottom layer's, the others' */
    void *workspace;
} cuda_layers;

static int layer(void *vctx, int64_t l, const lltm_sequence_forward_tensors *f,
                 const lltm_sequence_backward_tensors *b)
{
    cuda_layers *ctx = (cuda_layers *)vctx;
    const lltm_dims *d = &ctx->call->d;
    const int64_t I = l == 0 ? d->I : d->H;
    if (b != NULL)
        return lltm_sequence_backward_cuda(&ctx->plans[l > 0], d->T, d->B, I, d->H, b,
                                           ctx->workspace, lltm_cuda_gemm, &ctx->call->gemm,
                                           ctx->call->stream);
    return lltm_sequence_forward_cuda(&ctx->plans[l > 0], d->T, d->B, I, d->H, f,
                                      ctx->workspace, lltm_cuda_gemm, &ctx->call->gemm,
                                      ctx->call->stream);
}

static int by_layers(lltm_call *c, int *status)
{
    cuda_layers ctx = {c, {{0}}, NULL};
    void *scratch = NULL;
    size_t bytes = 0;
    const size_t scratch_bytes = lltm_stack_scratch_bytes(c);
    for (int k = 0; k < 2 && k < c->d.L; ++k) {
        const lltm_dims *d = &c->d;
        const int64_t I = k == 0 ? d->I : d->H;
        lltm_cuda_device dev;
        const int planned = layer_plan(&c->settings, c->args[0].device_index, c->stream,
                                       d->dtype, d->T, d->B, I, d->H, &dev, &ctx.plans[k], NULL);
        if (planned != LLTM_OK)
            return lltm_fail(&c->err, "no plan of the forced kernel family (lltm.overrides) "
                             "fits B=%lld, H=%lld on this device (%s)", (long long)d->B,
                             (long long)d->H, lltm_status_string(planned));
        const lltm_sequence_plan *plan = &ctx.plans[k];
        const size_t need = c->op->backward
                                ? lltm_sequence_backward_workspace_cuda(plan, d->T, d->B, I, d->H)
                                : lltm_sequence_forward_workspace_cuda(plan, d->T, d->B, I, d->H);
        bytes = need > bytes ? need : bytes;
    }
    if (lltm_workspace(c, bytes, &ctx.workspace) ||
        (scratch_bytes > 0 && lltm_workspace(c, scratch_bytes, &scratch)))
        return -1;
    *status = lltm_run_layers(c, scratch, layer, &ctx);
    return 0;
}

/* --- the stack in one launch a direction ----------------------------------------------- */

static int stacked(lltm_call *c, const lltm_stack_plan *plan, int *status)
{
    const lltm_dims *d = &c->d;
    const lltm_tensor *a = c->args;
    lltm_stack_forward_layer fwd[LLTM_STACK_MAX_LAYERS];
    lltm_stack_backward_layer bwd[LLTM_STACK_MAX_LAYERS];
    void *workspace = NULL;
    const size_t bytes = c->op->backward
                             ? lltm_stack_backward_workspace_cuda(plan, d->T, d->B, d->I, d->H)
                             : plan->workspace_bytes;
    if (lltm_workspace(c, bytes, &workspace))
        return -1;
    if (!c->op->backward) {
        for (int64_t l = 0; l < d->L; ++l) {
            lltm_sequence_forward_tensors t;
            lltm_stack_layer_forward(c, l, &t);
            fwd[l] = (lltm_stack_forward_layer){t.weights, t.bias,  t.h0,  t.c0, t.gates,
                                                t.output,  t.cells, t.h_n, t.c_n};
        }
        *status = lltm_stack_forward_cuda(plan, d->T, d->B, d->I, d->H, a[0].data, fwd,
                                          workspace, c->lengths, lltm_cuda_gemm, &c->gemm,
                                          c->stream);
        return 0;
    }
    for (int64_t l = 0; l < d->L; ++l) {
        lltm_sequence_backward_tensors t;
        lltm_stack_layer_backward(c, l, NULL, NULL, &t);
        /* grad_gates NULL: the whole call keeps dG in its workspace */
        bwd[l] = (lltm_stack_backward_layer){t.weights,   t.cells,   t.gates,     t.grad_h_n,
                                             t.grad_c_n,  NULL,      t.grad_bias, t.grad_h0,
                                             t.grad_c0,   t.h0,      t.output,    t.grad_weights};
    }
    *status = lltm_stack_backward_cuda(plan, d->T, d->B, d->I, d->H, a[3].data, a[0].data, bwd,
                                       c->data[0], workspace, c->lengths, lltm_cuda_gemm,
                                       &c->gemm, c->stream);
    return 0;
}

/* Any of the operators (ops.h has their signatures). */
static void layers_cuda(const lltm_op *op, StableIValue *stack, uint64_t num_args,
                        uint64_t num_outputs)
{
    lltm_call c;
    lltm_stack_plan plan;
    int status = LLTM_OK;
    if (lltm_open(&c, op, stack, num_args, num_outputs))
        goto fail;
    const lltm_dims *d = &c.d;
    /* (L = 1 for the sequence operators: no stacked launch) */
    const bool one_launch = stacked_plan(c.args[0].device_index, &c.settings, d->dtype, d->L,
                                         d->T, d->B, d->I, d->H, &plan) == LLTM_OK;
    if (one_launch ? stacked(&c, &plan, &status) : by_layers(&c, &status))
        goto fail;
    const char *core_fn = one_launch ? (op->backward ? "lltm_stack_backward_cuda"
                                                     : "lltm_stack_forward_cuda")
                                     : (op->backward ? "lltm_sequence_backward_cuda"
                                                     : "lltm_sequence_forward_cuda");
    if (lltm_core_status(&c, status, core_fn) || lltm_close(&c, stack))
        goto fail;
    return;
fail:
    lltm_call_raise(&c);
}

/* the operators' boxed kernels (ops.h) */
void lltm_sequence_forward_cuda_boxed(StableIValue *s, uint64_t n_args, uint64_t n_out)
{ layers_cuda(&lltm_sequence_forward_op, s, n_args, n_out); }
void lltm_sequence_backward_cuda_boxed(StableIValue *s, uint64_t n_args, uint64_t n_out)
{ layers_cuda(&lltm_sequence_backward_op, s, n_args, n_out); }
void lltm_sequence_backward_gates_cuda_boxed(StableIValue *s, uint64_t n_args, uint64_t n_out)
{ layers_cuda(&lltm_sequence_backward_gates_op, s, n_args, n_out); }
void lltm_stack_forward_cuda_boxed(StableIValue *s, uint64_t n_args, uint64_t n_out)
{ layers_cuda(&lltm_stack_forward_op, s, n_args, n_out); }
void lltm_stack_backward_cuda_boxed(StableIValue *s, uint64_t n_args, uint64_t n_out)
{ layers_cuda(&lltm_stack_backward_op, s, n_args, n_out); }
