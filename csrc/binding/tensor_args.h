/*
 * tensor_args.h - what every operator's boxed kernel shares: the opening
 * (own the inputs, read and check them against the operator's table of
 * shapes, allocate the results), the close (hand the results out) and the
 * raise, plus allocation, views and aten::mm through the stable ABI.
 *
 * Error convention: helpers return 0 on success, or nonzero after writing a
 * message into the call's lltm_error. A call collects every handle it owns
 * in one lltm_owned, and on failure frees them all before raising (raising
 * unwinds through C frames, so nothing after it runs).
 */
#ifndef LLTM_BINDING_TENSOR_ARGS_H
#define LLTM_BINDING_TENSOR_ARGS_H

#include "../core/lltm.h"
#include "torch_stable_abi.h"

#include <stdbool.h>
#include <stdint.h>

#define LLTM_MAX_DIM 4
#define LLTM_MAX_OWNED 48
#define LLTM_MAX_ARGS 12 /* tensor arguments of an operator, lengths included */
#define LLTM_MAX_RESULTS 6

typedef struct lltm_error {
    char msg[512];
} lltm_error;

/* Handles a call owns; freed together. */
typedef struct lltm_owned {
    AtenTensorHandle handles[LLTM_MAX_OWNED];
    int count;
} lltm_owned;

/* A tensor's metadata, read once. Pointers are borrowed from `handle`. */
typedef struct lltm_tensor {
    AtenTensorHandle handle;
    const char *name; /* the argument's name, for messages */
    int64_t dim;
    int64_t sizes[LLTM_MAX_DIM];
    int32_t dtype;       /* torch's code */
    int32_t device_type; /* torch's code */
    int32_t device_index;
    bool contiguous;
    void *data;
} lltm_tensor;

/* The sizes of a call (lltm.h's notation), read from its arguments: T steps
 * (1 for the cell), B rows, I inputs, H units, L layers (1 but for the stack). */
typedef struct lltm_dims {
    int64_t T, B, I, H, L;
    lltm_dtype dtype;
} lltm_dims;

/*
 * An operator's contract (ops.c): the name and shape of each tensor argument
 * and result, in the symbols T, B, I, H, L, 1, 2H, 3H, I+H, H+I, L-1 (e.g.
 * "[T, B, 3H]"); a shape may name another accepted form, "[3H] (or [1, 3H])".
 * Argument `input` gives T, B and I, argument `state` H and L; every
 * argument is then checked against them.
 */
/* A shape of an lltm_op as indices of its symbols (tensor_args.c), and its
 * other accepted form's (other_rank -1: none). */
typedef struct lltm_shape {
    int8_t rank, other_rank;
    int8_t symbols[LLTM_MAX_DIM], other[LLTM_MAX_DIM];
} lltm_shape;

typedef struct lltm_op_shapes {
    lltm_shape args[LLTM_MAX_ARGS], results[LLTM_MAX_RESULTS];
} lltm_op_shapes;

typedef struct lltm_op {
    const char *name; /* "lltm::cell_forward", for messages */
    int n_args, n_results, input, state;
    bool backward; /* `bool[n_results] output_mask` after the tensors */
    bool lengths;  /* an overload takes lengths [B] after the tensors */
    unsigned always; /* bits of the results made where output_mask leaves them out */
    unsigned kept;   /* bits of the results only a backward reads (LLTM_SETTING_INFERENCE) */
    const char *args[LLTM_MAX_ARGS][2]; /* name, shape */
    const char *results[LLTM_MAX_RESULTS][2];
    lltm_op_shapes *parsed; /* the shapes above, parsed once (lltm_op_parse) */
} lltm_op;

/* Parse op's shapes into op->parsed, once, before its kernels are
 * registered (no call reads them before): nonzero with a message in err
 * for a shape of a symbol the checks do not know. */
int lltm_op_parse(const lltm_op *op, char *err, size_t err_len);

extern const lltm_op lltm_cell_forward_op, lltm_cell_backward_op, lltm_sequence_forward_op,
    lltm_sequence_backward_op, lltm_sequence_backward_gates_op, lltm_stack_forward_op,
    lltm_stack_backward_op;

/* The core's matrix product (lltm_gemm) as aten::mm.out on tensors made
 * over the core's pointers, on the device of the context (the pointers are
 * that device's memory). The first failure's message goes to err. The
 * CUDA library's products (cublas_gemm.h) also read whether the call may
 * skip aten::mm (cublas_direct) and use TF32 for float32 there. */
typedef struct lltm_torch_gemm_ctx {
    int32_t device_type, device_index;
    lltm_error *err;
    bool cublas_direct, float32_tf32;
} lltm_torch_gemm_ctx;

#include "call_settings.h"

/* What a boxed kernel holds from its opening to its return. Lives on the
 * kernel's stack (the product callback's context points into it). */
typedef struct lltm_call {
    const lltm_op *op;
    lltm_owned owned;
    lltm_error err, gemm_err;
    lltm_tensor args[LLTM_MAX_ARGS]; /* lengths last in the lengths overloads */
    const int64_t *lengths;          /* [B] or NULL */
    lltm_dims d;
    lltm_call_settings settings; /* the call's last argument */
    bool mask[LLTM_MAX_RESULTS]; /* the results wanted: output_mask (forward: all) */
    AtenTensorHandle results[LLTM_MAX_RESULTS];
    void *data[LLTM_MAX_RESULTS]; /* NULL for a result not made */
    lltm_torch_gemm_ctx gemm;
#ifdef LLTM_WITH_CUDA
    CUDAGuardHandle guard;
    void *stream; /* torch's current stream of the arguments' device */
#endif
} lltm_call;

/* The opening of a kernel of `op` (or its lengths overload, told apart by
 * num_args): own every input, take the settings and the output_mask, read
 * the tensors (non-contiguous ones replaced by contiguous copies), check
 * them against op's table (one floating dtype, on this library's device
 * type; lengths: int64 [B], their values where they are in host memory),
 * allocate the results. The CUDA library then makes the arguments' device
 * current and takes torch's stream there (until lltm_close or
 * lltm_call_raise): every kernel, copy and product of the call runs on it. */
int lltm_open(lltm_call *c, const lltm_op *op, StableIValue *stack, uint64_t num_args,
              uint64_t num_outputs);

/* 0 where the core function `fn` returned LLTM_OK, else nonzero with the
 * failure in c->err (the product callback's own message where that failed). */
int lltm_core_status(lltm_call *c, int status, const char *fn);

/* Hand the results out as the op's outputs (undefined tensors, None in
 * Python, where output_mask leaves them out) and free what the call owns. */
int lltm_close(lltm_call *c, StableIValue *stack);

/* Free what the call owns, then raise RuntimeError("<op>: <c->err>"). */
void lltm_call_raise(lltm_call *c);

int lltm_fail(lltm_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* New uninitialised contiguous tensor like `like` (dtype, device), owned. */
int lltm_empty(int64_t ndim, const int64_t *sizes, const lltm_tensor *like, lltm_owned *owned,
               AtenTensorHandle *out, void **data, lltm_error *err);
/* New uninitialised byte tensor of `bytes` (at least 1) on the device of
 * the call's first argument, owned: workspace of a core function. */
int lltm_workspace(lltm_call *c, size_t bytes, void **data);

/* A view of `self` with the given sizes and strides, starting `offset`
 * elements after self's first element, owned. */
int lltm_view(AtenTensorHandle self, int64_t ndim, const int64_t *sizes, const int64_t *strides,
              int64_t offset, lltm_owned *owned, AtenTensorHandle *out, lltm_error *err);

/* out = a @ b through aten::mm.out (MKL / cuBLAS underneath). */
int lltm_mm_out(AtenTensorHandle a, AtenTensorHandle b, AtenTensorHandle out, lltm_error *err);

int lltm_torch_gemm(void *ctx, lltm_dtype dtype, int64_t M, int64_t N, int64_t K,
                    const void *a, int64_t a_rs, int64_t a_cs, const void *b, int64_t b_rs,
                    int64_t b_cs, void *c, int64_t ldc);

/* The core's parallel-for, run on torch's intra-op thread pool. */
int lltm_torch_parallel_for(int64_t begin, int64_t end, int64_t grain,
                            lltm_range_body body, void *ctx);

#ifdef LLTM_WITH_CUDA
/* The properties of `device` (asked once per device: what the device is)
 * and what settings `s` allow of them (dev->tf32, with each call);
 * sequence_cuda.c. */
int lltm_cuda_device_for(int device, const lltm_call_settings *s, lltm_cuda_device *dev);
#endif

#endif /* LLTM_BINDING_TENSOR_ARGS_H */
