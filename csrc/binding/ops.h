/*
 * ops.h - the lltm operators: their schemas (one contract for every device)
 * and the boxed kernels that implement them per device.
 *
 * A boxed kernel takes its arguments from stack[0..num_args) (tensor
 * handles it owns) and leaves its results in stack[0..num_outputs).
 */
#ifndef LLTM_BINDING_OPS_H
#define LLTM_BINDING_OPS_H

#include "tensor_args.h"

#define LLTM_NAMESPACE "lltm"

/* Each operator's arguments and returns; the schemas below put a name before
 * them. Every operator's last argument is `settings`, what the call runs with
 * (call_settings.h). */
#define LLTM_SIGNATURE_CELL_FORWARD                                                 \
    "(Tensor input, Tensor weights, Tensor bias, Tensor old_h, "                    \
    "Tensor old_cell, " LLTM_SCHEMA_SETTINGS ") -> "                              \
    "(Tensor new_h, Tensor new_cell, Tensor gates)"
/* The backward operators' output_mask (ATen's convention, as in
 * aten::convolution_backward): which of the five gradients to compute; the
 * others are not computed and come back undefined (None in Python). */
#define LLTM_SCHEMA_OUTPUT_MASK "bool[5] output_mask=[True, True, True, True, True]"
#define LLTM_SIGNATURE_CELL_BACKWARD                                                \
    "(Tensor grad_h, Tensor grad_cell, Tensor new_cell, "                           \
    "Tensor gates, Tensor input, Tensor old_h, Tensor weights, "                    \
    LLTM_SCHEMA_OUTPUT_MASK ", " LLTM_SCHEMA_SETTINGS ") -> "                       \
    "(Tensor grad_input, Tensor grad_weights, Tensor grad_bias, "                   \
    "Tensor grad_old_h, Tensor grad_old_cell)"
/* One layer over a whole sequence: input [T,B,I], h0/c0 [B,H]; output
 * [T,B,H] = h_1..h_T, h_n/c_n [B,H] = the last state (h0/c0 when T == 0);
 * cells [T,B,H] and gates [T,B,3H] (activations) are kept for the backward. */
#define LLTM_SIGNATURE_SEQUENCE_FORWARD                                             \
    "(Tensor input, Tensor weights, Tensor bias, Tensor h0, "                       \
    "Tensor c0, " LLTM_SCHEMA_SETTINGS ") -> "                                    \
    "(Tensor output, Tensor h_n, Tensor c_n, Tensor cells, Tensor gates)"
#define LLTM_SIGNATURE_SEQUENCE_BACKWARD                                            \
    "(Tensor grad_output, Tensor grad_h_n, Tensor grad_c_n, "                       \
    "Tensor input, Tensor weights, Tensor h0, Tensor output, Tensor cells, "        \
    "Tensor gates, " LLTM_SCHEMA_OUTPUT_MASK ", " LLTM_SCHEMA_SETTINGS ") -> "     \
    "(Tensor grad_input, Tensor grad_weights, Tensor grad_bias, Tensor grad_h0, "   \
    "Tensor grad_c0)"

/* The same with variable lengths: lengths [B] int64 on the input's device,
 * each in [1, T]; row b stops after its first lengths[b] steps (output 0
 * beyond them, h_n/c_n its state after them; lltm.h). The overloads share
 * the kernels of the operators above (the argument count tells them apart). */
#define LLTM_SIGNATURE_SEQUENCE_FORWARD_LENGTHS                                     \
    "(Tensor input, Tensor weights, Tensor bias, "                                  \
    "Tensor h0, Tensor c0, Tensor lengths, " LLTM_SCHEMA_SETTINGS ") -> "         \
    "(Tensor output, Tensor h_n, Tensor c_n, Tensor cells, Tensor gates)"
#define LLTM_SIGNATURE_SEQUENCE_BACKWARD_LENGTHS                                    \
    "(Tensor grad_output, Tensor grad_h_n, "                                        \
    "Tensor grad_c_n, Tensor input, Tensor weights, Tensor h0, Tensor output, "     \
    "Tensor cells, Tensor gates, Tensor lengths, " LLTM_SCHEMA_OUTPUT_MASK          \
    ", " LLTM_SCHEMA_SETTINGS ") -> (Tensor grad_input, Tensor grad_weights, "    \
    "Tensor grad_bias, Tensor grad_h0, Tensor grad_c0)"

/* sequence_backward with the gates' gradients dG [T,B,3H] out in place of
 * grad_weights (output_mask[1] asks for them), for a caller that forms
 * dW = dG^T [h_prev | x] itself: stacked layers run in time chunks form it
 * once a layer (lltm/_wavefront.py). The same kernels as sequence_backward. */
#define LLTM_SIGNATURE_SEQUENCE_BACKWARD_GATES                                      \
    "(Tensor grad_output, Tensor grad_h_n, Tensor grad_c_n, "                       \
    "Tensor input, Tensor weights, Tensor h0, Tensor output, Tensor cells, "        \
    "Tensor gates, " LLTM_SCHEMA_OUTPUT_MASK ", " LLTM_SCHEMA_SETTINGS ") -> "     \
    "(Tensor grad_input, Tensor grad_gates, Tensor grad_bias, Tensor grad_h0, "     \
    "Tensor grad_c0)"
#define LLTM_SIGNATURE_SEQUENCE_BACKWARD_GATES_LENGTHS                              \
    "(Tensor grad_output, Tensor grad_h_n, "                                        \
    "Tensor grad_c_n, Tensor input, Tensor weights, Tensor h0, Tensor output, "     \
    "Tensor cells, Tensor gates, Tensor lengths, " LLTM_SCHEMA_OUTPUT_MASK          \
    ", " LLTM_SCHEMA_SETTINGS ") -> (Tensor grad_input, Tensor grad_gates, "      \
    "Tensor grad_bias, Tensor grad_h0, Tensor grad_c0)"

/* L stacked layers over a whole sequence, the layer below's output the
 * input of the layer above (I of every layer above the first = H): input
 * [T,B,I]; weights0 [3H,H+I] of layer 0, weights [L-1,3H,2H] and biases
 * [L,3H] of all layers, h0/c0 [L,B,H]; output [T,B,H] the top layer's,
 * h_n/c_n [L,B,H], outputs [L-1,T,B,H] the layers' below the top (the
 * inputs of the layers above), cells [L,T,B,H] and gates [L,T,B,3H] kept
 * for the backward. The same results as L calls of sequence_forward, up to
 * rounding; on CUDA one launch a direction runs 2 or 3 layers of small
 * sizes (csrc/core/lltm_stack.h). */
#define LLTM_SIGNATURE_STACK_FORWARD                                                \
    "(Tensor input, Tensor weights0, Tensor weights, Tensor biases, Tensor h0, "    \
    "Tensor c0, " LLTM_SCHEMA_SETTINGS ") -> (Tensor output, Tensor h_n, "        \
    "Tensor c_n, Tensor outputs, Tensor cells, Tensor gates)"
#define LLTM_SCHEMA_STACK_OUTPUT_MASK                                               \
    "bool[6] output_mask=[True, True, True, True, True, True]"
#define LLTM_SIGNATURE_STACK_BACKWARD_ARGS                                          \
    "(Tensor grad_output, Tensor grad_h_n, Tensor grad_c_n, Tensor input, "         \
    "Tensor weights0, Tensor weights, Tensor h0, Tensor output, Tensor outputs, "   \
    "Tensor cells, Tensor gates, "
#define LLTM_SIGNATURE_STACK_BACKWARD_RETURNS                                       \
    ", " LLTM_SCHEMA_SETTINGS ") -> (Tensor grad_input, Tensor grad_weights0, "   \
    "Tensor grad_weights, Tensor grad_biases, Tensor grad_h0, Tensor grad_c0)"
#define LLTM_SIGNATURE_STACK_BACKWARD                                               \
    LLTM_SIGNATURE_STACK_BACKWARD_ARGS LLTM_SCHEMA_STACK_OUTPUT_MASK                \
    LLTM_SIGNATURE_STACK_BACKWARD_RETURNS
#define LLTM_SIGNATURE_STACK_FORWARD_LENGTHS                                        \
    "(Tensor input, Tensor weights0, Tensor weights, Tensor biases, Tensor h0, "    \
    "Tensor c0, Tensor lengths, " LLTM_SCHEMA_SETTINGS ") -> (Tensor output, "    \
    "Tensor h_n, Tensor c_n, Tensor outputs, Tensor cells, Tensor gates)"
#define LLTM_SIGNATURE_STACK_BACKWARD_LENGTHS                                       \
    LLTM_SIGNATURE_STACK_BACKWARD_ARGS "Tensor lengths, "                           \
    LLTM_SCHEMA_STACK_OUTPUT_MASK LLTM_SIGNATURE_STACK_BACKWARD_RETURNS

/* LLTM_OPERATORS(X) calls X(name, signature, CPU kernel, CUDA kernel) for
 * every operator. Each comes twice: the public operator (lltm::cell_forward:
 * Python registers its autograd formula, lltm/_ops.py) and the same kernels
 * under the name with a leading underscore (lltm::_cell_forward), which no
 * autograd kernel is registered for. The autograd formulas call the
 * underscored ones, so the graphs torch.compile makes of them hold those,
 * and running a graph passes no Python on its way to the kernels (the
 * public operators' autograd kernel is a Python function, entered on every
 * call, with gradients needed or not). */
#define LLTM_OPERATORS_ONCE(X, prefix)                                              \
    X(prefix "cell_forward", LLTM_SIGNATURE_CELL_FORWARD,                           \
      lltm_cell_forward_cpu, lltm_cell_forward_cuda)                                \
    X(prefix "cell_backward", LLTM_SIGNATURE_CELL_BACKWARD,                         \
      lltm_cell_backward_cpu, lltm_cell_backward_cuda)                              \
    X(prefix "sequence_forward", LLTM_SIGNATURE_SEQUENCE_FORWARD,                   \
      lltm_sequence_forward_cpu_boxed, lltm_sequence_forward_cuda_boxed)            \
    X(prefix "sequence_backward", LLTM_SIGNATURE_SEQUENCE_BACKWARD,                 \
      lltm_sequence_backward_cpu_boxed, lltm_sequence_backward_cuda_boxed)          \
    X(prefix "sequence_forward.lengths", LLTM_SIGNATURE_SEQUENCE_FORWARD_LENGTHS,   \
      lltm_sequence_forward_cpu_boxed, lltm_sequence_forward_cuda_boxed)            \
    X(prefix "sequence_backward.lengths", LLTM_SIGNATURE_SEQUENCE_BACKWARD_LENGTHS, \
      lltm_sequence_backward_cpu_boxed, lltm_sequence_backward_cuda_boxed)          \
    X(prefix "sequence_backward_gates", LLTM_SIGNATURE_SEQUENCE_BACKWARD_GATES,     \
      lltm_sequence_backward_gates_cpu_boxed, lltm_sequence_backward_gates_cuda_boxed) \
    X(prefix "sequence_backward_gates.lengths",                                     \
      LLTM_SIGNATURE_SEQUENCE_BACKWARD_GATES_LENGTHS,                               \
      lltm_sequence_backward_gates_cpu_boxed, lltm_sequence_backward_gates_cuda_boxed) \
    X(prefix "stack_forward", LLTM_SIGNATURE_STACK_FORWARD,                         \
      lltm_stack_forward_cpu_boxed, lltm_stack_forward_cuda_boxed)                  \
    X(prefix "stack_backward", LLTM_SIGNATURE_STACK_BACKWARD,                       \
      lltm_stack_backward_cpu_boxed, lltm_stack_backward_cuda_boxed)                \
    X(prefix "stack_forward.lengths", LLTM_SIGNATURE_STACK_FORWARD_LENGTHS,         \
      lltm_stack_forward_cpu_boxed, lltm_stack_forward_cuda_boxed)                  \
    X(prefix "stack_backward.lengths", LLTM_SIGNATURE_STACK_BACKWARD_LENGTHS,       \
      lltm_stack_backward_cpu_boxed, lltm_stack_backward_cuda_boxed)
#define LLTM_OPERATORS(X) LLTM_OPERATORS_ONCE(X, "") LLTM_OPERATORS_ONCE(X, "_")

typedef void (*lltm_boxed_kernel)(StableIValue *stack, uint64_t num_args,
                                  uint64_t num_outputs);

/* The boxed kernels: CPU ones in liblltm.so, CUDA ones in liblltm_cuda.so. */
#define LLTM_DECLARE_KERNELS(name, signature, cpu, cuda)                              \
    void cpu(StableIValue *stack, uint64_t num_args, uint64_t num_outputs);         \
    void cuda(StableIValue *stack, uint64_t num_args, uint64_t num_outputs);
LLTM_OPERATORS_ONCE(LLTM_DECLARE_KERNELS, "")
#undef LLTM_DECLARE_KERNELS

#endif /* LLTM_BINDING_OPS_H */
