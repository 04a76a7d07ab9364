/*
 * sequence_cuda.c - the CUDA kernels of lltm::sequence_forward and
 * lltm::sequence_backward: validate, guard the tensors' device, take torch's
 * current stream, allocate, and run one layer over the whole sequence:
 *
 *   forward   gates = x W_x^T for all steps (one aten::mm, cuBLAS), then the
 *             recurrence: one persistent kernel (csrc/core/
 *             lltm_cuda_sequence.cu), or, where no persistent plan fits, a
 *             time loop here of aten::mm (h_{t-1} W_h^T) + one pointwise
 *             kernel per step.
 *   backward  the recurrence in reverse (persistent, or per step: pointwise
 *             kernel + aten::mm dG_t W_h), then dW_h = dG^T [h_0..h_{T-1}],
 *             dW_x = dG^T x and dx = dG W_x as one aten::mm each over all
 *             T*B rows.
 *
 * The plan (lltm_sequence_plan_cuda) is chosen once per call; environment
 * variables constrain it for tests and measurements (plan_options below,
 * docs/cuda-plans.md).
 */
#include "ops.h"
#include "sequence_args.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static inline void *at(const void *base, int64_t index, size_t elem)
{
    return (char *)base + (size_t)index * elem;
}


/* An integer environment variable among `allowed` (0-terminated), or 0 when
 * unset or empty. */
static int env_choice(const char *name, const int *allowed, int *value, lltm_error *err)
{
    const char *text = getenv(name);
    *value = 0;
    if (text == NULL || *text == '\0')
        return 0;
    char *end = NULL;
    const long v = strtol(text, &end, 10);
    for (const int *a = allowed; *a; ++a)
        if (*end == '\0' && v == *a) {
            *value = (int)v;
            return 0;
        }
    return lltm_fail(err, "%s: unsupported value '%s'", name, text);
}

/* The plan options from the environment, for tests and measurements (the
 * core reads none; docs/cuda-plans.md lists them):
 *   LLTM_CUDA_SEQUENCE=auto|cluster|grid|steps   the kernel family
 *   LLTM_CUDA_CLUSTER_BLOCKS=8|16                the cluster shape
 *   LLTM_CUDA_CLUSTER_CHUNK=4|8|16               the cluster batch split's chunk (16: none)
 *   LLTM_CUDA_GRID_SHAPE=16x8|32x16|32x32|16x32  one grid layout
 *   LLTM_CUDA_GRID_GROUPS=n                      at most n batch groups */
static int plan_options(lltm_sequence_plan_options *o, lltm_error *err)
{
    static const int blocks[] = {8, 16, 0}, chunks[] = {4, 8, 16, 0};
    const char *family = getenv("LLTM_CUDA_SEQUENCE"), *shape = getenv("LLTM_CUDA_GRID_SHAPE");
    const char *groups = getenv("LLTM_CUDA_GRID_GROUPS");
    memset(o, 0, sizeof *o);
    if (family == NULL || *family == '\0' || strcmp(family, "auto") == 0)
        o->family = LLTM_SEQ_ANY;
    else if (strcmp(family, "cluster") == 0)
        o->family = LLTM_SEQ_CLUSTER;
    else if (strcmp(family, "grid") == 0)
        o->family = LLTM_SEQ_GRID;
    else if (strcmp(family, "steps") == 0)
        o->family = LLTM_SEQ_STEPS;
    else
        return lltm_fail(err, "LLTM_CUDA_SEQUENCE must be auto, cluster, grid or steps, got '%s'",
                         family);
    if (env_choice("LLTM_CUDA_CLUSTER_BLOCKS", blocks, &o->cluster_blocks, err) ||
        env_choice("LLTM_CUDA_CLUSTER_CHUNK", chunks, &o->cluster_chunk, err))
        return -1;
    if (shape && *shape) {
        char tail = 0;
        if (sscanf(shape, "%dx%d%c", &o->grid_lanes, &o->grid_values, &tail) != 2)
            return lltm_fail(err, "LLTM_CUDA_GRID_SHAPE must be like 32x16, got '%s'", shape);
    }
    if (groups && *groups) {
        char *end = NULL;
        const long n = strtol(groups, &end, 10);
        if (*end != '\0' || n < 1 || n > 1 << 20)
            return lltm_fail(err, "LLTM_CUDA_GRID_GROUPS must be a positive integer, got '%s'",
                             groups);
        o->grid_groups_max = (int)n;
    }
    return 0;
}

static int choose_plan(const lltm_sequence_dims *d, int device, lltm_sequence_plan *plan,
                       lltm_error *err)
{
    lltm_sequence_plan_options options;
    lltm_cuda_device dev;
    int status;
    if (plan_options(&options, err))
        return -1;
    status = lltm_cuda_device_query(device, &dev);
    if (status != LLTM_OK)
        return lltm_core_failed(err, "lltm_cuda_device_query", status);
    status = lltm_sequence_plan_cuda(&dev, d->dtype, d->T, d->B, d->I, d->H, &options, plan);
    if (status != LLTM_OK)
        return lltm_fail(err, "no persistent plan of LLTM_CUDA_SEQUENCE=%s fits B=%lld, H=%lld "
                         "on this device (%s)", getenv("LLTM_CUDA_SEQUENCE"), (long long)d->B,
                         (long long)d->H, lltm_status_string(status));
    return 0;
}

static bool half_type(lltm_dtype dtype)
{
    return dtype == LLTM_FLOAT16 || dtype == LLTM_BFLOAT16;
}

/* A float32 tensor of n elements on the device of `like`, owned: the float
 * state of the half types. */
static int empty_float(const lltm_tensor *like, int64_t n, lltm_owned *owned,
                       AtenTensorHandle *out, void **data, lltm_error *err)
{
    lltm_tensor f = *like;
    const int64_t sizes[1] = {n > 0 ? n : 1};
    f.dtype = aoti_torch_dtype_float32();
    return lltm_empty(1, sizes, &f, owned, out, data, err);
}

static int cuda_call(int status, const char *what, lltm_error *err)
{
    return status == LLTM_OK ? 0 : lltm_core_failed(err, what, status);
}

/* The address of element (0, 0) of m */
static int matrix_data(const lltm_matrix *m, size_t elem, char **data, lltm_error *err)
{
    void *base;
    if (aoti_torch_get_data_ptr(m->base, &base) != 0)
        return lltm_shim_failed(err, "aoti_torch_get_data_ptr");
    *data = (char *)base + (size_t)m->offset * elem;
    return 0;
}

/* out = a @ b on `stream`: a small product in one launch of our kernel
 * (lltm_small_mm_cuda: aten::mm costs ~40 us of host time a call on the GPU
 * machine, more than such a product's GPU time, and the eager step at small
 * sizes is host time), a large one through aten::mm (cuBLAS). */
static int mm_on_stream(lltm_dtype dtype, const lltm_matrix *a, const lltm_matrix *b,
                        const lltm_matrix *out, void *stream, lltm_error *err)
{
    if (out->col_stride != 1 || !lltm_small_mm_fits(a->rows, out->cols, a->cols))
        return lltm_mm_matrices(a, b, out, err);
    const size_t elem = lltm_dtype_size(dtype);
    char *pa = NULL, *pb = NULL, *pc = NULL;
    if (matrix_data(a, elem, &pa, err) || matrix_data(b, elem, &pb, err) ||
        matrix_data(out, elem, &pc, err))
        return -1;
    return cuda_call(lltm_small_mm_cuda(dtype, a->rows, out->cols, a->cols, pa, a->row_stride,
                                        a->col_stride, pb, b->row_stride, b->col_stride, pc,
                                        out->row_stride, stream),
                     "lltm_small_mm_cuda", err);
}

/* sequence_forward(input, weights, bias, h0, c0)
 *   -> (output [T,B,H], h_n [B,H], c_n [B,H], cells [T,B,H], gates [T,B,3H]) */
void lltm_sequence_forward_cuda(StableIValue *stack, uint64_t num_args, uint64_t num_outputs)
{
    lltm_owned owned = {.count = 0};
    lltm_error err;
    CUDAGuardHandle guard = NULL;
    void *stream = NULL;
    AtenTensorHandle handles[LLTM_SEQ_FWD_NARGS], output, h_n, c_n, cells, gates;
    void *output_data, *h_n_data, *c_n_data, *cells_data, *gates_data;
    lltm_tensor a[LLTM_SEQ_FWD_NARGS];
    lltm_sequence_dims d;
    lltm_sequence_plan plan = {.family = LLTM_SEQ_STEPS};

    if (lltm_take_inputs(stack, num_args, num_outputs, LLTM_SEQ_FWD_NARGS, 5, &owned,
                         handles, &err) ||
        lltm_read_tensors(handles, lltm_sequence_forward_names, LLTM_SEQ_FWD_NARGS, a, &err) ||
        lltm_check_sequence_forward(a, aoti_torch_device_type_cuda(), true, &d, &err) ||
        lltm_cuda_enter_device(a[0].device_index, &guard, &stream, &err) ||
        lltm_make_all_contiguous(a, LLTM_SEQ_FWD_NARGS, &owned, &err))
        goto fail;

    const int64_t T = d.T, B = d.B, I = d.I, H = d.H, G = 3 * H, K = I + H, TB = T * B;
    const size_t elem = lltm_dtype_size(d.dtype), state_bytes = (size_t)(B * H) * elem;
    const int64_t steps_H[3] = {T, B, H}, steps_G[3] = {T, B, G}, state[2] = {B, H};
    const lltm_tensor *input = &a[LLTM_SEQ_FWD_INPUT], *weights = &a[LLTM_SEQ_FWD_WEIGHTS];
    const lltm_tensor *bias = &a[LLTM_SEQ_FWD_BIAS], *h0 = &a[LLTM_SEQ_FWD_H0],
                      *c0 = &a[LLTM_SEQ_FWD_C0];
    if (lltm_empty(3, steps_H, &a[0], &owned, &output, &output_data, &err) ||
        lltm_empty(2, state, &a[0], &owned, &h_n, &h_n_data, &err) ||
        lltm_empty(2, state, &a[0], &owned, &c_n, &c_n_data, &err) ||
        lltm_empty(3, steps_H, &a[0], &owned, &cells, &cells_data, &err) ||
        lltm_empty(3, steps_G, &a[0], &owned, &gates, &gates_data, &err))
        goto fail;

    if (TB > 0) {
        /* gates [T*B,G] = x [T*B,I] W_x^T: the input projection of every step */
        if (I > 0) {
            const lltm_matrix x = lltm_rows(input->handle, 0, TB, I, I);
            const lltm_matrix W_x_t = lltm_transposed(lltm_rows(weights->handle, H, G, I, K));
            const lltm_matrix g = lltm_rows(gates, 0, TB, G, G);
            if (mm_on_stream(d.dtype, &x, &W_x_t, &g, stream, &err))
                goto fail;
        } else if (cuda_call(lltm_cuda_zero(gates_data, (size_t)(TB * G) * elem, stream),
                             "lltm_cuda_zero", &err)) {
            goto fail;
        }
        if (choose_plan(&d, a[0].device_index, &plan, &err))
            goto fail;
    }
    if (TB > 0 && plan.family != LLTM_SEQ_STEPS) {
        void *workspace = NULL;
        AtenTensorHandle ws;
        const size_t ws_bytes = plan.workspace_bytes;
        if (ws_bytes > 0 &&
            empty_float(&a[0], (int64_t)(ws_bytes / sizeof(float)), &owned, &ws, &workspace, &err))
            goto fail;
        if (cuda_call(lltm_sequence_forward_persistent_cuda(
                          &plan, T, B, I, H, h0->data, c0->data, weights->data,
                          bias->data, gates_data, output_data, cells_data, workspace, stream),
                      "lltm_sequence_forward_persistent_cuda", &err))
            goto fail;
    } else if (TB > 0) {
        /* per step: r = h_{t-1} W_h^T (aten::mm), then the pointwise kernel */
        AtenTensorHandle recurrent;
        void *recurrent_data;
        const int64_t step_G[2] = {B, G};
        if (lltm_empty(2, step_G, &a[0], &owned, &recurrent, &recurrent_data, &err))
            goto fail;
        const lltm_matrix W_h_t = lltm_transposed(lltm_rows(weights->handle, 0, G, H, K));
        const lltm_matrix r = lltm_rows(recurrent, 0, B, G, G);
        for (int64_t t = 0; t < T; ++t) {
            const lltm_matrix h_prev = t == 0 ? lltm_rows(h0->handle, 0, B, H, H)
                                              : lltm_rows(output, (t - 1) * B * H, B, H, H);
            const void *c_prev = t == 0 ? c0->data : at(cells_data, (t - 1) * B * H, elem);
            if (lltm_mm_matrices(&h_prev, &W_h_t, &r, &err) ||
                cuda_call(lltm_sequence_forward_step_cuda(
                              d.dtype, B, H, recurrent_data, at(gates_data, t * B * G, elem),
                              bias->data, c_prev, at(output_data, t * B * H, elem),
                              at(cells_data, t * B * H, elem), stream),
                          "lltm_sequence_forward_step_cuda", &err))
                goto fail;
        }
    }
    /* h_n, c_n: the last step's state (h0, c0 for an empty sequence) */
    if (cuda_call(lltm_cuda_copy(h_n_data,
                                 T > 0 ? at(output_data, (T - 1) * B * H, elem) : h0->data,
                                 state_bytes, stream), "lltm_cuda_copy", &err) ||
        cuda_call(lltm_cuda_copy(c_n_data,
                                 T > 0 ? at(cells_data, (T - 1) * B * H, elem) : c0->data,
                                 state_bytes, stream), "lltm_cuda_copy", &err))
        goto fail;

    lltm_return(&owned, output, &stack[0]);
    lltm_return(&owned, h_n, &stack[1]);
    lltm_return(&owned, c_n, &stack[2]);
    lltm_return(&owned, cells, &stack[3]);
    lltm_return(&owned, gates, &stack[4]);
    lltm_free_owned(&owned);
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
void lltm_sequence_backward_cuda(StableIValue *stack, uint64_t num_args, uint64_t num_outputs)
{
    lltm_owned owned = {.count = 0};
    lltm_error err;
    CUDAGuardHandle guard = NULL;
    void *stream = NULL;
    AtenTensorHandle handles[LLTM_SEQ_BWD_NARGS], d_input, d_weights, d_bias, d_h0, d_c0,
        d_gates, hx;
    void *d_weights_data, *d_bias_data, *d_h0_data, *d_c0_data, *d_gates_data, *hx_data;
    lltm_tensor a[LLTM_SEQ_BWD_NARGS];
    lltm_sequence_dims d;
    lltm_sequence_plan plan = {.family = LLTM_SEQ_STEPS};

    if (lltm_take_inputs(stack, num_args, num_outputs, LLTM_SEQ_BWD_NARGS, 5, &owned,
                         handles, &err) ||
        lltm_read_tensors(handles, lltm_sequence_backward_names, LLTM_SEQ_BWD_NARGS, a, &err) ||
        lltm_check_sequence_backward(a, aoti_torch_device_type_cuda(), true, &d, &err) ||
        lltm_cuda_enter_device(a[0].device_index, &guard, &stream, &err) ||
        lltm_make_all_contiguous(a, LLTM_SEQ_BWD_NARGS, &owned, &err))
        goto fail;

    const int64_t T = d.T, B = d.B, I = d.I, H = d.H, G = 3 * H, K = I + H, TB = T * B;
    const size_t elem = lltm_dtype_size(d.dtype), state_bytes = (size_t)(B * H) * elem;
    const int64_t steps_I[3] = {T, B, I}, steps_G[3] = {T, B, G}, steps_K[2] = {T * B, K};
    const int64_t W_sizes[2] = {G, K}, bias_size[1] = {G}, state[2] = {B, H};
    const lltm_tensor *weights = &a[LLTM_SEQ_BWD_WEIGHTS];
    const void *grad_output = a[LLTM_SEQ_BWD_GRAD_OUTPUT].data;
    const void *grad_h_n = a[LLTM_SEQ_BWD_GRAD_H_N].data, *grad_c_n = a[LLTM_SEQ_BWD_GRAD_C_N].data;
    const void *cells = a[LLTM_SEQ_BWD_CELLS].data, *gates = a[LLTM_SEQ_BWD_GATES].data;
    if (lltm_empty(3, steps_I, &a[0], &owned, &d_input, NULL, &err) ||
        lltm_empty(2, W_sizes, &a[0], &owned, &d_weights, &d_weights_data, &err) ||
        lltm_empty(1, bias_size, &a[0], &owned, &d_bias, &d_bias_data, &err) ||
        lltm_empty(2, state, &a[0], &owned, &d_h0, &d_h0_data, &err) ||
        lltm_empty(2, state, &a[0], &owned, &d_c0, &d_c0_data, &err))
        goto fail;

    if (TB == 0) { /* nothing ran: the state's gradients pass through */
        if (cuda_call(lltm_cuda_copy(d_h0_data, grad_h_n, state_bytes, stream),
                      "lltm_cuda_copy", &err) ||
            cuda_call(lltm_cuda_copy(d_c0_data, grad_c_n, state_bytes, stream),
                      "lltm_cuda_copy", &err) ||
            cuda_call(lltm_cuda_zero(d_weights_data, (size_t)(G * K) * elem, stream),
                      "lltm_cuda_zero", &err) ||
            cuda_call(lltm_cuda_zero(d_bias_data, (size_t)G * elem, stream), "lltm_cuda_zero",
                      &err))
            goto fail;
        goto done;
    }

    if (lltm_empty(3, steps_G, &a[0], &owned, &d_gates, &d_gates_data, &err) ||
        lltm_empty(2, steps_K, &a[0], &owned, &hx, &hx_data, &err) ||
        choose_plan(&d, a[0].device_index, &plan, &err))
        goto fail;

    if (plan.family != LLTM_SEQ_STEPS) {
        void *workspace = NULL;
        AtenTensorHandle ws;
        const size_t ws_bytes = plan.workspace_bytes;
        if (ws_bytes > 0 &&
            empty_float(&a[0], (int64_t)(ws_bytes / sizeof(float)), &owned, &ws, &workspace, &err))
            goto fail;
        if (cuda_call(lltm_sequence_backward_persistent_cuda(
                          &plan, T, B, I, H, grad_output, grad_h_n, grad_c_n,
                          weights->data, cells, gates, d_gates_data, d_bias_data, d_h0_data,
                          d_c0_data, workspace, stream),
                      "lltm_sequence_backward_persistent_cuda", &err))
            goto fail;
    } else {
        /* per step, reverse time: pointwise kernel (dG_t, dc in place in d_c0,
         * bias sum), then dh = dG_t W_h (aten::mm) into d_h0 */
        void *bias_acc = d_bias_data;
        AtenTensorHandle bias_ws;
        const size_t acc_bytes = (size_t)G * (half_type(d.dtype) ? sizeof(float) : elem);
        if (half_type(d.dtype) && empty_float(&a[0], G, &owned, &bias_ws, &bias_acc, &err))
            goto fail;
        if (cuda_call(lltm_cuda_zero(bias_acc, acc_bytes, stream), "lltm_cuda_zero", &err) ||
            cuda_call(lltm_cuda_copy(d_c0_data, grad_c_n, state_bytes, stream),
                      "lltm_cuda_copy", &err))
            goto fail;
        const lltm_matrix W_h = lltm_rows(weights->handle, 0, G, H, K);
        const lltm_matrix dh = lltm_rows(d_h0, 0, B, H, H);
        const void *dh_next = grad_h_n;
        for (int64_t t = T - 1; t >= 0; --t) {
            const lltm_matrix dG_t = lltm_rows(d_gates, t * B * G, B, G, G);
            if (cuda_call(lltm_sequence_backward_step_cuda(
                              d.dtype, B, H, at(grad_output, t * B * H, elem), dh_next,
                              d_c0_data, at(cells, t * B * H, elem), at(gates, t * B * G, elem),
                              at(d_gates_data, t * B * G, elem), bias_acc, stream),
                          "lltm_sequence_backward_step_cuda", &err) ||
                lltm_mm_matrices(&dG_t, &W_h, &dh, &err))
                goto fail;
            dh_next = d_h0_data;
        }
        if (half_type(d.dtype) &&
            cuda_call(lltm_sequence_convert_cuda(d.dtype, G, bias_acc, d_bias_data, stream),
                      "lltm_sequence_convert_cuda", &err))
            goto fail;
    }

    /* hx [T*B,K] = [h_prev | x], the rows of the weights' columns: h_prev =
     * [h0; h_1 .. h_{T-1}] = h0, then output[0 .. T-2] (one matrix product
     * for all of dW instead of two: one dispatcher call less, ~40 us of host
     * time on the GPU machine) */
    const size_t row_K = (size_t)K * elem, row_H = (size_t)H * elem, row_I = (size_t)I * elem;
    if (cuda_call(lltm_cuda_copy_2d(hx_data, row_K, a[LLTM_SEQ_BWD_H0].data, row_H, row_H,
                                    (size_t)B, stream), "lltm_cuda_copy_2d", &err) ||
        cuda_call(lltm_cuda_copy_2d(at(hx_data, B * K, elem), row_K,
                                    a[LLTM_SEQ_BWD_OUTPUT].data, row_H, row_H,
                                    (size_t)((T - 1) * B), stream), "lltm_cuda_copy_2d", &err) ||
        cuda_call(lltm_cuda_copy_2d(at(hx_data, H, elem), row_K, a[LLTM_SEQ_BWD_INPUT].data,
                                    row_I, row_I, (size_t)TB, stream), "lltm_cuda_copy_2d", &err))
        goto fail;
    {
        const lltm_matrix dG_t = lltm_transposed(lltm_rows(d_gates, 0, TB, G, G));
        const lltm_matrix dG = lltm_rows(d_gates, 0, TB, G, G);
        const lltm_matrix hxm = lltm_rows(hx, 0, TB, K, K);
        const lltm_matrix dW = lltm_rows(d_weights, 0, G, K, K);
        /* dW = dG^T [h_prev | x], dx = dG W_x: all steps at once */
        if (mm_on_stream(d.dtype, &dG_t, &hxm, &dW, stream, &err))
            goto fail;
        if (I > 0) {
            const lltm_matrix W_x = lltm_rows(weights->handle, H, G, I, K);
            const lltm_matrix dx = lltm_rows(d_input, 0, TB, I, I);
            if (mm_on_stream(d.dtype, &dG, &W_x, &dx, stream, &err))
                goto fail;
        }
    }

done:
    lltm_return(&owned, d_input, &stack[0]);
    lltm_return(&owned, d_weights, &stack[1]);
    lltm_return(&owned, d_bias, &stack[2]);
    lltm_return(&owned, d_h0, &stack[3]);
    lltm_return(&owned, d_c0, &stack[4]);
    lltm_free_owned(&owned);
    lltm_cuda_leave_device(guard);
    return;
fail:
    lltm_cuda_leave_device(guard);
    lltm_raise("lltm::sequence_backward", &owned, &err);
}
