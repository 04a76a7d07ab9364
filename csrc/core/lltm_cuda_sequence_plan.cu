/*
 * lltm_cuda_sequence_plan.cu - the plan chooser of the CUDA sequence
 * (lltm.h: lltm_sequence_plan_cuda): which kernel family and layout runs
 * one layer of B rows and H units on a device, decided once and returned as
 * a value that both directions take.
 *
 * What it asks the CUDA runtime: the occupancy of each kernel (blocks per
 * SM of a cooperative grid, resident clusters), once per device, dtype and
 * layout; the answers do not change, and the queries cost host time and are
 * best kept out of CUDA-graph capture, so they are cached (atomics: plans
 * may be made from several threads).
 */
#include "lltm_cuda_grid_layouts.h"
#include "lltm_cuda_launch.cuh"
#include "lltm_cuda_math.cuh"
#include "lltm_cuda_sequence.cuh"

#include <math.h>
#include <string.h>

namespace lltm_seq {

/* lltm_cuda_sequence.cuh */
int64_t max_resident_blocks(const void *kernel, size_t smem, const lltm_cuda_device &dev,
                            bool cooperative, int threads)
{
    if (!kernel || (cooperative && !dev.cooperative_launch) || smem > (size_t)dev.smem_optin)
        return 0;
    /* past the default limit only: a lower limit would refuse a later
     * launch of the same kernel with more (the block family's smem grows
     * with its rows) */
    if (smem > 48 * 1024 &&
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) !=
            cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    int per_sm = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem) !=
        cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return (int64_t)per_sm * dev.sm_count;
}

} // namespace lltm_seq

namespace {

using namespace lltm_seq;

constexpr int MAX_DEVICES = 64, NUM_DTYPES = 4;
/* layers planned to run at once on a device (lltm_sequence_plan_options.concurrent) */
constexpr int MAX_CONCURRENT = 2;

bool known_dtype(lltm_dtype dtype)
{
    return dtype == LLTM_FLOAT32 || dtype == LLTM_FLOAT64 || dtype == LLTM_FLOAT16 ||
           dtype == LLTM_BFLOAT16;
}

bool cached_device(const lltm_cuda_device &dev)
{
    return dev.device >= 0 && dev.device < MAX_DEVICES;
}

const void *grid_kernel_for(lltm_dtype dtype, bool forward, int lanes, int values, int chunk,
                            bool tf32)
{
    LLTM_DISPATCH_OR(dtype, grid_kernel<T>(forward, lanes, values, chunk, tf32), nullptr);
}
const void *cluster_kernel_for(lltm_dtype dtype, bool forward, const lltm_sequence_launch &l)
{
    LLTM_DISPATCH_OR(dtype, forward ? cluster_forward_kernel<T>(l) : cluster_backward_kernel<T>(l),
                     nullptr);
}

/* ---------------------------------------------------------------- grid -- */

/* The grid layouts: LLTM_GRID_LAYOUTS (lltm_cuda_grid_layouts.h), in the
 * order the chooser tries them; the rows of a chunk each comes in (a tie
 * keeps the first). */
constexpr int GRID_CHUNKS[] = {BC, GRID_SMALL_CHUNK};
constexpr int NUM_GRID_CHUNKS = 2;

/* max_resident_blocks of a layout's two kernels plus one (0: not asked
 * yet); [tf32]: float32's TF32 build */
int64_t resident_cache[MAX_DEVICES][NUM_DTYPES][LLTM_GRID_LAYOUT_COUNT][NUM_GRID_CHUNKS][2];

int64_t grid_resident_blocks(const lltm_cuda_device &dev, lltm_dtype dtype, int layout,
                             int chunk_index, bool tf32)
{
    const lltm_grid_layout g = LLTM_GRID_LAYOUTS[layout];
    const int ch = GRID_CHUNKS[chunk_index];
    int64_t *slot = cached_device(dev)
                        ? &resident_cache[dev.device][dtype][layout][chunk_index][tf32]
                        : nullptr;
    int64_t resident = slot ? __atomic_load_n(slot, __ATOMIC_RELAXED) - 1 : -1;
    if (resident < 0) {
        const size_t acc = acc_bytes(dtype), mma = grid_mma_bytes(dtype, tf32);
        const int64_t f =
            max_resident_blocks(grid_kernel_for(dtype, true, g.lanes, g.values, ch, tf32),
                                grid_forward_smem(acc, mma, g.lanes, g.values, ch), dev);
        const int64_t b =
            max_resident_blocks(grid_kernel_for(dtype, false, g.lanes, g.values, ch, tf32),
                                grid_backward_smem(acc, mma, g.lanes, g.values, ch), dev);
        resident = f < b ? f : b;
        if (slot)
            __atomic_store_n(slot, resident + 1, __ATOMIC_RELAXED);
    }
    return resident;
}

/* Batch groups of a grid layout (the grid is unit_blocks x groups): as many
 * as fit beside the unit blocks, at most one per ch-row chunk of B, at most
 * `cap` (0: no cap). */
int64_t grid_groups(int64_t resident, int64_t unit_blocks, int64_t B, int ch, int64_t cap)
{
    int64_t groups = resident / unit_blocks;
    const int64_t chunks = ceil_div(B, ch);
    if (groups > chunks)
        groups = chunks;
    if (cap >= 1 && cap < groups)
        groups = cap;
    return groups < 1 ? 1 : groups;
}

/* Whether a grid layout in chunks of GRID_CHUNKS[chunk_index] rows runs B,
 * H here (H within lanes * values, co-resident, in the library for the
 * dtype; `concurrent` such grids at once, each with its share of the
 * resident blocks), and its batch groups. */
bool grid_fits(const lltm_cuda_device &dev, lltm_dtype dtype, int layout, int chunk_index,
               bool tf32, int64_t B, int64_t H, int64_t cap, int concurrent, int64_t *groups)
{
    const lltm_grid_layout g = LLTM_GRID_LAYOUTS[layout];
    if (H > (int64_t)g.lanes * g.values)
        return false;
    /* a layout of the tensor cores only: where the dtype's products run
     * there (its kernels elsewhere stop at once) */
    if (grid_mma_only(g.values) && (dtype == LLTM_FLOAT32 || dtype == LLTM_FLOAT64 ||
                                    !lltm_cuda_grid_tensor_cores(&dev, dtype)))
        return false;
    const int64_t resident =
        grid_resident_blocks(dev, dtype, layout, chunk_index, tf32) / concurrent;
    const int64_t unit_blocks = ceil_div(H, NT / g.lanes);
    if (unit_blocks > resident)
        return false;
    *groups = grid_groups(resident, unit_blocks, B, GRID_CHUNKS[chunk_index], cap);
    return true;
}

lltm_sequence_launch grid_launch(lltm_dtype dtype, bool forward, int layout, int ch, bool tf32,
                                 int64_t H, int64_t groups)
{
    const lltm_grid_layout g = LLTM_GRID_LAYOUTS[layout];
    lltm_sequence_launch l = {};
    l.lanes = g.lanes;
    l.values = g.values;
    l.rows = ch;
    l.chunk = ch;
    l.exchange = LLTM_SEQ_EXCHANGE_GLOBAL;
    l.blocks = ceil_div(H, NT / g.lanes);
    l.groups = groups;
    l.tf32 = tf32;
    const size_t acc = acc_bytes(dtype), mma = grid_mma_bytes(dtype, tf32);
    l.smem = forward ? grid_forward_smem(acc, mma, g.lanes, g.values, ch)
                     : grid_backward_smem(acc, mma, g.lanes, g.values, ch);
    return l;
}

/* --------------------------------------------------------------- block -- */

const void *block_kernel_for(lltm_dtype dtype, bool forward, int chunk)
{
    LLTM_DISPATCH_OR(dtype, block_kernel<T>(forward, chunk), nullptr);
}

/* Blocks of both block kernels in chunks of BLOCK_CHUNKS[c] rows that run at
 * once, at the shared memory of one chunk a block (more rows a block add
 * little of it); per device, dtype and chunk, plus one (0: not asked yet).
 * The blocks never wait for each other: this sets how many batch groups run
 * side by side, not whether the plan can run. */
int64_t block_resident_cache[MAX_DEVICES][NUM_DTYPES][NUM_BLOCK_CHUNKS];

int64_t block_resident_blocks(const lltm_cuda_device &dev, lltm_dtype dtype, int c)
{
    int64_t *slot = cached_device(dev) ? &block_resident_cache[dev.device][dtype][c] : nullptr;
    int64_t resident = slot ? __atomic_load_n(slot, __ATOMIC_RELAXED) - 1 : -1;
    if (resident < 0) {
        const int ch = BLOCK_CHUNKS[c];
        const size_t acc = acc_bytes(dtype);
        const int threads = block_lanes(acc, ch) * BLOCK_UNITS;
        const int64_t f = max_resident_blocks(block_kernel_for(dtype, true, ch),
                                              block_forward_smem(acc, ch), dev, false, threads);
        const int64_t b = max_resident_blocks(block_kernel_for(dtype, false, ch),
                                              block_backward_smem(acc, ch), dev, false, threads);
        resident = f < b ? f : b;
        if (slot)
            __atomic_store_n(slot, resident + 1, __ATOMIC_RELAXED);
    }
    return resident;
}

/* The block plan in chunks of BLOCK_CHUNKS[c] rows: one block a batch group,
 * as many groups as run at once (a `concurrent`-th of them), at most one a
 * chunk and at most `cap` (0: no cap). False where H is past the block's
 * units or the rows of a group do not fit the block's shared memory. */
bool block_plan(const lltm_cuda_device &dev, lltm_dtype dtype, int c, int64_t B, int64_t H,
                int64_t cap, int concurrent, lltm_sequence_plan *plan)
{
    if (H > BLOCK_UNITS)
        return false;
    const int64_t resident = block_resident_blocks(dev, dtype, c) / concurrent;
    if (resident < 1)
        return false;
    const int ch = BLOCK_CHUNKS[c];
    const int64_t groups = grid_groups(resident, 1, B, ch, cap);
    const int64_t rows = group_rows(B, ch, groups);
    const size_t acc = acc_bytes(dtype);
    plan->family = LLTM_SEQ_BLOCK;
    for (int forward = 1; forward >= 0; --forward) {
        lltm_sequence_launch l = {};
        l.lanes = block_lanes(acc, ch);
        l.values = BLOCK_UNITS / l.lanes;
        l.rows = ch;
        l.chunk = ch;
        l.exchange = LLTM_SEQ_EXCHANGE_LOCAL;
        l.blocks = 1;
        l.groups = groups;
        l.smem = forward ? block_forward_smem(acc, rows) : block_backward_smem(acc, rows);
        if (l.smem > (size_t)dev.smem_optin)
            return false;
        (forward ? plan->forward : plan->backward) = l;
    }
    return true;
}

/* ------------------------------------------------------------- cluster -- */

/* How many clusters of `blocks` blocks of `kernel`, smem bytes each, can
 * run at once on the device (0: none, or the kernel is not in the library;
 * sets the kernel's attributes). */
int64_t cluster_resident(const void *kernel, int64_t blocks, size_t smem,
                         const lltm_cuda_device &dev, int threads = NT)
{
    if (!kernel || dev.major < 9 || !dev.cluster_launch || smem > (size_t)dev.smem_optin)
        return 0;
    if (cluster_attributes(kernel, blocks, smem) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t config = cluster_config(blocks, smem, nullptr, &attr, 1, threads);
    int resident = 0;
    if (cudaOccupancyMaxActiveClusters(&resident, kernel, &config) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return resident;
}

/* One launch of the cluster family: the layout, its blocks (H = 128, the
 * most, for the chooser's fit; ceil(H / units) in the plan) and smem. */
lltm_sequence_launch cluster_launch(lltm_dtype dtype, bool forward, int exchange, int lanes,
                                    int values, int rows, int chunk, int64_t B, int64_t H,
                                    int64_t groups)
{
    const size_t acc = acc_bytes(dtype);
    lltm_sequence_launch l = {};
    l.lanes = lanes;
    l.values = values;
    l.rows = rows;
    l.chunk = chunk;
    l.exchange = exchange;
    l.groups = groups;
    const int64_t grows = group_rows(B, chunk, groups);
    if (forward) {
        const int units = NT / lanes / (chunk / rows);
        l.blocks = ceil_div(H, units);
        l.smem = cluster_forward_smem(acc, lanes, values, units, grows, chunk);
    } else if (exchange == LLTM_SEQ_EXCHANGE_REDUCE_SCATTER) {
        l.blocks = ceil_div(H, RS_UNITS);
        l.smem = cluster_backward_rs_smem(acc, grows, chunk);
    } else {
        l.blocks = ceil_div(H, NT / lanes);
        l.smem = cluster_backward_broadcast_smem(acc, lanes, values, grows);
    }
    return l;
}

/* how many clusters of launch l (a cluster a batch group) run at once */
int64_t launch_resident(lltm_dtype dtype, bool forward, const lltm_sequence_launch &l,
                        const lltm_cuda_device &dev)
{
    const int threads = !forward && l.exchange == LLTM_SEQ_EXCHANGE_REDUCE_SCATTER
                            ? cluster_backward_rs_threads(acc_bytes(dtype), l.chunk)
                            : NT;
    return cluster_resident(cluster_kernel_for(dtype, forward, l), l.blocks, l.smem, dev,
                            threads);
}

/* whether `concurrent` launches l run at once (all their clusters resident) */
bool launch_fits(lltm_dtype dtype, bool forward, const lltm_sequence_launch &l,
                 const lltm_cuda_device &dev, int concurrent)
{
    const int64_t resident = launch_resident(dtype, forward, l, dev);
    return resident > 0 && resident >= l.groups * concurrent;
}

/* The two cluster shapes (lanes x values of the backward's unit layout):
 *   0: 16 x 8, 16 units a block, 8 blocks at H = 128 (the portable size);
 *      forward and backward (broadcast) in that layout;
 *   1: 32 x 4, 8 units a block, 16 blocks (a non-portable cluster: half the
 *      arithmetic per block and step, twice the remote stores); its forward
 *      runs 4 lanes a unit on 2 rows of each 16-row chunk (float64: 32 lanes
 *      on all 16: 96 values a lane would take 192 registers), its backward
 *      the reduce-scatter exchange.
 * Without a batch split (16-row chunks, one cluster). */
lltm_sequence_launch shape_launch(lltm_dtype dtype, int shape, bool forward, int64_t B, int64_t H)
{
    if (shape == 0)
        return cluster_launch(dtype, forward, LLTM_SEQ_EXCHANGE_BROADCAST, 16, 8, BC, BC, B, H, 1);
    if (!forward)
        return cluster_launch(dtype, false, LLTM_SEQ_EXCHANGE_REDUCE_SCATTER, 32, 4, BC, BC, B, H,
                              1);
    if (dtype == LLTM_FLOAT64)
        return cluster_launch(dtype, true, LLTM_SEQ_EXCHANGE_BROADCAST, 32, 4, BC, BC, B, H, 1);
    return cluster_launch(dtype, true, LLTM_SEQ_EXCHANGE_BROADCAST, 4, 32, 2, BC, B, H, 1);
}

/* The rows the cluster family takes: every row's state stays in shared
 * memory (B <= 64 in the 4-byte types, 32 in float64: where its kernels
 * were measured against the grid family's on an H100). */
int64_t cluster_max_rows(lltm_dtype dtype) { return dtype == LLTM_FLOAT64 ? 32 : 64; }

/* whether shape `shape` runs B rows (both kernels, no split; `concurrent`
 * launches of each at once), per device, dtype, shape, concurrent launches
 * and number of 16-row chunks (0: not asked yet, 1: no, 2: yes) */
constexpr int CLUSTER_MAX_CHUNKS = 4;
signed char cluster_cache[MAX_DEVICES][NUM_DTYPES][2][MAX_CONCURRENT][CLUSTER_MAX_CHUNKS + 1];

bool cluster_shape_fits(const lltm_cuda_device &dev, lltm_dtype dtype, int shape, int64_t B,
                        int concurrent)
{
    const int64_t chunks = ceil_div(B, BC);
    if (chunks < 1 || chunks * BC > cluster_max_rows(dtype) || chunks > CLUSTER_MAX_CHUNKS)
        return false;
    signed char *slot =
        cached_device(dev) ? &cluster_cache[dev.device][dtype][shape][concurrent - 1][chunks]
                           : nullptr;
    const int known = slot ? __atomic_load_n(slot, __ATOMIC_RELAXED) : 0;
    if (known)
        return known == 2;
    const int64_t rows = chunks * BC; /* the answer holds for every B of these chunks */
    const int64_t H = CLUSTER_MAX_H;  /* the most blocks */
    const bool fits =
        launch_fits(dtype, true, shape_launch(dtype, shape, true, rows, H), dev, concurrent) &&
        launch_fits(dtype, false, shape_launch(dtype, shape, false, rows, H), dev, concurrent);
    if (slot)
        __atomic_store_n(slot, (signed char)(fits ? 2 : 1), __ATOMIC_RELAXED);
    return fits;
}

/* Whether cluster shape `shape` (0: 8 blocks, 1: 16) runs B rows here. */
bool cluster_shape_ok(const lltm_cuda_device &dev, lltm_dtype dtype, int shape, int64_t B,
                      int concurrent)
{
    if (dev.major < 9 || !dev.cluster_launch)
        return false; /* before the caches: they are kept per device ordinal */
    return cluster_shape_fits(dev, dtype, shape, B, concurrent);
}

/* The 16-block shape's batch split: for B <= 16 (float accumulation), each
 * kernel runs chunks of 4 rows (else 8, where that many clusters do not fit
 * at once), one cluster of 16 blocks each: fewer multiply-adds a thread
 * (the forward: 8 lanes a unit on 1 row of 4, or 4 lanes on 1 row of 8;
 * the backward's products on 1 row) and fewer bytes exchanged per block and
 * step. The launch, or none (*split false: no split fits, B > 16, float64,
 * or `chunk` 16). chunk: 0 any, else only that many rows. */
constexpr int SPLIT_MAX_ROWS = 16;
signed char split_cache[MAX_DEVICES][NUM_DTYPES][2][MAX_CONCURRENT][2][SPLIT_MAX_ROWS / 4];

lltm_sequence_launch split_launch(lltm_dtype dtype, bool forward, int ch, int64_t B)
{
    const int64_t groups = ceil_div(B, ch);
    const int64_t H = CLUSTER_MAX_H; /* the most blocks */
    if (forward)
        return cluster_launch(dtype, true, LLTM_SEQ_EXCHANGE_BROADCAST, NT / RS_UNITS / ch,
                              CLUSTER_MAX_H / (NT / RS_UNITS / ch), 1, ch, B, H, groups);
    return cluster_launch(dtype, false, LLTM_SEQ_EXCHANGE_REDUCE_SCATTER, 32, 4, ch, ch, B, H,
                          groups);
}

bool cluster_split(const lltm_cuda_device &dev, lltm_dtype dtype, bool forward, int64_t B,
                   int chunk, int concurrent, int *rows)
{
    if (dtype == LLTM_FLOAT64 || B > SPLIT_MAX_ROWS || chunk == BC)
        return false;
    for (int ch = chunk == 8 ? 8 : 4; ch <= (chunk == 4 ? 4 : 8); ch *= 2) {
        signed char *slot = cached_device(dev)
                                ? &split_cache[dev.device][dtype][forward][concurrent - 1]
                                              [ch / 8][ceil_div(B, 4) - 1]
                                : nullptr;
        int known = slot ? __atomic_load_n(slot, __ATOMIC_RELAXED) : 0;
        if (!known) {
            known = launch_fits(dtype, forward, split_launch(dtype, forward, ch, B), dev,
                                concurrent)
                        ? 2
                        : 1;
            if (slot)
                __atomic_store_n(slot, (signed char)known, __ATOMIC_RELAXED);
        }
        if (known == 2) {
            *rows = ch;
            return true;
        }
    }
    return false;
}

/* The cluster plan's launches for B rows of H units, shape `shape` */
void cluster_plan(const lltm_cuda_device &dev, lltm_dtype dtype, int shape, int64_t B, int64_t H,
                  int chunk, int concurrent, lltm_sequence_plan *plan)
{
    plan->family = LLTM_SEQ_CLUSTER;
    for (int forward = 1; forward >= 0; --forward) {
        lltm_sequence_launch l = shape_launch(dtype, shape, forward, B, H);
        int rows = 0;
        if (shape == 1 && cluster_split(dev, dtype, forward, B, chunk, concurrent, &rows)) {
            l = split_launch(dtype, forward, rows, B);
            l.blocks = ceil_div(H, RS_UNITS);
        }
        (forward ? plan->forward : plan->backward) = l;
    }
}

/* The 16-block shape's batch groups, for B > 16 rows: a cluster a 16-row
 * chunk (at most `cap` clusters; 0: no cap), each walking its own chunks,
 * so the clusters of a batch run side by side on their own SMs instead of
 * one cluster walking every chunk each step. Whether `groups` clusters of
 * both kernels (at H = 128, the most blocks) fit at once (`concurrent`
 * launches of them), per device, dtype, concurrent launches and group
 * count (0: not asked yet, 1: no, 2: yes). */
signed char group_cache[MAX_DEVICES][NUM_DTYPES][MAX_CONCURRENT][CLUSTER_MAX_CHUNKS + 1];

bool cluster_grouped_plan(const lltm_cuda_device &dev, lltm_dtype dtype, int64_t B, int64_t H,
                          int64_t cap, int concurrent, lltm_sequence_plan *plan)
{
    int64_t groups = ceil_div(B, BC);
    if (cap >= 1 && cap < groups)
        groups = cap;
    if (groups < 2 || groups > CLUSTER_MAX_CHUNKS)
        return false;
    signed char *slot =
        cached_device(dev) ? &group_cache[dev.device][dtype][concurrent - 1][groups] : nullptr;
    int known = slot ? __atomic_load_n(slot, __ATOMIC_RELAXED) : 0;
    if (!known) {
        const int64_t rows = groups * BC; /* the answer holds for every B of these groups */
        bool fits = true;
        for (int forward = 1; forward >= 0 && fits; --forward) {
            lltm_sequence_launch l = shape_launch(dtype, 1, forward, rows, CLUSTER_MAX_H);
            l = cluster_launch(dtype, forward, l.exchange, l.lanes, l.values, l.rows, BC, rows,
                               CLUSTER_MAX_H, groups);
            fits = launch_fits(dtype, forward, l, dev, concurrent);
        }
        known = fits ? 2 : 1;
        if (slot)
            __atomic_store_n(slot, (signed char)known, __ATOMIC_RELAXED);
    }
    if (known != 2)
        return false;
    plan->family = LLTM_SEQ_CLUSTER;
    for (int forward = 1; forward >= 0; --forward) {
        const lltm_sequence_launch l = shape_launch(dtype, 1, forward, B, H);
        (forward ? plan->forward : plan->backward) = cluster_launch(
            dtype, forward, l.exchange, l.lanes, l.values, l.rows, BC, B, H, groups);
    }
    return true;
}

/* Asked for the virtual architecture of the code that runs on a device
 * (cudaFuncAttributes.ptxVersion); every unit is built with the same
 * architectures, so its answer holds for the cluster kernels too. */
__global__ void code_probe_kernel() {}

} // namespace

extern "C" {

int lltm_cuda_device_query(int device, lltm_cuda_device *out)
{
    if (!out)
        return LLTM_ERR_ARGUMENT;
    memset(out, 0, sizeof *out);
    out->device = device;
    if (cudaDeviceGetAttribute(&out->major, cudaDevAttrComputeCapabilityMajor, device) !=
            cudaSuccess ||
        cudaDeviceGetAttribute(&out->minor, cudaDevAttrComputeCapabilityMinor, device) !=
            cudaSuccess ||
        cudaDeviceGetAttribute(&out->sm_count, cudaDevAttrMultiProcessorCount, device) !=
            cudaSuccess ||
        cudaDeviceGetAttribute(&out->smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                               device) != cudaSuccess ||
        cudaDeviceGetAttribute(&out->cooperative_launch, cudaDevAttrCooperativeLaunch, device) !=
            cudaSuccess ||
        cudaDeviceGetAttribute(&out->cluster_launch, cudaDevAttrClusterLaunch, device) !=
            cudaSuccess) {
        cudaGetLastError();
        return LLTM_ERR_CUDA;
    }
    /* The cluster kernels exist only in code compiled for sm_90 and later:
     * a Hopper GPU running the library's compute_80 PTX (JIT-compiled at load)
     * has cluster launch, but no cluster kernels to launch. */
    int current = 0;
    cudaFuncAttributes code;
    if (cudaGetDevice(&current) != cudaSuccess || cudaSetDevice(device) != cudaSuccess) {
        cudaGetLastError();
        return LLTM_ERR_CUDA;
    }
    const cudaError_t probed = cudaFuncGetAttributes(&code, code_probe_kernel);
    if (cudaSetDevice(current) != cudaSuccess || probed != cudaSuccess) {
        cudaGetLastError();
        return LLTM_ERR_CUDA;
    }
    out->code_arch = code.ptxVersion;
    if (code.ptxVersion < 90)
        out->cluster_launch = 0;
    return LLTM_OK;
}

int lltm_sequence_plan_cuda(const lltm_cuda_device *dev, lltm_dtype dtype, int64_t T, int64_t B,
                            int64_t I, int64_t H, const lltm_sequence_plan_options *options,
                            lltm_sequence_plan *plan)
{
    static const lltm_sequence_plan_options none = {};
    const lltm_sequence_plan_options &o = options ? *options : none;
    if (!dev || !plan || !known_dtype(dtype) || bad_sizes(T, B, I, H) || o.concurrent < 0 ||
        o.concurrent > MAX_CONCURRENT ||
        (o.grid_chunk != 0 && o.grid_chunk != BC && o.grid_chunk != GRID_SMALL_CHUNK) ||
        (o.block_chunk != 0 && o.block_chunk != BLOCK_CHUNKS[0] &&
         o.block_chunk != BLOCK_CHUNKS[1]) ||
        o.grid_tf32 < -1 || o.grid_tf32 > 1)
        return LLTM_ERR_ARGUMENT;
    const int concurrent = o.concurrent > 1 ? o.concurrent : 1;
    memset(plan, 0, sizeof *plan);
    plan->family = LLTM_SEQ_STEPS;
    plan->dtype = dtype;
    plan->B = B;
    plan->H = H;
    if (T == 0 || B == 0 || H == 0 || o.family == LLTM_SEQ_STEPS)
        return LLTM_OK;

    /* Every plan that can run these sizes here (within the options), each
     * costed by the model (lltm_cuda_cost.c); the cheapest wins, a tie the
     * first considered: per-step kernels, clusters (16 blocks, then 8),
     * the grid layouts in LLTM_GRID_LAYOUTS order, each in 16-row chunks, then
     * in 4-row ones, the block family in BLOCK_CHUNKS order. */
    lltm_sequence_plan candidate = *plan;
    /* eager: the host issues the launches as the GPU runs them, so a plan
     * takes the longer of the two */
    auto cost_of = [&](const lltm_sequence_plan *p) {
        const double gpu = lltm_sequence_plan_cost_cuda(dev, p, T, B, I, H);
        const double host = o.eager ? lltm_sequence_plan_host_cost_cuda(p, T) : 0.0;
        return gpu > host ? gpu : host;
    };
    double best = o.family == LLTM_SEQ_ANY ? cost_of(plan) : INFINITY;
    auto consider = [&]() {
        const double cost = cost_of(&candidate);
        if (cost < best) {
            best = cost;
            *plan = candidate;
        }
    };
    if (H <= CLUSTER_MAX_H && (o.family == LLTM_SEQ_ANY || o.family == LLTM_SEQ_CLUSTER)) {
        for (int shape = 1; shape >= 0; --shape) {
            if (o.cluster_blocks && o.cluster_blocks != (shape == 1 ? 16 : 8))
                continue;
            if (!cluster_shape_ok(*dev, dtype, shape, B, concurrent))
                continue;
            cluster_plan(*dev, dtype, shape, B, H, o.cluster_chunk, concurrent, &candidate);
            consider();
            if (shape == 1 && B > BC && (o.cluster_chunk == 0 || o.cluster_chunk == BC) &&
                cluster_grouped_plan(*dev, dtype, B, H, o.grid_groups_max, concurrent,
                                     &candidate))
                consider();
        }
    }
    /* float32 where TF32 is allowed: the grid's FFMA and TF32 builds (or the
     * one asked for); TF32 in 16-row chunks only */
    const bool tf32_ok = dtype == LLTM_FLOAT32 && lltm_cuda_grid_tensor_cores(dev, dtype);
    const int first_build = o.grid_tf32 > 0 ? 1 : 0;
    if (o.family == LLTM_SEQ_ANY || o.family == LLTM_SEQ_GRID) {
        for (int k = 0; k < LLTM_GRID_LAYOUT_COUNT; ++k) {
            const lltm_grid_layout g = LLTM_GRID_LAYOUTS[k];
            if (o.grid_lanes && (o.grid_lanes != g.lanes || o.grid_values != g.values))
                continue;
            for (int c = 0; c < NUM_GRID_CHUNKS; ++c) {
                const int ch = GRID_CHUNKS[c];
                if (o.grid_chunk && o.grid_chunk != ch)
                    continue;
                const int end_build = o.grid_tf32 < 0 || !tf32_ok || ch != BC ? 1 : 2;
                for (int tf32 = first_build; tf32 < end_build; ++tf32) {
                    int64_t groups = 1;
                    if (!grid_fits(*dev, dtype, k, c, tf32, B, H, o.grid_groups_max, concurrent,
                                   &groups))
                        continue;
                    candidate.family = LLTM_SEQ_GRID;
                    candidate.forward = grid_launch(dtype, true, k, ch, tf32, H, groups);
                    candidate.backward = grid_launch(dtype, false, k, ch, tf32, H, groups);
                    consider();
                }
            }
        }
    }
    if (o.family == LLTM_SEQ_ANY || o.family == LLTM_SEQ_BLOCK) {
        for (int c = 0; c < NUM_BLOCK_CHUNKS; ++c) {
            if (o.block_chunk && o.block_chunk != BLOCK_CHUNKS[c])
                continue;
            if (block_plan(*dev, dtype, c, B, H, o.grid_groups_max, concurrent, &candidate))
                consider();
        }
    }
    if (plan->family == LLTM_SEQ_STEPS)
        /* a persistent family asked for by name but impossible here */
        return o.family == LLTM_SEQ_ANY ? LLTM_OK : LLTM_ERR_ARGUMENT;

    /* the workspace: the float32 state of the half types, then the batch
     * groups' bias sums of the backward ([groups][3H], accumulation type) */
    plan->workspace_bytes = half_state_bytes(dtype, B, H);
    if (plan->backward.groups > 1)
        plan->workspace_bytes += (size_t)(plan->backward.groups * 3 * H) * acc_bytes(dtype);
    return LLTM_OK;
}

int lltm_sequence_plan_residency_cuda(const lltm_cuda_device *dev, const lltm_sequence_plan *plan,
                                      int64_t resident[2], int64_t parts[2])
{
    if (!dev || !plan || !resident || !parts || !known_dtype(plan->dtype))
        return LLTM_ERR_ARGUMENT;
    const lltm_dtype dtype = plan->dtype;
    for (int d = 0; d < 2; ++d) {
        const lltm_sequence_launch &l = d == 0 ? plan->forward : plan->backward;
        int64_t n = 0, per_call = 1;
        if (plan->family == LLTM_SEQ_GRID) {
            /* the whole launch, one part: its blocks meet at every step */
            const int layout = lltm_grid_layout_index(l.lanes, l.values);
            int chunk = -1;
            for (int c = 0; c < NUM_GRID_CHUNKS; ++c)
                if (GRID_CHUNKS[c] == l.chunk)
                    chunk = c;
            const int64_t grid = l.blocks * l.groups;
            if (layout < 0 || chunk < 0 || grid < 1)
                return LLTM_ERR_ARGUMENT;
            n = grid_resident_blocks(*dev, dtype, layout, chunk, l.tf32 != 0) / grid;
        } else if (plan->family == LLTM_SEQ_BLOCK) {
            int c = -1;
            for (int k = 0; k < NUM_BLOCK_CHUNKS; ++k)
                if (BLOCK_CHUNKS[k] == l.chunk)
                    c = k;
            if (c < 0 || l.groups < 1)
                return LLTM_ERR_ARGUMENT;
            n = block_resident_blocks(*dev, dtype, c);
            per_call = l.groups;
        } else if (plan->family == LLTM_SEQ_CLUSTER) {
            if (l.groups < 1)
                return LLTM_ERR_ARGUMENT;
            n = launch_resident(dtype, d == 0, l, *dev);
            per_call = l.groups;
        } else if (plan->family == LLTM_SEQ_STEPS) {
            per_call = 0;
        } else {
            return LLTM_ERR_ARGUMENT;
        }
        resident[d] = n;
        parts[d] = per_call;
    }
    return LLTM_OK;
}

} /* extern "C" */
