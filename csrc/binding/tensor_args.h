/*
 * tensor_args.h - helpers the op implementations share: owning tensor
 * handles, reading tensor metadata, argument checks with clear messages,
 * contiguous copies, views and aten::mm through the dispatcher.
 *
 * Error convention: helpers return 0 on success, or nonzero after writing a
 * message into the caller's lltm_error. An op collects every handle it owns
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

typedef struct lltm_error {
    char msg[512];
} lltm_error;

/* Handles an op owns; freed together. */
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

/* Sizes of one cell step, derived from the arguments. */
typedef struct lltm_cell_dims {
    int64_t B, I, H;
    lltm_dtype dtype;
} lltm_cell_dims;

int lltm_fail(lltm_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* A shim call failed: name it, with torch's message where this torch can tell
 * it (2.13+; before that it only went to stderr). */
int lltm_shim_failed(lltm_error *err, const char *call);

/* Take ownership of `handle`; fails (after deleting it) when full. */
int lltm_own(lltm_owned *owned, AtenTensorHandle handle, lltm_error *err);
void lltm_free_owned(lltm_owned *owned);

/* Free what the op owns, then raise RuntimeError("<op>: <msg>"). */
void lltm_raise(const char *op, lltm_owned *owned, const lltm_error *err);

/* Read metadata of `handle` (rank <= LLTM_MAX_DIM) into *t; an undefined
 * tensor (None) is an error naming the argument. */
int lltm_read_tensor(AtenTensorHandle handle, const char *name, lltm_tensor *t,
                     lltm_error *err);

/* Checks with messages that name the argument and what was expected. */
int lltm_check_dim(const lltm_tensor *t, int64_t dim, const char *shape_doc,
                   lltm_error *err);
int lltm_check_size(const lltm_tensor *t, int64_t d, int64_t expected,
                    const char *what, lltm_error *err);
/* All tensors: one floating dtype, one device of type `device_type`. */
int lltm_check_same_dtype_device(const lltm_tensor *ts, int n,
                                 int32_t device_type, lltm_error *err);
/* Map torch's dtype code to the core's; fails for dtypes the device lacks. */
int lltm_core_dtype(const lltm_tensor *t, bool half_types_ok, lltm_dtype *out,
                    lltm_error *err);

/* Validate the five forward arguments (input, weights, bias, old_h, old_cell)
 * and derive B, I, H. Bias may be [3H] or [1,3H]. */
int lltm_check_cell_forward(const lltm_tensor in[5], int32_t device_type,
                            bool half_types_ok, lltm_cell_dims *dims,
                            lltm_error *err);
/* Validate the seven backward arguments (grad_h, grad_cell, new_cell, gates,
 * input, old_h, weights). */
int lltm_check_cell_backward(const lltm_tensor in[7], int32_t device_type,
                             bool half_types_ok, lltm_cell_dims *dims,
                             lltm_error *err);

/* The state size H read from `state` ([B, H]) is at least 1: the one
 * zero-size rule of every op on every device (B, I and T may be 0). */
int lltm_check_state_size(const lltm_tensor *state, int64_t H, lltm_error *err);

/* Bias of three gates of state size H: [3H], or the tutorial's [1, 3H]. */
int lltm_check_bias(const lltm_tensor *bias, int64_t H, lltm_error *err);

/* Read the metadata of n argument handles, named for messages. */
int lltm_read_tensors(AtenTensorHandle *handles, const char *const *names, int n,
                      lltm_tensor *args, lltm_error *err);

/* Replace t by a contiguous copy (owned) if it is not contiguous. */
int lltm_make_contiguous(lltm_tensor *t, lltm_owned *owned, lltm_error *err);
/* The same for n tensors. */
int lltm_make_all_contiguous(lltm_tensor *args, int n, lltm_owned *owned, lltm_error *err);

/* A core function returned `status` (not LLTM_OK): say which and why. */
int lltm_core_failed(lltm_error *err, const char *what, int status);

#ifdef LLTM_WITH_CUDA
/* Make cuda:device_index current (until lltm_cuda_leave_device) and fetch
 * torch's current stream there: every kernel, copy and mm of an op runs on
 * it, so side streams and CUDA-graph capture see the op in order. */
int lltm_cuda_enter_device(int32_t device_index, CUDAGuardHandle *guard, void **stream,
                           lltm_error *err);
void lltm_cuda_leave_device(CUDAGuardHandle guard);
#endif

/* New uninitialised byte tensor of `bytes` (at least 1) on the device of
 * `like`, owned: workspace of a core function. */
int lltm_workspace(size_t bytes, const lltm_tensor *like, lltm_owned *owned, void **data,
                   lltm_error *err);

/* New uninitialised contiguous tensor like `like` (dtype, device), owned. */
int lltm_empty(int64_t ndim, const int64_t *sizes, const lltm_tensor *like,
               lltm_owned *owned, AtenTensorHandle *out, void **data,
               lltm_error *err);

/* A view of `self` with the given sizes and strides, starting `offset`
 * elements after self's first element, owned. */
int lltm_view_at(AtenTensorHandle self, int64_t ndim, const int64_t *sizes,
                 const int64_t *strides, int64_t offset, lltm_owned *owned,
                 AtenTensorHandle *out, lltm_error *err);
/* The same, at offset 0. */
int lltm_view(AtenTensorHandle self, int64_t ndim, const int64_t *sizes,
              const int64_t *strides, lltm_owned *owned, AtenTensorHandle *out,
              lltm_error *err);

/* out = a @ b through aten::mm.out (MKL / cuBLAS underneath). */
int lltm_mm_out(AtenTensorHandle a, AtenTensorHandle b, AtenTensorHandle out,
                lltm_error *err);

/* Hand `handle` out as an op result: removes it from `owned` and stores it on
 * the stack (libtorch takes it over). */
void lltm_return(lltm_owned *owned, AtenTensorHandle handle, StableIValue *slot);

/* Inputs of a boxed kernel: check the counts, then own every input handle so
 * each is freed on every path. */
int lltm_take_inputs(StableIValue *stack, uint64_t num_args,
                     uint64_t num_outputs, uint64_t want_args,
                     uint64_t want_outputs, lltm_owned *owned,
                     AtenTensorHandle *handles, lltm_error *err);

/* The opening of every op's boxed kernel, in one call: check the argument
 * and output counts and own every input handle (lltm_take_inputs), read the
 * metadata of the n_in inputs into args[0..n_in), named by names[] for
 * messages (lltm_read_tensors), and replace the non-contiguous ones by
 * contiguous copies (lltm_make_all_contiguous; owned). The op's own checks
 * of shapes, dtype and device follow (e.g. lltm_check_cell_forward). On
 * failure: nonzero, message in err, every handle in `owned`. */
int lltm_open_op(StableIValue *stack, uint64_t num_args, uint64_t num_outputs, int n_in,
                 int n_out, const char *const *names, lltm_tensor *args, lltm_owned *owned,
                 lltm_error *err);

/* The opening of a backward operator's kernel: lltm_open_op for its n_in
 * tensors, then its last argument, `bool[n_out] output_mask` (ATen's
 * convention, as in aten::convolution_backward: which results to compute),
 * into mask[0..n_out). */
int lltm_open_backward_op(StableIValue *stack, uint64_t num_args, uint64_t num_outputs,
                          int n_in, int n_out, const char *const *names, lltm_tensor *args,
                          bool *mask, lltm_owned *owned, lltm_error *err);

/* The close of a backward operator's kernel: results[k] where mask[k], an
 * undefined tensor (None in Python) elsewhere (results[k] is not read), out
 * as the op's n outputs, then free what the op owns. Nonzero (nothing handed
 * out) if an undefined tensor could not be made. */
int lltm_return_masked(lltm_owned *owned, AtenTensorHandle *results, const bool *mask, int n,
                       StableIValue *stack, lltm_error *err);

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
int lltm_torch_gemm(void *ctx, lltm_dtype dtype, int64_t M, int64_t N, int64_t K,
                    const void *a, int64_t a_rs, int64_t a_cs, const void *b, int64_t b_rs,
                    int64_t b_cs, void *c, int64_t ldc);

/* The core's parallel-for, run on torch's intra-op thread pool. */
int lltm_torch_parallel_for(int64_t begin, int64_t end, int64_t grain,
                            lltm_range_body body, void *ctx);

#endif /* LLTM_BINDING_TENSOR_ARGS_H */
