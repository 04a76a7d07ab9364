/*
 * lltm_cuda_sequence_grid_launch.cuh - the launchers of the grid kernels
 * (lltm_cuda_sequence_grid.cuh) for one dtype: a cooperative launch of the
 * plan's layout and chunk rows, the layouts the library instantiates, and
 * the exported functions of one dtype's unit (lltm_cuda_seq_grid_<dtype>.cu
 * instantiates them: LLTM_SEQ_GRID_UNIT).
 */
#ifndef LLTM_CORE_CUDA_SEQUENCE_GRID_LAUNCH_CUH
#define LLTM_CORE_CUDA_SEQUENCE_GRID_LAUNCH_CUH

#include "lltm_cuda_sequence_grid.cuh"

namespace {

/* bytes of a value the kernel stages for tensor cores (grid_mma_bytes) */
template <typename T, bool TF32> constexpr size_t mma_bytes()
{
    return sizeof(T) == 2 ? 2 : std::is_same<T, float>::value && TF32 ? 4 : 0;
}

/* One grid launch of a layout and build: the forward or the backward (by
 * the args' type) */
template <typename T, int KS, int KR, int CH, bool TF32>
int run_grid(const lltm_sequence_launch &l, const lltm_seq::forward_args &a, cudaStream_t stream)
{
    typedef typename acc_of<T>::type A;
    auto kernel = sequence_forward_kernel<T, KS, KR, CH, TF32>;
    const size_t smem =
        lltm_seq::grid_forward_smem(sizeof(A), mma_bytes<T, TF32>(), KS, KR, CH);
    if (l.blocks != ceil_div(a.H, NT / KS) || l.groups < 1)
        return LLTM_ERR_ARGUMENT;
    const int status = allow_smem((const void *)kernel, smem);
    if (status != LLTM_OK)
        return status;
    A *h_work = NULL, *c_work = NULL;
    if (!std::is_same<T, A>::value) {
        if (!a.workspace)
            return LLTM_ERR_ARGUMENT;
        h_work = (A *)a.workspace;
        c_work = h_work + 2 * a.B * a.H;
    }
    return launch_status(launch_cooperative(
        kernel, l.blocks * l.groups, smem, stream, a.steps, a.B, a.H, a.I + a.H,
        (const T *)a.h0, (const T *)a.c0, (const T *)a.weights, (const T *)a.bias, (T *)a.gates,
        (T *)a.output, (T *)a.cells, h_work, c_work, a.lengths, (T *)a.h_n, (T *)a.c_n));
}

template <typename T, int KS, int KR, int CH, bool TF32>
int run_grid(const lltm_sequence_launch &l, const lltm_seq::backward_args &a, cudaStream_t stream)
{
    typedef typename acc_of<T>::type A;
    auto kernel = sequence_backward_kernel<T, KS, KR, CH, TF32>;
    const size_t smem =
        lltm_seq::grid_backward_smem(sizeof(A), mma_bytes<T, TF32>(), KS, KR, CH);
    if (l.blocks != ceil_div(a.H, NT / KS) || l.groups < 1)
        return LLTM_ERR_ARGUMENT;
    const int status = allow_smem((const void *)kernel, smem);
    if (status != LLTM_OK)
        return status;
    A *dg_work = NULL, *dc_work = NULL, *bias_work = NULL;
    if (!std::is_same<T, A>::value) {
        if (!a.workspace)
            return LLTM_ERR_ARGUMENT;
        dg_work = (A *)a.workspace;
        dc_work = dg_work + 2 * a.B * 3 * a.H;
    }
    const int work_status = bias_groups_work<T>(a, l.groups, &bias_work);
    if (work_status != LLTM_OK)
        return work_status;
    return launch_status(launch_cooperative(
        kernel, l.blocks * l.groups, smem, stream, a.steps, a.B, a.H, a.I + a.H,
        (const T *)a.grad_output, (const T *)a.grad_h_n, (const T *)a.grad_c_n,
        (const T *)a.weights, (const T *)a.cells, (const T *)a.gates, (T *)a.grad_gates,
        (T *)a.grad_bias, (T *)a.grad_h0, (T *)a.grad_c0, dg_work, dc_work, bias_work,
        a.lengths));
}

/* The layouts of the library (lanes x values; float64: not those of 32
 * values a lane, whose doubles of W_h would take 192 registers a thread;
 * those of 64 the half types' only, on tensor cores:
 * lltm_seq::grid_mma_only), each in chunks of 16 rows and of 4, and what the
 * chooser picks them for: see lltm.h, lltm_sequence_plan_cuda. float32's in 16-row
 * chunks come in two builds, FFMA and TF32 (lltm_sequence_launch.tf32);
 * the others in one (TF32 false). */
#define LLTM_SEQ_GRID_LAYOUTS(X)                                                             \
    X(16, 8, 16)                                                                             \
    X(16, 8, 4)                                                                              \
    X(32, 16, 16)                                                                            \
    X(32, 16, 4)                                                                             \
    if constexpr (!std::is_same<T, double>::value) {                                         \
        X(32, 32, 16)                                                                        \
        X(32, 32, 4)                                                                         \
        X(16, 32, 16)                                                                        \
        X(16, 32, 4)                                                                         \
    }                                                                                        \
    if constexpr (sizeof(T) == 2) {                                                          \
        X(8, 64, 16)                                                                         \
        X(8, 64, 4)                                                                          \
        X(16, 64, 16)                                                                        \
        X(16, 64, 4)                                                                         \
    }

/* Either build of a layout: TF32 for float32 in 16-row chunks where asked
 * (tf32; in 4-row chunks the TF32 tile of 16 rows lost to FFMA on 4) */
#define LLTM_SEQ_GRID_BUILDS(KS, KR, CH, tf32, CALL)                                         \
    if constexpr (std::is_same<T, float>::value && CH == BC) {                               \
        if (tf32)                                                                            \
            return CALL(KS, KR, CH, true);                                                   \
    }                                                                                        \
    return CALL(KS, KR, CH, false);

} // namespace

/* The unit's functions (lltm_cuda_sequence.cuh) */
template <typename T>
const void *lltm_seq::grid_kernel(bool forward, int lanes, int values, int chunk, bool tf32)
{
#define LLTM_SEQ_GRID_KERNEL(KS, KR, CH, TF)                                                 \
    forward ? (const void *)sequence_forward_kernel<T, KS, KR, CH, TF>                       \
            : (const void *)sequence_backward_kernel<T, KS, KR, CH, TF>
#define LLTM_SEQ_GRID_CASE(KS, KR, CH)                                                       \
    if (lanes == KS && values == KR && chunk == CH) {                                        \
        LLTM_SEQ_GRID_BUILDS(KS, KR, CH, tf32, LLTM_SEQ_GRID_KERNEL)                         \
    }
    LLTM_SEQ_GRID_LAYOUTS(LLTM_SEQ_GRID_CASE)
#undef LLTM_SEQ_GRID_CASE
#undef LLTM_SEQ_GRID_KERNEL
    return NULL;
}

/* run_grid of the launch's layout and build (Args: forward_args or
 * backward_args) */
template <typename T, typename Args>
int lltm_seq::grid_run(const lltm_sequence_launch &l, const Args &a, cudaStream_t stream)
{
#define LLTM_SEQ_GRID_RUN(KS, KR, CH, TF) run_grid<T, KS, KR, CH, TF>(l, a, stream)
#define LLTM_SEQ_GRID_CASE(KS, KR, CH)                                                       \
    if (l.lanes == KS && l.values == KR && l.chunk == CH) {                                  \
        LLTM_SEQ_GRID_BUILDS(KS, KR, CH, l.tf32, LLTM_SEQ_GRID_RUN)                          \
    }
    LLTM_SEQ_GRID_LAYOUTS(LLTM_SEQ_GRID_CASE)
#undef LLTM_SEQ_GRID_CASE
#undef LLTM_SEQ_GRID_RUN
    return LLTM_ERR_ARGUMENT;
}

#undef LLTM_SEQ_GRID_BUILDS

#define LLTM_SEQ_GRID_UNIT(T)                                                                \
    template const void *lltm_seq::grid_kernel<T>(bool, int, int, int, bool);                \
    template int lltm_seq::grid_run<T>(const lltm_sequence_launch &,                         \
                                       const lltm_seq::forward_args &, cudaStream_t);        \
    template int lltm_seq::grid_run<T>(const lltm_sequence_launch &,                         \
                                       const lltm_seq::backward_args &, cudaStream_t);

#endif /* LLTM_CORE_CUDA_SEQUENCE_GRID_LAUNCH_CUH */
