/*
 * sequence_args.h - what the CPU and CUDA kernels of lltm::sequence_forward
 * and lltm::sequence_backward share: argument checks and strided matrix
 * products on parts of a tensor (one time step, the W_h or W_x block of the
 * weights) without copies.
 */
#ifndef LLTM_BINDING_SEQUENCE_ARGS_H
#define LLTM_BINDING_SEQUENCE_ARGS_H

#include "call_settings.h"

/* Sizes of one layer over a sequence, derived from the arguments. */
typedef struct lltm_sequence_dims {
    int64_t T, B, I, H;
    lltm_dtype dtype;
} lltm_sequence_dims;

/* Argument order of the two operators (see ops.h). */
enum {
    LLTM_SEQ_FWD_INPUT, LLTM_SEQ_FWD_WEIGHTS, LLTM_SEQ_FWD_BIAS, LLTM_SEQ_FWD_H0,
    LLTM_SEQ_FWD_C0, LLTM_SEQ_FWD_NARGS
};
enum {
    LLTM_SEQ_BWD_GRAD_OUTPUT, LLTM_SEQ_BWD_GRAD_H_N, LLTM_SEQ_BWD_GRAD_C_N,
    LLTM_SEQ_BWD_INPUT, LLTM_SEQ_BWD_WEIGHTS, LLTM_SEQ_BWD_H0, LLTM_SEQ_BWD_OUTPUT,
    LLTM_SEQ_BWD_CELLS, LLTM_SEQ_BWD_GATES, LLTM_SEQ_BWD_NARGS
};

/* The lengths overloads take one argument more, lengths [B], last. */
extern const char *const lltm_sequence_forward_names[LLTM_SEQ_FWD_NARGS + 1];
extern const char *const lltm_sequence_backward_names[LLTM_SEQ_BWD_NARGS + 1];

/* lengths (the overloads' last argument): int64 [B] on `like`'s device;
 * with check_values (host memory) each in [1, T]. */
int lltm_check_lengths(const lltm_tensor *lengths, const lltm_tensor *like,
                       const lltm_sequence_dims *d, bool check_values, lltm_error *err);

/* input [T,B,I], weights [3H,I+H], bias [3H] or [1,3H], h0 [B,H], c0 [B,H] */
int lltm_check_sequence_forward(const lltm_tensor in[LLTM_SEQ_FWD_NARGS],
                                int32_t device_type, bool half_types_ok,
                                lltm_sequence_dims *dims, lltm_error *err);

/* grad_output [T,B,H], grad_h_n [B,H], grad_c_n [B,H], input [T,B,I],
 * weights [3H,I+H], h0 [B,H], output [T,B,H], cells [T,B,H], gates [T,B,3H] */
int lltm_check_sequence_backward(const lltm_tensor in[LLTM_SEQ_BWD_NARGS],
                                 int32_t device_type, bool half_types_ok,
                                 lltm_sequence_dims *dims, lltm_error *err);

/* Which operator a kernel serves: the forward, the backward, or the
 * backward that hands out dG [T,B,3H] (the gates' gradients) in place of
 * grad_weights, for a caller that forms dW itself
 * (lltm::sequence_backward_gates). */
typedef enum lltm_sequence_op {
    LLTM_SEQ_FORWARD, LLTM_SEQ_BACKWARD, LLTM_SEQ_BACKWARD_GATES
} lltm_sequence_op;

/* The five results of either operator, new and uninitialised, like the first
 * argument: sequence_forward's output [T,B,H], h_n [B,H], c_n [B,H], cells
 * [T,B,H], gates [T,B,3H]; sequence_backward's grad_input [T,B,I],
 * grad_weights [3H,I+H], grad_bias [3H], grad_h0 [B,H], grad_c0 [B,H], those
 * its output_mask leaves out not made (data NULL). */
typedef struct lltm_sequence_results {
    AtenTensorHandle tensors[5];
    void *data[5];
} lltm_sequence_results;

/* What a kernel of either operator holds from its opening to its return, on
 * either device: the inputs, the sizes, the results, the core's tensor
 * struct pointing at both, and the matrix-product callback's context. Lives
 * on the kernel's stack (the callback context points into it). */
typedef struct lltm_sequence_call {
    bool backward, gate_grads; /* gate_grads: LLTM_SEQ_BACKWARD_GATES */
    bool mask[5]; /* the results wanted: the backward's output_mask (forward: all) */
    lltm_owned owned;
    lltm_error err, gemm_err;
    lltm_tensor args[LLTM_SEQ_BWD_NARGS + 1]; /* the forward's: the first five;
                                              * the lengths overloads': lengths last */
    lltm_sequence_dims d;
    lltm_call_settings settings; /* the call's last argument */
    lltm_sequence_results results;
    lltm_sequence_forward_tensors forward_tensors;   /* filled for sequence_forward */
    lltm_sequence_backward_tensors backward_tensors; /* for sequence_backward */
    lltm_torch_gemm_ctx gemm;
} lltm_sequence_call;

/* The opening of either operator's kernel (or its lengths overload, told
 * apart by num_args): take the arguments off the stack (the settings into
 * c->settings) and check them for
 * `device_type` (lengths: their values on the CPU only, where they are in
 * host memory), allocate the five results and point the core's tensor
 * struct at the arguments and results. On failure: nonzero,
 * message in c->err, every handle in c->owned (lltm_raise frees them). */
int lltm_sequence_open(lltm_sequence_call *c, lltm_sequence_op op, StableIValue *stack,
                       uint64_t num_args, uint64_t num_outputs, int32_t device_type);

/* The close after the core call `core_fn` returned `status`: on LLTM_OK hand
 * the results out as the op's outputs (None where not wanted), free what the
 * op owns and return 0;
 * otherwise nonzero with the failure in c->err (the matrix-product
 * callback's own message where that failed). */
int lltm_sequence_close(lltm_sequence_call *c, int status, const char *core_fn,
                        StableIValue *stack);

/* The failure of the core call `core_fn` that returned `status` (not
 * LLTM_OK) into err: the matrix-product callback's own message (gemm_err)
 * where that failed. Returns nonzero. */
int lltm_sequence_core_failed(lltm_error *err, const lltm_error *gemm_err, const char *core_fn,
                              int status);

/* The operator's name, for lltm_raise. */
static inline const char *lltm_sequence_op_name(const lltm_sequence_call *c)
{
    return c->gate_grads ? "lltm::sequence_backward_gates"
           : c->backward ? "lltm::sequence_backward"
                         : "lltm::sequence_forward";
}

/* A matrix inside a tensor's storage: element (r, c) at
 * offset + r*row_stride + c*col_stride elements from the tensor's start. */
typedef struct lltm_matrix {
    AtenTensorHandle base;
    int64_t offset, rows, cols, row_stride, col_stride;
} lltm_matrix;

/* A row-major [rows, cols] block starting `offset` elements into `base`. */
static inline lltm_matrix lltm_rows(AtenTensorHandle base, int64_t offset,
                                    int64_t rows, int64_t cols, int64_t row_stride)
{
    lltm_matrix m = {base, offset, rows, cols, row_stride, 1};
    return m;
}

/* The transpose of m (a view, no copy). */
static inline lltm_matrix lltm_transposed(lltm_matrix m)
{
    lltm_matrix t = {m.base, m.offset, m.cols, m.rows, m.col_stride, m.row_stride};
    return t;
}

/* out = a @ b through aten::mm.out on views of the three (no copies of
 * strided operands where BLAS can read them as they are). */
int lltm_mm_matrices(const lltm_matrix *a, const lltm_matrix *b,
                     const lltm_matrix *out, lltm_error *err);

#endif /* LLTM_BINDING_SEQUENCE_ARGS_H */
