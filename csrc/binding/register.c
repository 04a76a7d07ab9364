/*
 * register.c - the entry points of the two libraries. liblltm.so defines the
 * lltm operator schemas and registers the CPU kernels (lltm_register);
 * liblltm_cuda.so (LLTM_WITH_CUDA, loaded after it where torch has CUDA)
 * registers the CUDA kernels (lltm_cuda_register). Python calls
 * lltm_resolve_torch() (torch_stable_abi.h), then the registration once
 * (lltm/_native.py): a failure comes back as a message rather than as an
 * exception thrown during dlopen or a crash.
 *
 * Each operator comes twice: the public one (lltm::cell_forward: Python
 * registers its autograd formula, lltm/_ops.py) and the same kernels under
 * the name with a leading underscore (lltm::_cell_forward), which no
 * autograd kernel is registered for. The autograd formulas call the
 * underscored ones, so the graphs torch.compile makes of them hold those,
 * and running a graph passes no Python on its way to the kernels (the
 * public operators' autograd kernel is a Python function, entered on every
 * call, with gradients needed or not).
 */
#include "ops.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define LLTM_EXPORT __attribute__((visibility("default")))

#ifdef LLTM_WITH_CUDA
#define DEVICE "CUDA"
#define LLTM_KERNEL(op, cpu, cuda) {&lltm_##op##_op, cuda},
#else
#define DEVICE "CPU"
#define LLTM_KERNEL(op, cpu, cuda) {&lltm_##op##_op, cpu},

static TorchLibraryHandle schema_library;

static void append(char *out, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void append(char *out, size_t n, const char *fmt, ...)
{
    const size_t used = strlen(out);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out + used, n - used, fmt, ap);
    va_end(ap);
}

/* The schema of `op` (name and overload in name[]), as ops.c says. */
static void schema(const lltm_op *op, const char *name, bool lengths, char *out, size_t n)
{
    snprintf(out, n, "%s(", name);
    for (int k = 0; k < op->n_args + lengths; ++k)
        append(out, n, "Tensor %s, ", k < op->n_args ? op->args[k][0] : "lengths");
    if (op->backward) {
        append(out, n, "bool[%d] output_mask=[True", op->n_results);
        for (int k = 1; k < op->n_results; ++k)
            append(out, n, ", True");
        append(out, n, "], ");
    }
    append(out, n, LLTM_SCHEMA_SETTINGS ") -> (");
    for (int k = 0; k < op->n_results; ++k)
        append(out, n, "%sTensor %s", k ? ", " : "", op->results[k][0]);
    append(out, n, ")");
}

/* The instruction set of the CPU kernels' own products (lltm.h): `isa` > 0
 * forces one, 0 the best again, < 0 only asks; the set in use, or < 0 where
 * the CPU lacks it. For tests and measurements (lltm._native.cpu_isa). */
LLTM_EXPORT int lltm_cpu_isa_hook(int isa)
{
    return isa < 0 ? lltm_cpu_isa() : lltm_cpu_set_isa(isa);
}
#endif

static const struct {
    const lltm_op *op;
    lltm_boxed_kernel fn;
} kernels[] = {LLTM_KERNELS(LLTM_KERNEL)};

/* The table of the k-th operator (ops.c), NULL past the last: lltm/_ops.py
 * makes the fake kernels from the tables, with the same checks and
 * messages as lltm_open. */
LLTM_EXPORT const lltm_op *lltm_operator(int k)
{
    return k >= 0 && k < (int)(sizeof kernels / sizeof kernels[0]) ? kernels[k].op : NULL;
}

/* Library handles must live as long as the process: deleting one would
 * remove its registrations. */
static TorchLibraryHandle kernel_library;
static int registered;

static int register_kernels(char *err, size_t err_len)
{
    if (registered)
        return 0; /* already registered in this process */
    if (lltm_resolve_torch(err, err_len) != 0)
        return -1; /* the message names what torch lacks */
#ifndef LLTM_WITH_CUDA
    if (aoti_torch_library_init_fragment(LLTM_NAMESPACE, __FILE__, __LINE__,
                                         &schema_library) != 0) {
        snprintf(err, err_len, "could not create the lltm library fragment");
        return -1;
    }
#endif
    if (aoti_torch_library_init_impl(LLTM_NAMESPACE, DEVICE, __FILE__, __LINE__,
                                     &kernel_library) != 0) {
        snprintf(err, err_len, "could not create the lltm " DEVICE " library");
        return -1;
    }
    for (size_t k = 0; k < 4 * sizeof kernels / sizeof kernels[0]; ++k) {
        /* each operator, its lengths overload (if any), each with and
         * without the underscore */
        const lltm_op *op = kernels[k / 4].op;
        const bool lengths = k % 2 == 1;
        char name[64];
        if (k % 4 == 0 && lltm_op_parse(op, err, err_len) != 0)
            return -1;
        if (lengths && !op->lengths)
            continue;
        snprintf(name, sizeof name, "%s%s%s", k % 4 < 2 ? "" : "_",
                 op->name + strlen(LLTM_NAMESPACE "::"), lengths ? ".lengths" : "");
#ifndef LLTM_WITH_CUDA
        char text[1024];
        schema(op, name, lengths, text, sizeof text);
        if (aoti_torch_library_def(schema_library, text) != 0) {
            snprintf(err, err_len, "could not define lltm::%s", text);
            return -1;
        }
#endif
        if (torch_library_impl(kernel_library, name, kernels[k / 4].fn,
                               LLTM_TORCH_TARGET_VERSION) != 0) {
            snprintf(err, err_len, "could not register the " DEVICE " kernel of lltm::%s",
                     name);
            return -1;
        }
    }
    registered = 1;
    return 0;
}

#ifdef LLTM_WITH_CUDA
LLTM_EXPORT int lltm_cuda_register(char *err, size_t err_len)
#else
LLTM_EXPORT int lltm_register(char *err, size_t err_len)
#endif
{
    return register_kernels(err, err_len);
}
