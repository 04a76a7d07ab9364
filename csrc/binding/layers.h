/*
 * layers.h - the sequence and stack operators as one-layer calls of the
 * core (lltm_sequence_* of either device): the arrays of each layer in the
 * operator's arguments and results, and the stack run layer by layer, the
 * layer below's output the input of the layer above. That is the CPU
 * kernels' algorithm, and the CUDA kernels' where no stacked launch fits.
 *
 * Notation of lltm.h: T steps, B rows, I inputs of the bottom layer, H
 * units of every layer, G = 3H; L layers, layer 0 at the bottom (L = 1 for
 * the sequence operators).
 */
#ifndef LLTM_BINDING_LAYERS_H
#define LLTM_BINDING_LAYERS_H

#include "ops.h"

/* Layer l's call on the kernel's device (its I: the bottom layer's for
 * l == 0, else H) on its arrays, f in the forward, b in the backward (the
 * other NULL); returns an lltm_status. */
typedef int (*lltm_layer_fn)(void *ctx, int64_t l, const lltm_sequence_forward_tensors *f,
                             const lltm_sequence_backward_tensors *b);

/* The stack operators' layer l: its input, weights, bias, state and results
 * in the operator's tensors. In the backward, its grad_output is given (the
 * top layer's: the operator's), and its grad_input is the operator's for
 * l == 0, else one half of `scratch` (lltm_stack_scratch_bytes; NULL: none). */
void lltm_stack_layer_forward(const lltm_call *c, int64_t l, lltm_sequence_forward_tensors *t);
void lltm_stack_layer_backward(const lltm_call *c, int64_t l, void *scratch,
                               const void *grad_output, lltm_sequence_backward_tensors *t);

/* The bytes of the backward's scratch: 2 T B H elements of the dtype in the
 * backward of more than one layer, else 0. */
size_t lltm_stack_scratch_bytes(const lltm_call *c);

/* The call as one-layer calls of `layer`: a sequence operator's one layer;
 * the stack's forward bottom up, its backward top down (layer l's
 * grad_input the grad_output of layer l-1, through `scratch`). Returns the
 * first failing call's lltm_status. */
int lltm_run_layers(const lltm_call *c, void *scratch, lltm_layer_fn layer, void *ctx);

static inline bool lltm_is_stack(const lltm_call *c)
{
    return c->op == &lltm_stack_forward_op || c->op == &lltm_stack_backward_op;
}

#endif /* LLTM_BINDING_LAYERS_H */
