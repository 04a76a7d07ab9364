/*
 * sequence_cuda.c - the CUDA kernels of lltm::sequence_forward and
 * lltm::sequence_backward: validate, guard the tensors' device, take torch's
 * current stream, choose the plan, allocate the results and the core's
 * workspace, and run one layer over the whole sequence in the core
 * (lltm_sequence_forward_cuda / lltm_sequence_backward_cuda, csrc/core/
 * lltm_cuda_sequence.cu), which calls back for the large matrix products
 * (aten::mm on the current stream, cuBLAS, through lltm_torch_gemm).
 *
 * The plan (lltm_sequence_plan_cuda) is chosen once per call; lltm.overrides
 * may constrain it for tests and measurements (plan_overrides below,
 * docs/cuda-plans.md).
 */
#include "ops.h"
#include "sequence_args.h"

#include <stdatomic.h>
#include <string.h>

static inline void *at(const void *base, int64_t index, size_t elem)
{
    return (char *)base + (size_t)index * elem;
}


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

static void plan_options(lltm_sequence_plan_options *o)
{
    while (atomic_exchange(&plan_overrides_lock, 1))
        ;
    *o = plan_overrides;
    atomic_store(&plan_overrides_lock, 0);
}

static int choose_plan(const lltm_sequence_dims *d, int device, lltm_sequence_plan *plan,
                       lltm_error *err)
{
    lltm_sequence_plan_options options;
    lltm_cuda_device dev;
    int status;
    plan_options(&options);
    status = lltm_cuda_device_query(device, &dev);
    if (status != LLTM_OK)
        return lltm_core_failed(err, "lltm_cuda_device_query", status);
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
    plan_options(&options);
    const int status = lltm_cuda_device_query(device, &dev);
    if (status != LLTM_OK)
        return status;
    return lltm_sequence_plan_cuda(&dev, (lltm_dtype)dtype, T, B, I, H, &options, plan);
}

/* sequence_forward(input, weights, bias, h0, c0)
 *   -> (output [T,B,H], h_n [B,H], c_n [B,H], cells [T,B,H], gates [T,B,3H]) */
void lltm_sequence_forward_cuda_boxed(StableIValue *stack, uint64_t num_args,
                                      uint64_t num_outputs)
{
    lltm_owned owned = {.count = 0};
    lltm_error err, gemm_err = {.msg = ""};
    CUDAGuardHandle guard = NULL;
    void *stream = NULL;
    lltm_sequence_results r;
    void *workspace = NULL;
    lltm_tensor a[LLTM_SEQ_FWD_NARGS];
    lltm_sequence_dims d;
    lltm_sequence_plan plan;

    if (lltm_open_op(stack, num_args, num_outputs, LLTM_SEQ_FWD_NARGS, 5,
                     lltm_sequence_forward_names, a, &owned, &err) ||
        lltm_check_sequence_forward(a, aoti_torch_device_type_cuda(), true, &d, &err) ||
        lltm_cuda_enter_device(a[0].device_index, &guard, &stream, &err))
        goto fail;

    if (lltm_sequence_results_new(false, &d, &a[0], &owned, &r, &err) ||
        choose_plan(&d, a[0].device_index, &plan, &err) ||
        lltm_workspace(lltm_sequence_forward_workspace_cuda(&plan, d.T, d.B, d.I, d.H), &a[0],
                       &owned, &workspace, &err))
        goto fail;

    lltm_torch_gemm_ctx gemm = {a[0].device_type, a[0].device_index, &gemm_err};
    int status = lltm_sequence_forward_cuda(
        &plan, d.T, d.B, d.I, d.H, a[LLTM_SEQ_FWD_INPUT].data, a[LLTM_SEQ_FWD_WEIGHTS].data,
        a[LLTM_SEQ_FWD_BIAS].data, a[LLTM_SEQ_FWD_H0].data, a[LLTM_SEQ_FWD_C0].data,
        r.data[0], r.data[1], r.data[2], r.data[3], r.data[4], workspace, lltm_torch_gemm,
        &gemm, stream);
    if (status != LLTM_OK) {
        lltm_sequence_core_failed(&err, &gemm_err, "lltm_sequence_forward_cuda", status);
        goto fail;
    }
    lltm_sequence_results_return(&owned, &r, stack);
    lltm_cuda_leave_device(guard);
    return;
fail:
    lltm_cuda_leave_device(guard);
    lltm_raise("lltm::sequence_forward", &owned, &err);
}

/* sequence_backward(grad_output, grad_h_n, grad_c_n, input, weights, h0,
 *                   output, cells, gates)
 *   -> (grad_input [T,B,I], grad_weights [3H,I+H], grad_bias [3H],
 *       grad_h0 [B,H], grad_c0 [B,H]) */
void lltm_sequence_backward_cuda_boxed(StableIValue *stack, uint64_t num_args,
                                       uint64_t num_outputs)
{
    lltm_owned owned = {.count = 0};
    lltm_error err, gemm_err = {.msg = ""};
    CUDAGuardHandle guard = NULL;
    void *stream = NULL;
    lltm_sequence_results r;
    void *workspace = NULL;
    lltm_tensor a[LLTM_SEQ_BWD_NARGS];
    lltm_sequence_dims d;
    lltm_sequence_plan plan;

    if (lltm_open_op(stack, num_args, num_outputs, LLTM_SEQ_BWD_NARGS, 5,
                     lltm_sequence_backward_names, a, &owned, &err) ||
        lltm_check_sequence_backward(a, aoti_torch_device_type_cuda(), true, &d, &err) ||
        lltm_cuda_enter_device(a[0].device_index, &guard, &stream, &err))
        goto fail;

    if (lltm_sequence_results_new(true, &d, &a[0], &owned, &r, &err) ||
        choose_plan(&d, a[0].device_index, &plan, &err) ||
        lltm_workspace(lltm_sequence_backward_workspace_cuda(&plan, d.T, d.B, d.I, d.H), &a[0],
                       &owned, &workspace, &err))
        goto fail;

    lltm_torch_gemm_ctx gemm = {a[0].device_type, a[0].device_index, &gemm_err};
    int status = lltm_sequence_backward_cuda(
        &plan, d.T, d.B, d.I, d.H, a[LLTM_SEQ_BWD_GRAD_OUTPUT].data,
        a[LLTM_SEQ_BWD_GRAD_H_N].data, a[LLTM_SEQ_BWD_GRAD_C_N].data,
        a[LLTM_SEQ_BWD_INPUT].data, a[LLTM_SEQ_BWD_WEIGHTS].data, a[LLTM_SEQ_BWD_H0].data,
        a[LLTM_SEQ_BWD_OUTPUT].data, a[LLTM_SEQ_BWD_CELLS].data, a[LLTM_SEQ_BWD_GATES].data,
        r.data[0], r.data[1], r.data[2], r.data[3], r.data[4], workspace,
        lltm_torch_gemm, &gemm, stream);
    if (status != LLTM_OK) {
        lltm_sequence_core_failed(&err, &gemm_err, "lltm_sequence_backward_cuda", status);
        goto fail;
    }
    lltm_sequence_results_return(&owned, &r, stack);
    lltm_cuda_leave_device(guard);
    return;
fail:
    lltm_cuda_leave_device(guard);
    lltm_raise("lltm::sequence_backward", &owned, &err);
}
