/*
 * lltm_cuda_seq_stack.cu - stacked layers in one launch a direction
 * (lltm_stack.h): the plan (layout, batch groups by the occupancy of both
 * kernels, workspace) and the launches, checked against the plan and handed
 * to the unit of their dtype (lltm_cuda_seq_stack_<dtype>.cu; the kernels:
 * lltm_cuda_sequence_stack.cuh).
 */
#include "lltm_stack.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "lltm_cuda_sequence_stack.cuh"

namespace {

using lltm_seq::NT;

constexpr int STACK_CHUNK = 4; /* rows a chunk: the small batches the stack is for */

bool half_type(lltm_dtype dtype) { return dtype == LLTM_FLOAT16 || dtype == LLTM_BFLOAT16; }

const void *stack_kernel_for(lltm_dtype dtype, bool forward, int lanes, int values, int layers)
{
    switch (dtype) {
    case LLTM_FLOAT32:
        return lltm_seq::stack_kernel<float>(forward, lanes, values, layers);
    case LLTM_FLOAT16:
        return lltm_seq::stack_kernel<__half>(forward, lanes, values, layers);
    case LLTM_BFLOAT16:
        return lltm_seq::stack_kernel<__nv_bfloat16>(forward, lanes, values, layers);
    default:
        return NULL;
    }
}

/* blocks of `kernel` resident at once on `dev` (0: none, or unknown) */
int64_t resident_blocks(const void *kernel, size_t smem, const lltm_cuda_device &dev)
{
    if (!kernel || !dev.cooperative_launch || smem > (size_t)dev.smem_optin)
        return 0;
    if (smem > 48 * 1024 &&
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) !=
            cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    int per_sm = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, NT, smem) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return (int64_t)per_sm * dev.sm_count;
}

bool plan_matches(const lltm_stack_plan *plan, int64_t B, int64_t H)
{
    return plan && plan->layers >= 2 && plan->layers <= LLTM_STACK_MAX_LAYERS && plan->B == B &&
           plan->H == H;
}

/* the workspace regions: per layer the float state (half types), then the
 * groups' bias sums [groups, L, G] */
constexpr size_t ALIGN = 256;
size_t round_up(size_t bytes) { return (bytes + ALIGN - 1) / ALIGN * ALIGN; }
size_t state_bytes(lltm_dtype dtype, int64_t B, int64_t H)
{
    return half_type(dtype) ? round_up((size_t)(7 * B * H) * sizeof(float)) : 0;
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
        if (state) {
            if (!workspace)
                return LLTM_ERR_ARGUMENT;
            a.h_work[l] = (float *)((char *)workspace + l * state);
            a.c_work[l] = a.h_work[l] + 2 * B * H;
        }
    }
    return lltm_seq::stack_forward<T>(p.forward, p.layers, a, stream);
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
    return lltm_seq::stack_backward<T>(p.backward, p.layers, a, stream);
}

} // namespace

extern "C" {

int lltm_stack_plan_cuda(const lltm_cuda_device *dev, lltm_dtype dtype, int layers, int64_t T,
                         int64_t B, int64_t I, int64_t H, lltm_stack_plan *plan)
{
    if (!dev || !plan || lltm_seq::bad_sizes(T, B, I, H))
        return LLTM_ERR_ARGUMENT;
    *plan = lltm_stack_plan{};
    if (layers < 2 || layers > LLTM_STACK_MAX_LAYERS || T * B == 0 || H < 1 || H > 256 ||
        !dev->cooperative_launch)
        return LLTM_ERR_ARGUMENT;
    const int lanes = 32, values = H <= 128 ? 4 : 8, U = NT / lanes;
    const size_t fsmem = lltm_seq::stack_forward_smem(lanes, values, STACK_CHUNK, layers);
    const size_t bsmem = lltm_seq::stack_backward_smem(lanes, values, STACK_CHUNK, layers);
    const int64_t fits_f =
        resident_blocks(stack_kernel_for(dtype, true, lanes, values, layers), fsmem, *dev);
    const int64_t fits_b =
        resident_blocks(stack_kernel_for(dtype, false, lanes, values, layers), bsmem, *dev);
    const int64_t unit_blocks = (H + U - 1) / U, chunks = (B + STACK_CHUNK - 1) / STACK_CHUNK;
    int64_t groups = (fits_f < fits_b ? fits_f : fits_b) / unit_blocks;
    groups = groups < chunks ? groups : chunks;
    if (groups < 1)
        return LLTM_ERR_ARGUMENT;
    lltm_sequence_launch l = {};
    l.lanes = lanes, l.values = values, l.rows = STACK_CHUNK, l.chunk = STACK_CHUNK;
    l.exchange = LLTM_SEQ_EXCHANGE_GLOBAL, l.blocks = unit_blocks, l.groups = groups;
    plan->dtype = dtype, plan->layers = layers, plan->B = B, plan->H = H;
    plan->forward = l, plan->forward.smem = fsmem;
    plan->backward = l, plan->backward.smem = bsmem;
    plan->workspace_bytes =
        layers * state_bytes(dtype, B, H) +
        (groups > 1 ? round_up((size_t)(groups * layers * 3 * H) * sizeof(float)) : 0);
    return LLTM_OK;
}

int lltm_stack_forward_persistent_cuda(const lltm_stack_plan *plan, int64_t T, int64_t B,
                                       int64_t I, int64_t H,
                                       const lltm_stack_forward_layer *layers, void *workspace,
                                       const int64_t *lengths, void *stream)
{
    if (lltm_seq::bad_sizes(T, B, I, H) || T < 1 || B < 1 || !layers || !plan_matches(plan, B, H))
        return LLTM_ERR_ARGUMENT;
    const cudaStream_t s = (cudaStream_t)stream;
    switch (plan->dtype) {
    case LLTM_FLOAT32:
        return forward_call<float>(*plan, T, B, I, H, layers, workspace, lengths, s);
    case LLTM_FLOAT16:
        return forward_call<__half>(*plan, T, B, I, H, layers, workspace, lengths, s);
    case LLTM_BFLOAT16:
        return forward_call<__nv_bfloat16>(*plan, T, B, I, H, layers, workspace, lengths, s);
    default:
        return LLTM_ERR_DTYPE;
    }
}

int lltm_stack_backward_persistent_cuda(const lltm_stack_plan *plan, int64_t T, int64_t B,
                                        int64_t I, int64_t H, const void *grad_output,
                                        const lltm_stack_backward_layer *layers,
                                        void *workspace, const int64_t *lengths, void *stream)
{
    if (lltm_seq::bad_sizes(T, B, I, H) || T < 1 || B < 1 || !layers || !plan_matches(plan, B, H))
        return LLTM_ERR_ARGUMENT;
    const cudaStream_t s = (cudaStream_t)stream;
    switch (plan->dtype) {
    case LLTM_FLOAT32:
        return backward_call<float>(*plan, T, B, I, H, grad_output, layers, workspace, lengths, s);
    case LLTM_FLOAT16:
        return backward_call<__half>(*plan, T, B, I, H, grad_output, layers, workspace, lengths,
                                     s);
    case LLTM_BFLOAT16:
        return backward_call<__nv_bfloat16>(*plan, T, B, I, H, grad_output, layers, workspace,
                                            lengths, s);
    default:
        return LLTM_ERR_DTYPE;
    }
}

} /* extern "C" */
