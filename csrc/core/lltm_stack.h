/*
 * lltm_stack.h - stacked layers in one persistent launch a direction (CUDA;
 * liblltm_cuda.so only). The notation of lltm.h: T steps, B batch rows, I
 * inputs of the bottom layer, H units of every layer, G = 3H; L layers,
 * layer 0 at the bottom, layer l > 0 fed layer l-1's output (its I = H).
 *
 * The same results as L calls of lltm_sequence_forward_persistent_cuda /
 * _backward_persistent_cuda with the products between them (layer l's input
 * projection h^{l-1} W_x^{l,T} before its forward, and the input gradient
 * dG^l W_x^l that is layer l-1's grad_output before its backward), up to
 * rounding: the layers run skewed in time in one cooperative grid (layer l
 * takes its step t at global step t + l; the backward the top layer first),
 * and the products between layers are formed inside the launch, step by
 * step (lltm_cuda_sequence_stack.cuh). A layer's persistent kernel that
 * leaves most of a step waiting on its grid barrier (small B x H) then
 * carries L layers for about the time of two. Not formed here, as for one
 * layer: layer 0's input projection x W_x^T (its gates come in holding it),
 * and, after the backward, each layer's dW = dG^T [h_prev | x] and layer
 * 0's dx = dG W_x: products over all T*B rows.
 *
 * Device pointers on the current device, `stream` a cudaStream_t; launches
 * only. Variable lengths: lengths [B] int64 (device) or NULL, each in
 * [1, T], the same for every layer, with lltm.h's rule.
 */
#ifndef LLTM_CORE_STACK_H
#define LLTM_CORE_STACK_H

#include "lltm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* the most layers one launch holds (each block keeps 2L - 1 matrices of
 * W in registers) */
#define LLTM_STACK_MAX_LAYERS 3

/* One stacked launch a direction: lanes x values of the grid kernels'
 * layout (H <= lanes * values), 4-row chunks, blocks x groups, the dynamic
 * shared memory of each kernel. workspace_bytes: for either direction
 * (float16 / bfloat16: every layer's recurrent state in float32; batch
 * groups > 1: their bias sums). */
typedef struct lltm_stack_plan {
    lltm_dtype dtype;
    int layers;
    int64_t B, H;
    lltm_sequence_launch forward, backward;
    size_t workspace_bytes;
} lltm_stack_plan;

/*
 * The plan for `layers` stacked layers of T steps, B rows, I inputs, H
 * units on `dev`: LLTM_OK, or LLTM_ERR_ARGUMENT where no stacked launch
 * runs these (layers outside 2 .. LLTM_STACK_MAX_LAYERS, float64, H > 256,
 * T * B == 0, no cooperative launch, or not even one batch group of blocks
 * resident at once). Layouts: 32 lanes x 4 values a unit at H <= 128, else
 * 32 x 8; as many batch groups (a 4-row chunk each at most) as the device
 * holds at once.
 */
int lltm_stack_plan_cuda(const lltm_cuda_device *dev, lltm_dtype dtype, int layers, int64_t T,
                         int64_t B, int64_t I, int64_t H, lltm_stack_plan *plan);

/* One layer's arrays in the stacked forward:
 *   weights  [G,H+I] (layer 0; W_h = columns 0..H-1 are read), [G,2H]
 *            above (W_h, then W_x of the layer's input)
 *   bias     [G]
 *   h0, c0   [B,H]
 *   gates    [T,B,G]  layer 0: in x_t W_x^T of every step; every layer:
 *            out the activations
 *   output   [T,B,H]  out: h_1..h_T (the next layer's input)
 *   cells    [T,B,H]  out: c_1..c_T */
typedef struct lltm_stack_forward_layer {
    const void *weights, *bias, *h0, *c0;
    void *gates, *output, *cells;
} lltm_stack_forward_layer;

/* One layer's arrays in the stacked backward (the forward's weights,
 * cells and gates):
 *   grad_h_n, grad_c_n  [B,H]  dL/dh_T, dL/dc_T of the layer
 *   grad_gates  [T,B,G]  out: dL/dg of every step
 *   grad_bias   [G]      out
 *   grad_h0, grad_c0     [B,H] out */
typedef struct lltm_stack_backward_layer {
    const void *weights, *cells, *gates, *grad_h_n, *grad_c_n;
    void *grad_gates, *grad_bias, *grad_h0, *grad_c0;
} lltm_stack_backward_layer;

/* The recurrences of plan->layers layers, layers[0] at the bottom; T, B >= 1.
 *   workspace  plan->workspace_bytes, 256-byte aligned (NULL if 0)
 *   grad_output [T,B,H]  dL/dh_t of the top layer's output (the layers
 *              below get theirs from the layer above, inside the launch) */
int lltm_stack_forward_persistent_cuda(const lltm_stack_plan *plan, int64_t T, int64_t B,
                                       int64_t I, int64_t H,
                                       const lltm_stack_forward_layer *layers, void *workspace,
                                       const int64_t *lengths, void *stream);
int lltm_stack_backward_persistent_cuda(const lltm_stack_plan *plan, int64_t T, int64_t B,
                                        int64_t I, int64_t H, const void *grad_output,
                                        const lltm_stack_backward_layer *layers,
                                        void *workspace, const int64_t *lengths, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* LLTM_CORE_STACK_H */
