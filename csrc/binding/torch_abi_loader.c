/*
 * torch_abi_loader.c - lltm_resolve_torch(): the table of torch's stable C ABI
 * filled from the torch libraries already loaded (see torch_abi_loader.h).
 */
#include "torch_abi_loader.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

/* torch's libraries by their sonames (torch's wheels name them so) */
static const char *const torch_sonames[] = {
    [LLTM_TORCH_CPU_LIBRARY] = "libtorch_cpu.so",
    [LLTM_TORCH_CUDA_LIBRARY] = "libtorch_cuda.so",
};

/* dlsym gives a data pointer; POSIX guarantees it converts to a function
 * pointer, which is stored into the slot bytewise */
_Static_assert(sizeof(void *) == sizeof(void (*)(void)),
               "function pointers must have the size of data pointers");

static bool resolved;

int lltm_resolve_torch(char *err, size_t err_len)
{
    /* Handles taken with RTLD_NOLOAD count a reference, never given back:
     * the table points into these libraries for the life of the process. */
    void *handles[2] = {NULL, NULL};

    if (resolved)
        return 0;
    for (size_t k = 0; k < lltm_torch_symbol_count; ++k) {
        const lltm_torch_symbol *symbol = &lltm_torch_symbols[k];
        const char *soname = torch_sonames[symbol->library];
        if (handles[symbol->library] == NULL) {
            handles[symbol->library] = dlopen(soname, RTLD_LAZY | RTLD_NOLOAD);
            if (handles[symbol->library] == NULL) {
                snprintf(err, err_len,
                         "%s is not loaded in this process (import torch first%s)", soname,
                         symbol->library == LLTM_TORCH_CUDA_LIBRARY
                             ? "; the CUDA library needs a torch built with CUDA"
                             : "");
                return -1;
            }
        }
        void *address = dlsym(handles[symbol->library], symbol->name);
        if (address == NULL && !symbol->optional) {
            snprintf(err, err_len, "%s has no function %s", soname, symbol->name);
            return -1;
        }
        memcpy(symbol->slot, &address, sizeof address);
    }
    resolved = true;
    return 0;
}
