/*
 * barrier_bench.cu - what a step barrier of the grid family costs on its own:
 * a cooperative launch of `blocks` blocks of 256 threads runs `steps` steps
 * of a few multiply-adds, each ended by cg::this_grid().sync() (the grid
 * kernels' step_barrier), or by a barrier among the blocks of one batch
 * group only (thread 0 of each block: a fence, an atomic add on the group's
 * counter, a spin on ld.acquire until the group's count; block barriers
 * around it), groups of 4 - 32 blocks. Prints us per barrier =
 * (time(2000 steps) - time(200)) / 1800, CUDA events, median of 7 runs.
 * Whether a barrier of fewer blocks (the batch groups are independent
 * within a step) would shorten the step.
 *
 *   nvcc -O3 -std=c++17 -arch=sm_90 dev/timing/barrier_bench.cu -o /tmp/barrier_bench
 *   /tmp/barrier_bench
 */
#include <cooperative_groups.h>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>

#include "../cuda/lab.h" /* CHECK */
namespace cg = cooperative_groups;

__global__ void grid_kernel(int steps, float *sink) {
    float acc = threadIdx.x;
    for (int s = 0; s < steps; ++s) { acc = acc * 1.0001f + 1.0f; cg::this_grid().sync(); }
    if (acc == -1.f) sink[0] = acc;
}
__device__ __forceinline__ unsigned ld_acquire(const unsigned *p) {
    unsigned v; asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory"); return v;
}
__global__ void group_kernel(int steps, int group_blocks, unsigned *counters, float *sink) {
    float acc = threadIdx.x;
    unsigned *counter = counters + (blockIdx.x / group_blocks) * 32; /* 128 bytes apart */
    unsigned target = 0;
    for (int s = 0; s < steps; ++s) {
        acc = acc * 1.0001f + 1.0f;
        __syncthreads();
        target += group_blocks;
        if (threadIdx.x == 0) {
            __threadfence();
            atomicAdd(counter, 1u);
            while ((int)(ld_acquire(counter) - target) < 0) {}
        }
        __syncthreads();
    }
    if (acc == -1.f) sink[0] = acc;
}
int main() {
    float *sink; unsigned *counters;
    CHECK(cudaMalloc(&sink, 4));
    CHECK(cudaMalloc(&counters, 132 * 128));
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    /* milliseconds of one launch of `steps` steps (the group counters zeroed first) */
    auto launch_ms = [&](auto launch, int steps) {
        float ms;
        CHECK(cudaMemset(counters, 0, 132 * 128));
        CHECK(cudaEventRecord(a));
        CHECK(launch(steps));
        CHECK(cudaEventRecord(b));
        CHECK(cudaEventSynchronize(b));
        CHECK(cudaEventElapsedTime(&ms, a, b));
        return ms;
    };
    auto timeit = [&](auto launch) {
        std::vector<float> v;
        for (int r = 0; r < 7; ++r)
            v.push_back((launch_ms(launch, 2000) - launch_ms(launch, 200)) * 1000 / 1800);
        std::sort(v.begin(), v.end());
        return v[3];
    };
    printf("blocks | grid.sync us | group of 4 | group of 8 | group of 16 | group of 32\n");
    for (int blocks : {8, 16, 32, 64, 128, 132}) {
        float g = timeit([&](int steps) { void *args[] = {&steps, &sink};
            return cudaLaunchCooperativeKernel((void *)grid_kernel, blocks, 256, args, 0, 0); });
        printf("%6d | %8.3f", blocks, g);
        for (int gb : {4, 8, 16, 32}) {
            if (blocks % gb) { printf(" | -"); continue; }
            float t = timeit([&](int steps) { void *args[] = {&steps, &gb, &counters, &sink};
                return cudaLaunchCooperativeKernel((void *)group_kernel, blocks, 256, args, 0, 0); });
            printf(" | %8.3f", t);
        }
        printf("\n");
    }
    CHECK(cudaFree(sink));
    CHECK(cudaFree(counters));
    return 0;
}
