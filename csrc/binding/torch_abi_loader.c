/*
 * torch_abi_loader.c - lltm_resolve_torch(): the pointers of
 * torch_stable_abi.h filled from the torch libraries already loaded. Python
 * imports torch (which loads libtorch_cpu.so, and libtorch_cuda.so in a CUDA
 * build) before loading our library; each function is found by name there
 * with dlopen(soname, RTLD_NOLOAD) and dlsym: nothing new is loaded.
 */
#include "torch_stable_abi.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

/* the pointers, NULL until resolved */
#define LLTM_TORCH_DEFINE(lib, need, ret, name, params) ret (*name) params;
LLTM_TORCH_FUNCTIONS(LLTM_TORCH_DEFINE)

/* the list's words for libraries and needs */
enum { CPU, CUDA };
enum { REQUIRED, OPTIONAL };

/* torch's libraries by their sonames (torch's wheels name them so) */
static const char *const torch_sonames[] = {[CPU] = "libtorch_cpu.so", [CUDA] = "libtorch_cuda.so"};

static const struct {
    const char *name;
    int lib;       /* CPU or CUDA */
    bool optional; /* may stay NULL */
    void *slot;    /* the pointer to fill */
} symbols[] = {
#define LLTM_TORCH_SYMBOL(lib, need, ret, name, params) {#name, lib, need == OPTIONAL, &name},
    LLTM_TORCH_FUNCTIONS(LLTM_TORCH_SYMBOL)
};

/* dlsym gives a data pointer; POSIX guarantees it converts to a function
 * pointer, which is stored into the slot bytewise */
_Static_assert(sizeof(void *) == sizeof(void (*)(void)),
               "function pointers must have the size of data pointers");

static bool resolved;

int lltm_resolve_torch(char *err, size_t err_len)
{
    /* Handles taken with RTLD_NOLOAD count a reference, never given back:
     * the pointers point into these libraries for the life of the process. */
    void *handles[2] = {NULL, NULL};

    if (resolved)
        return 0;
    for (size_t k = 0; k < sizeof symbols / sizeof symbols[0]; ++k) {
        const char *soname = torch_sonames[symbols[k].lib];
        void **handle = &handles[symbols[k].lib];
        if (*handle == NULL) {
            *handle = dlopen(soname, RTLD_LAZY | RTLD_NOLOAD);
            if (*handle == NULL) {
                snprintf(err, err_len,
                         "%s is not loaded in this process (import torch first%s)", soname,
                         symbols[k].lib == CUDA
                             ? "; the CUDA library needs a torch built with CUDA"
                             : "");
                return -1;
            }
        }
        void *address = dlsym(*handle, symbols[k].name);
        if (address == NULL && !symbols[k].optional) {
            snprintf(err, err_len, "%s has no function %s", soname, symbols[k].name);
            return -1;
        }
        memcpy(symbols[k].slot, &address, sizeof address);
    }
    resolved = true;
    return 0;
}
