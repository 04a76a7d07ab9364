/*
 * lltm_cuda_cost.c - the cost model of the CUDA routes (lltm.h, "CUDA route
 * costs"): the GPU time, in microseconds, that one forward + backward is
 * predicted to take on each route the library has, from the device's
 * properties and the sizes; the choosers (lltm_sequence_plan_cuda, the cell
 * binding) take the cheapest. Pure arithmetic: no CUDA call, no state.
 *
 * The terms (each a time per unit, fitted on an H100):
 *   products    every cuBLAS product (aten::mm through the binding): its
 *               flops at the FFMA rate, or the tensor-core rate for the half
 *               types where the device has tensor cores for them, or the
 *               TF32 rate for float32 where the caller lets its products run
 *               on TF32 (dev->tf32, compute capability 8.0+), plus the bytes
 *               it reads and writes at the memory rate; rates per SM, so
 *               they scale with the SM count
 *   steps       per step: the launches and latencies of the per-step
 *               kernels (more in float32 / float64, whose per-step products
 *               cuBLAS splits), the bytes both pointwise kernels move at the
 *               memory rate, plus two products (h W_h^T, dG W_h)
 *   grid        per step: the latency of the exchange (grid barriers,
 *               state through global memory), plus each thread's
 *               multiply-adds (passes over its chunks x rows x values, both
 *               directions) at the FFMA rate of one thread, plus the state
 *               values its block stages (passes x chunk rows x H); the half
 *               types on tensor cores: a part a step, a pass's latency by
 *               kernel (layout and chunk rows) and the rows all blocks
 *               stage
 *   cluster     the same terms for thread-block clusters (the exchange in
 *               distributed shared memory); both persistent families also
 *               pay for the gates and states a step moves through memory
 *   cell        fused: one step's latency (three launches), its flops at
 *               the rate of each kernel's tiles (lltm_cuda_cell_tiles.h),
 *               the reductions one thread runs alone (over the B rows for
 *               the weight gradient, over K = I + H for the gates and dX on
 *               the small tiles), which bound it where the tiles are few,
 *               and the bytes of W read twice and dW written, which bound it
 *               at small batches; cuBLAS: the latency of its seven launches,
 *               and its four products (the cell's own rates: products of
 *               one step)
 * Every term is a smooth function of the sizes (products, ceilings of
 * chunk counts): neighbouring shapes get neighbouring costs, and the choice
 * changes where two routes' predictions cross. The coefficients and where
 * they come from: "The coefficients" below.
 */
#include "lltm.h"
#include "lltm_cuda_cell_tiles.h"
#include "lltm_cuda_grid_layouts.h"

#include <math.h>

/* ------------------------------------------------------------------------ */
/* The coefficients (microseconds per unit).                                 */
/* ------------------------------------------------------------------------ */

#define COST_SMS 132.0 /* the SM count of the device they were fitted on */

/*
 * Fitted by dev/timing/fit_routes.py (non-negative least squares on
 * relative errors) to `python -m lltm.bench --sweep --sweep-variants` on one
 * H100 80GB HBM3 (132 SMs; torch 2.11.0+cu130): the run of 2026-11-24 05:10
 * UTC, tree f8aeba6 (every plan family and grid layout forced, B 1..1024, H
 * 64..2048, T 20, 100 and 1000, float32 and bfloat16; its per-step times,
 * from the kernels before the 2-D grid, left out; 108 cell times, both
 * routes, B 1..1024, H 128, 512, 1024) and the run of 08:40 UTC, tree
 * f82d008 (every family, B 1, 16, 64, 256, 1024 x H 64..2048, T 100): 407
 * sequence times. The cell's coefficients alone, the sequence's (its
 * product rates included) together; the cell's again on 2026-11-25 00:44
 * UTC (the fused kernels' medium tiles, the cuBLAS route's pointwise
 * backward over row chunks): 108 times, B 1..1024 (nine values), H 128,
 * 512, 1024, float32 and bfloat16, both routes. Median relative error 8.8%
 * (cell), 7.8% (sequence). The block family's three coefficients alone on
 * 2026-11-25 03:55 UTC (--only block_step,block_work,block_stage: every
 * family forced at H 32 and 64, B 1, 4, 16, 64, 256, 1024, float32 and
 * bfloat16, T 100; the other coefficients as they were): the model's pick
 * within 15% of the fastest at all 24 shapes.
 */
/* the cell's cuBLAS products (per flop: 38 TFLOPS FFMA, 490 TFLOPS tensor
 * cores; per byte: 2.6 TB/s) */
#define C_FLOP_FFMA 2.653e-08
#define C_FLOP_TENSOR 2.03e-09
#define C_BYTE 3.855e-07
/* the cell's float32 products on TF32 were not measured: at half the half
 * types' tensor-core rate (the H100's TF32 : BF16 rate) */
#define C_FLOP_TF32 (2.0 * C_FLOP_TENSOR)
/* the sequence's products (FFMA, tensor cores, TF32; a byte) */
#define C_SEQ_FLOP_FFMA 1.917e-08
#define C_SEQ_FLOP_TENSOR 1.152e-09
/* TF32: no sweep timed it (its check failed on the bench's old bar); set
 * to 4.0e-9 from the per-step family's GPU time on TF32 at float32
 * B256/H1024 (5,945 us, 3.2e-9 would fit it) and B1024/H256 (3,751 us,
 * 5.8e-9), T = 100 (dev/timing/sequence_profile.py --graph --tf32) */
#define C_SEQ_FLOP_TF32 4.0e-09
#define C_SEQ_BYTE 3.673e-07
/* the cell: cuBLAS route (seven launches; FFMA products' own latency) */
#define C_CUBLAS_CALL 17.58
#define C_CUBLAS_CALL_FFMA 6.074
/* the cell: fused route (a step; per flop on the small, medium and large
 * tiles, float32 and the half types (the fit leaves float32's small tiles
 * to the other terms); per row of B and per k of I + H one thread sums; per
 * byte of W read twice and dW written) */
#define C_FUSED_CALL 5.802
#define C_FUSED_FLOP_SMALL 0.0
#define C_FUSED_FLOP_MEDIUM 1.178e-07
#define C_FUSED_FLOP_LARGE 5.214e-08
#define C_FUSED_FLOP_SMALL_HALF 6.367e-07
#define C_FUSED_FLOP_MEDIUM_HALF 1.976e-07
#define C_FUSED_FLOP_LARGE_HALF 7.32e-08
#define C_FUSED_ROWS 0.14
#define C_FUSED_K 0.01126
#define C_FUSED_BYTE 7.64e-07
/* the sequence: a call (its launches and large products' latency) */
#define C_CALL 68.53
/* per step of the per-step kernels (four launches, latency; a term per row
 * one thread of the backward kernel walks, lltm_sequence_step_rows / 8,
 * fitted to 0 and left out) */
#define C_STEPS_STEP 9.12
/* more a step in float32 and float64: cuBLAS's per-step products there
 * (FFMA, or TF32) split K and add a reduce kernel */
#define C_STEPS_STEP_FFMA 2.174
/* the elements a (row, unit) of a step the two pointwise kernels read and
 * write: forward gates, recurrent (3 + 3), c_{t-1}, activations (3), c_t,
 * h_t; backward activations (3), c_t, grad_output, dh, dc in, dG (3), dc
 * out */
#define STEPS_POINTWISE_ELEMS 23.0
/* per step of the grid family: the exchange, a multiply-add of one thread,
 * a state value a block stages */
#define C_GRID_STEP 3.447
#define C_GRID_WORK 0.009531
#define C_GRID_STAGE 5.83e-05
/* The half types' grid kernels on tensor cores (compute capability 8.0+,
 * lltm_cuda_mma.cuh): a step's fixed part, a pass over a chunk by kernel
 * (layout and chunk rows: a pass stages the chunk, runs the tiles and adds
 * the 8 warps' partial sums between block barriers, a latency that each
 * kernel's code sets and H hardly moves; GRID_MMA_PASS, below), and the
 * rows every block of the launch stages (passes x chunk rows x blocks: the
 * same chunk read by each of its unit blocks). Fitted (non-negative least
 * squares on relative errors, the products', call and memory terms as they
 * are) to every grid layout forced in bfloat16 at B 1 - 1024 x H 64 - 1024,
 * to the layouts at every batch-group count from 1 to the most resident,
 * at B 16 - 1024 x H 128 - 1024, and to the map's 4-row plans of either
 * layout at B1/H256, B1/H512, B16/H256, T 100: 351 times, median error 3.1%
 * (90th percentile 8.2%), the pick among the measured plans within 10% of
 * the fastest at all 48 shapes (H100, 2026-11-27 03:37, 05:21, 05:32 and
 * 06:08 UTC; lltm.bench --sweep --sweep-variants, grid routes, and the
 * groups forced through lltm.overrides). One pass term for every kernel
 * left the layouts 15% apart (median error 7.2%); without the rows staged,
 * 32x16's 128 blocks at B64/H256 were costed below the 64 of 16x32 (899
 * against 835 us measured). The pass terms were refitted since, the step's
 * and rows' terms held (below). */
#define GRID_MMA_STEP 1.212
#define GRID_MMA_ROW 1.594e-04
/* a pass's microseconds, [16-row chunks, 4-row chunks] x layouts 16x8,
 * 16x32, 32x16, 32x32, 8x64, 16x64; float32's grid on TF32 (16-row chunks;
 * m16n8k8: twice the tiles of a half-type k range, float rows staged) by
 * layout, the rows' term 0 there (fitted with it: 2.2% against 3.2%, but
 * negative), the step's fixed part the half types'. Each kernel's term is
 * fitted alone, the others held (dev/timing/grid_costs.py fit: least squares
 * of the relative errors), to the times of forced plans (bfloat16, every
 * layout in either chunk size at each batch-group count, B 1 - 1024 x H 128
 * - 1024; float32 on TF32, torch's TF32 on), T 100: 503 times, median error 2.7%,
 * 90th percentile 7.9%, by kernel 1.5% - 6.3% (H100, 2026-11-27 13:21 -
 * 13:24 UTC, the kernels whose partial sums sit at a padded row stride) */
static const double GRID_MMA_PASS[LLTM_GRID_CHUNK_COUNT][LLTM_GRID_LAYOUT_COUNT] = {
    {1.8013, 2.3607, 2.3687, 2.6183, 3.0430, 2.7685},
    {1.2193, 1.3385, 1.3700, 1.5943, 1.5955, 1.6834}};
static const double GRID_TF32_PASS[LLTM_GRID_TF32_LAYOUTS] = {1.8073, 2.6145, 2.4922, 3.8008};
/* the same for the cluster family (its kernels of today: refitted to 84
 * times of every cluster shape and batch split, float32 and bfloat16, B 1 -
 * 64 x H 96 - 128, T 100, H100 2026-11-27 06:01 UTC: median error 18% ->
 * 9.5%; the staged values fitted to 0) */
#define C_CLUSTER_STEP 0.7225
#define C_CLUSTER_WORK 0.01744
#define C_CLUSTER_STAGE 0.0
/* the block family: a pass of a step over a batch group's chunks (its
 * latency), a multiply-add of one thread, a state value a block stages */
#define C_BLOCK_PASS 0.4869
#define C_BLOCK_WORK 0.008366
#define C_BLOCK_STAGE 0.0006165
/* per byte of the gates and states a step of a persistent kernel reads and
 * writes (STEPS_POINTWISE_ELEMS a row and unit, as the per-step kernels) */
#define C_PERSISTENT_BYTE 1.055e-06
/* not measured: float64 arithmetic taken at half the float32 rate (the
 * H100's FP64 : FP32 rate) */
#define FP64_SLOWDOWN 2.0

/* ------------------------------------------------------------------------ */
/* Features (dev/timing/fit_routes.py computes the same).                    */
/* ------------------------------------------------------------------------ */

static int tensor_cores(const lltm_cuda_device *dev, lltm_dtype dtype)
{
    if (dtype == LLTM_FLOAT16)
        return dev->major >= 7;
    if (dtype == LLTM_BFLOAT16)
        return dev->major >= 8;
    if (dtype == LLTM_FLOAT32)
        return dev->tf32 && dev->major >= 8;
    return 0;
}

static double sm_scale(const lltm_cuda_device *dev)
{
    return dev->sm_count > 0 ? COST_SMS / (double)dev->sm_count : 1.0;
}

static double elem_bytes(lltm_dtype dtype)
{
    return dtype == LLTM_FLOAT64 ? 8.0 : dtype == LLTM_FLOAT32 ? 4.0 : 2.0;
}

/* The rates of cuBLAS products (us a flop on FFMA, tensor cores, TF32;
 * us a byte): the cell's one-step products, and the sequence's (its large
 * products over all T * B rows and the per-step products run at rates the
 * cell's small ones never reach) */
typedef struct product_rates {
    double ffma, tensor, tf32, byte;
} product_rates;
static const product_rates CELL_RATES = {C_FLOP_FFMA, C_FLOP_TENSOR, C_FLOP_TF32, C_BYTE};
static const product_rates SEQ_RATES = {C_SEQ_FLOP_FFMA, C_SEQ_FLOP_TENSOR, C_SEQ_FLOP_TF32,
                                        C_SEQ_BYTE};

/* One cuBLAS product [M,K] x [K,N]: flops and bytes at their rates. */
static double product_us(const lltm_cuda_device *dev, const product_rates *r, lltm_dtype dtype,
                         double M, double N, double K)
{
    const double flops = 2.0 * M * N * K;
    const double bytes = (M * K + K * N + M * N) * elem_bytes(dtype);
    const double per_flop = !tensor_cores(dev, dtype)
                                ? (dtype == LLTM_FLOAT64 ? r->ffma * FP64_SLOWDOWN : r->ffma)
                            : dtype == LLTM_FLOAT32 ? r->tf32
                                                    : r->tensor;
    return (flops * per_flop + bytes * r->byte) * sm_scale(dev);
}

static double ceil_div_d(int64_t a, int64_t b) { return (double)((a + b - 1) / b); }

/* A persistent launch's passes a step over its batch group's chunks. */
static double launch_passes(const lltm_sequence_launch *l, int64_t B)
{
    const int64_t chunk = l->chunk > 0 ? l->chunk : 1, groups = l->groups > 0 ? l->groups : 1;
    return ceil_div_d((B + chunk - 1) / chunk, groups);
}

/* A persistent launch's work per step: each thread's multiply-adds (per
 * gate: passes x rows x values) and the state values its block stages
 * (passes x chunk x H). */
static void launch_work(const lltm_sequence_launch *l, int64_t B, int64_t H, double *work,
                        double *stage)
{
    const double passes = launch_passes(l, B);
    *work += passes * l->rows * l->values;
    *stage += passes * (double)(l->chunk > 0 ? l->chunk : 1) * (double)H;
}

/* A grid launch's passes and rows staged on tensor cores, in microseconds a
 * step. */
static double mma_launch_us(const lltm_sequence_launch *l, int64_t B)
{
    const int64_t chunk = l->chunk > 0 ? l->chunk : 1, groups = l->groups > 0 ? l->groups : 1;
    const int layout = lltm_grid_layout_index(l->lanes, l->values);
    const int c = lltm_grid_chunk_index((int)chunk);
    if (layout < 0 || c < 0)
        return INFINITY; /* no such kernel */
    if (l->tf32) /* no TF32 build of the layouts of 64 values */
        return layout < LLTM_GRID_TF32_LAYOUTS ? launch_passes(l, B) * GRID_TF32_PASS[layout]
                                               : INFINITY;
    return launch_passes(l, B) * (GRID_MMA_PASS[c][layout] +
                                  GRID_MMA_ROW * (double)(chunk * l->blocks * groups));
}

int lltm_cuda_grid_tensor_cores(const lltm_cuda_device *dev, lltm_dtype dtype)
{
    const int half = dtype == LLTM_FLOAT16 || dtype == LLTM_BFLOAT16;
    return dev && (half || (dtype == LLTM_FLOAT32 && dev->tf32)) && dev->major >= 8 &&
           dev->code_arch >= 80;
}

/* Whether a plan's grid kernels form their products on tensor cores:
 * float32's where the plan took the TF32 build */
static int grid_on_tensor_cores(const lltm_cuda_device *dev, const lltm_sequence_plan *plan)
{
    return plan->family == LLTM_SEQ_GRID && lltm_cuda_grid_tensor_cores(dev, plan->dtype) &&
           (plan->dtype != LLTM_FLOAT32 || plan->forward.tf32);
}

double lltm_sequence_plan_cost_cuda(const lltm_cuda_device *dev, const lltm_sequence_plan *plan,
                                    int64_t T, int64_t B, int64_t I, int64_t H)
{
    if (!dev || !plan || T < 0 || B < 0 || I < 0 || H < 0)
        return INFINITY;
    const lltm_dtype dt = plan->dtype;
    const double t = (double)T, b = (double)B, i = (double)I, h = (double)H;
    /* the products of every plan: x W_x^T for all steps, then dW and dx */
    const product_rates *r = &SEQ_RATES;
    double us = C_CALL + product_us(dev, r, dt, t * b, 3 * h, i) +
                product_us(dev, r, dt, 3 * h, h + i, t * b) +
                product_us(dev, r, dt, t * b, i, 3 * h);
    if (plan->family == LLTM_SEQ_STEPS) {
        const double bytes = STEPS_POINTWISE_ELEMS * b * h * elem_bytes(dt);
        const int half = dt == LLTM_FLOAT16 || dt == LLTM_BFLOAT16;
        const double ffma = half ? 0.0 : C_STEPS_STEP_FFMA;
        return us + t * (C_STEPS_STEP + ffma + r->byte * bytes * sm_scale(dev) +
                         product_us(dev, r, dt, b, 3 * h, h) + product_us(dev, r, dt, b, h, 3 * h));
    }
    /* the gates and states a step reads and writes in memory */
    const double memory = C_PERSISTENT_BYTE * STEPS_POINTWISE_ELEMS * b * h * elem_bytes(dt);
    if (grid_on_tensor_cores(dev, plan))
        return us + t * (GRID_MMA_STEP + mma_launch_us(&plan->forward, B) +
                         mma_launch_us(&plan->backward, B) + memory);
    double work = 0, stage = 0;
    launch_work(&plan->forward, B, H, &work, &stage);
    launch_work(&plan->backward, B, H, &work, &stage);
    const double slow = dt == LLTM_FLOAT64 ? FP64_SLOWDOWN : 1.0;
    if (plan->family == LLTM_SEQ_GRID)
        return us + t * (C_GRID_STEP + C_GRID_WORK * slow * work + C_GRID_STAGE * stage +
                         memory);
    if (plan->family == LLTM_SEQ_CLUSTER)
        return us + t * (C_CLUSTER_STEP + C_CLUSTER_WORK * slow * work +
                         C_CLUSTER_STAGE * stage + memory);
    if (plan->family == LLTM_SEQ_BLOCK) {
        /* a step is one thread's chain of math a pass over the group's chunks */
        return us + t * (C_BLOCK_PASS * launch_passes(&plan->forward, B) +
                         C_BLOCK_WORK * slow * work + C_BLOCK_STAGE * stage + memory);
    }
    return INFINITY;
}

/* The host's time a step of the per-step family, forward and backward (four
 * launches, two of them products straight through cuBLAS: the binding's
 * gemm), issued eagerly: eager steps of one layer at T = 100 where the host
 * is the bound, H100 machine, 2026-11-27 00:43 UTC (bfloat16 B1/H2048 4.30
 * ms, B64/H1024 4.14, B256/H1024 4.47; their GPU time 1.9 - 3.0 ms). Through
 * aten::mm the same steps cost 55 us (float32 B1024/H128 6.8 ms, bfloat16
 * B1/H2048 5.6). */
#define C_HOST_STEP_STEPS 43.0

double lltm_sequence_plan_host_cost_cuda(const lltm_sequence_plan *plan, int64_t T)
{
    if (!plan || T < 0)
        return 0.0;
    return plan->family == LLTM_SEQ_STEPS ? C_HOST_STEP_STEPS * (double)T : 0.0;
}

double lltm_cell_route_cost_cuda(const lltm_cuda_device *dev, lltm_dtype dtype, int route,
                                 int64_t B, int64_t I, int64_t H)
{
    if (!dev || B < 0 || I < 0 || H < 0)
        return INFINITY;
    const double b = (double)B, i = (double)I, h = (double)H, k = i + h;
    if (route == LLTM_CELL_FUSED) {
        /* the three kernels (gates, dW, dX), a third of the flops each, on
         * the tiles each takes for these sizes (lltm_cuda_cell_*.cu) */
        const int tiles[3] = {lltm_forward_tiles(B, H), lltm_weights_tiles(I, H),
                              lltm_inputs_tiles(B, I, H)};
        /* per flop on each kernel's tiles: [half][small, medium, large] */
        static const double rate[2][3] = {
            {C_FUSED_FLOP_SMALL, C_FUSED_FLOP_MEDIUM, C_FUSED_FLOP_LARGE},
            {C_FUSED_FLOP_SMALL_HALF, C_FUSED_FLOP_MEDIUM_HALF, C_FUSED_FLOP_LARGE_HALF}};
        const int half = dtype == LLTM_FLOAT16 || dtype == LLTM_BFLOAT16;
        const double slow = dtype == LLTM_FLOAT64 ? FP64_SLOWDOWN : 1.0;
        const double third = 2.0 * b * 3 * h * k; /* one product's flops */
        double us = 0;
        for (int j = 0; j < 3; ++j)
            us += third * rate[half][tiles[j]];
        /* a K-long sum of the forward's and of dX's small tiles, half a term
         * each (the larger tiles split theirs further for their work) */
        const double k_sums =
            0.5 * ((tiles[0] == LLTM_TILES_SMALL) + (tiles[2] == LLTM_TILES_SMALL));
        const double w_bytes = 3.0 * 3 * h * k * elem_bytes(dtype);
        return C_FUSED_CALL + us * slow * sm_scale(dev) +
               (C_FUSED_ROWS * b + C_FUSED_K * k * k_sums) * slow + C_FUSED_BYTE * w_bytes;
    }
    if (route == LLTM_CELL_CUBLAS)
        return C_CUBLAS_CALL + (tensor_cores(dev, dtype) ? 0.0 : C_CUBLAS_CALL_FFMA) +
               product_us(dev, &CELL_RATES, dtype, b, 3 * h, k) +
               product_us(dev, &CELL_RATES, dtype, 3 * h, k, b) +
               product_us(dev, &CELL_RATES, dtype, b, h, 3 * h) +
               product_us(dev, &CELL_RATES, dtype, b, i, 3 * h);
    return INFINITY;
}

int lltm_cell_route_cuda(const lltm_cuda_device *dev, lltm_dtype dtype, int64_t B, int64_t I,
                         int64_t H)
{
    return lltm_cell_route_cost_cuda(dev, dtype, LLTM_CELL_CUBLAS, B, I, H) <
                   lltm_cell_route_cost_cuda(dev, dtype, LLTM_CELL_FUSED, B, I, H)
               ? LLTM_CELL_CUBLAS
               : LLTM_CELL_FUSED;
}
