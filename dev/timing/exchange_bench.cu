/*
 * exchange_bench.cu - what one step of the cluster kernels' all-to-all
 * exchange costs on its own, with no math: a cluster of `blocks` blocks of
 * 256 threads runs `steps` steps; in each step every block waits until all
 * blocks' pieces of the step arrived in its shared memory (an mbarrier
 * counting bytes, double-buffered by step parity as in
 * csrc/core/lltm_cuda_sequence.cu), spins `work` cycles (a stand-in for the
 * step's math), then sends `bytes` bytes to every block of the cluster.
 *
 *   mode 0 "tile":  the bytes are written to a tile in shared memory, a
 *                   block barrier, then 16-byte st.async pieces spread over
 *                   the threads (the forward; the broadcast backward of
 *                   dev/cuda/sequence_cluster.cu)
 *   mode 1 "regs":  16-byte st.async pieces straight from registers, no
 *                   tile, no block barrier (the reduce-scatter backward)
 *   mode 2 "bulk":  the tile, fence.proxy.async, a block barrier, then one
 *                   cp.async.bulk (shared::cta -> shared::cluster) of all
 *                   `bytes` per destination, issued by thread `rank`
 *
 * The mbarrier and st.async calls are the sequence kernels' own
 * (csrc/core/lltm_cuda_cluster.cuh). Every received word is checked on the
 * last step (the sender's rank and step). Prints us per step = (time(steps) - time(10)) / (steps - 10),
 * CUDA events, median of 15 runs.
 *
 *   nvcc -O3 -std=c++17 -arch=sm_90 dev/timing/exchange_bench.cu -o /tmp/exchange_bench
 *   /tmp/exchange_bench            # the table of modes x bytes x work
 */
#include <cooperative_groups.h>
#include <cstdint>

#include "../../csrc/core/lltm_cuda_cluster.cuh" /* the kernels' mbarrier and st.async */
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <vector>

#include "../cuda/lab.h" /* CHECK */

namespace cg = cooperative_groups;

constexpr int NT = 256;
constexpr int MAX_BYTES = 2048; /* per destination */

__device__ __forceinline__ uint32_t mapa(uint32_t a, int rank)
{
    uint32_t r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
    return r;
}
__device__ __forceinline__ void bulk_copy(uint32_t dst, uint32_t src, unsigned bytes, uint32_t bar)
{
    asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes "
                 "[%0], [%1], %2, [%3];" ::"r"(dst),
                 "r"(src), "r"(bytes), "r"(bar)
                 : "memory");
}

__device__ __forceinline__ void spin(int cycles)
{
    if (cycles <= 0)
        return;
    const long long end = clock64() + cycles;
    while (clock64() < end) {
    }
}

/* shared memory: bars[2] | recv [2][ranks][bytes] | tiles [2][bytes] */
__global__ void __launch_bounds__(NT, 1)
exchange_kernel(int mode, int steps, int bytes, int work, unsigned *errors)
{
    extern __shared__ __align__(16) unsigned char smem[];
    uint64_t *bars = reinterpret_cast<uint64_t *>(smem);
    cg::cluster_group cluster = cg::this_cluster();
    const int ranks = (int)cluster.num_blocks(), n = (int)cluster.block_rank(), tid = threadIdx.x;
    unsigned char *recv = smem + 16;
    unsigned char *tiles = recv + 2 * ranks * bytes;
    const unsigned step_bytes = (unsigned)(ranks * bytes);
    const int words = bytes / 4, pieces = bytes / 16;

    for (int e = tid; e < 2 * ranks * words; e += NT)
        reinterpret_cast<unsigned *>(recv)[e] = 0xffffffffu;
    if (tid == 0) {
        mbar_init(&bars[0], 1);
        mbar_init(&bars[1], 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        if (steps > 1)
            mbar_expect_tx(&bars[1], step_bytes);
        if (steps > 2)
            mbar_expect_tx(&bars[0], step_bytes);
    }
    cluster.sync();

    for (int t = 0; t < steps; ++t) {
        if (t >= 1) {
            mbar_wait(&bars[t & 1], (unsigned)((t - 1) >> 1) & 1u);
            if (tid == 0 && t + 2 < steps)
                mbar_expect_tx(&bars[t & 1], step_bytes);
            if (t == steps - 1) { /* check what arrived for this step */
                const unsigned *in = reinterpret_cast<const unsigned *>(recv) +
                                     (size_t)(t & 1) * ranks * words;
                for (int e = tid; e < ranks * words; e += NT) {
                    const unsigned want = ((unsigned)(e / words) << 24) | (unsigned)(t - 1);
                    if (in[e] != want)
                        atomicAdd(errors, 1u);
                }
            }
        }
        spin(work);
        if (t + 1 >= steps)
            break;
        const unsigned value = ((unsigned)n << 24) | (unsigned)t; /* received at step t + 1 */
        const int p = (t + 1) & 1;
        const uint32_t dst0 = smem_addr(recv + ((size_t)p * ranks + n) * bytes);
        const uint32_t bar = smem_addr(&bars[p]);
        unsigned char *dst = recv + ((size_t)p * ranks + n) * bytes;
        if (mode == 1) {
            const float v = __uint_as_float(value), piece4[4] = {v, v, v, v};
            for (int e = tid; e < pieces * ranks; e += NT) {
                const int rank = e / pieces, piece = e % pieces;
                send16v<float, 4>(piece4, dst + piece * 16, &bars[p], rank);
            }
            continue;
        }
        unsigned *tile = reinterpret_cast<unsigned *>(tiles + (size_t)(t & 1) * bytes);
        if (mode == 2 && tid < ranks)
            asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); /* tile t-1 read */
        for (int e = tid; e < words; e += NT)
            tile[e] = value;
        if (mode == 2)
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        __syncthreads();
        if (mode == 0) {
            for (int e = tid; e < pieces * ranks; e += NT) {
                const int rank = e / pieces, piece = e % pieces;
                send16(tile + piece * 4, dst + piece * 16, &bars[p], rank);
            }
        } else if (tid < ranks) {
            bulk_copy(mapa(dst0, tid), smem_addr(tile), (unsigned)bytes, mapa(bar, tid));
            asm volatile("cp.async.bulk.commit_group;" ::: "memory");
        }
    }
    if (mode == 2 && tid < ranks)
        asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
    cluster.sync();
}

static float run(int blocks, int mode, int steps, int bytes, int work, unsigned *errors)
{
    const size_t smem = 16 + (size_t)2 * blocks * bytes + 2 * (size_t)bytes;
    cudaLaunchConfig_t config = {};
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = blocks;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    config.gridDim = dim3(blocks);
    config.blockDim = dim3(NT);
    config.dynamicSmemBytes = smem;
    config.attrs = attr;
    config.numAttrs = 1;
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    CHECK(cudaEventRecord(a));
    CHECK(cudaLaunchKernelEx(&config, exchange_kernel, mode, steps, bytes, work, errors));
    CHECK(cudaGetLastError());
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    CHECK(cudaEventDestroy(a));
    CHECK(cudaEventDestroy(b));
    return ms;
}

static float median_run(int blocks, int mode, int steps, int bytes, int work, unsigned *errors)
{
    std::vector<float> v;
    for (int r = 0; r < 15; ++r)
        v.push_back(run(blocks, mode, steps, bytes, work, errors));
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

int main(int argc, char **argv)
{
    const int steps = argc > 1 ? atoi(argv[1]) : 1000;
    CHECK(cudaFuncSetAttribute(exchange_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    CHECK(cudaFuncSetAttribute(exchange_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               16 + 2 * 16 * MAX_BYTES + 2 * MAX_BYTES));
    unsigned *errors;
    CHECK(cudaMalloc(&errors, sizeof(unsigned)));
    CHECK(cudaMemset(errors, 0, sizeof(unsigned)));
    const char *names[] = {"tile", "regs", "bulk"};
    printf("%-6s %-5s %6s %6s %10s\n", "blocks", "mode", "bytes", "work", "us/step");
    const int block_counts[] = {16, 8};
    const int sizes[] = {16, 64, 512, 1536};
    const int works[] = {0, 1000};
    for (int blocks : block_counts)
        for (int work : works)
            for (int bytes : sizes)
                for (int mode = 0; mode < 3; ++mode) {
                    run(blocks, mode, 20, bytes, work, errors); /* warm-up */
                    const float longer = median_run(blocks, mode, steps, bytes, work, errors);
                    const float shorter = median_run(blocks, mode, 10, bytes, work, errors);
                    printf("%-6d %-5s %6d %6d %10.3f\n", blocks, names[mode], bytes, work,
                           (longer - shorter) * 1e3f / (steps - 10));
                }
    unsigned host_errors = 0;
    CHECK(cudaMemcpy(&host_errors, errors, sizeof(unsigned), cudaMemcpyDeviceToHost));
    printf("words received wrong: %u\n", host_errors);
    CHECK(cudaFree(errors));
    return host_errors == 0 ? 0 : 1;
}
