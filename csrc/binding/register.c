/*
 * register.c - the entry points of the two libraries. liblltm.so defines the
 * lltm operator schemas and registers the CPU kernels (lltm_register);
 * liblltm_cuda.so (LLTM_WITH_CUDA, loaded after it where torch has CUDA)
 * registers the CUDA kernels (lltm_cuda_register). Python calls
 * lltm_resolve_torch() (torch_stable_abi.h), then the registration once
 * (lltm/_native.py): a failure comes back as a message rather than as an
 * exception thrown during dlopen or a crash.
 */
#include "ops.h"

#include <stdio.h>

#define LLTM_EXPORT __attribute__((visibility("default")))

/* Library handles must live as long as the process: deleting one would
 * remove its registrations. */
static TorchLibraryHandle kernel_library;
static int registered;

#ifdef LLTM_WITH_CUDA
#define DEVICE "CUDA"
#define LLTM_KERNEL(name, signature, cpu, cuda) {name, cuda},
#else
#define DEVICE "CPU"
#define LLTM_KERNEL(name, signature, cpu, cuda) {name, cpu},
#define LLTM_SCHEMA(name, signature, cpu, cuda) name signature,
static const char *const schemas[] = {LLTM_OPERATORS(LLTM_SCHEMA)};
static TorchLibraryHandle schema_library;

/* The instruction set of the CPU kernels' own products (lltm.h): `isa` > 0
 * forces one, 0 the best again, < 0 only asks; the set in use, or < 0 where
 * the CPU lacks it. For tests and measurements (lltm._native.cpu_isa). */
LLTM_EXPORT int lltm_cpu_isa_hook(int isa)
{
    return isa < 0 ? lltm_cpu_isa() : lltm_cpu_set_isa(isa);
}
#endif

static const struct {
    const char *name;
    lltm_boxed_kernel fn;
} kernels[] = {LLTM_OPERATORS(LLTM_KERNEL)};

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
    for (size_t k = 0; k < sizeof schemas / sizeof schemas[0]; ++k) {
        if (aoti_torch_library_def(schema_library, schemas[k]) != 0) {
            snprintf(err, err_len, "could not define lltm::%s", schemas[k]);
            return -1;
        }
    }
#endif
    if (aoti_torch_library_init_impl(LLTM_NAMESPACE, DEVICE, __FILE__, __LINE__,
                                     &kernel_library) != 0) {
        snprintf(err, err_len, "could not create the lltm " DEVICE " library");
        return -1;
    }
    for (size_t k = 0; k < sizeof kernels / sizeof kernels[0]; ++k) {
        if (torch_library_impl(kernel_library, kernels[k].name, kernels[k].fn,
                               LLTM_TORCH_TARGET_VERSION) != 0) {
            snprintf(err, err_len, "could not register the " DEVICE " kernel of lltm::%s",
                     kernels[k].name);
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
