/*
 * cublas_gemm.h - the CUDA library's matrix products for the core (an
 * lltm_gemm): in eager calls straight through the cuBLAS that torch has
 * already loaded, with a handle of the library's own per thread and device;
 * while the stream is captured into a CUDA graph, where the cuBLAS is not
 * found, and for layouts cuBLAS cannot take, through aten::mm
 * (lltm_torch_gemm).
 *
 * Why: an eager call of aten::mm through the stable ABI costs the host
 * about as much as torch.mm from Python (tensor handles for the three
 * operands, the dispatcher, ATen's checks), 20 - 25 us on the H100
 * machine, against a few microseconds of cuBLAS's own; the per-step family
 * makes two such products a time step.
 */
#ifndef LLTM_BINDING_CUBLAS_GEMM_H
#define LLTM_BINDING_CUBLAS_GEMM_H

#include "tensor_args.h"

/* An lltm_gemm over device pointers of the context's CUDA device, on
 * torch's current stream; `ctx` is an lltm_torch_gemm_ctx. */
int lltm_cuda_gemm(void *ctx, lltm_dtype dtype, int64_t M, int64_t N, int64_t K, const void *a,
                   int64_t a_rs, int64_t a_cs, const void *b, int64_t b_rs, int64_t b_cs,
                   void *c, int64_t ldc);

/* 1 where the direct route is loaded (torch's cuBLAS found, every function
 * present), else 0; counts of the products each route ran in this process
 * (for tests: the route under test is the one that ran). Exported from
 * liblltm_cuda.so. */
int lltm_cuda_gemm_direct_available(void);
void lltm_cuda_gemm_counts(int64_t *direct, int64_t *through_torch);

#endif /* LLTM_BINDING_CUBLAS_GEMM_H */
