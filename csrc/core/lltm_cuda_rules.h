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
