/*
 * sequence_cuda.c - the CUDA kernels of lltm::sequence_forward and
 * lltm::sequence_backward: validate, guard the tensors' device, take torch's
 * current stream, choose the plan, allocate the results and the core's
 * workspace, and run one layer over the whole sequence in the core
 * (lltm_sequence_forward_cuda / lltm_sequence_backward_cuda, csrc/core/
 * lltm_cuda_sequence.cu), which calls back for the large matrix products
 * (cuBLAS on the current stream: lltm_cuda_gemm, cublas_gemm.h).
 *
 * The plan (lltm_sequence_plan_cuda) is chosen once per call, from the
 * call's settings (call_settings.h): for the device to itself or shared
 * with a concurrent layer, and within what lltm.overrides forces for tests
 * and measurements (docs/cuda-plans.md).
 */
#include "../core/lltm_cuda_rules.h"
#include "ops.h"
#include "cublas_gemm.h"
#include "sequence_cuda.h"

#include <stdatomic.h>


/* (sequence_cuda.h) */
void lltm_cuda_plan_options(lltm_sequence_plan_options *o, const lltm_call_settings *s,
                            int device, void *stream)
{
    *o = s->plan;
    if (!stream && aoti_torch_get_current_cuda_stream(device, &stream) != 0)
        stream = NULL;
    o->eager = stream ? !lltm_cuda_stream_capturing(stream) : 1;
}

/* (sequence_cuda.h) Each device's properties, asked once. */
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

/* (sequence_cuda.h) */
int lltm_cuda_layer_plan(const lltm_call_settings *s, int device, void *stream,
                         lltm_dtype dtype, int64_t T, int64_t B, int64_t I, int64_t H,
                         lltm_cuda_device *dev, lltm_sequence_plan *plan, int *eager)
{
    lltm_sequence_plan_options options;
    lltm_cuda_plan_options(&options, s, device, stream);
    if (eager)
        *eager = options.eager;
    const int status = lltm_cuda_device_for(device, s, dev);
    if (status != LLTM_OK)
        return status;
    return lltm_sequence_plan_cuda(dev, dtype, T, B, I, H, &options, plan);
}

int lltm_cuda_choose_plan(const lltm_sequence_dims *d, const lltm_call_settings *s, int device,
                          void *stream, lltm_sequence_plan *plan, lltm_error *err)
{
    lltm_cuda_device dev;
    const int status = lltm_cuda_layer_plan(s, device, stream, d->dtype, d->T, d->B, d->I, d->H, &dev,
                                            plan, NULL);
    if (status != LLTM_OK)
        return lltm_fail(err, "no plan of the forced kernel family (lltm.overrides) fits "
                         "B=%lld, H=%lld on this device (%s)", (long long)d->B,
                         (long long)d->H, lltm_status_string(status));
    return 0;
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
    return lltm_cuda_layer_plan(&s, device, NULL, (lltm_dtype)dtype, T, B, I, H, &dev, plan,
                                NULL);
}

/* The time chunks over which lltm.LLTM overlaps stacked layers of these
 * sizes (lltm_wavefront_rule_cuda, from the plan a layer above the first
 * runs alone and its residency; a call on the current stream as it is):
 * *chunks, each chunk call planned for *sharing layers at once. */
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
    int status =
        lltm_cuda_layer_plan(&s, device, NULL, (lltm_dtype)dtype, T, B, H, H, &dev, &plan, &eager);
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

/* Either operator (the signatures: sequence_cpu.c). */
static void sequence_cuda(lltm_sequence_op op, StableIValue *stack, uint64_t num_args,
                          uint64_t num_outputs)
{
    lltm_sequence_call c;
    CUDAGuardHandle guard = NULL;
    void *stream = NULL, *workspace = NULL;
    lltm_sequence_plan plan;
    const bool backward = op != LLTM_SEQ_FORWARD;
    if (lltm_sequence_open(&c, op, stack, num_args, num_outputs,
                           aoti_torch_device_type_cuda()) ||
        lltm_cuda_enter_device(c.args[0].device_index, &guard, &stream, &c.err) ||
        lltm_cuda_choose_plan(&c.d, &c.settings, c.args[0].device_index, stream, &plan,
                              &c.err))
        goto fail;
    const lltm_sequence_dims *d = &c.d;
    const size_t bytes =
        backward ? lltm_sequence_backward_workspace_cuda(&plan, d->T, d->B, d->I, d->H)
                 : lltm_sequence_forward_workspace_cuda(&plan, d->T, d->B, d->I, d->H);
    if (lltm_workspace(bytes, &c.args[0], &c.owned, &workspace, &c.err))
        goto fail;
    const int status =
        backward ? lltm_sequence_backward_cuda(&plan, d->T, d->B, d->I, d->H,
                                               &c.backward_tensors, workspace, lltm_cuda_gemm,
                                               &c.gemm, stream)
                 : lltm_sequence_forward_cuda(&plan, d->T, d->B, d->I, d->H, &c.forward_tensors,
                                              workspace, lltm_cuda_gemm, &c.gemm, stream);
    if (lltm_sequence_close(&c, status,
                            backward ? "lltm_sequence_backward_cuda"
                                     : "lltm_sequence_forward_cuda",
                            stack))
        goto fail;
    lltm_cuda_leave_device(guard);
    return;
fail:
    lltm_cuda_leave_device(guard);
    lltm_raise(lltm_sequence_op_name(&c), &c.owned, &c.err);
}

/* the operators' boxed kernels (ops.h) */
void lltm_sequence_forward_cuda_boxed(StableIValue *s, uint64_t n_args, uint64_t n_out)
{ sequence_cuda(LLTM_SEQ_FORWARD, s, n_args, n_out); }
void lltm_sequence_backward_cuda_boxed(StableIValue *s, uint64_t n_args, uint64_t n_out)
{ sequence_cuda(LLTM_SEQ_BACKWARD, s, n_args, n_out); }
void lltm_sequence_backward_gates_cuda_boxed(StableIValue *s, uint64_t n_args, uint64_t n_out)
{ sequence_cuda(LLTM_SEQ_BACKWARD_GATES, s, n_args, n_out); }
