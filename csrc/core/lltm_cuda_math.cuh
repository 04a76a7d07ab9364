/*
 * lltm_cuda_math.cuh - the device-side element math shared by the CUDA
 * kernels (the cell's and the sequence's): element types and their
 * accumulation type, the activations, one step's backward for one (row,
 * unit), and the fixed-order sum of a bias gradient's pieces. The CUDA twin
 * of lltm_cpu_math.h.
 *
 * Precision: float and double compute in their own type (double math
 * functions for double, never a float detour); __half and __nv_bfloat16
 * load into float, compute and accumulate in float, round once when stored.
 */
#ifndef LLTM_CORE_CUDA_MATH_CUH
#define LLTM_CORE_CUDA_MATH_CUH

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <stdint.h>

namespace {

template <typename T> struct acc_of { typedef float type; };
template <> struct acc_of<double> { typedef double type; };

__device__ __forceinline__ float to_acc(float x) { return x; }
__device__ __forceinline__ double to_acc(double x) { return x; }
__device__ __forceinline__ float to_acc(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_acc(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_acc(typename acc_of<T>::type x);
template <> __device__ __forceinline__ float from_acc<float>(float x) { return x; }
template <> __device__ __forceinline__ double from_acc<double>(double x) { return x; }
template <> __device__ __forceinline__ __half from_acc<__half>(float x)
{
    return __float2half_rn(x);
}
template <> __device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float x)
{
    return __float2bfloat16_rn(x);
}

/* Three values into the gate blocks of a [.,3H] row (columns u, H + u,
 * 2H + u), each rounded to T */
template <typename T, typename A>
__device__ __forceinline__ void store_gates(T *row, int64_t H, int64_t u, A g0, A g1, A g2)
{
    row[u] = from_acc<T>(g0);
    row[H + u] = from_acc<T>(g1);
    row[2 * H + u] = from_acc<T>(g2);
}

__device__ __forceinline__ float sigmoid_(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ double sigmoid_(double x) { return 1.0 / (1.0 + exp(-x)); }
/* elu without a branch on the sign (the same values): see forward_step_math */
__device__ __forceinline__ float elu_(float x)
{
    const float e = expm1f(fminf(x, 0.0f));
    return x > 0.0f ? x : e;
}
__device__ __forceinline__ double elu_(double x) { return x > 0.0 ? x : expm1(x); }
/* The sigmoid of the sequence's steps (forward_step_math): in float the
 * reciprocal of 1 + e^-x (in [1, inf]) by MUFU.RCP, 2 ulp at most, with no
 * branch (an IEEE division branches to a slow path past a range check). A
 * recurrent kernel's step waits on this math in one thread; branch-free, one
 * thread's three gates interleave. */
__device__ __forceinline__ float step_sigmoid_(float x)
{
    return __fdividef(1.0f, 1.0f + expf(-x));
}
__device__ __forceinline__ double step_sigmoid_(double x) { return sigmoid_(x); }
__device__ __forceinline__ float tanh_(float x) { return tanhf(x); }
__device__ __forceinline__ double tanh_(double x) { return tanh(x); }

/* Backward of one (row, unit): from the activations i, o, z, the new cell c,
 * dL/dh and dL/dc of the step, the pre-activation gradients d[0..2] and
 * dL/dc_prev (= dL/dc total, since c = c_prev + i z). */
template <typename A>
__device__ __forceinline__ void backward_math(A i, A o, A z, A c, A dh, A dc_in, A d[3],
                                              A *dc_out)
{
    const A one = 1;
    const A tc = tanh_(c);
    const A dc = dc_in + dh * o * (one - tc * tc);
    const A d_elu = z > A(0) ? one : z + one; /* elu'(x) = exp(x) = z + 1 for x <= 0 */
    d[0] = dc * z * i * (one - i);
    d[1] = dh * tc * o * (one - o);
    d[2] = dc * i * d_elu;
    *dc_out = dc;
}

/* The same for a (row, unit) at a step that may lie past its row's length
 * (live false): no gate gradient, dL/dc passes through unchanged. */
template <typename A>
__device__ __forceinline__ void backward_step_math(bool live, A i, A o, A z, A c, A dh, A dc_in,
                                                   A d[3], A *dc_out)
{
    A g[3], dc;
    backward_math<A>(i, o, z, c, dh, dc_in, g, &dc); /* selected, not branched around */
    d[0] = live ? g[0] : A(0);
    d[1] = live ? g[1] : A(0);
    d[2] = live ? g[2] : A(0);
    *dc_out = live ? dc : dc_in;
}

/* Forward of one (row, unit) from its pre-activations and c_{t-1}: the
 * activations, c_t and h_t; past the row's length (live false) gates 0,
 * c_t = c_{t-1} and h_t = 0 (the state stays where the row ended). */
template <typename A>
__device__ __forceinline__ void forward_step_math(bool live, A g_i, A g_o, A g_z, A c_prev,
                                                  A *i, A *o, A *z, A *c, A *h)
{
    /* computed for every row, then selected: no branch around the math */
    const A si = step_sigmoid_(g_i), so = step_sigmoid_(g_o), ez = elu_(g_z);
    const A cn = c_prev + si * ez;
    const A hn = tanh_(cn) * so;
    *i = live ? si : A(0);
    *o = live ? so : A(0);
    *z = live ? ez : A(0);
    *c = live ? cn : c_prev;
    *h = live ? hn : A(0);
}

/* Steps of batch row b: lengths[b] (device memory), or `steps` without
 * lengths (NULL). */
__device__ __forceinline__ int64_t row_steps(const int64_t *__restrict__ lengths, int64_t b,
                                             int64_t steps)
{
    return lengths ? __ldg(lengths + b) : steps;
}

/* The last step of batch row b: row_steps clamped into [1, steps], less one
 * (where h_n takes the row's h; lengths outside [1, T] clamped, as
 * lltm_sequence_last_state_cuda documents). */
__device__ __forceinline__ int64_t row_last_step(const int64_t *__restrict__ lengths, int64_t b,
                                                 int64_t steps)
{
    const int64_t end = row_steps(lengths, b, steps);
    return (end < 1 ? 1 : end > steps ? steps : end) - 1;
}

/* Steps of the longest of batch rows b0 .. b0+n-1 (those below B): past
 * them a chunk of rows has no product to form. The same for every thread
 * that passes the same b0, so a block may branch on it. */
__device__ __forceinline__ int64_t chunk_steps(const int64_t *__restrict__ lengths, int64_t b0,
                                               int n, int64_t B, int64_t steps)
{
    if (!lengths)
        return steps;
    int64_t longest = 0;
    for (int k = 0; k < n && b0 + k < B; ++k) {
        const int64_t l = __ldg(lengths + b0 + k);
        longest = l > longest ? l : longest;
    }
    return longest;
}

/* The steps of a block's first two chunks of rows (chunk j starts at row
 * first_row + j*row_step), read once before the time loop: they do not
 * change with t, and read at each step their latency lies on the step's path
 * (a chunk's staging waits for them). Later chunks read theirs each step.
 * chunk: chunk_steps of the whole chunk; row: row_steps of the chunk's row
 * `r` (past B: 0). */
struct block_steps {
    int64_t chunk0, chunk1, row0, row1;
    __device__ block_steps() : chunk0(0), chunk1(0), row0(0), row1(0) {}
    __device__ block_steps(const int64_t *__restrict__ lengths, int64_t first_row,
                           int64_t row_step, int n, int r, int64_t B, int64_t steps)
        : chunk0(chunk_steps(lengths, first_row, n, B, steps)),
          chunk1(chunk_steps(lengths, first_row + row_step, n, B, steps)),
          row0(first_row + r < B ? row_steps(lengths, first_row + r, steps) : 0),
          row1(first_row + row_step + r < B ? row_steps(lengths, first_row + row_step + r, steps)
                                            : 0)
    {
    }
    /* chunk j of the block, starting at row b0 */
    __device__ int64_t chunk(const int64_t *__restrict__ lengths, int64_t j, int64_t b0, int n,
                             int64_t B, int64_t steps) const
    {
        return j == 0 ? chunk0 : j == 1 ? chunk1 : chunk_steps(lengths, b0, n, B, steps);
    }
    /* row b = b0 + r of chunk j (b < B) */
    __device__ int64_t row(const int64_t *__restrict__ lengths, int64_t j, int64_t b,
                           int64_t steps) const
    {
        return j == 0 ? row0 : j == 1 ? row1 : row_steps(lengths, b, steps);
    }
};

/* grad_bias [G] (dtype) = the sum of the lines of parts [lines, G]
 * (accumulation type), in line order: the fixed-order last stage of a bias
 * gradient that blocks sum in pieces (the cell's pointwise backward over row
 * chunks, the per-step kernels' backward). */
template <typename T>
__global__ void bias_sum_kernel(int64_t lines, int64_t G,
                                const typename acc_of<T>::type *__restrict__ parts,
                                T *__restrict__ grad_bias)
{
    typedef typename acc_of<T>::type A;
    for (int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; g < G;
         g += (int64_t)gridDim.x * blockDim.x) {
        A total = 0;
        for (int64_t p = 0; p < lines; ++p)
            total += parts[p * G + g];
        grad_bias[g] = from_acc<T>(total);
    }
}

} // namespace

/* One switch per C launcher: the lltm_dtype picks the element type T for
 * CALL (needs lltm.h); an unknown dtype returns `otherwise`
 * (LLTM_DISPATCH: LLTM_ERR_DTYPE). */
#define LLTM_DISPATCH_OR(dtype, CALL, otherwise)                                             \
    switch (dtype) {                                                                         \
    case LLTM_FLOAT32: { typedef float T; return CALL; }                                     \
    case LLTM_FLOAT64: { typedef double T; return CALL; }                                    \
    case LLTM_FLOAT16: { typedef __half T; return CALL; }                                    \
    case LLTM_BFLOAT16: { typedef __nv_bfloat16 T; return CALL; }                            \
    }                                                                                        \
    return otherwise
#define LLTM_DISPATCH(dtype, CALL) LLTM_DISPATCH_OR(dtype, CALL, LLTM_ERR_DTYPE)

#endif /* LLTM_CORE_CUDA_MATH_CUH */
