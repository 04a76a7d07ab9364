/*
 * cuda_runtime.h (fiber emulation) - runs the project's CUDA kernels (the
 * cell's and the sequence's, the .cu files of csrc/core) on the CPU, so CI (no GPU)
 * checks their indexing, tiling, padding, warp-shuffle reductions and
 * block, grid and cluster barriers.
 *
 * Model: every thread of every block is a fiber (ucontext) on one OS thread,
 * so a grid-wide barrier works (all blocks are resident, as in a cooperative
 * or cluster launch; an ordinary launch runs its blocks one after another,
 * so __shared__, which becomes `static`, is the running block's). A fiber runs until it waits at a barrier: the block's
 * (__syncthreads), its warp's (each __shfl_xor_sync is two warp barriers
 * around a slot exchange) or the grid's (grid/cluster sync, or the split
 * cluster barrier: barrier_arrive counts the thread in and goes on,
 * barrier_wait blocks until every thread arrived in that phase); the last to
 * arrive makes the others runnable. A launch of several clusters (gridDim.x
 * a multiple of the cluster size) maps ranks within each cluster; its
 * cluster barriers meet the whole grid (stronger than the hardware's). A barrier that some threads never reach
 * is reported as a deadlock; a wait without its arrival, a second arrival
 * before the wait, a launch that ends between the two, map_shared_rank of an
 * address outside the block's dynamic shared memory or of a rank outside the
 * cluster as misuse. The emulated cluster launch is one cluster (the whole
 * grid): map_shared_rank(p, r) is p's offset in block r's shared memory,
 * stores there are seen at once. Transaction barriers (mbarrier: init,
 * arrive.expect_tx, try_wait.parity) and st.async of 16 bytes with
 * complete_tx on the receiver's mbarrier follow the PTX rules: a phase
 * completes when its arrivals are in and its transaction count is back at
 * 0 (the count may go negative before the arrival), try_wait.parity(P)
 * waits while the current phase's parity is P; a barrier used before its
 * init, a count past 2^20 - 1, or a misaligned st.async is misuse. Dynamic shared memory starts as NaN bytes
 * (0xff), so a read of shared memory nothing wrote shows. Not emulated:
 * timing, the memory model, caches. The device (its properties and
 * occupancy answers) is emu_device.h's: an H100 unless a test describes
 * another.
 *
 * The sources launch through LLTM_LAUNCH(grid, block, smem, stream, kernel)
 * (args...) and declare dynamic shared memory with LLTM_DYNAMIC_SMEM(name)
 * (csrc/core/lltm_cuda_launch.cuh); both are defined here, so the tests
 * compile the .cu files as they are.
 */
#pragma once
/* lltm_cuda_cluster.cuh takes the emulator's cluster primitives (mbarriers,
 * st.async) instead of its PTX */
#define LLTM_CUDA_EMULATION 1
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include <array>
#include <deque>
#include <functional>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) alignas(n)

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct float4 { float x, y, z, w; };
struct double2 { double x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }

typedef struct CUstream_st *cudaStream_t;
typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevice = 101,
    cudaErrorLaunchFailure = 719,
} cudaError_t;
enum cudaDeviceAttr {
    cudaDevAttrMultiProcessorCount,
    cudaDevAttrCooperativeLaunch,
    cudaDevAttrClusterLaunch,
    cudaDevAttrMaxSharedMemoryPerBlockOptin,
    cudaDevAttrComputeCapabilityMajor,
    cudaDevAttrComputeCapabilityMinor,
    cudaDevAttrMaxSharedMemoryPerMultiprocessor,
    cudaDevAttrMaxThreadsPerMultiProcessor,
    cudaDevAttrMaxRegistersPerMultiprocessor,
};
enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize,
    cudaFuncAttributeNonPortableClusterSizeAllowed,
};
enum cudaMemcpyKind { cudaMemcpyDeviceToDevice };
enum cudaLaunchAttributeID { cudaLaunchAttributeClusterDimension };
struct cudaLaunchAttribute {
    cudaLaunchAttributeID id;
    struct {
        struct { unsigned x, y, z; } clusterDim;
    } val;
};
struct cudaLaunchConfig_t {
    dim3 gridDim, blockDim;
    size_t dynamicSmemBytes;
    cudaStream_t stream;
    cudaLaunchAttribute *attrs;
    unsigned numAttrs;
};

namespace emu {

constexpr size_t STACK_BYTES = 48 * 1024;
constexpr size_t SMEM_OPTIN = 227 * 1024; /* the default device's (emu_device.h) */

struct Fiber {
    ucontext_t ctx;
    dim3 tid, bid;
    unsigned block = 0, lane = 0, warp = 0; /* warp: index over the grid */
    bool done = false;
    unsigned lag = 0; /* runs only when no fiber of a smaller lag can (0, 1, 2) */
    bool grid_arrived = false; /* between barrier_arrive and barrier_wait */
    unsigned grid_phase = 0;   /* the grid barrier's phase it arrived in */
    std::vector<char> stack;
};

struct Barrier {
    unsigned expected = 0, arrived = 0, phase = 0; /* phase: completions so far */
    std::vector<Fiber *> waiting;
};

struct Mbarrier { /* a transaction barrier's state, by its address */
    unsigned count = 0, pending = 0, phase = 0;
    long long tx = 0;
    std::vector<Fiber *> waiting;
};

struct Grid {
    std::map<const void *, Mbarrier> mbarriers;
    dim3 grid, block;
    unsigned threads_per_block = 0;
    unsigned cluster_blocks = 0; /* blocks a cluster (the grid, but for cluster launches) */
    std::vector<Fiber> fibers;
    std::vector<Barrier> block_barriers, warp_barriers;
    Barrier grid_barrier;
    std::vector<std::vector<unsigned char>> smem;
    std::vector<std::vector<double>> slots; /* per warp: one value per lane */
    /* per warp: each lane's mma registers (cuda_mma.h) */
    std::vector<std::vector<std::array<uint32_t, 6>>> fragments;
    std::vector<Fiber *> runnable[3]; /* by lag */
    std::function<void()> body;
};

inline Grid *g = nullptr;
inline void wake(Fiber *f) { g->runnable[f->lag].push_back(f); }
inline uint64_t launches = 0; /* seeds each launch's schedule */
} // namespace emu
inline dim3 blockDim, gridDim; /* of the launch running now */
namespace emu {
inline Fiber *current = nullptr;
inline ucontext_t scheduler;
inline cudaError_t last_error = cudaSuccess;
inline bool deadlock = false;
inline bool misuse = false; /* of the split barrier or map_shared_rank, this launch */
} // namespace emu

/* the emulated devices and the runtime calls about them */
#include "emu_device.h"

namespace emu {

inline void report_misuse(const char *what)
{
    if (!misuse)
        fprintf(stderr, "emu: %s\n", what);
    misuse = true;
}

inline void yield_to_scheduler() { swapcontext(&current->ctx, &scheduler); }

/* Count one arrival at b; the last of a phase completes it and makes the
 * waiting fibers runnable. */
inline void count_arrival(Barrier &b)
{
    if (++b.arrived == b.expected) {
        b.arrived = 0;
        ++b.phase;
        for (Fiber *f : b.waiting)
            wake(f);
        b.waiting.clear();
    }
}

/* Wait at b until `expected` fibers arrived. */
inline void arrive(Barrier &b)
{
    const unsigned phase = b.phase;
    count_arrival(b);
    if (b.phase != phase)
        return; /* the last one goes on without switching */
    b.waiting.push_back(current);
    yield_to_scheduler();
}

/* The grid (cluster) barrier split in two: arrive, then wait for the phase
 * arrived in to complete. */
inline void grid_arrive()
{
    if (current->grid_arrived)
        report_misuse("barrier_arrive twice without barrier_wait");
    current->grid_arrived = true;
    current->grid_phase = g->grid_barrier.phase;
    count_arrival(g->grid_barrier);
}

inline void grid_wait()
{
    if (!current->grid_arrived) {
        report_misuse("barrier_wait without barrier_arrive");
        return;
    }
    current->grid_arrived = false;
    if (g->grid_barrier.phase != current->grid_phase)
        return;
    g->grid_barrier.waiting.push_back(current);
    yield_to_scheduler();
}

inline void grid_sync()
{
    grid_arrive();
    grid_wait();
}

inline void trampoline()
{
    g->body();
    if (current->grid_arrived)
        report_misuse("a thread ended between barrier_arrive and barrier_wait");
    current->done = true;
    yield_to_scheduler();
}

/* getcontext returns twice: keep it out of run()'s frame */
__attribute__((noinline)) inline void make_fiber(Fiber &f)
{
    f.stack.resize(STACK_BYTES);
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack.data();
    f.ctx.uc_stack.ss_size = f.stack.size();
    f.ctx.uc_link = nullptr;
    makecontext(&f.ctx, trampoline, 0);
}

inline unsigned char *dynamic_smem() { return g->smem[current->block].data(); }

/* Transaction barriers (PTX mbarrier) and st.async: see the file comment. */
inline Mbarrier *mbarrier_at(const void *bar)
{
    auto it = g->mbarriers.find(bar);
    if (it == g->mbarriers.end()) {
        report_misuse("mbarrier used before mbarrier.init");
        return nullptr;
    }
    return &it->second;
}

inline void mbar_settle(Mbarrier &m)
{
    if (m.tx > (1 << 20) - 1 || m.tx < -((1 << 20) - 1))
        report_misuse("mbarrier transaction count out of range");
    if (m.pending == 0 && m.tx == 0) {
        ++m.phase;
        m.pending = m.count;
        for (Fiber *f : m.waiting)
            wake(f);
        m.waiting.clear();
    }
}

inline void mbar_init(uint64_t *bar, unsigned count)
{
    Mbarrier &m = g->mbarriers[bar];
    m = Mbarrier();
    m.count = m.pending = count;
}

inline void mbar_arrive_expect_tx(uint64_t *bar, unsigned bytes)
{
    Mbarrier *m = mbarrier_at(bar);
    if (!m)
        return;
    if (m->pending == 0) {
        report_misuse("mbarrier arrival beyond its count");
        return;
    }
    --m->pending;
    m->tx += bytes;
    mbar_settle(*m);
}

inline void mbar_wait(uint64_t *bar, unsigned parity)
{
    for (;;) {
        Mbarrier *m = mbarrier_at(bar);
        if (!m || (m->phase & 1u) != (parity & 1u))
            return;
        m->waiting.push_back(current);
        yield_to_scheduler();
    }
}

template <typename T> T *map_shared_rank(T *addr, int rank);

/* st.async of 16 bytes: src (this block) -> dst mapped to block `rank`,
 * complete_tx(16) on bar mapped to block `rank` */
inline void st_async16(const void *src, void *dst, uint64_t *bar, int rank)
{
    if (((uintptr_t)src | (uintptr_t)dst) % 16 != 0)
        report_misuse("st.async of 16 bytes at an address not 16-byte aligned");
    unsigned char *remote = map_shared_rank(static_cast<unsigned char *>(dst), rank);
    uint64_t *remote_bar = map_shared_rank(bar, rank);
    memcpy(remote, src, 16);
    if (Mbarrier *m = mbarrier_at(remote_bar)) {
        m->tx -= 16;
        mbar_settle(*m);
    }
    if (current->lag) { /* a slow sender: let the others run on */
        wake(current);
        yield_to_scheduler();
    }
}

/* addr (in this block's dynamic shared memory) in block `rank`'s */
template <typename T> T *map_shared_rank(T *addr, int rank)
{
    const std::vector<unsigned char> &mine = g->smem[current->block];
    const unsigned char *p = reinterpret_cast<const unsigned char *>(addr);
    if (p < mine.data() || p + sizeof(T) > mine.data() + mine.size() - 16) {
        report_misuse("map_shared_rank of an address outside the block's shared memory");
        return addr;
    }
    if (rank < 0 || (unsigned)rank >= g->cluster_blocks) {
        report_misuse("map_shared_rank of a rank outside the cluster");
        return addr;
    }
    const unsigned block = current->block / g->cluster_blocks * g->cluster_blocks + (unsigned)rank;
    return reinterpret_cast<T *>(g->smem[block].data() + (p - mine.data()));
}

/* Run body() as every thread of grid x block, all resident at once, in
 * clusters of `cluster` blocks (0: one, the grid); or (count > 0) only the
 * blocks [first, first + count) of the grid, resident together. */
inline cudaError_t run(dim3 grid, dim3 block, size_t smem, std::function<void()> body,
                       unsigned cluster = 0, unsigned first = 0, unsigned count = 0)
{
    const unsigned nt = block.x * block.y * block.z;
    const unsigned total = grid.x * grid.y * grid.z;
    const unsigned nb = count ? count : total;
    if (nt == 0 || nt > 1024 || nt % 32 != 0 || total == 0 ||
        smem > (size_t)device().smem_optin ||
        grid.y > 65535 || grid.z > 65535)
        return last_error = cudaErrorInvalidConfiguration;
    Grid state;
    state.grid = grid;
    state.block = block;
    state.threads_per_block = nt;
    state.cluster_blocks = cluster ? cluster : nb;
    if (nb % state.cluster_blocks != 0)
        return last_error = cudaErrorInvalidConfiguration;
    state.body = std::move(body);
    state.fibers.resize((size_t)nb * nt);
    state.block_barriers.resize(nb);
    state.warp_barriers.resize((size_t)nb * nt / 32);
    state.slots.assign((size_t)nb * nt / 32, std::vector<double>(32));
    state.fragments.assign((size_t)nb * nt / 32, std::vector<std::array<uint32_t, 6>>(32));
    state.smem.assign(nb, std::vector<unsigned char>(smem + 16, 0xff));
    for (auto &b : state.block_barriers)
        b.expected = nt;
    for (auto &w : state.warp_barriers)
        w.expected = 32;
    state.grid_barrier.expected = nb * nt;
    g = &state;
    misuse = false;
    gridDim = grid;
    blockDim = block;
    for (unsigned b = 0; b < nb; ++b)
        for (unsigned t = 0; t < nt; ++t) {
            Fiber &f = state.fibers[(size_t)b * nt + t];
            const unsigned gb = first + b; /* the block's index in the grid */
            f.block = b;
            f.bid = dim3(gb % grid.x, (gb / grid.x) % grid.y, gb / (grid.x * grid.y));
            f.tid = dim3(t % block.x, (t / block.x) % block.y, t / (block.x * block.y));
            f.lane = t % 32;
            f.warp = (b * nt + t) / 32;
            make_fiber(f);
        }
    /* Runnable fibers are picked in a pseudo-random order (a fixed seed per
     * launch), so blocks drift apart as far as the barriers allow: a missing
     * barrier shows up as reads of outputs not yet written (poisoned with
     * NaN). One fiber in 8 lags (lag 1: it runs only when no fiber of lag 0
     * can), and one more, the straggler (lag 2), runs only when no other
     * fiber can; lagging fibers yield after each st.async, as slow warps
     * would, so a thread that still has to read what a faster one overwrites
     * after its next wait shows as a wrong result. */
    uint64_t rng = 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull * ++launches;
    auto next = [&rng] {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        return (size_t)(rng >> 33);
    };
    for (auto &f : state.fibers)
        f.lag = next() % 8 == 0 ? 1 : 0;
    state.fibers[next() % state.fibers.size()].lag = 2;
    for (auto &f : state.fibers)
        wake(&f);
    for (;;) {
        unsigned lag = 0;
        while (lag < 3 && state.runnable[lag].empty())
            ++lag;
        if (lag == 3)
            break;
        std::vector<Fiber *> &from = state.runnable[lag];
        const size_t pick = next() % from.size();
        std::swap(from[pick], from.back());
        current = from.back();
        from.pop_back();
        swapcontext(&scheduler, &current->ctx);
    }
    bool all_done = true;
    for (auto &f : state.fibers)
        all_done = all_done && f.done;
    g = nullptr;
    current = nullptr;
    if (!all_done) {
        deadlock = true;
        fprintf(stderr, "emu: deadlock: some threads wait at a barrier others never reach\n");
        return last_error = cudaErrorLaunchFailure;
    }
    if (misuse)
        return last_error = cudaErrorLaunchFailure;
    return cudaSuccess;
}

template <typename... P, size_t... N>
std::tuple<P...> unpack(void **args, std::index_sequence<N...>)
{
    return std::tuple<P...>(*static_cast<P *>(args[N])...);
}

/* A persistent launch: arguments as the runtime's void **args. */
template <typename... P>
cudaError_t launch_args(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, void **args)
{
    std::tuple<P...> params = unpack<P...>(args, std::index_sequence_for<P...>{});
    return run(grid, block, smem, [&] { std::apply(kernel, params); });
}

struct cfg {
    dim3 grid, block;
    size_t smem;
    cfg(dim3 g_, dim3 b_, size_t s = 0, cudaStream_t = nullptr) : grid(g_), block(b_), smem(s) {}
};

/* kernel<<<grid, block, smem, stream>>>(args...): an ordinary launch, whose
 * blocks never wait for each other, runs one block at a time, so that
 * static __shared__ arrays (static variables here) are the running block's */
template <typename... P, typename... Args>
void launch(cfg c, void (*kernel)(P...), Args... args)
{
    std::tuple<P...> params(static_cast<P>(args)...);
    const unsigned blocks = c.grid.x * c.grid.y * c.grid.z;
    for (unsigned b = 0; b < (blocks ? blocks : 1); ++b) {
        cudaError_t e = run(c.grid, c.block, c.smem, [&] { std::apply(kernel, params); }, 0, b,
                            1);
        if (e != cudaSuccess) {
            last_error = e;
            return;
        }
    }
}

/* LLTM_LAUNCH(grid, block, smem, stream, kernel)(args...) */
template <typename K> struct launcher {
    cfg c;
    K kernel;
    template <typename... Args> void operator()(Args... args) const { launch(c, kernel, args...); }
};
template <typename... P> launcher<void (*)(P...)> make_launcher(cfg c, void (*kernel)(P...))
{
    return launcher<void (*)(P...)>{c, kernel};
}

inline void warp_sync() { arrive(g->warp_barriers[current->warp]); }

template <typename T> T shfl_xor(T v, int mask)
{
    auto &slot = g->slots[current->warp];
    static_assert(sizeof(T) <= sizeof(double), "shuffle of a wider type");
    memcpy(&slot[current->lane], &v, sizeof(T));
    warp_sync();
    T r;
    memcpy(&r, &slot[current->lane ^ (unsigned)mask], sizeof(T));
    warp_sync();
    return r;
}

} // namespace emu

/* the warp's tensor-core operations (ldmatrix, mma.sync) */
#include "cuda_mma.h"

#define LLTM_LAUNCH(grid, block, smem, stream, ...)                                          \
    emu::make_launcher(emu::cfg(grid, block, smem, stream), __VA_ARGS__)
#define LLTM_DYNAMIC_SMEM(name) unsigned char *name = emu::dynamic_smem()

#define threadIdx (emu::current->tid)
#define blockIdx (emu::current->bid)

/* a kernel that must never run here (see sequence_forward_kernel) */
[[noreturn]] inline void __trap() { abort(); }
inline void __syncthreads() { emu::arrive(emu::g->block_barriers[emu::current->block]); }

template <typename T> inline T __shfl_xor_sync(unsigned, T v, int mask)
{
    return emu::shfl_xor(v, mask);
}
/* the device's fast division: MUFU.RCP, then a multiply (2 ulp at most
 * for normal divisors); here the exact one */
inline float __fdividef(float a, float b) { return a / b; }
template <typename T> inline T __ldcg(const T *p) { return *p; }
template <typename T> inline T __ldg(const T *p) { return *p; }
inline unsigned __float_as_uint(float x)
{
    unsigned u;
    memcpy(&u, &x, sizeof(u));
    return u;
}

enum cudaStreamCaptureStatus {
    cudaStreamCaptureStatusNone = 0,
    cudaStreamCaptureStatusActive = 1,
    cudaStreamCaptureStatusInvalidated = 2,
};
/* No graphs run here; a test says whether streams count as being captured
 * (emu_set_capturing), so that what the library does differently under
 * capture runs too. */
namespace emu {
inline bool capturing = false;
} // namespace emu
extern "C" __attribute__((used, visibility("default"))) inline void emu_set_capturing(int on)
{
    emu::capturing = on != 0;
}
inline cudaError_t cudaStreamIsCapturing(cudaStream_t, cudaStreamCaptureStatus *status)
{
    *status = emu::capturing ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
    return cudaSuccess;
}
inline cudaError_t cudaGetLastError()
{
    cudaError_t e = emu::last_error;
    emu::last_error = cudaSuccess;
    return e;
}
inline cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind,
                                   cudaStream_t)
{
    memcpy(dst, src, n);
    return cudaSuccess;
}
inline cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                                     size_t width, size_t height, cudaMemcpyKind, cudaStream_t)
{
    for (size_t r = 0; r < height; ++r)
        memcpy((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void *dst, int v, size_t n, cudaStream_t)
{
    memset(dst, v, n);
    return cudaSuccess;
}

/* The runtime's C++ launch forms that the sequence kernels use. */
template <typename... P>
inline cudaError_t cudaLaunchCooperativeKernel(void (*kernel)(P...), dim3 grid, dim3 block,
                                               void **args, size_t smem, cudaStream_t)
{
    return emu::launch_args(kernel, grid, block, smem, args);
}
template <typename... P, typename... Args>
inline cudaError_t cudaLaunchKernelEx(const cudaLaunchConfig_t *config, void (*kernel)(P...),
                                      Args &&...args)
{
    unsigned blocks = 1;
    for (unsigned a = 0; a < config->numAttrs; ++a)
        if (config->attrs[a].id == cudaLaunchAttributeClusterDimension)
            blocks = config->attrs[a].val.clusterDim.x;
    /* clusters of `blocks` along x */
    if (config->gridDim.x % blocks != 0 || config->gridDim.y != 1 || config->gridDim.z != 1 ||
        !emu::cluster_size_ok((const void *)kernel, blocks))
        return emu::last_error = cudaErrorInvalidConfiguration;
    std::tuple<P...> params(static_cast<P>(args)...);
    return emu::run(config->gridDim, config->blockDim, config->dynamicSmemBytes,
                    [&] { std::apply(kernel, params); }, blocks);
}
