/*
 * register_cpu.c - the entry point of liblltm.so: defines the lltm operator
 * schemas and registers the CPU kernels. Python calls lltm_resolve_torch()
 * (torch_stable_abi.h) then lltm_register() once after loading the library
 * (lltm/_native.py): a failure comes back as a message rather than as an
 * exception thrown during dlopen or a crash.
 */
#include "ops.h"
#include "torch_stable_abi.h"

#include <stdio.h>

#define LLTM_EXPORT __attribute__((visibility("default")))

/* Library handles must live as long as the process: deleting one would
 * remove its registrations. */
static TorchLibraryHandle schema_library, cpu_library;
static int registered;

typedef struct kernel_entry {
    const char *name;
    lltm_boxed_kernel fn;
} kernel_entry;

#define LLTM_SCHEMA(name, signature, cpu, cuda) name signature,
static const char *const schemas[] = {LLTM_OPERATORS(LLTM_SCHEMA)};
#undef LLTM_SCHEMA

#define LLTM_CPU_KERNEL(name, signature, cpu, cuda) {name, cpu},
static const kernel_entry cpu_kernels[] = {LLTM_OPERATORS(LLTM_CPU_KERNEL)};
#undef LLTM_CPU_KERNEL

/* The instruction set of the CPU kernels' own products (lltm.h): `isa` > 0
 * forces one, 0 the best again, < 0 only asks; the set in use, or < 0 where
 * the CPU lacks it. For tests and measurements (lltm._native.cpu_isa). */
LLTM_EXPORT int lltm_cpu_isa_hook(int isa)
{
    return isa < 0 ? lltm_cpu_isa() : lltm_cpu_set_isa(isa);
}

LLTM_EXPORT int lltm_register(char *err, size_t err_len)
{
    if (registered)
        return 0; /* already registered in this process */
    if (lltm_resolve_torch(err, err_len) != 0)
        return -1; /* the message names what torch lacks */
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
    if (aoti_torch_library_init_impl(LLTM_NAMESPACE, "CPU", __FILE__, __LINE__,
                                     &cpu_library) != 0) {
        snprintf(err, err_len, "could not create the lltm CPU library");
        return -1;
    }
    for (size_t k = 0; k < sizeof cpu_kernels / sizeof cpu_kernels[0]; ++k) {
        if (torch_library_impl(cpu_library, cpu_kernels[k].name, cpu_kernels[k].fn,
                               LLTM_TORCH_TARGET_VERSION) != 0) {
            snprintf(err, err_len, "could not register the CPU kernel of lltm::%s",
                     cpu_kernels[k].name);
            return -1;
        }
    }
    registered = 1;
    return 0;
}
