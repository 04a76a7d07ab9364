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
#include "lltm_cuda_rules.h"
#include "lltm_cuda_launch.cuh"
#include "lltm_cuda_math.cuh"
#include "lltm_cuda_sequence.cuh"

#include <string.h>

namespace lltm_seq {

/* lltm_cuda_sequence.cuh */
int64_t max_resident_blocks(const void *kernel, size_t smem, const lltm_cuda_device &dev,
                            bool cooperative, int threads)
{
    if (!kernel || (cooperative && !dev.cooperative_launch) || smem > (size_t)dev.smem_optin ||
        allow_smem(kernel, smem) != LLTM_OK)
        return 0;
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

bool known_dtype(lltm_dtype dtype)
{
    return dtype == LLTM_FLOAT32 || dtype == LLTM_FLOAT64 || dtype == LLTM_FLOAT16 ||
           dtype == LLTM_BFLOAT16;
}

const void *grid_kernel_for(lltm_dtype dtype, bool forward, int lanes, int values, int chunk,
                            bool tf32)
{
    LLTM_DISPATCH_OR(dtype, grid_kernel<T>(forward, lanes, values, chunk, tf32), nullptr);
}

/* ---------------------------------------------------------------- grid -- */

/* The grid layouts and the rows of a chunk each comes in:
 * LLTM_GRID_LAYOUTS and LLTM_GRID_CHUNKS (lltm_cuda_grid_layouts.h), in the
 * order the chooser tries them (a tie keeps the first). */
static_assert(BC == 16 && GRID_SMALL_CHUNK == 4, "LLTM_GRID_CHUNKS: the grid kernels' chunks");

/* max_resident_blocks of a layout's two kernels plus one (0: not asked
 * yet); [tf32]: float32's TF32 build */
int64_t resident_cache[MAX_DEVICES][NUM_DTYPES][LLTM_GRID_LAYOUT_COUNT][LLTM_GRID_CHUNK_COUNT][2];

int64_t grid_resident_blocks(const lltm_cuda_device &dev, lltm_dtype dtype, int layout,
                             int chunk_index, bool tf32)
{
    const lltm_grid_layout g = LLTM_GRID_LAYOUTS[layout];
    const int ch = LLTM_GRID_CHUNKS[chunk_index];
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

/* Whether a grid layout in chunks of LLTM_GRID_CHUNKS[chunk_index] rows
 * runs B, H here (H within lanes * values, co-resident, in the library for the
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
    *groups = grid_groups(resident, unit_blocks, B, LLTM_GRID_CHUNKS[chunk_index], cap);
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
        (o.cluster_blocks != 0 && o.cluster_blocks != CLUSTER_RANKS) ||
        (o.family == LLTM_SEQ_CLUSTER && o.grid_groups_max != 0) ||
        (o.grid_chunk != 0 && lltm_grid_chunk_index(o.grid_chunk) < 0) ||
        (o.block_chunk != 0 && block_chunk_index(o.block_chunk) < 0) ||
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

    /* Every plan that can run these sizes here (within the options), ranked
     * by the rules (lltm_cuda_rules.c); the lowest rank wins, a tie the
     * first considered: per-step kernels, clusters, the grid layouts in
     * LLTM_GRID_LAYOUTS order, each in 16-row chunks, then in 4-row ones,
     * the block family in BLOCK_CHUNKS order. */
    lltm_sequence_plan candidate = *plan;
    int64_t best = o.family == LLTM_SEQ_ANY
                       ? lltm_sequence_plan_rank_cuda(dev, plan, o.eager, concurrent)
                       : LLTM_RANK_NONE;
    auto consider = [&]() {
        const int64_t rank = lltm_sequence_plan_rank_cuda(dev, &candidate, o.eager, concurrent);
        if (rank < best) {
            best = rank;
            *plan = candidate;
        }
    };
    if ((o.family == LLTM_SEQ_ANY || o.family == LLTM_SEQ_CLUSTER) &&
        cluster_plan(*dev, dtype, B, H, o.cluster_chunk, concurrent, &candidate))
        consider();
    /* float32 where TF32 is allowed: the grid's FFMA and TF32 builds (or the
     * one asked for); TF32 in 16-row chunks only */
    const bool tf32_ok = dtype == LLTM_FLOAT32 && lltm_cuda_grid_tensor_cores(dev, dtype);
    const int first_build = o.grid_tf32 > 0 ? 1 : 0;
    if (o.family == LLTM_SEQ_ANY || o.family == LLTM_SEQ_GRID) {
        for (int k = 0; k < LLTM_GRID_LAYOUT_COUNT; ++k) {
            const lltm_grid_layout g = LLTM_GRID_LAYOUTS[k];
            if (o.grid_lanes && (o.grid_lanes != g.lanes || o.grid_values != g.values))
                continue;
            for (int c = 0; c < LLTM_GRID_CHUNK_COUNT; ++c) {
                const int ch = LLTM_GRID_CHUNKS[c];
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
            const int chunk = lltm_grid_chunk_index(l.chunk);
            const int64_t grid = l.blocks * l.groups;
            if (layout < 0 || chunk < 0 || grid < 1)
                return LLTM_ERR_ARGUMENT;
            n = grid_resident_blocks(*dev, dtype, layout, chunk, l.tf32 != 0) / grid;
        } else if (plan->family == LLTM_SEQ_BLOCK) {
            const int c = block_chunk_index(l.chunk);
            if (c < 0 || l.groups < 1)
                return LLTM_ERR_ARGUMENT;
            n = block_resident_blocks(*dev, dtype, c);
            per_call = l.groups;
        } else if (plan->family == LLTM_SEQ_CLUSTER) {
            if (l.groups < 1)
                return LLTM_ERR_ARGUMENT;
            n = cluster_launch_resident(dtype, d == 0, l, *dev);
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
