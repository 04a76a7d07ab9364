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

/* A shim call failed: name it, with torch's message where this torch can tell
 * it (2.13+; before that it only went to stderr). */
static int shim_failed(lltm_error *err, const char *call)
{
    const char *why = NULL;
    if (torch_exception_get_what_without_backtrace != NULL)
        why = torch_exception_get_what_without_backtrace();
    return lltm_fail(err, "%s failed%s%s", call, why ? ": " : "", why ? why : "");
}

/* Take ownership of `handle`; fails (after deleting it) when full. */
static int own(lltm_owned *owned, AtenTensorHandle handle, lltm_error *err)
{
    if (owned->count == LLTM_MAX_OWNED) {
        aoti_torch_delete_tensor_object(handle);
        return lltm_fail(err, "internal error: too many tensor handles");
    }
    owned->handles[owned->count++] = handle;
    return 0;
}

static void free_owned(lltm_owned *owned)
{
    for (int i = 0; i < owned->count; ++i)
        aoti_torch_delete_tensor_object(owned->handles[i]);
    owned->count = 0;
}

static int read_tensor(AtenTensorHandle handle, const char *name, lltm_tensor *t,
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
        return shim_failed(err, "aoti_torch_is_defined");
    if (!defined)
        return lltm_fail(err, "%s is an undefined tensor (None); expected a tensor", name);
    if (aoti_torch_get_dim(handle, &t->dim) != 0)
        return shim_failed(err, "aoti_torch_get_dim");
    if (t->dim > LLTM_MAX_DIM)
        return lltm_fail(err, "%s must have at most %d dimensions, got %lld",
                         name, LLTM_MAX_DIM, (long long)t->dim);
    if (aoti_torch_get_sizes(handle, &sizes) != 0)
        return shim_failed(err, "aoti_torch_get_sizes");
    for (int64_t d = 0; d < t->dim; ++d)
        t->sizes[d] = sizes[d];
    if (aoti_torch_get_dtype(handle, &t->dtype) != 0 ||
        aoti_torch_get_device_type(handle, &t->device_type) != 0 ||
        aoti_torch_get_device_index(handle, &t->device_index) != 0 ||
        aoti_torch_is_contiguous(handle, &t->contiguous) != 0 ||
        aoti_torch_get_data_ptr(handle, &t->data) != 0)
        return shim_failed(err, "reading tensor metadata");
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

/* torch's code of each lltm_dtype (0 - 3: float32, float64, float16, bfloat16) */
static int32_t torch_dtype(int dtype)
{
    const int32_t codes[] = {aoti_torch_dtype_float32(), aoti_torch_dtype_float64(),
                             aoti_torch_dtype_float16(), aoti_torch_dtype_bfloat16()};
    return codes[dtype];
}

static const char *dtype_name(int32_t code)
{
    static const char *const names[] = {"float32", "float64", "float16", "bfloat16"};
    for (int k = 0; k < 4; ++k)
        if (code == torch_dtype(k))
            return names[k];
    return "a non-floating or unsupported dtype";
}

static const char *device_name(int32_t type)
{
    if (type == aoti_torch_device_type_cpu()) return "cpu";
    if (type == aoti_torch_device_type_cuda()) return "cuda";
    return "another device";
}

/* The first argument's dtype as the core's; then every argument of that
 * dtype on one device of `device_type`. */
static int check_dtype_device(const lltm_tensor *ts, int n, int32_t device_type,
                              lltm_dtype *dtype, lltm_error *err)
{
    int k = 0;
    while (k < 4 && ts[0].dtype != torch_dtype(k))
        ++k;
    if (k == 4)
        return lltm_fail(err, "%s has dtype %s; expected float32, float64, float16 or bfloat16",
                         ts[0].name, dtype_name(ts[0].dtype));
    *dtype = (lltm_dtype)k;
    for (k = 0; k < n; ++k) {
        if (ts[k].device_type != device_type || ts[k].device_index != ts[0].device_index)
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

/* The symbols of the operators' shapes (lltm_op), with what each size is
 * for messages (%s: the state argument's name). The first five are the
 * sizes the arguments input and state give. */
static const struct {
    const char *symbol, *what;
} SIZES[] = {
    {"T", "sequence length T of input"},
    {"B", "batch size B of input"},
    {"I", "input features I of input"},
    {"H", "state size H of %s"},
    {"L", "layers L of %s"},
    {"1", "1, a single row"},
    {"2H", "2H, state then input of a layer above the first"},
    {"3H", "3H, three gates of state size H of %s"},
    {"I+H", "I+H, input features I of input plus state size H of %s"},
    {"H+I", "H+I, state size H of %s plus input features I of input"},
    {"L-1", "L-1, one less than the layers L of %s"},
};
enum { N_LETTERS = 5, N_SIZES = sizeof SIZES / sizeof SIZES[0] };

/* The k-th symbol of the tables' shapes and what it is (for lltm/_ops.py's
 * fake kernels); NULL past the last. */
__attribute__((visibility("default"))) const char *lltm_size_symbol(int k, const char **what)
{
    if (k < 0 || k >= N_SIZES)
        return NULL;
    *what = SIZES[k].what;
    return SIZES[k].symbol;
}

/* The value of each of SIZES for the sizes d. */
static void size_values(const lltm_dims *d, int64_t value[N_SIZES])
{
    const int64_t v[N_SIZES] = {d->T,     d->B,     d->I,        d->H,        d->L,    1,
                                2 * d->H, 3 * d->H, d->I + d->H, d->H + d->I, d->L - 1};
    memcpy(value, v, sizeof v);
}

/* The symbols of the first shape at or after `shape` ("[T, B, 3H]") as
 * indices of SIZES; its rank, or -1 for a symbol SIZES lacks. */
static int parse_shape(const char *shape, int8_t symbols[LLTM_MAX_DIM])
{
    int rank = 0;
    for (const char *p = strchr(shape, '['); p != NULL && (*p == '[' || *p == ','); ++rank) {
        p += 1 + strspn(p + 1, " ");
        const size_t len = strcspn(p, ",]");
        int s = 0;
        while (s < N_SIZES && (strlen(SIZES[s].symbol) != len || strncmp(SIZES[s].symbol, p, len)))
            ++s;
        if (s == N_SIZES || rank == LLTM_MAX_DIM)
            return -1;
        symbols[rank] = (int8_t)s;
        p += len;
    }
    return rank;
}

/* `text` parsed, with its other form ("(or [1, 3H])"); nonzero for a
 * symbol SIZES lacks. */
static int parse_forms(const char *text, lltm_shape *shape)
{
    const char *other = strstr(text, "(or ");
    shape->rank = (int8_t)parse_shape(text, shape->symbols);
    shape->other_rank = other ? (int8_t)parse_shape(other, shape->other) : -1;
    return shape->rank < 0 || (other && shape->other_rank < 0);
}

int lltm_op_parse(const lltm_op *op, char *err, size_t err_len)
{
    for (int k = 0; k < op->n_args + op->n_results; ++k) {
        const bool arg = k < op->n_args;
        const char *text = arg ? op->args[k][1] : op->results[k - op->n_args][1];
        if (parse_forms(text, arg ? &op->parsed->args[k]
                                  : &op->parsed->results[k - op->n_args])) {
            snprintf(err, err_len, "%s: a shape of unknown symbols, %s", op->name, text);
            return -1;
        }
    }
    return 0;
}

/* The symbols of t's shape: the form of argument k's shape of t's rank,
 * else NULL with the message of a wrong rank. */
static const int8_t *shape_of(const lltm_op *op, int k, const lltm_tensor *t, lltm_error *err)
{
    const lltm_shape *shape = &op->parsed->args[k];
    char got[96];
    if (shape->rank == t->dim)
        return shape->symbols;
    if (shape->other_rank == t->dim)
        return shape->other;
    lltm_fail(err, "%s must be %lld-dimensional %s, got shape %s", t->name,
              (long long)shape->rank, op->args[k][1], format_shape(t, got, sizeof got));
    return NULL;
}

/* The arguments against the operator's table: sizes from input and state
 * (H >= 1, L >= 1: the one zero-size rule of every op on every device; B, I
 * and T may be 0), then every argument's shape. */
static int check_args(lltm_call *c, int32_t device_type)
{
    const lltm_op *op = c->op;
    const lltm_tensor *a = c->args;
    const char *state = op->args[op->state][0];
    lltm_dims *d = &c->d;
    int64_t *letters[N_LETTERS] = {&d->T, &d->B, &d->I, &d->H, &d->L};
    bool bound[N_LETTERS] = {false};
    const int sources[2] = {op->input, op->state};
    const int8_t *symbols;
    if (check_dtype_device(a, op->n_args, device_type, &d->dtype, &c->err))
        return -1;
    d->T = d->L = 1;
    for (int i = 0; i < 2; ++i) {
        const int k = sources[i];
        if (!(symbols = shape_of(op, k, &a[k], &c->err)))
            return -1;
        for (int j = 0; j < a[k].dim; ++j)
            if (symbols[j] < N_LETTERS && !bound[symbols[j]]) {
                *letters[symbols[j]] = a[k].sizes[j];
                bound[symbols[j]] = true;
            }
    }
    if (d->L < 1)
        return lltm_fail(&c->err, "%s holds L = 0 layers; expected at least one", state);
    if (d->H == 0)
        return lltm_fail(&c->err, "%s has state size H = 0; expected H > 0", state);
    int64_t value[N_SIZES];
    size_values(d, value);
    for (int i = -1; i < op->n_args; ++i) { /* the state's batch size first */
        const int k = i < 0 ? op->state : i;
        if (!(symbols = shape_of(op, k, &a[k], &c->err)))
            return -1;
        for (int j = 0; j < a[k].dim; ++j) {
            char what[160], got[96];
            if (a[k].sizes[j] == value[symbols[j]])
                continue;
            snprintf(what, sizeof what, SIZES[symbols[j]].what, state);
            return lltm_fail(&c->err,
                             "%s has size %lld in dimension %d, expected %lld (%s); shape %s",
                             a[k].name, (long long)a[k].sizes[j], j,
                             (long long)value[symbols[j]], what,
                             format_shape(&a[k], got, sizeof got));
        }
    }
    return 0;
}

/* lengths: int64 [B] on the first argument's device; with check_values
 * (host memory) each in [1, T]. */
static int check_lengths(const lltm_tensor *lengths, const lltm_tensor *like,
                         const lltm_dims *d, bool check_values, lltm_error *err)
{
    if (lengths->dtype != aoti_torch_dtype_int64() || lengths->dim != 1 ||
        lengths->sizes[0] != d->B)
        return lltm_fail(err,
                         "lengths must be an int64 tensor of shape [%lld] (one length per "
                         "batch row B of input), got %s of %lld dimensions, first size %lld",
                         (long long)d->B,
                         lengths->dtype == aoti_torch_dtype_int64() ? "int64"
                                                                    : "another dtype",
                         (long long)lengths->dim,
                         (long long)(lengths->dim > 0 ? lengths->sizes[0] : 0));
    if (lengths->device_type != like->device_type ||
        lengths->device_index != like->device_index)
        return lltm_fail(err, "lengths must be on the device of %s", like->name);
    if (!check_values)
        return 0;
    const int64_t *values = (const int64_t *)lengths->data;
    for (int64_t b = 0; b < d->B; ++b)
        if (values[b] < 1 || values[b] > d->T)
            return lltm_fail(err,
                             "lengths[%lld] = %lld; every length must be in [1, T] with T = "
                             "%lld steps in input",
                             (long long)b, (long long)values[b], (long long)d->T);
    return 0;
}

int lltm_empty(int64_t ndim, const int64_t *sizes, const lltm_tensor *like, lltm_owned *owned,
               AtenTensorHandle *out, void **data, lltm_error *err)
{
    int64_t strides[LLTM_MAX_DIM];
    int64_t step = 1;
    for (int64_t d = ndim - 1; d >= 0; --d) {
        strides[d] = step;
        step *= sizes[d] > 1 ? sizes[d] : 1;
    }
    if (aoti_torch_empty_strided(ndim, sizes, strides, like->dtype, like->device_type,
                                 like->device_index, out) != 0)
        return shim_failed(err, "aoti_torch_empty_strided");
    if (own(owned, *out, err))
        return -1;
    if (data != NULL && aoti_torch_get_data_ptr(*out, data) != 0)
        return shim_failed(err, "aoti_torch_get_data_ptr");
    return 0;
}

int lltm_workspace(lltm_call *c, size_t bytes, void **data)
{
    lltm_tensor bytes_like = c->args[0];
    AtenTensorHandle handle;
    const int64_t sizes[1] = {bytes > 0 ? (int64_t)bytes : 1};
    bytes_like.dtype = aoti_torch_dtype_uint8();
    return lltm_empty(1, sizes, &bytes_like, &c->owned, &handle, data, &c->err);
}

/* Replace t by a contiguous copy (owned) if it is not contiguous. */
static int make_contiguous(lltm_tensor *t, lltm_owned *owned, lltm_error *err)
{
    AtenTensorHandle copy;
    if (t->contiguous)
        return 0;
    if (lltm_empty(t->dim, t->sizes, t, owned, &copy, &t->data, err))
        return -1;
    if (aoti_torch_copy_(copy, t->handle, 0) != 0)
        return shim_failed(err, "copying to a contiguous tensor");
    t->handle = copy;
    t->contiguous = true;
    return 0;
}

int lltm_view(AtenTensorHandle self, int64_t ndim, const int64_t *sizes, const int64_t *strides,
              int64_t offset, lltm_owned *owned, AtenTensorHandle *out, lltm_error *err)
{
    /* The offset is relative to self's own storage offset. */
    if (aoti_torch__reinterpret_tensor(self, ndim, sizes, strides, offset, out) != 0)
        return shim_failed(err, "aoti_torch__reinterpret_tensor");
    return own(owned, *out, err);
}

int lltm_mm_out(AtenTensorHandle a, AtenTensorHandle b, AtenTensorHandle out,
                lltm_error *err)
{
    /* Direct calls into ATen's mm kernel where torch exports them: the
     * dispatcher route below costs a schema lookup and boxing per call. */
    int32_t device_type;
    if (aoti_torch_get_device_type(out, &device_type) != 0)
        return shim_failed(err, "aoti_torch_get_device_type");
    if (device_type == aoti_torch_device_type_cpu() && aoti_torch_cpu_mm_out) {
        if (aoti_torch_cpu_mm_out(out, a, b) != 0)
            return shim_failed(err, "aoti_torch_cpu_mm_out");
        return 0;
    }
#ifdef LLTM_WITH_CUDA
    if (device_type == aoti_torch_device_type_cuda() && aoti_torch_cuda_mm_out) {
        if (aoti_torch_cuda_mm_out(out, a, b) != 0)
            return shim_failed(err, "aoti_torch_cuda_mm_out");
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
            return shim_failed(err, "aoti_torch_new_tensor_handle");
        }
        stack[k] = (StableIValue)(uintptr_t)copy;
    }
    if (torch_call_dispatcher("aten::mm", "out", stack, LLTM_TORCH_TARGET_VERSION) != 0)
        return shim_failed(err, "aten::mm.out");
    /* mm.out returns its `out` argument as a new handle. */
    aoti_torch_delete_tensor_object((AtenTensorHandle)(uintptr_t)stack[0]);
    return 0;
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
            failed = shim_failed(ctx->err, "aoti_torch_create_tensor_from_blob");
        }
    if (!failed)
        failed = lltm_mm_out(t[0], t[1], t[2], ctx->err);
    for (int k = 0; k < 3; ++k)
        if (t[k] != NULL)
            aoti_torch_delete_tensor_object(t[k]);
    return failed;
}

/* The list of a `bool[n] output_mask` argument into mask[0..n); the kernel
 * owns the list: it is deleted on every path. */
static int read_output_mask(StableIValue item, int n, bool *mask, lltm_error *err)
{
    StableListHandle list = (StableListHandle)(uintptr_t)item;
    size_t size = 0;
    int failed = 0;
    if (torch_list_size(list, &size) != 0)
        failed = shim_failed(err, "torch_list_size");
    else if (size != (size_t)n)
        failed = lltm_fail(err, "output_mask has %zu entries, expected %d (one per gradient)",
                           size, n);
    for (size_t k = 0; !failed && k < size; ++k) {
        StableIValue value;
        if (torch_list_get_item(list, k, &value) != 0)
            failed = shim_failed(err, "torch_list_get_item");
        else
            mask[k] = value != 0;
    }
    if (torch_delete_list(list) != 0 && !failed)
        failed = shim_failed(err, "torch_delete_list");
    return failed;
}

#ifdef LLTM_WITH_CUDA
static void leave_device(lltm_call *c)
{
    if (c->guard != NULL)
        aoti_torch_delete_cuda_guard(c->guard);
    c->guard = NULL;
}
#endif

int lltm_open(lltm_call *c, const lltm_op *op, StableIValue *stack, uint64_t num_args,
              uint64_t num_outputs)
{
    lltm_tensor *a = c->args;
    lltm_error mask_err;
    int bad_mask = 0;
    c->op = op;
    c->owned.count = 0;
    c->err.msg[0] = c->gemm_err.msg[0] = '\0';
    c->lengths = NULL;
    for (int k = 0; k < LLTM_MAX_RESULTS; ++k) {
        c->mask[k] = true;
        c->results[k] = NULL;
        c->data[k] = NULL;
    }
#ifdef LLTM_WITH_CUDA
    const int32_t device_type = aoti_torch_device_type_cuda();
    c->guard = NULL;
    c->stream = NULL;
#else
    const int32_t device_type = aoti_torch_device_type_cpu();
#endif
    /* The settings, last, are a plain integer: nothing to own or free. The
     * backward's output_mask comes before them. */
    const int64_t packed = num_args > 0 ? (int64_t)stack[--num_args] : LLTM_SETTINGS_NOT_GIVEN;
    if (op->backward)
        bad_mask = num_args == 0
                       ? lltm_fail(&mask_err, "internal error: no output_mask")
                       : read_output_mask(stack[--num_args], op->n_results, c->mask, &mask_err);
    const bool with_lengths = op->lengths && num_args == (uint64_t)op->n_args + 1;
    const int n = op->n_args + with_lengths;
    /* Own every handle first, so even a miscounted call frees its inputs. */
    for (uint64_t k = 0; k < num_args; ++k)
        if (own(&c->owned, (AtenTensorHandle)(uintptr_t)stack[k], &c->err))
            return -1;
    if (num_args != (uint64_t)n || num_outputs != (uint64_t)op->n_results)
        return lltm_fail(&c->err, "internal error: called with %llu arguments and %llu outputs, expected %d and %d",
                         (unsigned long long)num_args, (unsigned long long)num_outputs, n,
                         op->n_results);
    for (int k = 0; k < n; ++k)
        if (read_tensor((AtenTensorHandle)(uintptr_t)stack[k],
                        k < op->n_args ? op->args[k][0] : "lengths", &a[k], &c->err) ||
            make_contiguous(&a[k], &c->owned, &c->err))
            return -1;
    if (bad_mask) {
        c->err = mask_err;
        return -1;
    }
    if (check_args(c, device_type) ||
        lltm_call_settings_decode(packed, &c->settings, &c->err))
        return -1;
#ifndef LLTM_WITH_CUDA
    /* an inference forward: what only a backward reads is not made */
    for (int k = 0; k < op->n_results && c->settings.inference; ++k)
        c->mask[k] = c->mask[k] && !(op->kept >> k & 1);
#endif
    if (with_lengths) {
        if (check_lengths(&a[n - 1], &a[0], &c->d, device_type == aoti_torch_device_type_cpu(),
                          &c->err))
            return -1;
        c->lengths = (const int64_t *)a[n - 1].data;
    }
#ifdef LLTM_WITH_CUDA
    if (aoti_torch_create_cuda_guard(a[0].device_index, &c->guard) != 0) {
        c->guard = NULL;
        return lltm_fail(&c->err, "could not make cuda:%d the current device", a[0].device_index);
    }
    if (aoti_torch_get_current_cuda_stream(a[0].device_index, &c->stream) != 0)
        return lltm_fail(&c->err, "could not get the current CUDA stream of cuda:%d",
                         a[0].device_index);
#endif
    int64_t value[N_SIZES];
    size_values(&c->d, value);
    for (int k = 0; k < op->n_results; ++k) {
        const lltm_shape *shape = &op->parsed->results[k];
        int64_t sizes[LLTM_MAX_DIM];
        for (int j = 0; j < shape->rank; ++j)
            sizes[j] = value[shape->symbols[j]];
        if ((c->mask[k] || (op->always >> k & 1)) &&
            lltm_empty(shape->rank, sizes, &a[0], &c->owned, &c->results[k], &c->data[k],
                       &c->err))
            return -1;
    }
    /* The products go straight to cuBLAS where nothing asks for aten::mm's
     * guarantees (cublas_gemm.h), on TF32 where allowed. */
    c->gemm = (lltm_torch_gemm_ctx){a[0].device_type, a[0].device_index, &c->gemm_err,
                                    c->settings.given && !c->settings.deterministic,
                                    c->settings.float32_tf32};
    return 0;
}

int lltm_core_status(lltm_call *c, int status, const char *fn)
{
    if (status == LLTM_OK)
        return 0;
    if (status == LLTM_ERR_GEMM && c->gemm_err.msg[0] != '\0')
        return lltm_fail(&c->err, "%s: %s", fn, c->gemm_err.msg);
    return lltm_fail(&c->err, "%s failed: %s", fn, lltm_status_string(status));
}

int lltm_close(lltm_call *c, StableIValue *stack)
{
    const int n = c->op->n_results;
    /* Every undefined tensor first: a failure then hands nothing out. */
    for (int k = 0; k < n; ++k) {
        if (c->mask[k])
            continue;
        if (aoti_torch_new_uninitialized_tensor(&c->results[k]) != 0)
            return shim_failed(&c->err, "aoti_torch_new_uninitialized_tensor");
        if (own(&c->owned, c->results[k], &c->err))
            return -1;
    }
    /* libtorch takes the results over: out of `owned`, onto the stack */
    for (int k = 0; k < n; ++k) {
        for (int i = 0; i < c->owned.count; ++i)
            if (c->owned.handles[i] == c->results[k]) {
                c->owned.handles[i] = c->owned.handles[--c->owned.count];
                break;
            }
        stack[k] = (StableIValue)(uintptr_t)c->results[k];
    }
    free_owned(&c->owned);
#ifdef LLTM_WITH_CUDA
    leave_device(c);
#endif
    return 0;
}

void lltm_call_raise(lltm_call *c)
{
    char msg[sizeof c->err.msg + 64];
#ifdef LLTM_WITH_CUDA
    leave_device(c);
#endif
    snprintf(msg, sizeof msg, "%s: %s", c->op->name, c->err.msg);
    free_owned(&c->owned);
    aoti_torch_check(false, c->op->name, __FILE__, __LINE__, msg);
}

int lltm_torch_parallel_for(int64_t begin, int64_t end, int64_t grain,
                            lltm_range_body body, void *ctx)
{
    return torch_parallel_for(begin, end, grain, body, ctx);
}
