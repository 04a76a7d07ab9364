/* sequence_args.c - see sequence_args.h. */
#include "sequence_args.h"

const char *const lltm_sequence_forward_names[LLTM_SEQ_FWD_NARGS + 1] = {
    "input", "weights", "bias", "h0", "c0", "lengths"};
const char *const lltm_sequence_backward_names[LLTM_SEQ_BWD_NARGS + 1] = {
    "grad_output", "grad_h_n", "grad_c_n", "input", "weights",
    "h0",          "output",   "cells",    "gates", "lengths"};

int lltm_check_lengths(const lltm_tensor *lengths, const lltm_tensor *like,
                       const lltm_sequence_dims *d, bool check_values, lltm_error *err)
{
    if (lengths->dtype != aoti_torch_dtype_int64() || lengths->dim != 1 ||
        lengths->sizes[0] != d->B)
        return lltm_fail(err,
                         "lengths must be an int64 tensor of shape [%lld] (one length per "
                         "batch row B of input), got %s of %lld dimensions, first size %lld",
                         (long long)d->B,
                         lengths->dtype == aoti_torch_dtype_int64() ? "int64"
                                                                    : "another dtype",
                         (long long)lengths->dim,
                         (long long)(lengths->dim > 0 ? lengths->sizes[0] : 0));
    if (lengths->device_type != like->device_type ||
        lengths->device_index != like->device_index)
        return lltm_fail(err, "lengths must be on the device of %s", like->name);
    if (!check_values)
        return 0;
    const int64_t *values = (const int64_t *)lengths->data;
    for (int64_t b = 0; b < d->B; ++b)
        if (values[b] < 1 || values[b] > d->T)
            return lltm_fail(err,
                             "lengths[%lld] = %lld; every length must be in [1, T] with T = "
                             "%lld steps in input",
                             (long long)b, (long long)values[b], (long long)d->T);
    return 0;
}

/* t is [B, H] */
static int check_state(const lltm_tensor *t, const lltm_sequence_dims *d, lltm_error *err)
{
    return lltm_check_dim(t, 2, "[B, H]", err) ||
           lltm_check_size(t, 0, d->B, "batch size B of input", err) ||
           lltm_check_size(t, 1, d->H, "state size H of h0", err);
}

/* t is [T, B, n] */
static int check_steps(const lltm_tensor *t, const lltm_sequence_dims *d, int64_t n,
                       const char *shape_doc, const char *what, lltm_error *err)
{
    return lltm_check_dim(t, 3, shape_doc, err) ||
           lltm_check_size(t, 0, d->T, "sequence length T of input", err) ||
           lltm_check_size(t, 1, d->B, "batch size B of input", err) ||
           lltm_check_size(t, 2, n, what, err);
}

static int check_weights(const lltm_tensor *w, const lltm_sequence_dims *d, lltm_error *err)
{
    return lltm_check_dim(w, 2, "[3H, I+H]", err) ||
           lltm_check_size(w, 0, 3 * d->H, "3H, three gates of state size H of h0", err) ||
           lltm_check_size(w, 1, d->I + d->H,
                           "I+H, input features I of input plus state size H of h0", err);
}

/* Sizes from input [T,B,I] and a state [B,H]; rejects H == 0. */
static int read_dims(const lltm_tensor *input, const lltm_tensor *state,
                     lltm_sequence_dims *d, lltm_error *err)
{
    if (lltm_check_dim(input, 3, "[T, B, I]", err) ||
        lltm_check_dim(state, 2, "[B, H]", err))
        return -1;
    d->T = input->sizes[0];
    d->B = input->sizes[1];
    d->I = input->sizes[2];
    d->H = state->sizes[1];
    return lltm_check_state_size(state, d->H, err);
}

int lltm_check_sequence_forward(const lltm_tensor in[LLTM_SEQ_FWD_NARGS],
                                int32_t device_type, bool half_types_ok,
                                lltm_sequence_dims *d, lltm_error *err)
{
    const lltm_tensor *bias = &in[LLTM_SEQ_FWD_BIAS];
    if (lltm_core_dtype(&in[0], half_types_ok, &d->dtype, err) ||
        lltm_check_same_dtype_device(in, LLTM_SEQ_FWD_NARGS, device_type, err) ||
        read_dims(&in[LLTM_SEQ_FWD_INPUT], &in[LLTM_SEQ_FWD_H0], d, err) ||
        check_state(&in[LLTM_SEQ_FWD_H0], d, err) ||
        check_state(&in[LLTM_SEQ_FWD_C0], d, err) ||
        check_weights(&in[LLTM_SEQ_FWD_WEIGHTS], d, err))
        return -1;
    return lltm_check_bias(bias, d->H, err);
}

int lltm_check_sequence_backward(const lltm_tensor in[LLTM_SEQ_BWD_NARGS],
                                 int32_t device_type, bool half_types_ok,
                                 lltm_sequence_dims *d, lltm_error *err)
{
    if (lltm_core_dtype(&in[0], half_types_ok, &d->dtype, err) ||
        lltm_check_same_dtype_device(in, LLTM_SEQ_BWD_NARGS, device_type, err) ||
        read_dims(&in[LLTM_SEQ_BWD_INPUT], &in[LLTM_SEQ_BWD_H0], d, err) ||
        check_state(&in[LLTM_SEQ_BWD_H0], d, err) ||
        check_state(&in[LLTM_SEQ_BWD_GRAD_H_N], d, err) ||
        check_state(&in[LLTM_SEQ_BWD_GRAD_C_N], d, err) ||
        check_weights(&in[LLTM_SEQ_BWD_WEIGHTS], d, err))
        return -1;
    return check_steps(&in[LLTM_SEQ_BWD_GRAD_OUTPUT], d, d->H, "[T, B, H]", "state size H", err) ||
           check_steps(&in[LLTM_SEQ_BWD_OUTPUT], d, d->H, "[T, B, H]", "state size H", err) ||
           check_steps(&in[LLTM_SEQ_BWD_CELLS], d, d->H, "[T, B, H]", "state size H", err) ||
           check_steps(&in[LLTM_SEQ_BWD_GATES], d, 3 * d->H, "[T, B, 3H]", "3H", err);
}

static int make_view(const lltm_matrix *m, AtenTensorHandle *out, lltm_error *err)
{
    const int64_t sizes[2] = {m->rows, m->cols};
    const int64_t strides[2] = {m->row_stride, m->col_stride};
    if (aoti_torch__reinterpret_tensor(m->base, 2, sizes, strides, m->offset, out) != 0)
        return lltm_shim_failed(err, "aoti_torch__reinterpret_tensor");
    return 0;
}

int lltm_mm_matrices(const lltm_matrix *a, const lltm_matrix *b,
                     const lltm_matrix *out, lltm_error *err)
{
    /* The dispatcher consumes its tensor arguments: hand it the views. */
    const lltm_matrix *ms[3] = {a, b, out};
    StableIValue stack[3];
    for (int k = 0; k < 3; ++k) {
        AtenTensorHandle view;
        if (make_view(ms[k], &view, err)) {
            for (int j = 0; j < k; ++j)
                aoti_torch_delete_tensor_object((AtenTensorHandle)(uintptr_t)stack[j]);
            return -1;
        }
        stack[k] = (StableIValue)(uintptr_t)view;
    }
    if (torch_call_dispatcher("aten::mm", "out", stack, LLTM_TORCH_TARGET_VERSION) != 0)
        return lltm_shim_failed(err, "aten::mm.out");
    /* mm.out returns its `out` argument as a new handle. */
    aoti_torch_delete_tensor_object((AtenTensorHandle)(uintptr_t)stack[0]);
    return 0;
}

static int results_new(bool backward, bool gate_grads, const bool *mask,
                       const lltm_sequence_dims *d, const lltm_tensor *like, lltm_owned *owned,
                       lltm_sequence_results *results, lltm_error *err)
{
    const int64_t G = 3 * d->H;
    const int64_t forward_sizes[5][3] = {{d->T, d->B, d->H}, {d->B, d->H}, {d->B, d->H},
                                         {d->T, d->B, d->H}, {d->T, d->B, G}};
    int64_t backward_sizes[5][3] = {{d->T, d->B, d->I}, {G, d->I + d->H}, {G},
                                    {d->B, d->H}, {d->B, d->H}};
    const int forward_dims[5] = {3, 2, 2, 3, 3};
    int backward_dims[5] = {3, 2, 1, 2, 2};
    if (gate_grads) { /* grad_gates [T,B,G] in grad_weights' place */
        backward_sizes[1][0] = d->T, backward_sizes[1][1] = d->B, backward_sizes[1][2] = G;
        backward_dims[1] = 3;
    }
    for (int k = 0; k < 5; ++k) {
        results->tensors[k] = NULL;
        results->data[k] = NULL;
        if (mask[k] && lltm_empty(backward ? backward_dims[k] : forward_dims[k],
                       backward ? backward_sizes[k] : forward_sizes[k], like, owned,
                       &results->tensors[k], &results->data[k], err))
            return -1;
    }
    return 0;
}

int lltm_sequence_open(lltm_sequence_call *c, lltm_sequence_op op, StableIValue *stack,
                       uint64_t num_args, uint64_t num_outputs, int32_t device_type)
{
    lltm_tensor *a = c->args;
    const bool backward = op != LLTM_SEQ_FORWARD;
    const int64_t settings = lltm_take_settings(stack, &num_args);
    c->backward = backward;
    c->gate_grads = op == LLTM_SEQ_BACKWARD_GATES;
    c->owned.count = 0;
    c->err.msg[0] = '\0';
    c->gemm_err.msg[0] = '\0';
    for (int k = 0; k < 5; ++k)
        c->mask[k] = true;
    /* the tensors: nargs, and lengths after them in the lengths overloads
     * (the backward's output_mask is last, after the tensors) */
    const int nargs = backward ? LLTM_SEQ_BWD_NARGS : LLTM_SEQ_FWD_NARGS;
    const bool with_lengths = num_args == (uint64_t)nargs + 1 + backward;
    if (backward) {
        if (lltm_open_backward_op(stack, num_args, num_outputs, nargs + with_lengths, 5,
                                  lltm_sequence_backward_names, a, c->mask, &c->owned,
                                  &c->err) ||
            lltm_check_sequence_backward(a, device_type, true, &c->d, &c->err))
            return -1;
    } else if (lltm_open_op(stack, num_args, num_outputs, nargs + with_lengths, 5,
                            lltm_sequence_forward_names, a, &c->owned, &c->err) ||
               lltm_check_sequence_forward(a, device_type, true, &c->d, &c->err)) {
        return -1;
    }
    if (lltm_call_settings_decode(settings, &c->settings, &c->err))
        return -1;
    const int64_t *lengths = NULL;
    if (with_lengths) {
        if (lltm_check_lengths(&a[nargs], &a[0], &c->d,
                               device_type == aoti_torch_device_type_cpu(), &c->err))
            return -1;
        lengths = (const int64_t *)a[nargs].data;
    }
    if (results_new(backward, c->gate_grads, c->mask, &c->d, &a[0], &c->owned, &c->results, &c->err))
        return -1;
    void *const *r = c->results.data;
    if (backward)
        c->backward_tensors = (lltm_sequence_backward_tensors){
            a[LLTM_SEQ_BWD_GRAD_OUTPUT].data, a[LLTM_SEQ_BWD_GRAD_H_N].data,
            a[LLTM_SEQ_BWD_GRAD_C_N].data,    a[LLTM_SEQ_BWD_INPUT].data,
            a[LLTM_SEQ_BWD_WEIGHTS].data,     a[LLTM_SEQ_BWD_H0].data,
            a[LLTM_SEQ_BWD_OUTPUT].data,      a[LLTM_SEQ_BWD_CELLS].data,
            a[LLTM_SEQ_BWD_GATES].data,       r[0], c->gate_grads ? NULL : r[1],
            r[2],                             r[3], r[4], lengths, c->gate_grads ? r[1] : NULL};
    else
        c->forward_tensors = (lltm_sequence_forward_tensors){
            a[LLTM_SEQ_FWD_INPUT].data, a[LLTM_SEQ_FWD_WEIGHTS].data, a[LLTM_SEQ_FWD_BIAS].data,
            a[LLTM_SEQ_FWD_H0].data,    a[LLTM_SEQ_FWD_C0].data,      r[0], r[1], r[2], r[3],
            r[4],                       lengths};
    c->gemm = lltm_gemm_context(&a[0], &c->settings, &c->gemm_err);
    return 0;
}

int lltm_sequence_core_failed(lltm_error *err, const lltm_error *gemm_err, const char *core_fn,
                              int status)
{
    if (status == LLTM_ERR_GEMM && gemm_err->msg[0] != '\0')
        return lltm_fail(err, "%s: %s", core_fn, gemm_err->msg);
    return lltm_core_failed(err, core_fn, status);
}

int lltm_sequence_close(lltm_sequence_call *c, int status, const char *core_fn,
                        StableIValue *stack)
{
    if (status != LLTM_OK)
        return lltm_sequence_core_failed(&c->err, &c->gemm_err, core_fn, status);
    return lltm_return_masked(&c->owned, c->results.tensors, c->mask, 5, stack, &c->err);
}
