/*
 * lltm_cuda_seq_stack.cu - stacked layers in one launch a direction
 * (lltm_stack.h): the plan (layout, batch groups by the occupancy of both
 * kernels, workspace), the launches, checked against the plan and handed
 * to the unit of their dtype (lltm_cuda_seq_stack_<dtype>.cu; the kernels:
 * lltm_cuda_sequence_stack.cuh), and the whole stack around them (the
 * products and final states, through the one-layer code's pieces).
 */
#include "lltm_stack.h"
#include "lltm_cuda_rules.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "lltm_cuda_sequence_stack_launch.cuh"

namespace {

using lltm_seq::elem_bytes;
using lltm_seq::NT;

constexpr int STACK_CHUNK = 4;      /* rows a chunk: the small batches the stack is for */
constexpr int STACK_MMA_CHUNK = 16; /* tensor cores: where 4-row chunks would share blocks */
constexpr int STACK_MAX_H = 256;

/* LLTM_DISPATCH_OR (lltm_cuda_math.cuh) over the stack's dtypes: no float64 */
#define LLTM_STACK_DISPATCH_OR(dtype, CALL, otherwise)                                       \
    switch (dtype) {                                                                         \
    case LLTM_FLOAT32: { typedef float T; return CALL; }                                     \
    case LLTM_FLOAT16: { typedef __half T; return CALL; }                                    \
    case LLTM_BFLOAT16: { typedef __nv_bfloat16 T; return CALL; }                            \
    default: return otherwise;                                                               \
    }

const void *stack_kernel_for(lltm_dtype dtype, bool forward, int lanes, int values, int chunk,
                             int layers)
{
    LLTM_STACK_DISPATCH_OR(dtype, lltm_seq::stack_kernel<T>(forward, lanes, values, chunk, layers),
                           NULL);
}

bool plan_matches(const lltm_stack_plan *plan, int64_t B, int64_t H)
{
    return plan && plan->layers >= 2 && plan->layers <= LLTM_STACK_MAX_LAYERS && plan->B == B &&
           plan->H == H;
}

/* the workspace regions: per layer the float state (half types: h, c
 * forward, dG, dc backward), then the groups' bias sums [groups, L, G] */
using lltm_seq::round_up;
size_t state_bytes(lltm_dtype dtype, int64_t B, int64_t H)
{
    return round_up(lltm_seq::half_state_bytes(dtype, B, H));
}

template <typename T>
int forward_call(const lltm_stack_plan &p, int64_t T_, int64_t B, int64_t I, int64_t H,
                 const lltm_stack_forward_layer *layers, void *workspace, const int64_t *lengths,
                 cudaStream_t stream)
{
    lltm_seq::stack_forward_args<T> a = {};
    a.steps = T_, a.B = B, a.I = I, a.H = H, a.lengths = lengths;
    const size_t state = state_bytes(p.dtype, B, H);
    for (int l = 0; l < p.layers; ++l) {
        const lltm_stack_forward_layer &y = layers[l];
        if (!y.weights || !y.bias || !y.h0 || !y.c0 || !y.gates || !y.output || !y.cells)
            return LLTM_ERR_ARGUMENT;
        a.weights[l] = (const T *)y.weights, a.bias[l] = (const T *)y.bias;
        a.h0[l] = (const T *)y.h0, a.c0[l] = (const T *)y.c0;
        a.gates[l] = (T *)y.gates, a.output[l] = (T *)y.output, a.cells[l] = (T *)y.cells;
        a.h_n[l] = (T *)y.h_n, a.c_n[l] = (T *)y.c_n;
        if (state) {
            if (!workspace)
                return LLTM_ERR_ARGUMENT;
            a.h_work[l] = (float *)((char *)workspace + l * state);
            a.c_work[l] = a.h_work[l] + 2 * B * H;
        }
    }
    return lltm_seq::stack_run<T>(p.forward, p.layers, a, stream);
}

template <typename T>
int backward_call(const lltm_stack_plan &p, int64_t T_, int64_t B, int64_t I, int64_t H,
                  const void *grad_output, const lltm_stack_backward_layer *layers,
                  void *workspace, const int64_t *lengths, cudaStream_t stream)
{
    lltm_seq::stack_backward_args<T> a = {};
    a.steps = T_, a.B = B, a.I = I, a.H = H, a.lengths = lengths;
    a.grad_output = (const T *)grad_output;
    if (!grad_output)
        return LLTM_ERR_ARGUMENT;
    const size_t state = state_bytes(p.dtype, B, H);
    for (int l = 0; l < p.layers; ++l) {
        const lltm_stack_backward_layer &y = layers[l];
        if (!y.weights || !y.cells || !y.gates || !y.grad_h_n || !y.grad_c_n || !y.grad_gates ||
            !y.grad_bias || !y.grad_h0 || !y.grad_c0)
            return LLTM_ERR_ARGUMENT;
        a.weights[l] = (const T *)y.weights, a.cells[l] = (const T *)y.cells;
        a.gates[l] = (const T *)y.gates;
        a.grad_h_n[l] = (const T *)y.grad_h_n, a.grad_c_n[l] = (const T *)y.grad_c_n;
        a.grad_gates[l] = (T *)y.grad_gates, a.grad_bias[l] = (T *)y.grad_bias;
        a.grad_h0[l] = (T *)y.grad_h0, a.grad_c0[l] = (T *)y.grad_c0;
        if (state) {
            if (!workspace)
                return LLTM_ERR_ARGUMENT;
            a.dg_work[l] = (float *)((char *)workspace + l * state);
            a.dc_work[l] = a.dg_work[l] + 2 * B * 3 * H;
        }
    }
    if (p.backward.groups > 1) {
        if (!workspace)
            return LLTM_ERR_ARGUMENT;
        a.bias_work = (float *)((char *)workspace + p.layers * state);
    }
    return lltm_seq::stack_run<T>(p.backward, p.layers, a, stream);
}

} // namespace

extern "C" {

int lltm_stack_plan_cuda(const lltm_cuda_device *dev, lltm_dtype dtype, int layers, int64_t T,
                         int64_t B, int64_t I, int64_t H, lltm_stack_plan *plan)
{
    if (!dev || !plan || lltm_seq::bad_sizes(T, B, I, H))
        return LLTM_ERR_ARGUMENT;
    *plan = lltm_stack_plan{};
    if (layers < 2 || layers > LLTM_STACK_MAX_LAYERS || T * B == 0 || H < 1 ||
        H > STACK_MAX_H || !dev->cooperative_launch)
        return LLTM_ERR_ARGUMENT;
    /* The half types' products on tensor cores (sm_80+ code): 16 units a
     * block (their tiles of 2L - 1 matrices fit a block's registers), half
     * the blocks that stage each row of every layer's state a step, and
     * 16-row chunks where 4-row ones would leave a block several a step (a
     * 4-row chunk's tiles cost what a 16-row one's do). */
    const bool mma = dtype != LLTM_FLOAT32 && lltm_cuda_grid_tensor_cores(dev, dtype);
    const int lanes = mma ? 16 : 32, U = NT / lanes;
    const int values = mma ? (H <= 128 ? 8 : 16) : H <= 128 ? 4 : 8;
    const size_t mma_bytes = mma ? elem_bytes(dtype) : 0;
    const int64_t unit_blocks = (H + U - 1) / U;
    int chunk = STACK_CHUNK;
    size_t fsmem = 0, bsmem = 0;
    int64_t groups = 0, chunks = 0;
    for (;;) {
        fsmem = lltm_seq::stack_forward_smem(lanes, values, chunk, layers, mma_bytes);
        bsmem = lltm_seq::stack_backward_smem(lanes, values, chunk, layers, mma_bytes);
        const int64_t fits_f = lltm_seq::max_resident_blocks(
            stack_kernel_for(dtype, true, lanes, values, chunk, layers), fsmem, *dev);
        const int64_t fits_b = lltm_seq::max_resident_blocks(
            stack_kernel_for(dtype, false, lanes, values, chunk, layers), bsmem, *dev);
        chunks = (B + chunk - 1) / chunk;
        groups = (fits_f < fits_b ? fits_f : fits_b) / unit_blocks;
        if (!mma || chunk == STACK_MMA_CHUNK || chunks <= groups)
            break;
        chunk = STACK_MMA_CHUNK;
    }
    groups = groups < chunks ? groups : chunks;
    if (groups < 1)
        return LLTM_ERR_ARGUMENT;
    lltm_sequence_launch l = {};
    l.lanes = lanes, l.values = values, l.rows = chunk, l.chunk = chunk;
    l.exchange = LLTM_SEQ_EXCHANGE_GLOBAL, l.blocks = unit_blocks, l.groups = groups;
    plan->dtype = dtype, plan->layers = layers, plan->B = B, plan->H = H;
    plan->forward = l, plan->forward.smem = fsmem;
    plan->backward = l, plan->backward.smem = bsmem;
    plan->workspace_bytes =
        layers * state_bytes(dtype, B, H) +
        (groups > 1 ? round_up((size_t)(groups * layers * 3 * H) * sizeof(float)) : 0);
    return LLTM_OK;
}

int lltm_stack_forward_persistent_cuda(const lltm_stack_plan *plan, int64_t steps, int64_t B,
                                       int64_t I, int64_t H,
                                       const lltm_stack_forward_layer *layers, void *workspace,
                                       const int64_t *lengths, void *stream)
{
    if (lltm_seq::bad_sizes(steps, B, I, H) || steps < 1 || B < 1 || !layers ||
        !plan_matches(plan, B, H))
        return LLTM_ERR_ARGUMENT;
    LLTM_STACK_DISPATCH_OR(plan->dtype,
                           forward_call<T>(*plan, steps, B, I, H, layers, workspace, lengths,
                                           (cudaStream_t)stream),
                           LLTM_ERR_DTYPE);
}

int lltm_stack_backward_persistent_cuda(const lltm_stack_plan *plan, int64_t steps, int64_t B,
                                        int64_t I, int64_t H, const void *grad_output,
                                        const lltm_stack_backward_layer *layers,
                                        void *workspace, const int64_t *lengths, void *stream)
{
    if (lltm_seq::bad_sizes(steps, B, I, H) || steps < 1 || B < 1 || !layers ||
        !plan_matches(plan, B, H))
        return LLTM_ERR_ARGUMENT;
    LLTM_STACK_DISPATCH_OR(plan->dtype,
                           backward_call<T>(*plan, steps, B, I, H, grad_output, layers, workspace,
                                            lengths, (cudaStream_t)stream),
                           LLTM_ERR_DTYPE);
}

size_t lltm_stack_backward_workspace_cuda(const lltm_stack_plan *plan, int64_t T, int64_t B,
                                          int64_t I, int64_t H)
{
    if (!plan_matches(plan, B, H) || lltm_seq::bad_sizes(T, B, I, H) || T * B == 0)
        return 0;
    const size_t elem = elem_bytes(plan->dtype), L = (size_t)plan->layers;
    const int64_t K = H + (I > H ? I : H); /* the widest [h_prev | x] */
    /* the recurrence's, then per layer dG and the places of unwanted
     * gradients (h0, c0, bias), then hx */
    return round_up(plan->workspace_bytes) +
           L * (round_up((size_t)(T * B * 3 * H) * elem) + 2 * round_up((size_t)(B * H) * elem) +
                round_up((size_t)(3 * H) * elem)) +
           (size_t)(T * B * K) * elem;
}

int lltm_stack_forward_cuda(const lltm_stack_plan *plan, int64_t T, int64_t B, int64_t I,
                            int64_t H, const void *input, const lltm_stack_forward_layer *layers,
                            void *workspace, const int64_t *lengths, lltm_gemm gemm,
                            void *gemm_ctx, void *stream)
{
    if (!plan_matches(plan, B, H) || lltm_seq::bad_sizes(T, B, I, H) || T < 1 || B < 1 ||
        !layers || !gemm || (I > 0 && !input))
        return LLTM_ERR_ARGUMENT;
    for (int l = 0; l < plan->layers; ++l)
        if (!layers[l].h_n || !layers[l].c_n)
            return LLTM_ERR_ARGUMENT;
    /* the recurrence writes each layer's h_n and c_n itself */
    const int status = lltm_seq::input_projection(plan->dtype, T * B, I, H, input,
                                                  layers[0].weights, layers[0].gates, gemm,
                                                  gemm_ctx, stream);
    return status == LLTM_OK ? lltm_stack_forward_persistent_cuda(plan, T, B, I, H, layers,
                                                                  workspace, lengths, stream)
                             : status;
}

int lltm_stack_backward_cuda(const lltm_stack_plan *plan, int64_t T, int64_t B, int64_t I,
                             int64_t H, const void *input, const void *grad_output,
                             const lltm_stack_backward_layer *layers, void *grad_input,
                             void *workspace, const int64_t *lengths, lltm_gemm gemm,
                             void *gemm_ctx, void *stream)
{
    if (!plan_matches(plan, B, H) || lltm_seq::bad_sizes(T, B, I, H) || T < 1 || B < 1 ||
        !layers || !gemm || !workspace || (I > 0 && !input))
        return LLTM_ERR_ARGUMENT;
    const int L = plan->layers;
    const size_t elem = elem_bytes(plan->dtype);
    /* the recurrence's arrays: dG and the unwanted gradients' places in the
     * workspace (lltm_stack_backward_workspace_cuda's order) */
    lltm_stack_backward_layer local[LLTM_STACK_MAX_LAYERS] = {};
    char *at = (char *)workspace + round_up(plan->workspace_bytes);
    for (int l = 0; l < L; ++l) {
        const lltm_stack_backward_layer &y = layers[l];
        if (!y.h0 || !y.output)
            return LLTM_ERR_ARGUMENT;
        local[l] = y;
        local[l].grad_gates = at;
        at += round_up((size_t)(T * B * 3 * H) * elem);
        if (!y.grad_h0)
            local[l].grad_h0 = at;
        at += round_up((size_t)(B * H) * elem);
        if (!y.grad_c0)
            local[l].grad_c0 = at;
        at += round_up((size_t)(B * H) * elem);
        if (!y.grad_bias)
            local[l].grad_bias = at;
        at += round_up((size_t)(3 * H) * elem);
    }
    void *hx = at;
    int status = lltm_stack_backward_persistent_cuda(plan, T, B, I, H, grad_output, local,
                                                     plan->workspace_bytes ? workspace : NULL,
                                                     lengths, stream);
    for (int l = 0; l < L && status == LLTM_OK; ++l) {
        const lltm_stack_backward_layer &y = local[l];
        status = lltm_seq::weight_grads(plan->dtype, T, B, l == 0 ? I : H, H, y.grad_gates, y.h0,
                                        y.output, l == 0 ? input : local[l - 1].output,
                                        y.weights, hx, y.grad_weights,
                                        l == 0 ? grad_input : NULL, gemm, gemm_ctx, stream);
    }
    return status;
}

} /* extern "C" */
