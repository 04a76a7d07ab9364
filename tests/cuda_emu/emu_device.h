/*
 * emu_device.h (fiber emulation, included by cuda_runtime.h) - the
 * emulated devices: their properties, the runtime calls that report them
 * (cudaDeviceGetAttribute, cudaFuncGetAttributes, the occupancy queries)
 * and the current device (cudaGetDevice / cudaSetDevice).
 *
 * Every ordinal starts as an H100 SXM running sm_90 code, the device the
 * emulated tests were written against. A test may describe another device
 * under an ordinal (emu_set_device) and make it current (emu_use_device),
 * so that the plan choosers, which ask the runtime, see that device's
 * answers. The chooser caches its answers per ordinal: give each described
 * device an ordinal of its own and describe it only once.
 *
 * Occupancy (blocks of a kernel an SM holds) is the least of what the SM's
 * threads, shared memory and registers allow. The emulator cannot see a
 * kernel's registers; the library's persistent kernels keep W_h in
 * registers, so each thread is taken to use as many as still let one block
 * fit, at most 255 (a 256-thread block: one an SM; 128 threads: two).
 * Resident clusters: the SMs' blocks in clusters of the launch's size, at
 * most max_clusters (a cluster stays within one GPU processing cluster;
 * the H100 SXM answers 7 for clusters of 16, and the model keeps 7 for
 * every size, which understates smaller clusters).
 */
#pragma once

namespace emu {

struct Device {
    int sm_count, major, minor;
    int smem_optin;         /* dynamic shared memory a block may opt in to, bytes */
    int smem_per_sm;        /* shared memory of an SM for its blocks, bytes */
    int max_threads_per_sm;
    int regs_per_sm;        /* 32-bit registers */
    int max_cluster;        /* blocks a cluster, with the non-portable opt-in (0: no clusters) */
    int max_clusters;       /* clusters resident at once (0: as many as the SMs hold) */
    int code_arch;          /* virtual architecture of the code that runs (its PTX) */
};

constexpr Device H100 = {132, 9, 0, (int)SMEM_OPTIN, 228 * 1024, 2048, 65536, 16, 7, 90};
constexpr int DEVICE_COUNT = 64;
constexpr int PORTABLE_CLUSTER = 8;

inline std::array<Device, DEVICE_COUNT> devices = [] {
    std::array<Device, DEVICE_COUNT> all;
    all.fill(H100);
    return all;
}();
inline int current_device = 0;
inline const Device &device() { return devices[current_device]; }
inline bool valid_ordinal(int ordinal) { return ordinal >= 0 && ordinal < DEVICE_COUNT; }

/* blocks of `threads` threads and `smem` bytes of dynamic shared memory an SM of d holds */
inline int blocks_per_sm(const Device &d, int threads, size_t smem)
{
    if (threads < 1 || smem > (size_t)d.smem_optin)
        return 0;
    const int warps = (threads + 31) / 32;
    /* a warp's registers, allocated in 256s: as many as let one block fit,
     * at most 255 a thread */
    const int most = (255 * 32 + 255) & ~255;
    int warp_regs = d.regs_per_sm / warps / 256 * 256;
    warp_regs = warp_regs < most ? warp_regs : most;
    const int by_regs = warp_regs ? d.regs_per_sm / (warps * warp_regs) : 0;
    const int by_threads = d.max_threads_per_sm / (warps * 32);
    /* from compute capability 8.0 the system keeps 1 KB of an SM's shared
     * memory a block */
    const size_t block_smem = smem + (d.major >= 8 ? 1024 : 0);
    const int by_smem = block_smem ? (int)((size_t)d.smem_per_sm / block_smem) : by_threads;
    int n = by_regs < by_threads ? by_regs : by_threads;
    return by_smem < n ? by_smem : n;
}

inline std::vector<const void *> nonportable; /* kernels allowed clusters over 8 */

/* whether d runs clusters of `blocks` blocks: at most 8, up to its largest
 * where the kernel allows non-portable sizes */
inline bool cluster_fits(const Device &d, unsigned blocks, bool nonportable_allowed)
{
    const unsigned most = (unsigned)d.max_cluster;
    return blocks >= 1 &&
           blocks <= (nonportable_allowed || most < PORTABLE_CLUSTER ? most : PORTABLE_CLUSTER);
}
inline bool cluster_size_ok(const void *kernel, unsigned blocks)
{
    bool allowed = false;
    for (const void *k : nonportable)
        allowed = allowed || k == kernel;
    return cluster_fits(device(), blocks, allowed);
}

/* clusters of `blocks` blocks (threads, smem as blocks_per_sm) resident at
 * once on d */
inline int resident_clusters(const Device &d, unsigned blocks, int threads, size_t smem)
{
    const int clusters = blocks_per_sm(d, threads, smem) * d.sm_count / (int)blocks;
    return d.max_clusters && d.max_clusters < clusters ? d.max_clusters : clusters;
}

} // namespace emu

/* Describe device `ordinal` (see the file comment); 0 on success. */
extern "C" __attribute__((used, visibility("default"))) inline int
emu_set_device(int ordinal, int sm_count, int major, int minor, int smem_optin, int smem_per_sm,
               int max_threads_per_sm, int regs_per_sm, int max_cluster, int max_clusters,
               int code_arch)
{
    if (!emu::valid_ordinal(ordinal) || sm_count < 1 || smem_optin < 0 ||
        smem_optin > smem_per_sm || max_cluster < 0 || max_clusters < 0)
        return 1;
    emu::devices[ordinal] = {sm_count,    major,       minor,        smem_optin,
                             smem_per_sm, max_threads_per_sm, regs_per_sm,
                             max_cluster, max_clusters, code_arch};
    return 0;
}
/* For tests, the current device's occupancy answers: blocks an SM holds,
 * and clusters resident at once (non-portable sizes allowed, as the
 * library's cluster kernels ask for them) */
extern "C" __attribute__((used, visibility("default"))) inline int
emu_blocks_per_sm(int threads, long long smem)
{
    return smem < 0 ? 0 : emu::blocks_per_sm(emu::device(), threads, (size_t)smem);
}
extern "C" __attribute__((used, visibility("default"))) inline int
emu_resident_clusters(int blocks, int threads, long long smem)
{
    const emu::Device &d = emu::device();
    if (smem < 0 || !emu::cluster_fits(d, (unsigned)blocks, true))
        return 0;
    return emu::resident_clusters(d, (unsigned)blocks, threads, (size_t)smem);
}
/* Make device `ordinal` current (cudaSetDevice); 0 on success. */
extern "C" __attribute__((used, visibility("default"))) inline int emu_use_device(int ordinal)
{
    if (!emu::valid_ordinal(ordinal))
        return 1;
    emu::current_device = ordinal;
    return 0;
}

inline cudaError_t cudaGetDevice(int *device)
{
    *device = emu::current_device;
    return cudaSuccess;
}
inline cudaError_t cudaSetDevice(int device)
{
    if (!emu::valid_ordinal(device))
        return emu::last_error = cudaErrorInvalidDevice;
    emu::current_device = device;
    return cudaSuccess;
}
/* ptxVersion: the code's virtual architecture (a Hopper GPU running the
 * library's compute_80 PTX: 80); binaryVersion: the device's own, the
 * machine code being built for it or JIT-compiled from the PTX */
struct cudaFuncAttributes {
    int ptxVersion, binaryVersion;
};
template <typename K> cudaError_t cudaFuncGetAttributes(cudaFuncAttributes *attr, K)
{
    attr->ptxVersion = emu::device().code_arch;
    attr->binaryVersion = emu::device().major * 10 + emu::device().minor;
    return cudaSuccess;
}
inline cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int device)
{
    if (!emu::valid_ordinal(device))
        return emu::last_error = cudaErrorInvalidDevice;
    const emu::Device &d = emu::devices[device];
    switch (attr) {
    case cudaDevAttrMultiProcessorCount: *value = d.sm_count; break;
    case cudaDevAttrCooperativeLaunch: *value = 1; break;
    case cudaDevAttrClusterLaunch: *value = d.major >= 9 && d.max_cluster > 0; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = d.smem_optin; break;
    case cudaDevAttrComputeCapabilityMajor: *value = d.major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = d.minor; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *value = d.smem_per_sm; break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: *value = d.max_threads_per_sm; break;
    case cudaDevAttrMaxRegistersPerMultiprocessor: *value = d.regs_per_sm; break;
    }
    return cudaSuccess;
}
inline cudaError_t cudaFuncSetAttribute(const void *kernel, cudaFuncAttribute attr, int value)
{
    if (attr == cudaFuncAttributeNonPortableClusterSizeAllowed) {
        if (value)
            emu::nonportable.push_back(kernel);
        return cudaSuccess;
    }
    return value <= emu::device().smem_optin ? cudaSuccess : cudaErrorInvalidValue;
}
inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, const void *,
                                                                 int threads, size_t smem)
{
    *n = emu::blocks_per_sm(emu::device(), threads, smem);
    return cudaSuccess;
}
inline cudaError_t cudaOccupancyMaxActiveClusters(int *n, const void *kernel,
                                                  const cudaLaunchConfig_t *config)
{
    unsigned blocks = 1;
    for (unsigned a = 0; a < config->numAttrs; ++a)
        if (config->attrs[a].id == cudaLaunchAttributeClusterDimension)
            blocks = config->attrs[a].val.clusterDim.x;
    if (blocks > 16)
        return emu::last_error = cudaErrorInvalidValue;
    const dim3 b = config->blockDim;
    *n = emu::cluster_size_ok(kernel, blocks)
             ? emu::resident_clusters(emu::device(), blocks, (int)(b.x * b.y * b.z),
                                      config->dynamicSmemBytes)
             : 0;
    return cudaSuccess;
}
