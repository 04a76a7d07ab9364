/*
 * lltm_cuda_launch.cuh - how the CUDA sources launch kernels and declare
 * dynamic shared memory, written once so that the CPU emulator
 * (tests/cuda_emu) compiles the .cu files unchanged:
 *
 *   LLTM_LAUNCH(grid, block, smem, stream, kernel)(args...)
 *       kernel<<<grid, block, smem, stream>>>(args...) (the kernel last: a
 *       template's argument list may hold commas)
 *   LLTM_DYNAMIC_SMEM(name);
 *       extern __shared__ __align__(16) unsigned char name[];
 *
 * The emulator's cuda_runtime.h defines both before this header is read.
 * Also the launch-status check and the sizes shared by the launchers.
 */
#ifndef LLTM_CORE_CUDA_LAUNCH_CUH
#define LLTM_CORE_CUDA_LAUNCH_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "lltm.h"

#ifndef LLTM_LAUNCH
#define LLTM_LAUNCH(grid, block, smem, stream, ...) __VA_ARGS__<<<grid, block, smem, stream>>>
#endif
#ifndef LLTM_DYNAMIC_SMEM
#define LLTM_DYNAMIC_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#endif

/* Device code that needs thread-block clusters (distributed shared memory,
 * mbarrier transactions, st.async): sm_90 and later. The host side never
 * launches it elsewhere (the plan chooser asks the compute capability). */
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define LLTM_CUDA_HAS_CLUSTERS 1
#else
#define LLTM_CUDA_HAS_CLUSTERS 0
#endif

namespace {

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* LLTM_OK when the launch and everything before it succeeded */
inline int launch_status(cudaError_t launch)
{
    const cudaError_t last = cudaGetLastError();
    return (launch == cudaSuccess && last == cudaSuccess) ? LLTM_OK : LLTM_ERR_CUDA;
}

/* blocks of a grid-stride pointwise kernel over n elements */
inline unsigned pointwise_blocks(int64_t n, int threads)
{
    const int64_t blocks = ceil_div(n, threads);
    return (unsigned)(blocks < 4096 ? (blocks > 0 ? blocks : 1) : 4096);
}

} // namespace

#endif /* LLTM_CORE_CUDA_LAUNCH_CUH */
