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
 * W in registers: a unit's rows on FFMA, tensor-core tiles in the half
 * types on compute capability 8.0+) */
#define LLTM_STACK_MAX_LAYERS 3

/* One stacked launch a direction: lanes x values of the grid kernels'
 * layout (H <= lanes * values), rows a chunk (4 or 16), blocks x groups,
 * the dynamic shared memory of each kernel. workspace_bytes: for either
 * direction (float16 / bfloat16: every layer's recurrent state in float32;
 * batch groups > 1: their bias sums). */
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
 * resident at once). Layouts (lanes x values a unit): float32, and the half
 * types before compute capability 8.0, 32 x 4 at H <= 128, else 32 x 8, in
 * 4-row chunks; the half types on tensor cores 16 x 8 and 16 x 16, in
 * 4-row chunks, or 16-row ones where the 4-row chunks outnumber the batch
 * groups resident (a 4-row chunk's tiles cost what a 16-row one's do). As
 * many batch groups (a chunk each at most) as the device holds at once.
 */
int lltm_stack_plan_cuda(const lltm_cuda_device *dev, lltm_dtype dtype, int layers, int64_t T,
                         int64_t B, int64_t I, int64_t H, lltm_stack_plan *plan);

/* One layer's arrays in the stacked forward:
 *   weights  [G,H+I] (layer 0), [G,2H] above (W_h, then W_x of the layer's
 *            input); the recurrence reads W_h of layer 0, W_h and W_x above
 *   bias     [G]
 *   h0, c0   [B,H]
 *   gates    [T,B,G]  out: the activations (the recurrence alone: layer 0's
 *            come in holding x_t W_x^T of every step)
 *   output   [T,B,H]  out: h_1..h_T (the next layer's input)
 *   cells    [T,B,H]  out: c_1..c_T
 *   h_n, c_n [B,H]    out: each row's state after its last step (the
 *            recurrence alone: NULL, not written) */
typedef struct lltm_stack_forward_layer {
    const void *weights, *bias, *h0, *c0;
    void *gates, *output, *cells, *h_n, *c_n;
} lltm_stack_forward_layer;

/* One layer's arrays in the stacked backward (the forward's weights,
 * cells, gates; for the whole call also its h0 and output):
 *   grad_h_n, grad_c_n  [B,H]  dL/dh_T, dL/dc_T of the layer
 *   grad_gates  [T,B,G]  out: dL/dg of every step (the recurrence alone;
 *               the whole call keeps them in its workspace)
 *   grad_bias   [G]      out
 *   grad_h0, grad_c0     [B,H] out
 *   grad_weights [G,K]   out, K as weights' (the whole call only)
 * The whole call takes NULL for a gradient that is not wanted (grad_bias,
 * grad_h0, grad_c0: not returned; grad_weights: its products not formed);
 * the others come out the same. */
typedef struct lltm_stack_backward_layer {
    const void *weights, *cells, *gates, *grad_h_n, *grad_c_n;
    void *grad_gates, *grad_bias, *grad_h0, *grad_c0;
    const void *h0, *output;
    void *grad_weights;
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

/* The whole stack, as L calls of lltm_sequence_forward_cuda /
 * _backward_cuda (lltm.h) would run it: forward, layer 0's input
 * projection input [T,B,I] W_x^T, the recurrence, each layer's h_n and c_n;
 * backward, the recurrence, then each layer's dW = dG^T [h_prev | x] (x:
 * input, or the layer below's output) and layer 0's grad_input [T,B,I] =
 * dG W_x (NULL: not formed). Products through lltm_small_mm_cuda or `gemm`
 * as lltm.h says for one layer.
 *   workspace  forward: plan->workspace_bytes; backward:
 *              lltm_stack_backward_workspace_cuda bytes; 256-byte aligned */
size_t lltm_stack_backward_workspace_cuda(const lltm_stack_plan *plan, int64_t T, int64_t B,
                                          int64_t I, int64_t H);
int lltm_stack_forward_cuda(const lltm_stack_plan *plan, int64_t T, int64_t B, int64_t I,
                            int64_t H, const void *input, const lltm_stack_forward_layer *layers,
                            void *workspace, const int64_t *lengths, lltm_gemm gemm,
                            void *gemm_ctx, void *stream);
int lltm_stack_backward_cuda(const lltm_stack_plan *plan, int64_t T, int64_t B, int64_t I,
                             int64_t H, const void *input, const void *grad_output,
                             const lltm_stack_backward_layer *layers, void *grad_input,
                             void *workspace, const int64_t *lengths, lltm_gemm gemm,
                             void *gemm_ctx, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* LLTM_CORE_STACK_H */
