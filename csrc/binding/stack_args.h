/*
 * stack_args.h - what the CPU and CUDA kernels of lltm::stack_forward and
 * lltm::stack_backward share: argument checks, results, and the stack run
 * as one-layer calls (every layer's lltm_sequence_* call in turn, the layer
 * below's output the input of the layer above), which is the CPU kernels'
 * algorithm and the CUDA kernels' where no stacked launch fits.
 *
 * Notation of lltm.h: T steps, B rows, I inputs of the bottom layer, H
 * units of every layer, G = 3H; L layers, layer 0 at the bottom.
 */
#ifndef LLTM_BINDING_STACK_ARGS_H
#define LLTM_BINDING_STACK_ARGS_H

#include "sequence_args.h"

/* Argument order of the two operators (ops.h). */
enum {
    LLTM_STACK_FWD_INPUT, LLTM_STACK_FWD_WEIGHTS0, LLTM_STACK_FWD_WEIGHTS,
    LLTM_STACK_FWD_BIASES, LLTM_STACK_FWD_H0, LLTM_STACK_FWD_C0, LLTM_STACK_FWD_NARGS
};
enum {
    LLTM_STACK_BWD_GRAD_OUTPUT, LLTM_STACK_BWD_GRAD_H_N, LLTM_STACK_BWD_GRAD_C_N,
    LLTM_STACK_BWD_INPUT, LLTM_STACK_BWD_WEIGHTS0, LLTM_STACK_BWD_WEIGHTS, LLTM_STACK_BWD_H0,
    LLTM_STACK_BWD_OUTPUT, LLTM_STACK_BWD_OUTPUTS, LLTM_STACK_BWD_CELLS, LLTM_STACK_BWD_GATES,
    LLTM_STACK_BWD_NARGS
};
#define LLTM_STACK_RESULTS 6

/* Sizes of the stack: one layer's (I: the bottom layer's inputs) and L. */
typedef struct lltm_stack_dims {
    lltm_sequence_dims seq;
    int64_t L;
} lltm_stack_dims;

/*
 * What a kernel of either operator holds from its opening to its return.
 * Forward results: output [T,B,H] (the top layer's), h_n, c_n [L,B,H],
 * outputs [L-1,T,B,H] (the layers below the top), cells [L,T,B,H], gates
 * [L,T,B,G]. Backward results: grad_input [T,B,I], grad_weights0 [G,H+I],
 * grad_weights [L-1,G,2H], grad_biases [L,G], grad_h0, grad_c0 [L,B,H];
 * those the output_mask leaves out not made (data NULL).
 */
typedef struct lltm_stack_call {
    bool backward;
    bool mask[LLTM_STACK_RESULTS];
    lltm_owned owned;
    lltm_error err, gemm_err;
    lltm_tensor args[LLTM_STACK_BWD_NARGS + 1]; /* lengths last in the overloads */
    const int64_t *lengths;                      /* [B] or NULL */
    lltm_stack_dims d;
    lltm_call_settings settings; /* the call's last argument */
    AtenTensorHandle results[LLTM_STACK_RESULTS];
    void *data[LLTM_STACK_RESULTS];
    lltm_torch_gemm_ctx gemm;
} lltm_stack_call;

/* The opening of either operator's kernel (or its lengths overload, told
 * apart by num_args), as lltm_sequence_open: arguments checked for
 * `device_type`, results allocated. */
int lltm_stack_open(lltm_stack_call *c, bool backward, StableIValue *stack, uint64_t num_args,
                    uint64_t num_outputs, int32_t device_type);

/* The close after the core call `core_fn` returned `status`, as
 * lltm_sequence_close. */
int lltm_stack_close(lltm_stack_call *c, int status, const char *core_fn, StableIValue *stack);

static inline const char *lltm_stack_op_name(const lltm_stack_call *c)
{
    return c->backward ? "lltm::stack_backward" : "lltm::stack_forward";
}

/* Layer l's call on the kernel's device (its I: the bottom layer's for
 * l == 0, else H) on its arrays; returns an lltm_status. */
typedef int (*lltm_layer_forward)(void *ctx, int64_t l, const lltm_sequence_forward_tensors *t);
typedef int (*lltm_layer_backward)(void *ctx, int64_t l,
                                   const lltm_sequence_backward_tensors *t);

/* Layer l's inputs I. */
static inline int64_t lltm_stack_layer_inputs(const lltm_stack_dims *d, int64_t l)
{
    return l == 0 ? d->seq.I : d->seq.H;
}

/* Layer l's arrays in the forward: its input, weights and bias, state and
 * results in the operator's tensors. */
void lltm_stack_layer_forward(const lltm_stack_call *c, int64_t l,
                              lltm_sequence_forward_tensors *t);

/* Layer l's arrays in the backward: its grad_output (the top layer's:
 * the operator's), the forward's arrays, its gradients in the operator's
 * results; its grad_input the operator's for l == 0, else one half of
 * `scratch` (below; NULL: none). */
void lltm_stack_layer_backward(const lltm_stack_call *c, int64_t l, void *scratch,
                               const void *grad_output, lltm_sequence_backward_tensors *t);

/* The bytes of lltm_stack_backward_by_layers' scratch: 2 T B H elements of
 * the dtype in the backward of more than one layer, else 0. */
size_t lltm_stack_scratch_bytes(const lltm_stack_call *c);

/* The stack as L one-layer calls: the forward bottom up; the backward top
 * down, layer l's grad_input the grad_output of layer l-1, through
 * `scratch` (lltm_stack_scratch_bytes; NULL when L == 1). Returns the
 * first failing call's lltm_status. */
int lltm_stack_forward_by_layers(const lltm_stack_call *c, lltm_layer_forward layer, void *ctx);
int lltm_stack_backward_by_layers(const lltm_stack_call *c, void *scratch,
                                  lltm_layer_backward layer, void *ctx);

#endif /* LLTM_BINDING_STACK_ARGS_H */
