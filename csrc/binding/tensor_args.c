/* tensor_args.c - see tensor_args.h. */
#include "tensor_args.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int lltm_fail(lltm_error *err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return -1;
}

/* A shim call failed: say which, with torch's own message where this torch
 * can tell it (2.13+; before that it only went to stderr). */
int lltm_shim_failed(lltm_error *err, const char *call)
{
    const char *why = NULL;
    if (torch_exception_get_what_without_backtrace != NULL)
        why = torch_exception_get_what_without_backtrace();
    return lltm_fail(err, "%s failed%s%s", call, why ? ": " : "", why ? why : "");
}

int lltm_own(lltm_owned *owned, AtenTensorHandle handle, lltm_error *err)
{
    if (owned->count == LLTM_MAX_OWNED) {
        aoti_torch_delete_tensor_object(handle);
        return lltm_fail(err, "internal error: too many tensor handles");
    }
    owned->handles[owned->count++] = handle;
    return 0;
}

void lltm_free_owned(lltm_owned *owned)
{
    for (int i = 0; i < owned->count; ++i)
        aoti_torch_delete_tensor_object(owned->handles[i]);
    owned->count = 0;
}

void lltm_raise(const char *op, lltm_owned *owned, const lltm_error *err)
{
    char msg[sizeof err->msg + 64];
    snprintf(msg, sizeof msg, "%s: %s", op, err->msg);
    lltm_free_owned(owned);
    aoti_torch_check(false, op, __FILE__, __LINE__, msg);
}

int lltm_read_tensor(AtenTensorHandle handle, const char *name, lltm_tensor *t,
                     lltm_error *err)
{
    int64_t *sizes = NULL;
    bool defined = false;
    memset(t, 0, sizeof *t);
    t->handle = handle;
    t->name = name;
    /* An undefined tensor fails every other getter (with a C++ backtrace on
     * stderr before torch 2.13): ask first. */
    if (handle != NULL && aoti_torch_is_defined(handle, &defined) != 0)
        return lltm_shim_failed(err, "aoti_torch_is_defined");
    if (!defined)
        return lltm_fail(err, "%s is an undefined tensor (None); expected a tensor", name);
    if (aoti_torch_get_dim(handle, &t->dim) != 0)
        return lltm_shim_failed(err, "aoti_torch_get_dim");
    if (t->dim > LLTM_MAX_DIM)
        return lltm_fail(err, "%s must have at most %d dimensions, got %lld",
                         name, LLTM_MAX_DIM, (long long)t->dim);
    if (aoti_torch_get_sizes(handle, &sizes) != 0)
        return lltm_shim_failed(err, "aoti_torch_get_sizes");
    for (int64_t d = 0; d < t->dim; ++d)
        t->sizes[d] = sizes[d];
    if (aoti_torch_get_dtype(handle, &t->dtype) != 0 ||
        aoti_torch_get_device_type(handle, &t->device_type) != 0 ||
        aoti_torch_get_device_index(handle, &t->device_index) != 0 ||
        aoti_torch_is_contiguous(handle, &t->contiguous) != 0 ||
        aoti_torch_get_data_ptr(handle, &t->data) != 0)
        return lltm_shim_failed(err, "reading tensor metadata");
    return 0;
}

/* "[16, 32]" */
static const char *format_shape(const lltm_tensor *t, char *buf, size_t n)
{
    size_t used = (size_t)snprintf(buf, n, "[");
    for (int64_t d = 0; d < t->dim && used < n; ++d)
        used += (size_t)snprintf(buf + used, n - used, "%s%lld", d ? ", " : "",
                                 (long long)t->sizes[d]);
    if (used < n)
        snprintf(buf + used, n - used, "]");
    return buf;
}

int lltm_check_dim(const lltm_tensor *t, int64_t dim, const char *shape_doc,
                   lltm_error *err)
{
    char shape[96];
    if (t->dim != dim)
        return lltm_fail(err, "%s must be %lld-dimensional %s, got shape %s",
                         t->name, (long long)dim, shape_doc,
                         format_shape(t, shape, sizeof shape));
    return 0;
}

int lltm_check_size(const lltm_tensor *t, int64_t d, int64_t expected,
                    const char *what, lltm_error *err)
{
    char shape[96];
    if (t->sizes[d] != expected)
        return lltm_fail(err, "%s has size %lld in dimension %lld, expected %lld (%s); shape %s",
                         t->name, (long long)t->sizes[d], (long long)d,
                         (long long)expected, what,
                         format_shape(t, shape, sizeof shape));
    return 0;
}

static const char *dtype_name(int32_t code)
{
    if (code == aoti_torch_dtype_float32()) return "float32";
    if (code == aoti_torch_dtype_float64()) return "float64";
    if (code == aoti_torch_dtype_float16()) return "float16";
    if (code == aoti_torch_dtype_bfloat16()) return "bfloat16";
    return "a non-floating or unsupported dtype";
}

static const char *device_name(int32_t type)
{
    if (type == aoti_torch_device_type_cpu()) return "cpu";
    if (type == aoti_torch_device_type_cuda()) return "cuda";
    return "another device";
}

int lltm_core_dtype(const lltm_tensor *t, bool half_types_ok, lltm_dtype *out,
                    lltm_error *err)
{
    if (t->dtype == aoti_torch_dtype_float32()) { *out = LLTM_FLOAT32; return 0; }
    if (t->dtype == aoti_torch_dtype_float64()) { *out = LLTM_FLOAT64; return 0; }
    if (half_types_ok && t->dtype == aoti_torch_dtype_float16()) { *out = LLTM_FLOAT16; return 0; }
    if (half_types_ok && t->dtype == aoti_torch_dtype_bfloat16()) { *out = LLTM_BFLOAT16; return 0; }
    return lltm_fail(err, "%s has dtype %s; expected %s", t->name,
                     dtype_name(t->dtype),
                     half_types_ok ? "float32, float64, float16 or bfloat16"
                                   : "float32 or float64 on this device");
}

int lltm_check_same_dtype_device(const lltm_tensor *ts, int n,
                                 int32_t device_type, lltm_error *err)
{
    for (int k = 0; k < n; ++k) {
        if (ts[k].device_type != device_type ||
            ts[k].device_index != ts[0].device_index)
            return lltm_fail(err, "all tensors must be on one device: %s is on %s:%d, %s on %s:%d",
                             ts[0].name, device_name(ts[0].device_type), ts[0].device_index,
                             ts[k].name, device_name(ts[k].device_type), ts[k].device_index);
        if (ts[k].dtype != ts[0].dtype)
            return lltm_fail(err, "all tensors must have one dtype: %s is %s, %s is %s",
                             ts[0].name, dtype_name(ts[0].dtype), ts[k].name,
                             dtype_name(ts[k].dtype));
    }
    return 0;
}

int lltm_check_state_size(const lltm_tensor *state, int64_t H, lltm_error *err)
{
    if (H == 0)
        return lltm_fail(err, "%s has state size H = 0; expected H > 0", state->name);
    return 0;
}

/* input [B,I], weights [3H,I+H], bias [3H] or [1,3H], old_h [B,H], old_cell [B,H] */
int lltm_check_cell_forward(const lltm_tensor in[5], int32_t device_type,
                            bool half_types_ok, lltm_cell_dims *dims,
                            lltm_error *err)
{
    const lltm_tensor *input = &in[0], *weights = &in[1], *bias = &in[2],
                      *old_h = &in[3], *old_cell = &in[4];
    if (lltm_core_dtype(input, half_types_ok, &dims->dtype, err) ||
        lltm_check_same_dtype_device(in, 5, device_type, err) ||
        lltm_check_dim(input, 2, "[B, I]", err) ||
        lltm_check_dim(old_h, 2, "[B, H]", err) ||
        lltm_check_dim(weights, 2, "[3H, I+H]", err))
        return -1;
    dims->B = input->sizes[0];
    dims->I = input->sizes[1];
    dims->H = old_h->sizes[1];
    if (lltm_check_state_size(old_h, dims->H, err))
        return -1;
    const int64_t G = 3 * dims->H;
    if (lltm_check_size(old_h, 0, dims->B, "batch size B of input", err) ||
        lltm_check_dim(old_cell, 2, "[B, H]", err) ||
        lltm_check_size(old_cell, 0, dims->B, "batch size B of input", err) ||
        lltm_check_size(old_cell, 1, dims->H, "state size H of old_h", err) ||
        lltm_check_size(weights, 0, G, "3H, three gates of state size H of old_h", err) ||
        lltm_check_size(weights, 1, dims->I + dims->H,
                        "I+H, input features I of input plus state size H of old_h", err))
        return -1;
    return lltm_check_bias(bias, dims->H, err);
}

int lltm_check_bias(const lltm_tensor *bias, int64_t H, lltm_error *err)
{
    if (bias->dim == 2) {
        if (lltm_check_size(bias, 0, 1, "bias is [3H] or [1, 3H]", err))
            return -1;
    } else if (lltm_check_dim(bias, 1, "[3H] (or [1, 3H])", err)) {
        return -1;
    }
    return lltm_check_size(bias, bias->dim - 1, 3 * H, "3H, three gates of state size H", err);
}

int lltm_read_tensors(AtenTensorHandle *handles, const char *const *names, int n,
                      lltm_tensor *args, lltm_error *err)
{
    for (int k = 0; k < n; ++k)
        if (lltm_read_tensor(handles[k], names[k], &args[k], err))
            return -1;
    return 0;
}

int lltm_core_failed(lltm_error *err, const char *what, int status)
{
    return lltm_fail(err, "%s failed: %s", what, lltm_status_string(status));
}

/* grad_h [B,H], grad_cell [B,H], new_cell [B,H], gates [B,3H], input [B,I],
 * old_h [B,H], weights [3H,I+H] */
int lltm_check_cell_backward(const lltm_tensor in[7], int32_t device_type,
                             bool half_types_ok, lltm_cell_dims *dims,
                             lltm_error *err)
{
    const lltm_tensor *gates = &in[3], *input = &in[4], *old_h = &in[5],
                      *weights = &in[6];
    if (lltm_core_dtype(&in[0], half_types_ok, &dims->dtype, err) ||
        lltm_check_same_dtype_device(in, 7, device_type, err) ||
        lltm_check_dim(input, 2, "[B, I]", err) ||
        lltm_check_dim(old_h, 2, "[B, H]", err))
        return -1;
    dims->B = input->sizes[0];
    dims->I = input->sizes[1];
    dims->H = old_h->sizes[1];
    if (lltm_check_state_size(old_h, dims->H, err))
        return -1;
    for (int k = 0; k < 3; ++k)
        if (lltm_check_dim(&in[k], 2, "[B, H]", err) ||
            lltm_check_size(&in[k], 0, dims->B, "batch size B of input", err) ||
            lltm_check_size(&in[k], 1, dims->H, "state size H of old_h", err))
            return -1;
    return lltm_check_size(old_h, 0, dims->B, "batch size B of input", err) ||
           lltm_check_dim(gates, 2, "[B, 3H]", err) ||
           lltm_check_size(gates, 0, dims->B, "batch size B of input", err) ||
           lltm_check_size(gates, 1, 3 * dims->H, "3H", err) ||
           lltm_check_dim(weights, 2, "[3H, I+H]", err) ||
           lltm_check_size(weights, 0, 3 * dims->H, "3H", err) ||
           lltm_check_size(weights, 1, dims->I + dims->H, "I+H", err);
}

int lltm_empty(int64_t ndim, const int64_t *sizes, const lltm_tensor *like,
               lltm_owned *owned, AtenTensorHandle *out, void **data,
               lltm_error *err)
{
    int64_t strides[LLTM_MAX_DIM];
    int64_t step = 1;
    for (int64_t d = ndim - 1; d >= 0; --d) {
        strides[d] = step;
        step *= sizes[d] > 1 ? sizes[d] : 1;
    }
    if (aoti_torch_empty_strided(ndim, sizes, strides, like->dtype, like->device_type,
                                 like->device_index, out) != 0)
        return lltm_shim_failed(err, "aoti_torch_empty_strided");
    if (lltm_own(owned, *out, err))
        return -1;
    if (data != NULL && aoti_torch_get_data_ptr(*out, data) != 0)
        return lltm_shim_failed(err, "aoti_torch_get_data_ptr");
    return 0;
}

int lltm_workspace(size_t bytes, const lltm_tensor *like, lltm_owned *owned, void **data,
                   lltm_error *err)
{
    lltm_tensor bytes_like = *like;
    AtenTensorHandle handle;
    const int64_t sizes[1] = {bytes > 0 ? (int64_t)bytes : 1};
    bytes_like.dtype = aoti_torch_dtype_uint8();
    return lltm_empty(1, sizes, &bytes_like, owned, &handle, data, err);
}

int lltm_make_contiguous(lltm_tensor *t, lltm_owned *owned, lltm_error *err)
{
    AtenTensorHandle copy;
    if (t->contiguous)
        return 0;
    if (lltm_empty(t->dim, t->sizes, t, owned, &copy, &t->data, err))
        return -1;
    if (aoti_torch_copy_(copy, t->handle, 0) != 0)
        return lltm_shim_failed(err, "copying to a contiguous tensor");
    t->handle = copy;
    t->contiguous = true;
    return 0;
}

int lltm_make_all_contiguous(lltm_tensor *args, int n, lltm_owned *owned, lltm_error *err)
{
    for (int k = 0; k < n; ++k)
        if (lltm_make_contiguous(&args[k], owned, err))
            return -1;
    return 0;
}

int lltm_view_at(AtenTensorHandle self, int64_t ndim, const int64_t *sizes,
                 const int64_t *strides, int64_t offset, lltm_owned *owned,
                 AtenTensorHandle *out, lltm_error *err)
{
    /* The offset is relative to self's own storage offset. */
    if (aoti_torch__reinterpret_tensor(self, ndim, sizes, strides, offset, out) != 0)
        return lltm_shim_failed(err, "aoti_torch__reinterpret_tensor");
    return lltm_own(owned, *out, err);
}

int lltm_view(AtenTensorHandle self, int64_t ndim, const int64_t *sizes,
              const int64_t *strides, lltm_owned *owned, AtenTensorHandle *out,
              lltm_error *err)
{
    return lltm_view_at(self, ndim, sizes, strides, 0, owned, out, err);
}

int lltm_mm_out(AtenTensorHandle a, AtenTensorHandle b, AtenTensorHandle out,
                lltm_error *err)
{
    /* Direct calls into ATen's mm kernel where torch exports them: the
     * dispatcher route below costs a schema lookup and boxing per call. */
    int32_t device_type;
    if (aoti_torch_get_device_type(out, &device_type) != 0)
        return lltm_shim_failed(err, "aoti_torch_get_device_type");
    if (device_type == aoti_torch_device_type_cpu() && aoti_torch_cpu_mm_out) {
        if (aoti_torch_cpu_mm_out(out, a, b) != 0)
            return lltm_shim_failed(err, "aoti_torch_cpu_mm_out");
        return 0;
    }
#ifdef LLTM_WITH_CUDA
    if (device_type == aoti_torch_device_type_cuda() && aoti_torch_cuda_mm_out) {
        if (aoti_torch_cuda_mm_out(out, a, b) != 0)
            return lltm_shim_failed(err, "aoti_torch_cuda_mm_out");
        return 0;
    }
#endif
    /* The dispatcher consumes tensor arguments: pass new handles. */
    StableIValue stack[3];
    AtenTensorHandle args[3] = {a, b, out};
    for (int k = 0; k < 3; ++k) {
        AtenTensorHandle copy;
        if (aoti_torch_new_tensor_handle(args[k], &copy) != 0) {
            for (int j = 0; j < k; ++j)
                aoti_torch_delete_tensor_object((AtenTensorHandle)(uintptr_t)stack[j]);
            return lltm_shim_failed(err, "aoti_torch_new_tensor_handle");
        }
        stack[k] = (StableIValue)(uintptr_t)copy;
    }
    if (torch_call_dispatcher("aten::mm", "out", stack, LLTM_TORCH_TARGET_VERSION) != 0)
        return lltm_shim_failed(err, "aten::mm.out");
    /* mm.out returns its `out` argument as a new handle. */
    aoti_torch_delete_tensor_object((AtenTensorHandle)(uintptr_t)stack[0]);
    return 0;
}

void lltm_return(lltm_owned *owned, AtenTensorHandle handle, StableIValue *slot)
{
    for (int i = 0; i < owned->count; ++i) {
        if (owned->handles[i] == handle) {
            owned->handles[i] = owned->handles[--owned->count];
            break;
        }
    }
    *slot = (StableIValue)(uintptr_t)handle;
}

int lltm_take_inputs(StableIValue *stack, uint64_t num_args,
                     uint64_t num_outputs, uint64_t want_args,
                     uint64_t want_outputs, lltm_owned *owned,
                     AtenTensorHandle *handles, lltm_error *err)
{
    /* Own every handle first, so even a miscounted call frees its inputs. */
    for (uint64_t k = 0; k < num_args; ++k) {
        AtenTensorHandle h = (AtenTensorHandle)(uintptr_t)stack[k];
        if (lltm_own(owned, h, err))
            return -1;
        if (k < want_args)
            handles[k] = h;
    }
    if (num_args != want_args || num_outputs != want_outputs)
        return lltm_fail(err, "internal error: called with %llu arguments and %llu outputs, expected %llu and %llu",
                         (unsigned long long)num_args, (unsigned long long)num_outputs,
                         (unsigned long long)want_args, (unsigned long long)want_outputs);
    return 0;
}

static int32_t torch_dtype(lltm_dtype dtype)
{
    switch (dtype) {
    case LLTM_FLOAT32: return aoti_torch_dtype_float32();
    case LLTM_FLOAT64: return aoti_torch_dtype_float64();
    case LLTM_FLOAT16: return aoti_torch_dtype_float16();
    case LLTM_BFLOAT16: return aoti_torch_dtype_bfloat16();
    }
    return -1;
}

int lltm_torch_gemm(void *vctx, lltm_dtype dtype, int64_t M, int64_t N, int64_t K,
                    const void *a, int64_t a_rs, int64_t a_cs, const void *b, int64_t b_rs,
                    int64_t b_cs, void *c, int64_t ldc)
{
    const lltm_torch_gemm_ctx *ctx = (const lltm_torch_gemm_ctx *)vctx;
    const int64_t sizes[3][2] = {{M, K}, {K, N}, {M, N}};
    const int64_t strides[3][2] = {{a_rs, a_cs}, {b_rs, b_cs}, {ldc, 1}};
    void *data[3] = {(void *)a, (void *)b, c}; /* mm reads a and b only */
    AtenTensorHandle t[3] = {NULL, NULL, NULL};
    int failed = 0;
    for (int k = 0; k < 3 && !failed; ++k)
        if (aoti_torch_create_tensor_from_blob(data[k], 2, sizes[k], strides[k], 0,
                                               torch_dtype(dtype), ctx->device_type,
                                               ctx->device_index, &t[k]) != 0) {
            t[k] = NULL;
            failed = lltm_shim_failed(ctx->err, "aoti_torch_create_tensor_from_blob");
        }
    if (!failed)
        failed = lltm_mm_out(t[0], t[1], t[2], ctx->err);
    for (int k = 0; k < 3; ++k)
        if (t[k] != NULL)
            aoti_torch_delete_tensor_object(t[k]);
    return failed;
}

int lltm_open_op(StableIValue *stack, uint64_t num_args, uint64_t num_outputs, int n_in,
                 int n_out, const char *const *names, lltm_tensor *args, lltm_owned *owned,
                 lltm_error *err)
{
    AtenTensorHandle handles[LLTM_MAX_OWNED];
    if (n_in < 0 || n_in > LLTM_MAX_OWNED || n_out < 0)
        return lltm_fail(err, "internal error: %d inputs, %d outputs", n_in, n_out);
    if (lltm_take_inputs(stack, num_args, num_outputs, (uint64_t)n_in, (uint64_t)n_out, owned,
                         handles, err) ||
        lltm_read_tensors(handles, names, n_in, args, err) ||
        lltm_make_all_contiguous(args, n_in, owned, err))
        return -1;
    return 0;
}

/* The list of a `bool[n] output_mask` argument into mask[0..n); the kernel
 * owns the list: it is deleted on every path. */
static int read_output_mask(StableIValue item, int n, bool *mask, lltm_error *err)
{
    StableListHandle list = (StableListHandle)(uintptr_t)item;
    size_t size = 0;
    int failed = 0;
    if (torch_list_size(list, &size) != 0)
        failed = lltm_shim_failed(err, "torch_list_size");
    else if (size != (size_t)n)
        failed = lltm_fail(err, "output_mask has %zu entries, expected %d (one per gradient)",
                           size, n);
    for (size_t k = 0; !failed && k < size; ++k) {
        StableIValue value;
        if (torch_list_get_item(list, k, &value) != 0)
            failed = lltm_shim_failed(err, "torch_list_get_item");
        else
            mask[k] = value != 0;
    }
    if (torch_delete_list(list) != 0 && !failed)
        failed = lltm_shim_failed(err, "torch_delete_list");
    return failed;
}

int lltm_open_backward_op(StableIValue *stack, uint64_t num_args, uint64_t num_outputs,
                          int n_in, int n_out, const char *const *names, lltm_tensor *args,
                          bool *mask, lltm_owned *owned, lltm_error *err)
{
    lltm_error mask_err;
    const int bad_mask = num_args == 0
                             ? lltm_fail(&mask_err, "internal error: no output_mask")
                             : read_output_mask(stack[num_args - 1], n_out, mask, &mask_err);
    if (lltm_open_op(stack, num_args == 0 ? 0 : num_args - 1, num_outputs, n_in, n_out, names,
                     args, owned, err))
        return -1;
    if (bad_mask) {
        *err = mask_err;
        return -1;
    }
    return 0;
}

int lltm_return_masked(lltm_owned *owned, AtenTensorHandle *results, const bool *mask, int n,
                       StableIValue *stack, lltm_error *err)
{
    /* Every undefined tensor first: a failure then hands nothing out. */
    for (int k = 0; k < n; ++k) {
        if (mask[k])
            continue;
        if (aoti_torch_new_uninitialized_tensor(&results[k]) != 0)
            return lltm_shim_failed(err, "aoti_torch_new_uninitialized_tensor");
        if (lltm_own(owned, results[k], err))
            return -1;
    }
    for (int k = 0; k < n; ++k)
        lltm_return(owned, results[k], &stack[k]);
    lltm_free_owned(owned);
    return 0;
}

int lltm_torch_parallel_for(int64_t begin, int64_t end, int64_t grain,
                            lltm_range_body body, void *ctx)
{
    return torch_parallel_for(begin, end, grain, body, ctx);
}

#ifdef LLTM_WITH_CUDA
int lltm_cuda_enter_device(int32_t device_index, CUDAGuardHandle *guard, void **stream,
                           lltm_error *err)
{
    if (aoti_torch_create_cuda_guard(device_index, guard) != 0) {
        *guard = NULL;
        return lltm_fail(err, "could not make cuda:%d the current device", device_index);
    }
    if (aoti_torch_get_current_cuda_stream(device_index, stream) != 0)
        return lltm_fail(err, "could not get the current CUDA stream of cuda:%d", device_index);
    return 0;
}

void lltm_cuda_leave_device(CUDAGuardHandle guard)
{
    if (guard != NULL)
        aoti_torch_delete_cuda_guard(guard);
}
#endif
