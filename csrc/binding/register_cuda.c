/*
 * register_cuda.c - the entry point of liblltm_cuda.so: registers the CUDA
 * kernels of the lltm operators (whose schemas liblltm.so defined, loaded
 * first). Python loads it only where torch has CUDA, calls lltm_resolve_torch()
 * at once (this library calls functions of libtorch_cuda too), and
 * lltm_cuda_register() when CUDA initialises (lltm/_native.py).
 */
#include "ops.h"
#include "torch_stable_abi.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LLTM_EXPORT __attribute__((visibility("default")))

/* Must live as long as the process: deleting it would remove the kernels. */
static TorchLibraryHandle cuda_library;
static int registered;

typedef struct kernel_entry {
    const char *name;
    lltm_boxed_kernel fn;
} kernel_entry;

#define LLTM_CUDA_KERNEL(name, signature, cpu, cuda) {name, cuda},
static const kernel_entry cuda_kernels[] = {LLTM_OPERATORS(LLTM_CUDA_KERNEL)};
#undef LLTM_CUDA_KERNEL

LLTM_EXPORT int lltm_cuda_register(char *err, size_t err_len)
{
    if (registered)
        return 0; /* already registered in this process */
    if (lltm_resolve_torch(err, err_len) != 0)
        return -1; /* the message names what torch lacks */
    if (aoti_torch_library_init_impl(LLTM_NAMESPACE, "CUDA", __FILE__, __LINE__,
                                     &cuda_library) != 0) {
        snprintf(err, err_len, "could not create the lltm CUDA library");
        return -1;
    }
    for (size_t k = 0; k < sizeof cuda_kernels / sizeof cuda_kernels[0]; ++k) {
        if (torch_library_impl(cuda_library, cuda_kernels[k].name, cuda_kernels[k].fn,
                               LLTM_TORCH_TARGET_VERSION) != 0) {
            snprintf(err, err_len, "could not register the CUDA kernel of lltm::%s",
                     cuda_kernels[k].name);
            return -1;
        }
    }
    registered = 1;
    return 0;
}
