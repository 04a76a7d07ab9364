/*
 * ops.c - each operator's arguments and results with their shapes (lltm_op,
 * tensor_args.h), in the order of its schema. register.c writes the schema
 * from them: the tensors, then `Tensor lengths` in a lengths overload, the
 * backward's output_mask, and `int settings=-1`, what the call runs with
 * (call_settings.h).
 *
 * The backward operators' output_mask (ATen's convention, as in
 * aten::convolution_backward) says which results to compute; the others are
 * not computed and come back undefined (None in Python).
 *
 * The lengths overloads (lltm::sequence_forward.lengths, ...) take lengths
 * [B] int64 on the input's device, each in [1, T]; row b stops after its
 * first lengths[b] steps (output 0 beyond them, h_n/c_n its state after
 * them; lltm.h).
 */
#include "tensor_args.h"

/* each operator's parsed shapes (lltm_op_parse): a static object of its own */
#define PARSED .parsed = &(lltm_op_shapes){.args = {{0}}}

const lltm_op lltm_cell_forward_op = {
    .name = "lltm::cell_forward", .n_args = 5, .n_results = 3, .input = 0, .state = 3,
    .args = {{"input", "[B, I]"}, {"weights", "[3H, I+H]"}, {"bias", "[3H] (or [1, 3H])"},
             {"old_h", "[B, H]"}, {"old_cell", "[B, H]"}},
    .results = {{"new_h", "[B, H]"}, {"new_cell", "[B, H]"}, {"gates", "[B, 3H]"}},
    PARSED,
};

/* The bias and old_cell gradients are made whatever output_mask says: the
 * gate-gradient pass writes them anyway. */
const lltm_op lltm_cell_backward_op = {
    .name = "lltm::cell_backward", .n_args = 7, .n_results = 5, .input = 4, .state = 5,
    .backward = true, .always = 1 << 2 | 1 << 4,
    .args = {{"grad_h", "[B, H]"}, {"grad_cell", "[B, H]"}, {"new_cell", "[B, H]"},
             {"gates", "[B, 3H]"}, {"input", "[B, I]"}, {"old_h", "[B, H]"},
             {"weights", "[3H, I+H]"}},
    .results = {{"grad_input", "[B, I]"}, {"grad_weights", "[3H, I+H]"},
                {"grad_bias", "[3H]"}, {"grad_old_h", "[B, H]"}, {"grad_old_cell", "[B, H]"}},
    PARSED,
};

/* One layer over a whole sequence: output = h_1..h_T, h_n/c_n = the last
 * state (h0/c0 when T == 0); cells and gates (activations) are kept for
 * the backward. */
const lltm_op lltm_sequence_forward_op = {
    .name = "lltm::sequence_forward", .n_args = 5, .n_results = 5, .input = 0, .state = 3,
    .lengths = true,
    .args = {{"input", "[T, B, I]"}, {"weights", "[3H, I+H]"}, {"bias", "[3H] (or [1, 3H])"},
             {"h0", "[B, H]"}, {"c0", "[B, H]"}},
    .results = {{"output", "[T, B, H]"}, {"h_n", "[B, H]"}, {"c_n", "[B, H]"},
                {"cells", "[T, B, H]"}, {"gates", "[T, B, 3H]"}},
    .kept = 1 << 3 | 1 << 4,
    PARSED,
};

#define SEQUENCE_BACKWARD_ARGS                                                              \
    .n_args = 9, .n_results = 5, .input = 3, .state = 5, .backward = true, .lengths = true, \
    .args = {{"grad_output", "[T, B, H]"}, {"grad_h_n", "[B, H]"}, {"grad_c_n", "[B, H]"},  \
             {"input", "[T, B, I]"}, {"weights", "[3H, I+H]"}, {"h0", "[B, H]"},            \
             {"output", "[T, B, H]"}, {"cells", "[T, B, H]"}, {"gates", "[T, B, 3H]"}}

const lltm_op lltm_sequence_backward_op = {
    .name = "lltm::sequence_backward", SEQUENCE_BACKWARD_ARGS,
    .results = {{"grad_input", "[T, B, I]"}, {"grad_weights", "[3H, I+H]"},
                {"grad_bias", "[3H]"}, {"grad_h0", "[B, H]"}, {"grad_c0", "[B, H]"}},
    PARSED,
};

/* sequence_backward with the gates' gradients dG out in place of
 * grad_weights, for a caller that forms dW = dG^T [h_prev | x] itself:
 * stacked layers run in time chunks form it once a layer
 * (lltm/_wavefront.py). */
const lltm_op lltm_sequence_backward_gates_op = {
    .name = "lltm::sequence_backward_gates", SEQUENCE_BACKWARD_ARGS,
    .results = {{"grad_input", "[T, B, I]"}, {"grad_gates", "[T, B, 3H]"},
                {"grad_bias", "[3H]"}, {"grad_h0", "[B, H]"}, {"grad_c0", "[B, H]"}},
    PARSED,
};

/* L stacked layers over a whole sequence, the layer below's output the
 * input of the layer above (I of every layer above the first = H):
 * weights0 of layer 0, weights and biases of the layers above; output the
 * top layer's, outputs the layers' below the top (the inputs of the layers
 * above), cells and gates kept for the backward. The same results as L
 * calls of sequence_forward, up to rounding; on CUDA one launch a direction
 * runs 2 or 3 layers of small sizes (csrc/core/lltm_stack.h). */
const lltm_op lltm_stack_forward_op = {
    .name = "lltm::stack_forward", .n_args = 6, .n_results = 6, .input = 0, .state = 4,
    .lengths = true,
    .args = {{"input", "[T, B, I]"}, {"weights0", "[3H, H+I]"}, {"weights", "[L-1, 3H, 2H]"},
             {"biases", "[L, 3H]"}, {"h0", "[L, B, H]"}, {"c0", "[L, B, H]"}},
    .results = {{"output", "[T, B, H]"}, {"h_n", "[L, B, H]"}, {"c_n", "[L, B, H]"},
                {"outputs", "[L-1, T, B, H]"}, {"cells", "[L, T, B, H]"},
                {"gates", "[L, T, B, 3H]"}},
    .kept = 1 << 4 | 1 << 5,
    PARSED,
};

const lltm_op lltm_stack_backward_op = {
    .name = "lltm::stack_backward", .n_args = 11, .n_results = 6, .input = 3, .state = 6,
    .backward = true, .lengths = true,
    .args = {{"grad_output", "[T, B, H]"}, {"grad_h_n", "[L, B, H]"},
             {"grad_c_n", "[L, B, H]"}, {"input", "[T, B, I]"}, {"weights0", "[3H, H+I]"},
             {"weights", "[L-1, 3H, 2H]"}, {"h0", "[L, B, H]"}, {"output", "[T, B, H]"},
             {"outputs", "[L-1, T, B, H]"}, {"cells", "[L, T, B, H]"},
             {"gates", "[L, T, B, 3H]"}},
    .results = {{"grad_input", "[T, B, I]"}, {"grad_weights0", "[3H, H+I]"},
                {"grad_weights", "[L-1, 3H, 2H]"}, {"grad_biases", "[L, 3H]"},
                {"grad_h0", "[L, B, H]"}, {"grad_c0", "[L, B, H]"}},
    PARSED,
};
