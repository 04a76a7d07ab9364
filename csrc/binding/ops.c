/* ops.c - each operator's arguments and results (lltm_op, tensor_args.h),
 * in the order of its schema (ops.h). */
#include "tensor_args.h"

const lltm_op lltm_cell_forward_op = {
    .name = "lltm::cell_forward", .n_args = 5, .n_results = 3, .input = 0, .state = 3,
    .args = {{"input", "[B, I]"}, {"weights", "[3H, I+H]"}, {"bias", "[3H] (or [1, 3H])"},
             {"old_h", "[B, H]"}, {"old_cell", "[B, H]"}},
    .results = {"[B, H]", "[B, H]", "[B, 3H]"},
};

/* The bias and old_cell gradients are made whatever output_mask says: the
 * gate-gradient pass writes them anyway. */
const lltm_op lltm_cell_backward_op = {
    .name = "lltm::cell_backward", .n_args = 7, .n_results = 5, .input = 4, .state = 5,
    .backward = true, .always = 1 << 2 | 1 << 4,
    .args = {{"grad_h", "[B, H]"}, {"grad_cell", "[B, H]"}, {"new_cell", "[B, H]"},
             {"gates", "[B, 3H]"}, {"input", "[B, I]"}, {"old_h", "[B, H]"},
             {"weights", "[3H, I+H]"}},
    .results = {"[B, I]", "[3H, I+H]", "[3H]", "[B, H]", "[B, H]"},
};

const lltm_op lltm_sequence_forward_op = {
    .name = "lltm::sequence_forward", .n_args = 5, .n_results = 5, .input = 0, .state = 3,
    .lengths = true,
    .args = {{"input", "[T, B, I]"}, {"weights", "[3H, I+H]"}, {"bias", "[3H] (or [1, 3H])"},
             {"h0", "[B, H]"}, {"c0", "[B, H]"}},
    .results = {"[T, B, H]", "[B, H]", "[B, H]", "[T, B, H]", "[T, B, 3H]"},
};

#define SEQUENCE_BACKWARD_ARGS                                                          \
    .n_args = 9, .n_results = 5, .input = 3, .state = 5, .backward = true, .lengths = true, \
    .args = {{"grad_output", "[T, B, H]"}, {"grad_h_n", "[B, H]"}, {"grad_c_n", "[B, H]"},  \
             {"input", "[T, B, I]"}, {"weights", "[3H, I+H]"}, {"h0", "[B, H]"},            \
             {"output", "[T, B, H]"}, {"cells", "[T, B, H]"}, {"gates", "[T, B, 3H]"}}

const lltm_op lltm_sequence_backward_op = {
    .name = "lltm::sequence_backward", SEQUENCE_BACKWARD_ARGS,
    .results = {"[T, B, I]", "[3H, I+H]", "[3H]", "[B, H]", "[B, H]"},
};

/* grad_gates [T,B,3H] in grad_weights' place */
const lltm_op lltm_sequence_backward_gates_op = {
    .name = "lltm::sequence_backward_gates", SEQUENCE_BACKWARD_ARGS,
    .results = {"[T, B, I]", "[T, B, 3H]", "[3H]", "[B, H]", "[B, H]"},
};

const lltm_op lltm_stack_forward_op = {
    .name = "lltm::stack_forward", .n_args = 6, .n_results = 6, .input = 0, .state = 4,
    .lengths = true,
    .args = {{"input", "[T, B, I]"}, {"weights0", "[3H, H+I]"}, {"weights", "[L-1, 3H, 2H]"},
             {"biases", "[L, 3H]"}, {"h0", "[L, B, H]"}, {"c0", "[L, B, H]"}},
    .results = {"[T, B, H]", "[L, B, H]", "[L, B, H]", "[L-1, T, B, H]", "[L, T, B, H]",
                "[L, T, B, 3H]"},
};

const lltm_op lltm_stack_backward_op = {
    .name = "lltm::stack_backward", .n_args = 11, .n_results = 6, .input = 3, .state = 6,
    .backward = true, .lengths = true,
    .args = {{"grad_output", "[T, B, H]"}, {"grad_h_n", "[L, B, H]"},
             {"grad_c_n", "[L, B, H]"}, {"input", "[T, B, I]"}, {"weights0", "[3H, H+I]"},
             {"weights", "[L-1, 3H, 2H]"}, {"h0", "[L, B, H]"}, {"output", "[T, B, H]"},
             {"outputs", "[L-1, T, B, H]"}, {"cells", "[L, T, B, H]"},
             {"gates", "[L, T, B, 3H]"}},
    .results = {"[T, B, I]", "[3H, H+I]", "[L-1, 3H, 2H]", "[L, 3H]", "[L, B, H]", "[L, B, H]"},
};
