/*
 * lltm_cuda_rules.h - the rules that pick a CUDA route (lltm_cuda_rules.c):
 * which route runs, from the sizes and the device's properties (lltm.h's
 * lltm_cuda_device), each rule commented with the measurement behind it.
 * Pure arithmetic, deterministic; plain C (no CUDA): both compilers include
 * it.
 *   lltm_sequence_plan_rank_cuda  the rules' rank of a plan that fits (made
 *                                 by lltm_sequence_plan_cuda or a candidate
 *                                 of it; `concurrent` layers of it at once
 *                                 on the device): the chooser runs the lowest
 *   lltm_cuda_grid_tensor_cores   whether the grid kernels use tensor cores
 *   lltm_cell_route_cuda          the cell's route for these sizes
 *   lltm_stack_rule_cuda          whether lltm.LLTM runs a group of layers in
 *                                 one stacked launch (lltm_stack.h), where
 *                                 one fits
 *   lltm_wavefront_rule_cuda      in how many time chunks lltm.LLTM overlaps
 *                                 its stacked layers
 */
#ifndef LLTM_CORE_CUDA_RULES_H
#define LLTM_CORE_CUDA_RULES_H

#include "lltm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The tuned constants kept beside the kernels they steer (the others are in
 * lltm_cuda_rules.c). */

/* Small products run by the library's own kernel (lltm_small_mm_cuda) where
 * M*N*K <= LLTM_SMALL_MM_MAX_PRODUCT and K <= LLTM_SMALL_MM_MAX_K, eagerly
 * (an aten::mm call costs ~40 us of host time on the GPU machine); larger
 * products are GPU-bound, and a long reduction runs one tile after another
 * in each block, ~0.5 us apiece: the weight gradient's K = T*B took 60 us
 * where cuBLAS splits it. */
#define LLTM_SMALL_MM_MAX_PRODUCT (1LL << 27)
#define LLTM_SMALL_MM_MAX_K 512

/* The fused cell kernels' tiles (lltm_cuda_cell_tiles.h): the large tiles
 * where they still make LLTM_CUDA_LARGE_TILE_MIN_BLOCKS blocks; else the
 * medium ones where the small would make LLTM_CUDA_MEDIUM_TILE_MIN_BLOCKS
 * and, for the kernels whose medium tile spans 16 rows, the batch has at
 * least LLTM_CUDA_MEDIUM_TILE_MIN_ROWS rows; else the small (from
 * dev/timing/cell_tiles.cu on the H100, float32, GPU time a launch: at
 * B16/I32/H128 the small tiles are the fastest of each kernel, 3.3, 2.8, 3.3
 * us; at B16/I256/H512 the medium ones take 9.3, 5.3 and 11.2 us against
 * 13.7, 9.5 and 18.8; at B1/I256/H512 the medium forward tile is slower,
 * 8.0 against 6.1 us, the other two faster). Tests force one configuration
 * by defining them. */
#ifndef LLTM_CUDA_LARGE_TILE_MIN_BLOCKS
#define LLTM_CUDA_LARGE_TILE_MIN_BLOCKS 120
#endif
#ifndef LLTM_CUDA_MEDIUM_TILE_MIN_BLOCKS
#define LLTM_CUDA_MEDIUM_TILE_MIN_BLOCKS 192
#endif
#ifndef LLTM_CUDA_MEDIUM_TILE_MIN_ROWS
#define LLTM_CUDA_MEDIUM_TILE_MIN_ROWS 9
#endif

enum { /* the cell's matrix-product routes */
    LLTM_CELL_FUSED = 1,  /* the library's fused kernels: forward 1 launch, backward 2 */
    LLTM_CELL_CUBLAS = 2, /* products through cuBLAS around pointwise kernels */
};
#define LLTM_RANK_NONE INT64_MAX /* no rank: not a plan of these rules */
int64_t lltm_sequence_plan_rank_cuda(const lltm_cuda_device *dev, const lltm_sequence_plan *plan,
                                     int eager, int concurrent);
/* Whether the grid kernels of `dtype` form their products on tensor cores on
 * `dev` (lltm_cuda_mma.cuh): float16, bfloat16, and float32 where dev->tf32,
 * at compute capability and code_arch 8.0+ (the kernels' rule, for the host). */
int lltm_cuda_grid_tensor_cores(const lltm_cuda_device *dev, lltm_dtype dtype);
int lltm_cell_route_cuda(const lltm_cuda_device *dev, lltm_dtype dtype, int64_t B, int64_t I,
                         int64_t H);
/* 1 where `layers` stacked layers of B rows, H units run faster in one
 * stacked launch than as calls of one layer, `layer` being the plan a layer
 * above the first runs alone (eager: a call not captured into a CUDA graph). */
int lltm_stack_rule_cuda(const lltm_cuda_device *dev, lltm_dtype dtype, int layers, int64_t B,
                         int64_t H, int eager, const lltm_sequence_plan *layer);
/* The time chunks (*chunks >= 1) over which lltm.LLTM overlaps its stacked
 * layers of T steps, each chunk call planned for *sharing layers at once,
 * from `layer` (the plan a layer above the first runs alone on the whole
 * device) and its residency (lltm_sequence_plan_residency_cuda). */
void lltm_wavefront_rule_cuda(const lltm_cuda_device *dev, const lltm_sequence_plan *layer,
                              const int64_t resident[2], const int64_t parts[2], int64_t T,
                              int eager, int *chunks, int *sharing);

#ifdef __cplusplus
}
#endif

#endif /* LLTM_CORE_CUDA_RULES_H */
