/*
 * lltm_cuda_rules.c - the rules that pick a CUDA route (lltm.h, "CUDA
 * rules"): which of the plans that fit a layer runs it, and which of the
 * cell's two routes runs a step. Pure arithmetic on the sizes and the
 * device's properties: no CUDA call, no state. What fits is the plan
 * chooser's (lltm_cuda_sequence_plan.cu: occupancy, shared memory,
 * clusters, tensor cores); these rules only order what fits.
 *
 * The sequence rules are read off every plan forced at 121 shapes (float32
 * and bfloat16, T 20, 100, 1000, B 1 - 1024, H 64 - 2048; `python -m
 * lltm.bench --sweep --sweep-variants --sweep-kind sequence`, graph replay,
 * H200, 2026-12-03, code of 0d47453; a first form of the table picked
 * within 8% of the fastest plan at every shape, 1.002x of it on geometric
 * mean), and from lltm.LLTM of one and three layers at the 60 shapes of
 * the H200 maps against the cost model they replace (the per-step
 * family's thresholds, the layout on tensor cores). float16 takes
 * bfloat16's rules and float64 float32's: their kernels are the same code.
 */
#include "lltm_cuda_rules.h"
#include "lltm_cuda_grid_layouts.h"

/* B x H past which the per-step family wins: its products spread over the
 * whole GPU, where a persistent kernel's blocks each carry many rows, and
 * stacked layers' steps overlap (lltm/_schedule.py, time chunks). Under
 * capture, half types from 2^17 (bfloat16 B1024/H128 1,419 us against grid
 * 16x8's 1,760; B512/H128 1,252 against 1,042), from 2^16 at H = 1024
 * (one layer B64/H1024 1,941 against 16x64's 1,872, three layers in time
 * chunks 3,817 against 6,165); float32 on FFMA from 2^16 at H >= 256
 * (B256/H256 3,083 against 16x32's 3,317; B64/H1024 6,615 against 32x32's
 * 7,596) and from 2^17 (B1024/H128 3,273 against 16x8's 3,338; three
 * layers 8,618 against 10,191). Eager calls pay ~43 us of host time a step
 * for its launches (H100 machine, bfloat16 B64/H1024, T 100), which the
 * persistent kernels do not: half types from 2^18 (B256/H1024 2,787 us
 * against 6,480), float32 from 2^16 at H >= 512, 2^17 at H >= 256, 2^18.
 * Layers that share the device (a bidirectional layer's directions, time
 * chunks planned for two layers) count their rows together: bfloat16 three
 * layers B256/H256 in 4 chunks planned for two layers at once 2,913 us
 * with the per-step family (H200, 2026-11-28), 3,497 with the halved
 * grid 8x64 (2026-12-03). */
#define STEPS_HALF_BH (1 << 17)
#define STEPS_FFMA_BH (1 << 16)
/* The grid family in 4-row chunks: a thread walks a quarter of a 16-row
 * chunk's rows; pays at B <= 4, and up to B x H = 2^14 at H <= 512 in the
 * half types and at H >= 256 on FFMA (float32 B64/H256 1,225 us against
 * 1,312 in 16-row chunks, B32/H512 1,409 against 1,481; bfloat16
 * B128/H128 590 against 16x8's 656; float32 B128/H128 the 16-row 16x8 843
 * against 907, B128/H256 16x32's 1,805 against 2,281). */
#define GRID_SMALL_BH (1 << 14)
/* The block family (H <= 64) first wherever it fits (float32 B1024/H64
 * 787 us against the grid's best 1,602); 4-row chunks from B = 512 on
 * (bfloat16 B1024/H64 670 us against 801 in 1-row chunks, B512 329
 * against 382; B256 202 in 1-row chunks against 296). Clusters next
 * wherever they fit (H <= 256 and B <= 64, 32 past H = 128): 0.48x - 0.91x
 * of the best other plan at every such shape with H > 64. */
#define BLOCK_WIDE_B 512

int lltm_cuda_grid_tensor_cores(const lltm_cuda_device *dev, lltm_dtype dtype)
{
    const int half = dtype == LLTM_FLOAT16 || dtype == LLTM_BFLOAT16;
    return dev && (half || (dtype == LLTM_FLOAT32 && dev->tf32)) && dev->major >= 8 &&
           dev->code_arch >= 80;
}

static int is_half(lltm_dtype dtype) { return dtype == LLTM_FLOAT16 || dtype == LLTM_BFLOAT16; }

/* Whether the per-step family is the rules' first choice (STEPS_*_BH). */
static int steps_first(lltm_dtype dtype, int64_t B, int64_t H, int eager, int concurrent)
{
    /* layers sharing the device count their rows together */
    const int64_t bh = B * H * (concurrent > 1 ? concurrent : 1);
    if (H > 1024) /* past the widest persistent layout */
        return 1;
    if (is_half(dtype))
        return eager ? bh >= 2 * STEPS_HALF_BH
                     : bh >= STEPS_HALF_BH || (H >= 1024 && 2 * bh >= STEPS_HALF_BH);
    if (eager)
        return (H >= 512 && bh >= STEPS_FFMA_BH) || (H >= 256 && bh >= 2 * STEPS_FFMA_BH) ||
               bh >= 4 * STEPS_FFMA_BH;
    return (H >= 256 && bh >= STEPS_FFMA_BH) || bh >= 2 * STEPS_FFMA_BH;
}

/* The grid layout on tensor cores (its position in LLTM_GRID_LAYOUTS) among
 * those that walk their batch group's chunks in the fewest passes (bfloat16
 * B256/H256 8x64 1,100 us against 16x32's 1,534; B64/H256 in 4-row chunks
 * 8x64 618 against 16x32's 879): 16x8 at H <= 128 (B512/H128 1,042 against
 * 8x64's 1,068), 16x32 to H = 512 (B64/H512 906 against 8x64's 1,030),
 * 16x64 above (B32/H1024 1,079 against 32x32's 1,710), 32x32 at B <= 4
 * (B1/H1024 646 against 695). On FFMA the layout whose thread does the
 * fewest multiply-adds a step wins, a tie the one of fewer blocks (float32
 * B32/H256 32x16 1,159 against 16x32's 1,486; one layer B1/H512, 4-row
 * chunks, 32x16 527, and 597 by 16x32 in a map run without 32x16; B128/H256
 * tied, 16x32 in half the blocks 1,805 against 2,353). */
static int grid_layout(int64_t B, int64_t H)
{
    if (H <= 128)
        return lltm_grid_layout_index(16, 8);
    if (H <= 512)
        return lltm_grid_layout_index(16, 32);
    return B <= 4 ? lltm_grid_layout_index(32, 32) : lltm_grid_layout_index(16, 64);
}

/* A rank: the rule's band (the lower wins) and an order within it. */
static int64_t rank(int band, int64_t within) { return (int64_t)band << 40 | within; }

int64_t lltm_sequence_plan_rank_cuda(const lltm_cuda_device *dev, const lltm_sequence_plan *plan,
                                     int eager, int concurrent)
{
    if (!dev || !plan)
        return LLTM_RANK_NONE;
    const lltm_dtype dtype = plan->dtype;
    const int64_t B = plan->B, H = plan->H;
    const lltm_sequence_launch *l = &plan->forward;
    if (plan->family == LLTM_SEQ_BLOCK)
        return H <= 64 ? rank(0, (l->chunk == 4) != (B >= BLOCK_WIDE_B)) : rank(7, 0);
    if (plan->family == LLTM_SEQ_STEPS)
        return rank(steps_first(dtype, B, H, eager, concurrent) ? 1 : 9, 0);
    if (plan->family == LLTM_SEQ_CLUSTER)
        return rank(2, 0);
    if (plan->family != LLTM_SEQ_GRID)
        return LLTM_RANK_NONE;
    /* the grid: FFMA's layout by the multiply-adds a thread does a step
     * (its passes over its batch group's chunks x values), a tie to the
     * fewer blocks; on tensor cores by its passes, a tie to grid_layout
     * (16x8 alone at H <= 128) */
    const int64_t chunk = l->chunk > 0 ? l->chunk : 1;
    const int64_t chunks = (B + chunk - 1) / chunk;
    const int64_t groups = l->groups > 0 ? l->groups : 1;
    int64_t passes = (chunks + groups - 1) / groups;
    if (passes > (1 << 16))
        passes = 1 << 16;
    int64_t within;
    if (lltm_cuda_grid_tensor_cores(dev, dtype) && (dtype != LLTM_FLOAT32 || l->tf32)) {
        const int layout = lltm_grid_layout_index(l->lanes, l->values);
        within = (H <= 128 ? 0 : passes) << 8 | (layout == grid_layout(B, H) ? 0 : 1 + layout);
    } else {
        within = (passes * l->values) << 16 | (l->blocks & 0xffff);
    }
    if (l->tf32) /* float32's TF32 build: only where forced or measured */
        return rank(8, within);
    const int small = B <= 4 || (H <= 512 && B * H <= GRID_SMALL_BH && (is_half(dtype) || H >= 256));
    return rank((l->chunk == 4) == small ? 3 : 4, within);
}

/* The cell: cuBLAS's products (seven launches) where the step's products
 * are large, the fused kernels (three launches) below. The crossover of
 * the cost model that was fitted to the times of both routes at 108 shapes
 * (B 1 - 1024, H 128, 512, 1024, float32 and bfloat16; `python -m
 * lltm.bench --sweep --sweep-variants --sweep-kind cell`, H100,
 * 2026-11-25, f6769d6; its pick within 9% of the faster at 54 shapes),
 * read off at 132 SMs; products on FFMA (float32 without TF32) cross over
 * at twice the size. */
#define CELL_CUBLAS_B 128
#define CELL_CUBLAS_BH 8192
#define CELL_CUBLAS_H 512

int lltm_cell_route_cuda(const lltm_cuda_device *dev, lltm_dtype dtype, int64_t B, int64_t I,
                         int64_t H)
{
    (void)I;
    const int ffma = dtype == LLTM_FLOAT32 && !(dev && dev->tf32 && dev->major >= 8);
    const int64_t scale = ffma ? 2 : 1;
    return B >= CELL_CUBLAS_B || B * H >= scale * CELL_CUBLAS_BH || H >= scale * CELL_CUBLAS_H
               ? LLTM_CELL_CUBLAS
               : LLTM_CELL_FUSED;
}

/* --- lltm.LLTM's stacked layers (lltm/_schedule.py asks through the binding) ---
 *
 * One stacked launch a group of layers (lltm_stack.h) where it fits and
 * (lltm.LLTM both ways, forward + backward; docs/performance.md, "Stacked
 * layers in one launch"):
 *   - float32 (and the half types without tensor cores), captured: where a
 *     layer alone runs the grid family in 2 - STACK_GRID_GROUPS batch groups
 *     (B about 5 - 16 at H 129 - 256 on an H100 or H200): 0.67x - 0.94x of a
 *     call a layer; in one group 0.84x - 0.96x for two layers (0.97x - 1.08x
 *     for three). With more groups, and against the cluster and block
 *     families, it loses (0.99x - 4.8x). Eager where B x H <= STACK_EAGER_BH:
 *     0.32x - 0.94x (a call a layer is bound by the host's time there).
 *   - the half types on tensor cores (bfloat16, H200, against a call a layer
 *     in time chunks): captured where STACK_HALF_MIN_BH <= B x H <=
 *     STACK_HALF_MAX_BH and H >= STACK_HALF_MIN_H, 0.71x - 1.00x (B32 - B256,
 *     H 128 - 256; three layers B128/H128 1.07x); below, the cluster family
 *     runs a layer in a fraction of the stacked step (0.99x - 1.73x), above,
 *     the stacked blocks each carry several chunks (0.96x - 1.21x), at H = 64
 *     the block family is 2.1x - 2.4x faster. Eager where B x H <=
 *     STACK_HALF_MAX_BH: 0.29x - 0.95x (above, 0.98x - 1.07x). */
#define STACK_GRID_GROUPS 4
#define STACK_EAGER_BH 4096
#define STACK_HALF_MIN_BH 8192
#define STACK_HALF_MAX_BH 32768
#define STACK_HALF_MIN_H 128

int lltm_stack_rule_cuda(const lltm_cuda_device *dev, lltm_dtype dtype, int layers, int64_t B,
                         int64_t H, int eager, const lltm_sequence_plan *layer)
{
    const int64_t bh = B * H;
    if (is_half(dtype) && lltm_cuda_grid_tensor_cores(dev, dtype))
        return eager ? bh <= STACK_HALF_MAX_BH
                     : H >= STACK_HALF_MIN_H && bh >= STACK_HALF_MIN_BH && bh <= STACK_HALF_MAX_BH;
    if (eager)
        return bh <= STACK_EAGER_BH;
    if (!layer || layer->family != LLTM_SEQ_GRID)
        return 0;
    const int64_t groups = layer->forward.groups;
    return (groups >= 2 && groups <= STACK_GRID_GROUPS) || (groups == 1 && layers == 2);
}

/* --- lltm.LLTM's stacked layers in time chunks (a wavefront) ---
 *
 * From three layers at every chunk count 1 - 6 and 8, planned for the whole
 * device and for two layers at once, 56 shapes (float32 and bfloat16, B 1 -
 * 1024 x H 64 - 2048, T 100; `python3 dev/timing/wavefront_timing.py
 * --layers 3 --chunks 1,2,3,4,5,6,8 --shared`, graph replay, H200,
 * 2026-11-28): this rule's pick within 5% of the fastest schedule at 50
 * shapes, 1.018x of it on geometric mean, at most 1.12x. Captured:
 *   - the per-step family (another layer's products fill what one leaves
 *     idle): WAVE_CHUNKS chunks (0.66x - 1.05x of a call a layer, 21 shapes);
 *   - a persistent plan of which two layers' launches are resident at once:
 *     WAVE_CHUNKS (0.58x - 0.91x, 16 shapes); 1.5 - 2 layers (clusters that
 *     fill most of the GPU): 3 (0.84x - 0.91x, 4 shapes);
 *   - a grid on tensor cores holding one layer: WAVE_CHUNKS, each chunk call
 *     planned for two layers at once (0.80x - 0.89x, 5 shapes);
 *   - else one call a layer (a grid's blocks meet every step, so a second
 *     layer's launch waits for the first's end: 2 - 4 chunks 0.98x - 1.07x).
 * Eager: one call a layer (each chunk call adds the host's ~200 us to issue
 * it, which the overlap rarely repays). No chunk under WAVE_MIN_STEPS steps. */
#define WAVE_CHUNKS 4
#define WAVE_MIN_STEPS 8

void lltm_wavefront_rule_cuda(const lltm_cuda_device *dev, const lltm_sequence_plan *layer,
                              const int64_t resident[2], const int64_t parts[2], int64_t T,
                              int eager, int *chunks, int *sharing)
{
    int64_t most = T / WAVE_MIN_STEPS < WAVE_CHUNKS ? T / WAVE_MIN_STEPS : WAVE_CHUNKS;
    *chunks = *sharing = 1;
    if (eager || !layer || most < 2)
        return;
    if (layer->family == LLTM_SEQ_STEPS) {
        *chunks = (int)most;
        return;
    }
    /* layers resident at once: of the direction holding fewer, its parts
     * resident over a call's (7 clusters of a layer's 4: 1.75) */
    double at_once = -1;
    for (int d = 0; d < 2; ++d)
        if (parts[d] > 0 && (at_once < 0 || (double)resident[d] / parts[d] < at_once))
            at_once = (double)resident[d] / parts[d];
    if (at_once >= 2)
        *chunks = (int)most;
    else if (at_once >= 1.5)
        *chunks = most < 3 ? (int)most : 3;
    else if (layer->family == LLTM_SEQ_GRID && lltm_cuda_grid_tensor_cores(dev, layer->dtype) &&
             (layer->dtype != LLTM_FLOAT32 || layer->forward.tf32)) {
        *chunks = (int)most;
        *sharing = 2;
    }
}
