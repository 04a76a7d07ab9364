/*
 * lltm_cuda_sequence_stack_launch.cuh - the launchers of the stacked
 * layers' kernels (lltm_cuda_sequence_stack.cuh): their layouts, shared
 * memory and cooperative launches, for one dtype; each
 * lltm_cuda_seq_stack_<dtype>.cu instantiates them (LLTM_SEQ_STACK_INSTANCES).
 */
#ifndef LLTM_CORE_CUDA_SEQUENCE_STACK_LAUNCH_CUH
#define LLTM_CORE_CUDA_SEQUENCE_STACK_LAUNCH_CUH

#include "lltm_cuda_sequence_stack.cuh"

namespace lltm_seq {

/* Dynamic shared memory of the stack's kernels: FFMA (float state), or
 * tensor cores (mma: bytes of a staged value, 0 for none) for the
 * layouts that exist there only (stack_mma_only), else the larger of the
 * two (a half type's binary forms its products on tensor cores on sm_80+
 * only). */
inline size_t stack_forward_smem(int ks, int kr, int ch, int layers, size_t mma)
{
    const size_t ffma = (size_t)(2 * layers - 1) * ch * ks * kr * sizeof(float);
    const int parts = mma_parts_ld(NT / ks * 3, mma_parts_bank(true, ks));
    const size_t tiles =
        (2 * layers - 1) * mma_tile_bytes(ks * kr, mma) + layers * mma_parts_bytes(ch, parts);
    return !mma ? ffma : stack_mma_only(ks, kr, ch) ? tiles : max_size(ffma, tiles);
}
inline size_t stack_backward_smem(int ks, int kr, int ch, int layers, size_t mma)
{
    const int U = NT / ks;
    const size_t sums = (size_t)layers * ch * (ks * 3 * kr + ks * U + U);
    const size_t bias = (size_t)layers * 3 * ch * U;
    const size_t ffma = max_size(sums, bias) * sizeof(float);
    const int parts = mma_parts_ld(U, mma_parts_bank(false, ks));
    const size_t tiles = max_size(
        layers * (mma_tile_bytes(3 * ks * kr, mma) + mma_parts_bytes(ch, parts)),
        bias * sizeof(float));
    return !mma ? ffma : stack_mma_only(ks, kr, ch) ? tiles : max_size(ffma, tiles);
}

} // namespace lltm_seq

namespace {

/* The layouts of the stack (lanes x values, rows a chunk) for L = 2, 3:
 * 32 lanes a unit in 4-row chunks on FFMA (and tensor cores); on tensor
 * cores only, 16 lanes a unit in 4- and 16-row chunks */
#define LLTM_SEQ_STACK_CASES(X)                                                              \
    X(32, 8, 4, 2)                                                                           \
    X(32, 8, 4, 3)                                                                           \
    X(32, 4, 4, 2)                                                                           \
    X(32, 4, 4, 3)                                                                           \
    X(16, 8, 4, 2)                                                                           \
    X(16, 8, 4, 3)                                                                           \
    X(16, 8, 16, 2)                                                                          \
    X(16, 8, 16, 3)                                                                          \
    X(16, 16, 4, 2)                                                                          \
    X(16, 16, 4, 3)                                                                          \
    X(16, 16, 16, 2)                                                                         \
    X(16, 16, 16, 3)

/* whether T has the layout's kernels: float32 (no tensor-core build of the
 * stack) not those of tensor cores only */
template <typename T> constexpr bool stack_layout_of(int ks, int kr, int ch)
{
    return !(std::is_same<T, float>::value && lltm_seq::stack_mma_only(ks, kr, ch));
}

/* one cooperative launch of `kernel` for `l` (its blocks x groups resident
 * at once: the plan's) */
template <typename Args>
int stack_launch(void (*kernel)(Args), const lltm_sequence_launch &l, const Args &a,
                 cudaStream_t stream)
{
    const int status = allow_smem((const void *)kernel, l.smem);
    return status != LLTM_OK
               ? status
               : launch_status(launch_cooperative(kernel, l.blocks * l.groups, l.smem, stream, a));
}

} // namespace

/* The exported functions of one dtype's unit: the kernel lookup (for the
 * chooser's occupancy queries; NULL: no such layout) and the launch of the
 * forward (Args: stack_forward_args<T>) or backward kernel of l's layout for
 * `layers` layers (LLTM_ERR_ARGUMENT for a layout the library has no kernel
 * of). Each lltm_cuda_seq_stack_<dtype>.cu instantiates them
 * (LLTM_SEQ_STACK_INSTANCES(, T)); the others see them extern. */
namespace lltm_seq {
template <typename T>
const void *stack_kernel(bool forward, int lanes, int values, int chunk, int layers);
template <typename T, typename Args>
int stack_run(const lltm_sequence_launch &l, int layers, const Args &a, cudaStream_t stream);
} // namespace lltm_seq

#define LLTM_SEQ_STACK_INSTANCES(EXTERN, T)                                                  \
    EXTERN template const void *lltm_seq::stack_kernel<T>(bool, int, int, int, int);         \
    EXTERN template int lltm_seq::stack_run<T>(const lltm_sequence_launch &, int,            \
                                               const lltm_seq::stack_forward_args<T> &,      \
                                               cudaStream_t);                                \
    EXTERN template int lltm_seq::stack_run<T>(const lltm_sequence_launch &, int,            \
                                               const lltm_seq::stack_backward_args<T> &,     \
                                               cudaStream_t);
LLTM_SEQ_STACK_INSTANCES(extern, float)
LLTM_SEQ_STACK_INSTANCES(extern, __half)
LLTM_SEQ_STACK_INSTANCES(extern, __nv_bfloat16)

template <typename T>
const void *lltm_seq::stack_kernel(bool forward, int lanes, int values, int chunk, int layers)
{
#define LLTM_SEQ_STACK_CASE(KS, KR, CH, LL)                                                  \
    if constexpr (stack_layout_of<T>(KS, KR, CH))                                            \
        if (lanes == KS && values == KR && chunk == CH && layers == LL)                      \
            return forward ? (const void *)stack_forward_kernel<T, KS, KR, CH, LL>           \
                           : (const void *)stack_backward_kernel<T, KS, KR, CH, LL>;
    LLTM_SEQ_STACK_CASES(LLTM_SEQ_STACK_CASE)
#undef LLTM_SEQ_STACK_CASE
    return NULL;
}

template <typename T, typename Args>
int lltm_seq::stack_run(const lltm_sequence_launch &l, int layers, const Args &a,
                        cudaStream_t stream)
{
    constexpr bool forward = std::is_same<Args, lltm_seq::stack_forward_args<T>>::value;
    if (l.groups < 1 || l.blocks < 1)
        return LLTM_ERR_ARGUMENT;
#define LLTM_SEQ_STACK_CASE(KS, KR, CH, LL)                                                  \
    if constexpr (stack_layout_of<T>(KS, KR, CH))                                            \
        if (l.lanes == KS && l.values == KR && l.chunk == CH && layers == LL) {              \
            if constexpr (forward)                                                           \
                return stack_launch(stack_forward_kernel<T, KS, KR, CH, LL>, l, a, stream);  \
            else                                                                             \
                return stack_launch(stack_backward_kernel<T, KS, KR, CH, LL>, l, a, stream); \
        }
    LLTM_SEQ_STACK_CASES(LLTM_SEQ_STACK_CASE)
#undef LLTM_SEQ_STACK_CASE
    return LLTM_ERR_ARGUMENT;
}

#endif /* LLTM_CORE_CUDA_SEQUENCE_STACK_LAUNCH_CUH */
