/*
 * sequence_cuda.c - the CUDA kernels of lltm::sequence_forward and
 * lltm::sequence_backward: validate, guard the tensors' device, take torch's
 * current stream, choose the plan, allocate the results and the core's
 * workspace, and run one layer over the whole sequence in the core
 * (lltm_sequence_forward_cuda / lltm_sequence_backward_cuda, csrc/core/
 * lltm_cuda_sequence.cu), which calls back for the large matrix products
 * (cuBLAS on the current stream: lltm_cuda_gemm, cublas_gemm.h).
 *
 * The plan (lltm_sequence_plan_cuda) is chosen once per call, for the
 * device to itself or shared with a concurrent layer (concurrent_layers
 * below); lltm.overrides may constrain it for tests and measurements
 * (plan_overrides below, docs/cuda-plans.md).
 */
#include "ops.h"
#include "cublas_gemm.h"
#include "sequence_cuda.h"

#include <stdatomic.h>
#include <string.h>

/* Constraints on the plan, for tests and measurements: none by default.
 * lltm/overrides.py sets them (from its environment variables, read once,
 * or its context managers; docs/cuda-plans.md lists them). */
static lltm_sequence_plan_options plan_overrides;
static atomic_int plan_overrides_lock;

__attribute__((visibility("default"))) void
lltm_cuda_set_sequence_plan_options(const lltm_sequence_plan_options *options)
{
    while (atomic_exchange(&plan_overrides_lock, 1))
        ;
    if (options)
        plan_overrides = *options;
    else
        memset(&plan_overrides, 0, sizeof plan_overrides);
    atomic_store(&plan_overrides_lock, 0);
}

/* How many layers of the calling thread's next calls run at once on the
 * device (0 or 1: one; 2: the two directions of a bidirectional layer, on
 * two streams): lltm.sequence sets it around both directions' forward
 * calls, its backward formula around the backward calls of those layers.
 * Per thread: autograd runs backward calls on its own threads. */
static _Thread_local int concurrent_layers;

__attribute__((visibility("default"))) int lltm_cuda_set_concurrent_layers(int layers)
{
    if (layers < 0 || layers > 2)
        return LLTM_ERR_ARGUMENT;
    concurrent_layers = layers;
    return LLTM_OK;
}

/* (sequence_cuda.h) The overrides, the calling thread's concurrent layers,
 * and whether the call is eager (the stream not being captured: the host's
 * time to issue a plan counts, lltm.h). */
void lltm_cuda_plan_options(lltm_sequence_plan_options *o, int device, void *stream)
{
    while (atomic_exchange(&plan_overrides_lock, 1))
        ;
    *o = plan_overrides;
    atomic_store(&plan_overrides_lock, 0);
    if (o->concurrent < concurrent_layers)
        o->concurrent = concurrent_layers;
    if (!stream && aoti_torch_get_current_cuda_stream(device, &stream) != 0)
        stream = NULL;
    o->eager = stream ? !lltm_cuda_stream_capturing(stream) : 1;
}

int lltm_cuda_choose_plan(const lltm_sequence_dims *d, int device, void *stream,
                          lltm_sequence_plan *plan, lltm_error *err)
{
    lltm_sequence_plan_options options;
    lltm_cuda_device dev;
    int status;
    lltm_cuda_plan_options(&options, device, stream);
    status = lltm_cuda_device_query(device, &dev);
    if (status != LLTM_OK)
        return lltm_core_failed(err, "lltm_cuda_device_query", status);
    dev.tf32 = lltm_cuda_float32_tf32();
    status = lltm_sequence_plan_cuda(&dev, d->dtype, d->T, d->B, d->I, d->H, &options, plan);
    if (status != LLTM_OK)
        return lltm_fail(err, "no plan of the forced kernel family (lltm.overrides) fits "
                         "B=%lld, H=%lld on this device (%s)", (long long)d->B,
                         (long long)d->H, lltm_status_string(status));
    return 0;
}

/* The plan the sequence operators would run now for one layer of these
 * sizes on device `device` (the current one), with the constraints of
 * lltm.overrides in force; for measurements that record what they timed
 * (lltm/bench/variants.py). Returns an lltm_status (LLTM_ERR_ARGUMENT: no
 * plan of a forced family fits). */
__attribute__((visibility("default"))) int
lltm_cuda_sequence_plan_in_force(int device, int dtype, int64_t T, int64_t B, int64_t I,
                                 int64_t H, lltm_sequence_plan *plan)
{
    lltm_sequence_plan_options options;
    lltm_cuda_device dev;
    if (!plan)
        return LLTM_ERR_ARGUMENT;
    lltm_cuda_plan_options(&options, device, NULL);
    const int status = lltm_cuda_device_query(device, &dev);
    if (status != LLTM_OK)
        return status;
    dev.tf32 = lltm_cuda_float32_tf32();
    return lltm_sequence_plan_cuda(&dev, (lltm_dtype)dtype, T, B, I, H, &options, plan);
}

/* The GPU time, in microseconds, of one forward + backward of that layer as
 * the library's cost model predicts it for the plan in force (lltm.LLTM
 * chooses how many time chunks its stacked layers overlap in from it,
 * lltm/_wavefront.py). Returns an lltm_status, as above. */
__attribute__((visibility("default"))) int
lltm_cuda_sequence_cost_in_force(int device, int dtype, int64_t T, int64_t B, int64_t I,
                                 int64_t H, lltm_sequence_plan *plan, double *cost)
{
    lltm_sequence_plan_options options;
    lltm_cuda_device dev;
    if (!plan || !cost)
        return LLTM_ERR_ARGUMENT;
    lltm_cuda_plan_options(&options, device, NULL);
    int status = lltm_cuda_device_query(device, &dev);
    if (status != LLTM_OK)
        return status;
    dev.tf32 = lltm_cuda_float32_tf32();
    status = lltm_sequence_plan_cuda(&dev, (lltm_dtype)dtype, T, B, I, H, &options, plan);
    if (status != LLTM_OK)
        return status;
    *cost = lltm_sequence_plan_cost_cuda(&dev, plan, T, B, I, H);
    return LLTM_OK;
}

/* How much of the device a layer of these sizes, run by the plan in force,
 * holds (lltm_sequence_plan_residency_cuda: for the forward and the
 * backward, the parts a call launches and how many fit at once): what
 * lltm.LLTM's time chunks can overlap (lltm/_wavefront.py). Returns an
 * lltm_status, as above. */
__attribute__((visibility("default"))) int
lltm_cuda_sequence_residency_in_force(int device, int dtype, int64_t T, int64_t B, int64_t I,
                                      int64_t H, int64_t *resident, int64_t *parts)
{
    lltm_sequence_plan plan;
    lltm_cuda_device dev;
    if (!resident || !parts)
        return LLTM_ERR_ARGUMENT;
    int status = lltm_cuda_sequence_plan_in_force(device, dtype, T, B, I, H, &plan);
    if (status == LLTM_OK)
        status = lltm_cuda_device_query(device, &dev);
    if (status != LLTM_OK)
        return status;
    return lltm_sequence_plan_residency_cuda(&dev, &plan, resident, parts);
}

/* Whether the grid family's kernels of `dtype` run their products on tensor
 * cores on device `device` (lltm_cuda_grid_tensor_cores; float32: where
 * torch's float32 matmul precision allows TF32 now): 1 or 0 in
 * *tensor_cores; for the Python layer's choices between routes
 * (lltm/_stack.py, lltm/_wavefront.py). Returns an lltm_status. */
__attribute__((visibility("default"))) int
lltm_cuda_grid_tensor_cores_in_force(int device, int dtype, int *tensor_cores)
{
    lltm_cuda_device dev;
    if (!tensor_cores)
        return LLTM_ERR_ARGUMENT;
    const int status = lltm_cuda_device_query(device, &dev);
    if (status != LLTM_OK)
        return status;
    dev.tf32 = lltm_cuda_float32_tf32();
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
        lltm_cuda_choose_plan(&c.d, c.args[0].device_index, stream, &plan, &c.err))
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
