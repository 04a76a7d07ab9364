/*
 * lltm_cuda_sequence_plan_cluster.cu - the cluster family's part of the plan
 * chooser (lltm_cuda_sequence_plan.cu): its shapes and layouts, and whether
 * their clusters fit the device at once (cudaOccupancyMaxActiveClusters,
 * asked once per device, dtype and shape, cached as the chooser caches its
 * other occupancy answers).
 *
 * The shapes (lltm.h, lltm_sequence_plan_cuda), all of 16 blocks, a
 * cluster a batch chunk, every cluster of a launch resident at once:
 *   8 units a block (H <= 128), a cluster per 16-row chunk, or per 4- or
 *      8-row chunk at B <= 16;
 *   16 units a block (128 < H <= 256), a cluster per 4- or 8-row chunk.
 */
#include "lltm_cuda_launch.cuh"
#include "lltm_cuda_math.cuh"
#include "lltm_cuda_sequence.cuh"

namespace {

using namespace lltm_seq;

const void *cluster_kernel_for(lltm_dtype dtype, bool forward, const lltm_sequence_launch &l)
{
    LLTM_DISPATCH_OR(dtype, forward ? cluster_forward_kernel<T>(l) : cluster_backward_kernel<T>(l),
                     nullptr);
}

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

/* One launch of the cluster family: the layout, its blocks (at the most H
 * of its shape for the chooser's fit; ceil(H / units) in the plan) and
 * smem. */
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
    } else { /* the reduce-scatter exchange: NT / lanes units a block */
        l.blocks = ceil_div(H, NT / lanes);
        l.smem = cluster_backward_rs_smem(acc, grows, chunk, NT / lanes);
    }
    return l;
}

} // namespace

/* lltm_cuda_sequence.cuh */
int64_t lltm_seq::cluster_launch_resident(lltm_dtype dtype, bool forward,
                                          const lltm_sequence_launch &l,
                                          const lltm_cuda_device &dev)
{
    const int threads = !forward && l.exchange == LLTM_SEQ_EXCHANGE_REDUCE_SCATTER
                            ? cluster_backward_rs_threads(acc_bytes(dtype), l.chunk, NT / l.lanes)
                            : NT;
    return cluster_resident(cluster_kernel_for(dtype, forward, l), l.blocks, l.smem, dev,
                            threads);
}

namespace {

/* The yes/no answer kept in *slot (0: not asked yet, 1: no, 2: yes; NULL:
 * not kept, a device past the caches), asking fits() where there is none */
template <typename F> bool cached_answer(signed char *slot, F fits)
{
    int known = slot ? __atomic_load_n(slot, __ATOMIC_RELAXED) : 0;
    if (!known) {
        known = fits() ? 2 : 1;
        if (slot)
            __atomic_store_n(slot, (signed char)known, __ATOMIC_RELAXED);
    }
    return known == 2;
}

/* whether `concurrent` launches l run at once (all their clusters resident) */
bool launch_fits(lltm_dtype dtype, bool forward, const lltm_sequence_launch &l,
                 const lltm_cuda_device &dev, int concurrent)
{
    const int64_t resident = cluster_launch_resident(dtype, forward, l, dev);
    return resident > 0 && resident >= l.groups * concurrent;
}

/* The cluster shape at H <= 128: 8 units a block, 16 blocks at H = 128 (a
 * non-portable cluster); its forward runs 4 lanes a unit on 2 rows of each
 * 16-row chunk (float64: 32 lanes on all 16: 96 values a lane would take
 * 192 registers), its backward the reduce-scatter exchange (32 x 4: lanes x
 * values of its unit layout). A cluster a 16-row chunk, side by side on
 * their own SMs (one cluster walking several chunks took 1.7x - 3.2x the
 * time at B 32 - 64: H200, 2026-12-03). */
lltm_sequence_launch shape_launch(lltm_dtype dtype, bool forward, int64_t B, int64_t H)
{
    const int64_t groups = ceil_div(B, BC);
    if (!forward)
        return cluster_launch(dtype, false, LLTM_SEQ_EXCHANGE_REDUCE_SCATTER, 32, 4, BC, BC, B, H,
                              groups);
    if (dtype == LLTM_FLOAT64)
        return cluster_launch(dtype, true, LLTM_SEQ_EXCHANGE_BROADCAST, 32, 4, BC, BC, B, H,
                              groups);
    return cluster_launch(dtype, true, LLTM_SEQ_EXCHANGE_BROADCAST, 4, 32, 2, BC, B, H, groups);
}

/* The rows the cluster family takes: every row's state stays in shared
 * memory (B <= 64 in the 4-byte types, 32 in float64: where its kernels
 * were measured against the grid family's on an H100). */
int64_t cluster_max_rows(lltm_dtype dtype) { return dtype == LLTM_FLOAT64 ? 32 : 64; }

/* whether the shape runs B rows here (both kernels, a cluster a 16-row
 * chunk, all of them and `concurrent` launches of each at once), per
 * device, dtype, concurrent launches and number of 16-row chunks (0: not
 * asked yet, 1: no, 2: yes) */
constexpr int CLUSTER_MAX_CHUNKS = 4;
signed char cluster_cache[MAX_DEVICES][NUM_DTYPES][MAX_CONCURRENT][CLUSTER_MAX_CHUNKS + 1];

bool cluster_shape_fits(const lltm_cuda_device &dev, lltm_dtype dtype, int64_t B, int concurrent)
{
    if (dev.major < 9 || !dev.cluster_launch)
        return false; /* before the cache: it is kept per device ordinal */
    const int64_t chunks = ceil_div(B, BC);
    if (chunks < 1 || chunks * BC > cluster_max_rows(dtype) || chunks > CLUSTER_MAX_CHUNKS)
        return false;
    signed char *slot =
        cached_device(dev) ? &cluster_cache[dev.device][dtype][concurrent - 1][chunks] : nullptr;
    return cached_answer(slot, [&] {
        const int64_t rows = chunks * BC; /* the answer holds for every B of these chunks */
        const int64_t H = CLUSTER_MAX_H;  /* the most blocks */
        return launch_fits(dtype, true, shape_launch(dtype, true, rows, H), dev, concurrent) &&
               launch_fits(dtype, false, shape_launch(dtype, false, rows, H), dev, concurrent);
    });
}

/* The shape's batch split: for B <= 16 (float accumulation), each kernel
 * runs chunks of 4 rows (else 8, where that many clusters do not fit at
 * once), a cluster of 16 blocks each: fewer multiply-adds a thread
 * (the forward: 8 lanes a unit on 1 row of 4, or 4 lanes on 1 row of 8;
 * the backward's products on 1 row) and fewer bytes exchanged per block and
 * step. The launch, or none (*split false: no split fits, B > 16, float64,
 * or `chunk` 16). chunk: 0 any, else only that many rows. */
constexpr int SPLIT_MAX_ROWS = 16;
signed char split_cache[MAX_DEVICES][NUM_DTYPES][2][MAX_CONCURRENT][2][SPLIT_MAX_ROWS / 4];

lltm_sequence_launch split_launch(lltm_dtype dtype, bool forward, int ch, int64_t B, int64_t H)
{
    const int64_t groups = ceil_div(B, ch);
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
        if (cached_answer(slot, [&] {
                /* at H = 128: the most blocks */
                return launch_fits(dtype, forward,
                                   split_launch(dtype, forward, ch, B, CLUSTER_MAX_H), dev,
                                   concurrent);
            })) {
            *rows = ch;
            return true;
        }
    }
    return false;
}

/* The 16-block clusters of WIDE_UNITS units a block, for CLUSTER_MAX_H < H
 * <= WIDE_MAX_H (not float64: its backward's 3 x 16 rows of W_h x 2 columns
 * a thread would not fit its registers): a cluster a chunk of `ch` rows (4,
 * or 8 where that many clusters do not fit), both kernels. The forward runs
 * 8 lanes x 32 values on 2 rows of a 4-row chunk, or 16 x 16 on all 8 rows
 * of an 8-row one; the backward the reduce-scatter exchange (lanes = NT /
 * units; values 4, as the 8-unit blocks' launch; measured against the grid
 * at 42 shapes: H100, float32 and bfloat16, B 1 - 48, H 160 - 256, T 100).
 * At float32 B16/H256
 * on an H100 the kernels alone (dev/cuda/sequence_cluster.cu) take 143 us
 * forward and 168 backward in 4-row chunks, against the grid's 242 and
 * 258. */
lltm_sequence_launch wide_launch(lltm_dtype dtype, bool forward, int ch, int64_t B, int64_t H)
{
    const int64_t groups = ceil_div(B, ch);
    if (!forward)
        return cluster_launch(dtype, false, LLTM_SEQ_EXCHANGE_REDUCE_SCATTER, NT / WIDE_UNITS, 4,
                              ch, ch, B, H, groups);
    return ch == 4 ? cluster_launch(dtype, true, LLTM_SEQ_EXCHANGE_BROADCAST, 8, 32, 2, 4, B, H,
                                    groups)
                   : cluster_launch(dtype, true, LLTM_SEQ_EXCHANGE_BROADCAST, 16, 16, 8, 8, B, H,
                                    groups);
}

/* Whether the wide clusters of `ch`-row chunks fit for B rows (both
 * kernels, all their clusters at once, `concurrent` launches of each), per
 * device, dtype, concurrent launches, chunk and cluster count (0: not asked
 * yet, 1: no, 2: yes); the plan's launches where they do. chunk: 0 either
 * (4 first), else only that one. */
constexpr int WIDE_MAX_GROUPS = 16;
signed char wide_cache[MAX_DEVICES][NUM_DTYPES][MAX_CONCURRENT][2][WIDE_MAX_GROUPS + 1];

bool wide_plan(const lltm_cuda_device &dev, lltm_dtype dtype, int64_t B, int64_t H, int chunk,
               int concurrent, lltm_sequence_plan *plan)
{
    if (dtype == LLTM_FLOAT64 || H <= CLUSTER_MAX_H || H > WIDE_MAX_H || B < 1 ||
        B > cluster_max_rows(dtype) || chunk == BC || dev.major < 9 || !dev.cluster_launch)
        return false;
    for (int ch = chunk == 8 ? 8 : 4; ch <= (chunk == 4 ? 4 : 8); ch *= 2) {
        const int64_t groups = ceil_div(B, ch);
        if (groups > WIDE_MAX_GROUPS)
            continue;
        signed char *slot =
            cached_device(dev)
                ? &wide_cache[dev.device][dtype][concurrent - 1][ch / 8][groups]
                : nullptr;
        const bool fits = cached_answer(slot, [&] {
            const int64_t rows = groups * ch; /* the answer holds for every B of these groups */
            return launch_fits(dtype, true, wide_launch(dtype, true, ch, rows, WIDE_MAX_H), dev,
                               concurrent) &&
                   launch_fits(dtype, false, wide_launch(dtype, false, ch, rows, WIDE_MAX_H), dev,
                               concurrent);
        });
        if (fits) {
            plan->family = LLTM_SEQ_CLUSTER;
            plan->forward = wide_launch(dtype, true, ch, B, H);
            plan->backward = wide_launch(dtype, false, ch, B, H);
            return true;
        }
    }
    return false;
}

} // namespace

/* lltm_cuda_sequence.cuh */
bool lltm_seq::cluster_plan(const lltm_cuda_device &dev, lltm_dtype dtype, int64_t B, int64_t H,
                            int chunk, int concurrent, lltm_sequence_plan *plan)
{
    if (H > CLUSTER_MAX_H)
        return wide_plan(dev, dtype, B, H, chunk, concurrent, plan);
    if (!cluster_shape_fits(dev, dtype, B, concurrent))
        return false;
    plan->family = LLTM_SEQ_CLUSTER;
    for (int forward = 1; forward >= 0; --forward) {
        lltm_sequence_launch l = shape_launch(dtype, forward, B, H);
        int rows = 0;
        if (cluster_split(dev, dtype, forward, B, chunk, concurrent, &rows))
            l = split_launch(dtype, forward, rows, B, H);
        (forward ? plan->forward : plan->backward) = l;
    }
    return true;
}
