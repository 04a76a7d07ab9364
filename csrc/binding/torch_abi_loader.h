/*
 * torch_abi_loader.h - filling the table of torch_stable_abi_table.h from the
 * torch libraries the process has loaded.
 *
 * The native libraries have no link-time dependency on torch's libraries:
 * Python imports torch (which loads libtorch_cpu.so, and libtorch_cuda.so in a
 * CUDA build), loads our library, then calls lltm_resolve_torch(), which finds
 * each function of torch_stable_abi.h by name in those libraries
 * (dlopen(soname, RTLD_NOLOAD) and dlsym: nothing new is loaded). A function
 * missing from torch fails the call with a message naming it, unless it is
 * optional (LLTM_OPTIONAL: its pointer stays NULL). The registration entry
 * points (lltm_register, lltm_cuda_register) call it first too.
 */
#ifndef LLTM_BINDING_TORCH_ABI_LOADER_H
#define LLTM_BINDING_TORCH_ABI_LOADER_H

#include "torch_stable_abi.h"

enum { LLTM_TORCH_CPU_LIBRARY = 0, LLTM_TORCH_CUDA_LIBRARY = 1 };

/* One function of the table (torch_stable_abi_table.c, generated). */
typedef struct lltm_torch_symbol {
    const char *name;
    int library;   /* LLTM_TORCH_CPU_LIBRARY or LLTM_TORCH_CUDA_LIBRARY */
    bool optional; /* NULL is allowed (LLTM_OPTIONAL) */
    void *slot;    /* the table's pointer of that function */
} lltm_torch_symbol;

extern const lltm_torch_symbol lltm_torch_symbols[];
extern const size_t lltm_torch_symbol_count;

/* Fills the table; 0 on success (then again: nothing to do). Else -1, the
 * table unusable, and in err a message naming the library or function that is
 * missing. Exported: Python calls it right after loading the library. */
__attribute__((visibility("default"))) int lltm_resolve_torch(char *err, size_t err_len);

#endif /* LLTM_BINDING_TORCH_ABI_LOADER_H */
