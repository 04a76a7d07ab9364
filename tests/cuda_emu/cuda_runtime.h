/*
 * cuda_runtime.h (emulation) - runs the project's CUDA C kernels on the CPU,
 * so CI (no GPU) checks their indexing, tiling, edge guards and barriers
 * against the reference. Only what lltm_cuda_cell.cu uses is provided.
 *
 * Model: blocks run one after another; the threads of a block run as real
 * threads (std::thread) meeting at __syncthreads() on a barrier. __shared__
 * becomes `static`: shared by the threads of the running block. Launches
 * `k<<<grid, block, smem, stream>>>(args)` are rewritten by the test's build
 * step into emu::launch(emu::cfg(grid, block, smem, stream), k, args).
 * Not emulated: warps, memory-model subtleties, timing.
 */
#pragma once
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include <thread>
#include <tuple>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

typedef struct CUstream_st *cudaStream_t;
typedef enum cudaError { cudaSuccess = 0, cudaErrorInvalidConfiguration = 9 } cudaError_t;

inline thread_local dim3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;

namespace emu {
inline pthread_barrier_t barrier;
inline cudaError_t last_error = cudaSuccess;

struct cfg {
    dim3 grid, block;
    cfg(dim3 g, dim3 b, size_t smem = 0, cudaStream_t s = nullptr) : grid(g), block(b)
    {
        (void)smem;
        (void)s;
    }
};

template <typename... P, typename... Args>
void launch(cfg c, void (*kernel)(P...), Args... args)
{
    const unsigned nt = c.block.x * c.block.y * c.block.z;
    if (nt == 0 || nt > 1024 || c.grid.x == 0 || c.grid.y == 0 || c.grid.z == 0 ||
        c.grid.y > 65535 || c.grid.z > 65535) {
        last_error = cudaErrorInvalidConfiguration;
        return;
    }
    std::tuple<P...> params(static_cast<P>(args)...);
    gridDim = c.grid;
    blockDim = c.block;
    pthread_barrier_init(&barrier, nullptr, nt);
    for (unsigned bz = 0; bz < c.grid.z; ++bz)
        for (unsigned by = 0; by < c.grid.y; ++by)
            for (unsigned bx = 0; bx < c.grid.x; ++bx) {
                std::vector<std::thread> threads;
                threads.reserve(nt);
                for (unsigned t = 0; t < nt; ++t)
                    threads.emplace_back([&, t] {
                        blockIdx = dim3(bx, by, bz);
                        threadIdx = dim3(t % c.block.x, (t / c.block.x) % c.block.y,
                                         t / (c.block.x * c.block.y));
                        std::apply(kernel, params);
                    });
                for (auto &th : threads)
                    th.join();
            }
    pthread_barrier_destroy(&barrier);
}
} // namespace emu

inline void __syncthreads() { pthread_barrier_wait(&emu::barrier); }

inline cudaError_t cudaGetLastError()
{
    cudaError_t e = emu::last_error;
    emu::last_error = cudaSuccess;
    return e;
}
