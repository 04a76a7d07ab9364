/* stack_args.c - see stack_args.h. */
#include "stack_args.h"

static const char *const forward_names[LLTM_STACK_FWD_NARGS + 1] = {
    "input", "weights0", "weights", "biases", "h0", "c0", "lengths"};
static const char *const backward_names[LLTM_STACK_BWD_NARGS + 1] = {
    "grad_output", "grad_h_n", "grad_c_n", "input", "weights0", "weights",
    "h0",          "output",   "outputs",  "cells", "gates",    "lengths"};

/* t has dim sizes; names[k] says what sizes[k] is. */
static int check_shape(const lltm_tensor *t, int dim, const int64_t *sizes,
                       const char *shape_doc, const char *const *names, lltm_error *err)
{
    if (lltm_check_dim(t, dim, shape_doc, err))
        return -1;
    for (int k = 0; k < dim; ++k)
        if (lltm_check_size(t, k, sizes[k], names[k], err))
            return -1;
    return 0;
}

static const char *const STATE_NAMES[3] = {"layers L of h0", "batch size B of input",
                                           "state size H of h0"};
static const char *const STEPS_NAMES[3] = {"sequence length T of input", "batch size B of input",
                                           "state size H of h0"};

/* Sizes from input [T,B,I] and h0 [L,B,H]: L >= 1, H >= 1. */
static int read_dims(const lltm_tensor *input, const lltm_tensor *h0, lltm_stack_dims *d,
                     lltm_error *err)
{
    if (lltm_check_dim(input, 3, "[T, B, I]", err) || lltm_check_dim(h0, 3, "[L, B, H]", err))
        return -1;
    d->seq.T = input->sizes[0];
    d->seq.B = input->sizes[1];
    d->seq.I = input->sizes[2];
    d->L = h0->sizes[0];
    d->seq.H = h0->sizes[2];
    if (d->L < 1)
        return lltm_fail(err, "h0 holds L = 0 layers; expected at least one");
    return lltm_check_state_size(h0, d->seq.H, err);
}

/* weights0 [G,H+I], weights [L-1,G,2H], h0 [L,B,H] and the states like it */
static int check_layers(const lltm_tensor *weights0, const lltm_tensor *weights,
                        const lltm_tensor *const *states, int n_states,
                        const lltm_stack_dims *d, lltm_error *err)
{
    const int64_t B = d->seq.B, I = d->seq.I, H = d->seq.H, G = 3 * H;
    const int64_t w0[2] = {G, H + I}, w[3] = {d->L - 1, G, 2 * H}, s[3] = {d->L, B, H};
    static const char *const w0_names[2] = {
        "3H, three gates of state size H of h0",
        "H+I, state size H of h0 plus input features I of input"};
    static const char *const w_names[3] = {"L-1, the layers of h0 above the first",
                                           "3H, three gates of state size H of h0",
                                           "2H, state then input of a layer above the first"};
    if (check_shape(weights0, 2, w0, "[3H, H+I]", w0_names, err) ||
        check_shape(weights, 3, w, "[L-1, 3H, 2H]", w_names, err))
        return -1;
    for (int k = 0; k < n_states; ++k)
        if (check_shape(states[k], 3, s, "[L, B, H]", STATE_NAMES, err))
            return -1;
    return 0;
}

static int check_forward(const lltm_tensor *in, int32_t device_type, lltm_stack_dims *d,
                         lltm_error *err)
{
    if (lltm_core_dtype(&in[0], true, &d->seq.dtype, err) ||
        lltm_check_same_dtype_device(in, LLTM_STACK_FWD_NARGS, device_type, err) ||
        read_dims(&in[LLTM_STACK_FWD_INPUT], &in[LLTM_STACK_FWD_H0], d, err))
        return -1;
    const lltm_tensor *states[2] = {&in[LLTM_STACK_FWD_H0], &in[LLTM_STACK_FWD_C0]};
    const int64_t biases[2] = {d->L, 3 * d->seq.H};
    static const char *const bias_names[2] = {"layers L of h0",
                                              "3H, three gates of state size H of h0"};
    return check_layers(&in[LLTM_STACK_FWD_WEIGHTS0], &in[LLTM_STACK_FWD_WEIGHTS], states, 2,
                        d, err) ||
           check_shape(&in[LLTM_STACK_FWD_BIASES], 2, biases, "[L, 3H]", bias_names, err);
}

static int check_backward(const lltm_tensor *in, int32_t device_type, lltm_stack_dims *d,
                          lltm_error *err)
{
    if (lltm_core_dtype(&in[0], true, &d->seq.dtype, err) ||
        lltm_check_same_dtype_device(in, LLTM_STACK_BWD_NARGS, device_type, err) ||
        read_dims(&in[LLTM_STACK_BWD_INPUT], &in[LLTM_STACK_BWD_H0], d, err))
        return -1;
    const int64_t T = d->seq.T, B = d->seq.B, H = d->seq.H, L = d->L;
    const lltm_tensor *states[3] = {&in[LLTM_STACK_BWD_H0], &in[LLTM_STACK_BWD_GRAD_H_N],
                                    &in[LLTM_STACK_BWD_GRAD_C_N]};
    const int64_t top[3] = {T, B, H}, below[4] = {L - 1, T, B, H}, cells[4] = {L, T, B, H},
                  gates[4] = {L, T, B, 3 * H};
    static const char *const layered[4] = {"layers L of h0", "sequence length T of input",
                                           "batch size B of input", "state size H of h0"};
    static const char *const below_names[4] = {"L-1, the layers of h0 below the top",
                                               "sequence length T of input",
                                               "batch size B of input", "state size H of h0"};
    static const char *const gates_names[4] = {"layers L of h0", "sequence length T of input",
                                               "batch size B of input",
                                               "3H, three gates of state size H of h0"};
    return check_layers(&in[LLTM_STACK_BWD_WEIGHTS0], &in[LLTM_STACK_BWD_WEIGHTS], states, 3,
                        d, err) ||
           check_shape(&in[LLTM_STACK_BWD_GRAD_OUTPUT], 3, top, "[T, B, H]", STEPS_NAMES,
                       err) ||
           check_shape(&in[LLTM_STACK_BWD_OUTPUT], 3, top, "[T, B, H]", STEPS_NAMES, err) ||
           check_shape(&in[LLTM_STACK_BWD_OUTPUTS], 4, below, "[L-1, T, B, H]", below_names,
                       err) ||
           check_shape(&in[LLTM_STACK_BWD_CELLS], 4, cells, "[L, T, B, H]", layered, err) ||
           check_shape(&in[LLTM_STACK_BWD_GATES], 4, gates, "[L, T, B, 3H]", gates_names,
                       err);
}

static int results_new(lltm_stack_call *c)
{
    const lltm_stack_dims *d = &c->d;
    const int64_t T = d->seq.T, B = d->seq.B, I = d->seq.I, H = d->seq.H, G = 3 * H, L = d->L;
    const int64_t forward_sizes[LLTM_STACK_RESULTS][4] = {
        {T, B, H}, {L, B, H}, {L, B, H}, {L - 1, T, B, H}, {L, T, B, H}, {L, T, B, G}};
    const int64_t backward_sizes[LLTM_STACK_RESULTS][4] = {
        {T, B, I}, {G, H + I}, {L - 1, G, 2 * H}, {L, G}, {L, B, H}, {L, B, H}};
    const int forward_dims[LLTM_STACK_RESULTS] = {3, 3, 3, 4, 4, 4};
    const int backward_dims[LLTM_STACK_RESULTS] = {3, 2, 3, 2, 3, 3};
    for (int k = 0; k < LLTM_STACK_RESULTS; ++k) {
        c->results[k] = NULL;
        c->data[k] = NULL;
        if (c->mask[k] &&
            lltm_empty(c->backward ? backward_dims[k] : forward_dims[k],
                       c->backward ? backward_sizes[k] : forward_sizes[k], &c->args[0],
                       &c->owned, &c->results[k], &c->data[k], &c->err))
            return -1;
    }
    return 0;
}

int lltm_stack_open(lltm_stack_call *c, bool backward, StableIValue *stack, uint64_t num_args,
                    uint64_t num_outputs, int32_t device_type)
{
    lltm_tensor *a = c->args;
    const int64_t settings = lltm_take_settings(stack, &num_args);
    c->backward = backward;
    c->owned.count = 0;
    c->err.msg[0] = '\0';
    c->gemm_err.msg[0] = '\0';
    c->lengths = NULL;
    for (int k = 0; k < LLTM_STACK_RESULTS; ++k)
        c->mask[k] = true;
    const int nargs = backward ? LLTM_STACK_BWD_NARGS : LLTM_STACK_FWD_NARGS;
    const bool with_lengths = num_args == (uint64_t)nargs + 1 + backward;
    if (backward) {
        if (lltm_open_backward_op(stack, num_args, num_outputs, nargs + with_lengths,
                                  LLTM_STACK_RESULTS, backward_names, a, c->mask, &c->owned,
                                  &c->err) ||
            check_backward(a, device_type, &c->d, &c->err))
            return -1;
    } else if (lltm_open_op(stack, num_args, num_outputs, nargs + with_lengths,
                            LLTM_STACK_RESULTS, forward_names, a, &c->owned, &c->err) ||
               check_forward(a, device_type, &c->d, &c->err)) {
        return -1;
    }
    if (lltm_call_settings_decode(settings, &c->settings, &c->err))
        return -1;
    if (with_lengths) {
        if (lltm_check_lengths(&a[nargs], &a[0], &c->d.seq,
                               device_type == aoti_torch_device_type_cpu(), &c->err))
            return -1;
        c->lengths = (const int64_t *)a[nargs].data;
    }
    if (results_new(c))
        return -1;
    c->gemm = lltm_gemm_context(&a[0], &c->settings, &c->gemm_err);
    return 0;
}

int lltm_stack_close(lltm_stack_call *c, int status, const char *core_fn, StableIValue *stack)
{
    if (status != LLTM_OK)
        return lltm_sequence_core_failed(&c->err, &c->gemm_err, core_fn, status);
    return lltm_return_masked(&c->owned, c->results, c->mask, LLTM_STACK_RESULTS, stack,
                              &c->err);
}

/* `count` elements of the call's dtype past p (NULL stays NULL) */
static void *at(const lltm_stack_call *c, const void *p, int64_t count)
{
    if (p == NULL)
        return NULL;
    return (char *)p + (size_t)count * lltm_dtype_size(c->d.seq.dtype);
}

/* layer l's input, weights and output; the inputs of the forward's order */
static void layer_arrays(const lltm_stack_call *c, int64_t l, const void *const *in,
                         const void *output, const void *outputs, const void **input,
                         const void **weights, void **layer_output)
{
    const int64_t TBH = c->d.seq.T * c->d.seq.B * c->d.seq.H, G = 3 * c->d.seq.H;
    *input = l == 0 ? in[LLTM_STACK_FWD_INPUT] : at(c, outputs, (l - 1) * TBH);
    *weights = l == 0 ? in[LLTM_STACK_FWD_WEIGHTS0]
                      : at(c, in[LLTM_STACK_FWD_WEIGHTS], (l - 1) * G * 2 * c->d.seq.H);
    *layer_output = l == c->d.L - 1 ? (void *)output : at(c, outputs, l * TBH);
}

void lltm_stack_layer_forward(const lltm_stack_call *c, int64_t l,
                              lltm_sequence_forward_tensors *t)
{
    const lltm_tensor *a = c->args;
    const int64_t T = c->d.seq.T, B = c->d.seq.B, H = c->d.seq.H, G = 3 * H;
    const void *in[LLTM_STACK_FWD_NARGS];
    for (int k = 0; k < LLTM_STACK_FWD_NARGS; ++k)
        in[k] = a[k].data;
    layer_arrays(c, l, in, c->data[0], c->data[3], &t->input, &t->weights, &t->output);
    t->bias = at(c, a[LLTM_STACK_FWD_BIASES].data, l * G);
    t->h0 = at(c, a[LLTM_STACK_FWD_H0].data, l * B * H);
    t->c0 = at(c, a[LLTM_STACK_FWD_C0].data, l * B * H);
    t->h_n = at(c, c->data[1], l * B * H);
    t->c_n = at(c, c->data[2], l * B * H);
    t->cells = at(c, c->data[4], l * T * B * H);
    t->gates = at(c, c->data[5], l * T * B * G);
    t->lengths = c->lengths;
}

size_t lltm_stack_scratch_bytes(const lltm_stack_call *c)
{
    const lltm_sequence_dims *d = &c->d.seq;
    return c->backward && c->d.L > 1
               ? 2 * (size_t)(d->T * d->B * d->H) * lltm_dtype_size(d->dtype)
               : 0;
}

int lltm_stack_forward_by_layers(const lltm_stack_call *c, lltm_layer_forward layer, void *ctx)
{
    for (int64_t l = 0; l < c->d.L; ++l) {
        lltm_sequence_forward_tensors t;
        lltm_stack_layer_forward(c, l, &t);
        const int status = layer(ctx, l, &t);
        if (status != LLTM_OK)
            return status;
    }
    return LLTM_OK;
}

void lltm_stack_layer_backward(const lltm_stack_call *c, int64_t l, void *scratch,
                               const void *grad_output, lltm_sequence_backward_tensors *t)
{
    const lltm_tensor *a = c->args;
    const int64_t T = c->d.seq.T, B = c->d.seq.B, H = c->d.seq.H, G = 3 * H, L = c->d.L;
    /* the forward's inputs, in its order, for layer_arrays */
    const void *in[LLTM_STACK_FWD_NARGS] = {
        a[LLTM_STACK_BWD_INPUT].data, a[LLTM_STACK_BWD_WEIGHTS0].data,
        a[LLTM_STACK_BWD_WEIGHTS].data, NULL, a[LLTM_STACK_BWD_H0].data, NULL};
    void *output;
    layer_arrays(c, l, in, a[LLTM_STACK_BWD_OUTPUT].data, a[LLTM_STACK_BWD_OUTPUTS].data,
                 &t->input, &t->weights, &output);
    t->output = output;
    t->grad_output = grad_output;
    t->grad_h_n = at(c, a[LLTM_STACK_BWD_GRAD_H_N].data, l * B * H);
    t->grad_c_n = at(c, a[LLTM_STACK_BWD_GRAD_C_N].data, l * B * H);
    t->h0 = at(c, a[LLTM_STACK_BWD_H0].data, l * B * H);
    t->cells = at(c, a[LLTM_STACK_BWD_CELLS].data, l * T * B * H);
    t->gates = at(c, a[LLTM_STACK_BWD_GATES].data, l * T * B * G);
    /* layer l > 0's input gradient is layer l-1's grad_output: the two
     * halves of scratch in turn (read one, write the other) */
    t->grad_input = l == 0 ? c->data[0] : at(c, scratch, ((L - 1 - l) % 2) * T * B * H);
    t->grad_weights = l == 0 ? c->data[1] : at(c, c->data[2], (l - 1) * G * 2 * H);
    t->grad_bias = at(c, c->data[3], l * G);
    t->grad_h0 = at(c, c->data[4], l * B * H);
    t->grad_c0 = at(c, c->data[5], l * B * H);
    t->lengths = c->lengths;
    t->grad_gates = NULL; /* dG in the core's workspace */
}

int lltm_stack_backward_by_layers(const lltm_stack_call *c, void *scratch,
                                  lltm_layer_backward layer, void *ctx)
{
    const void *grad_output = c->args[LLTM_STACK_BWD_GRAD_OUTPUT].data;
    for (int64_t l = c->d.L - 1; l >= 0; --l) {
        lltm_sequence_backward_tensors t;
        lltm_stack_layer_backward(c, l, scratch, grad_output, &t);
        const int status = layer(ctx, l, &t);
        if (status != LLTM_OK)
            return status;
        grad_output = t.grad_input;
    }
    return LLTM_OK;
}
