/* layers.c - see layers.h. */
#include "layers.h"

/* `count` elements of the call's dtype past p (NULL stays NULL) */
static void *at(const lltm_call *c, const void *p, int64_t count)
{
    if (p == NULL)
        return NULL;
    return (char *)p + (size_t)count * lltm_dtype_size(c->d.dtype);
}

/* (the arguments and results in the order of ops.c) */
void lltm_stack_layer_forward(const lltm_call *c, int64_t l, lltm_sequence_forward_tensors *t)
{
    const lltm_tensor *a = c->args;
    void *const *r = c->data;
    const int64_t T = c->d.T, B = c->d.B, H = c->d.H, G = 3 * H;
    *t = (lltm_sequence_forward_tensors){
        .input = l == 0 ? a[0].data : at(c, r[3], (l - 1) * T * B * H),
        .weights = l == 0 ? a[1].data : at(c, a[2].data, (l - 1) * G * 2 * H),
        .bias = at(c, a[3].data, l * G),
        .h0 = at(c, a[4].data, l * B * H),
        .c0 = at(c, a[5].data, l * B * H),
        .output = l == c->d.L - 1 ? r[0] : at(c, r[3], l * T * B * H),
        .h_n = at(c, r[1], l * B * H),
        .c_n = at(c, r[2], l * B * H),
        .cells = at(c, r[4], l * T * B * H),
        .gates = at(c, r[5], l * T * B * G),
        .lengths = c->lengths};
}

void lltm_stack_layer_backward(const lltm_call *c, int64_t l, void *scratch,
                               const void *grad_output, lltm_sequence_backward_tensors *t)
{
    const lltm_tensor *a = c->args;
    void *const *r = c->data;
    const int64_t T = c->d.T, B = c->d.B, H = c->d.H, G = 3 * H, L = c->d.L;
    *t = (lltm_sequence_backward_tensors){
        .grad_output = grad_output,
        .grad_h_n = at(c, a[1].data, l * B * H),
        .grad_c_n = at(c, a[2].data, l * B * H),
        .input = l == 0 ? a[3].data : at(c, a[8].data, (l - 1) * T * B * H),
        .weights = l == 0 ? a[4].data : at(c, a[5].data, (l - 1) * G * 2 * H),
        .h0 = at(c, a[6].data, l * B * H),
        .output = l == L - 1 ? a[7].data : at(c, a[8].data, l * T * B * H),
        .cells = at(c, a[9].data, l * T * B * H),
        .gates = at(c, a[10].data, l * T * B * G),
        /* layer l > 0's input gradient is layer l-1's grad_output: the two
         * halves of scratch in turn (read one, write the other) */
        .grad_input = l == 0 ? r[0] : at(c, scratch, ((L - 1 - l) % 2) * T * B * H),
        .grad_weights = l == 0 ? r[1] : at(c, r[2], (l - 1) * G * 2 * H),
        .grad_bias = at(c, r[3], l * G),
        .grad_h0 = at(c, r[4], l * B * H),
        .grad_c0 = at(c, r[5], l * B * H),
        .lengths = c->lengths,
        .grad_gates = NULL}; /* dG in the core's workspace */
}

size_t lltm_stack_scratch_bytes(const lltm_call *c)
{
    const lltm_dims *d = &c->d;
    return c->op->backward && d->L > 1
               ? 2 * (size_t)(d->T * d->B * d->H) * lltm_dtype_size(d->dtype)
               : 0;
}

int lltm_run_layers(const lltm_call *c, void *scratch, lltm_layer_fn layer, void *ctx)
{
    const lltm_tensor *a = c->args;
    void *const *r = c->data;
    lltm_sequence_forward_tensors f;
    lltm_sequence_backward_tensors b;
    if (!lltm_is_stack(c) && c->op->backward) {
        /* sequence_backward_gates: dG [T,B,3H] out in grad_weights' place */
        const bool gates = c->op == &lltm_sequence_backward_gates_op;
        b = (lltm_sequence_backward_tensors){
            a[0].data, a[1].data, a[2].data, a[3].data, a[4].data, a[5].data, a[6].data,
            a[7].data, a[8].data, r[0], gates ? NULL : r[1], r[2], r[3], r[4], c->lengths,
            gates ? r[1] : NULL};
        return layer(ctx, 0, NULL, &b);
    }
    if (!lltm_is_stack(c)) {
        f = (lltm_sequence_forward_tensors){a[0].data, a[1].data, a[2].data, a[3].data,
                                            a[4].data, r[0], r[1], r[2], r[3], r[4], c->lengths};
        return layer(ctx, 0, &f, NULL);
    }
    const void *grad_output = a[0].data;
    for (int64_t k = 0; k < c->d.L; ++k) {
        int status;
        if (c->op->backward) {
            lltm_stack_layer_backward(c, c->d.L - 1 - k, scratch, grad_output, &b);
            status = layer(ctx, c->d.L - 1 - k, NULL, &b);
            grad_output = b.grad_input;
        } else {
            lltm_stack_layer_forward(c, k, &f);
            status = layer(ctx, k, &f, NULL);
        }
        if (status != LLTM_OK)
            return status;
    }
    return LLTM_OK;
}
