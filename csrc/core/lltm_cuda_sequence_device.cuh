/*
 * lltm_cuda_sequence_device.cuh - the device helpers that the persistent
 * sequence kernels share (grid: lltm_cuda_sequence_grid.cuh; cluster:
 * lltm_cuda_sequence_cluster_forward.cuh, _cluster_backward.cuh): block and
 * chunk sizes, the warp-shuffle row reduction, staging of state rows into
 * shared memory, the per-unit weight registers, the cluster's tile sends,
 * and the sum of the batch groups' bias gradients.
 *
 * How the persistent kernels work. The grid stays resident for all T steps;
 * block n owns hidden units [n*U, (n+1)*U) and keeps, in registers, the
 * recurrent weights W_h that its units need:
 *   forward   rows i/o/z of its units ([3U, H] of W_h): g = h_{t-1} W_h^T
 *   backward  columns of its units ([3H, U] of W_h):   dh = dG_{t+1} W_h
 * Each step a block forms its dot products over h_{t-1} (or dG_{t+1}) held
 * in shared memory, 16 batch rows at a time (KS lanes of a warp split one
 * unit's k range; their partial sums meet by warp shuffles, which also leave
 * each lane holding exactly one batch row of the unit), finishes the step's
 * pointwise math in that lane, and the blocks exchange the new state:
 *   - cluster kernels (sm_90+): the grid is one thread-block cluster (or one
 *     cluster per batch group); each block sends its units' new state
 *     straight into the shared memory of every block of its cluster
 *     (distributed shared memory, st.async in 16-byte pieces, double-
 *     buffered by step parity) and waits on its own transaction barrier
 *     until the whole state of the step has arrived. The state never goes
 *     through global memory.
 *   - grid kernels: a cooperative launch; each step a block writes its
 *     results to global memory, meets the others at grid.sync() and stages
 *     the state back from L2 into shared memory.
 * Which kernel runs with which layout is the plan's (lltm.h,
 * lltm_sequence_plan; chosen in lltm_cuda_sequence_plan.cu).
 *
 * Variable lengths (lengths [B] in device memory, or NULL): each kernel
 * reads row b's length where it loads the row's other step inputs and runs
 * the step's pointwise math through forward_step_math / backward_step_math
 * (lltm_cuda_math.cuh), which leave a row past its length unchanged (state
 * kept, h and gates 0; backward: dG 0, dL/dc passed on). Rows are
 * independent, so a stopped row's products (over its zero h, or its zero
 * dG) feed nothing but its own discarded values; the kernels' barriers and
 * exchanges stay uniform.
 *
 * Precision: float32 and float64 compute in their own type; float16 and
 * bfloat16 load, convert to float and accumulate in float, and the
 * persistent kernels carry the recurrent state (h, c, dG, dc) between steps
 * in float32 (workspaces, or shared memory in the cluster kernels). The grid
 * kernels of the half types on sm_80+ multiply h_{t-1} and dG_{t+1} as
 * stored in the half type (tensor cores, float sums; c and dc stay float).
 */
#ifndef LLTM_CORE_CUDA_SEQUENCE_DEVICE_CUH
#define LLTM_CORE_CUDA_SEQUENCE_DEVICE_CUH

#include "lltm.h"

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdint.h>

#include <type_traits>

#include "lltm_cuda_cluster.cuh"
#include "lltm_cuda_launch.cuh"
#include "lltm_cuda_math.cuh"
#include "lltm_cuda_sequence.cuh"

namespace cg = cooperative_groups;

namespace {

/* 16-byte shared-memory vectors of the accumulation type; component e is a
 * compile-time constant wherever the loops are unrolled. */
template <typename A> struct vec_of;
template <> struct vec_of<float> { typedef float4 type; static constexpr int n = 4; };
template <> struct vec_of<double> { typedef double2 type; static constexpr int n = 2; };
__device__ __forceinline__ float component(const float4 &v, int e)
{
    return e == 0 ? v.x : e == 1 ? v.y : e == 2 ? v.z : v.w;
}
__device__ __forceinline__ double component(const double2 &v, int e)
{
    return e == 0 ? v.x : v.y;
}

/* ------------------------------------------------- persistent kernels -- */

using lltm_seq::BC; /* batch rows per chunk (a power of two) */
using lltm_seq::NT; /* threads per block */

/*
 * Sum acc over the KS lanes that share a unit (aligned groups of KS lanes
 * of a warp) and leave each lane with the PER values of one batch row:
 * on entry acc[bb*PER + p] holds this lane's partial sums for its ROWS rows
 * (ROWS <= KS, both powers of two); on exit acc[0..PER) holds the full sums
 * of row (s & (ROWS-1)), s the lane's index in its group. Halving exchanges
 * (masks ROWS/2 .. 1) send away the half of the rows the partner keeps; the
 * remaining masks (KS/2 .. ROWS) add whole. Fixed order: the same bits for
 * the same inputs every run.
 */
template <int ROWS, int PER, int STAGE, typename A>
__device__ __forceinline__ void halve_rows(A (&acc)[ROWS * PER], int s)
{
    /* one template level per stage: every index below is a constant, so acc
     * stays in registers */
    if constexpr ((1 << STAGE) < ROWS) {
        constexpr int mask = ROWS >> (STAGE + 1);
        constexpr int half = (ROWS * PER) >> (STAGE + 1);
        const bool upper = (s & mask) != 0;
#pragma unroll
        for (int v = 0; v < half; ++v) {
            const A send = upper ? acc[v] : acc[v + half];
            const A keep = upper ? acc[v + half] : acc[v];
            acc[v] = keep + __shfl_xor_sync(0xffffffffu, send, mask);
        }
        halve_rows<ROWS, PER, STAGE + 1>(acc, s);
    }
}

template <int KS, int ROWS, int PER, typename A>
__device__ __forceinline__ void reduce_rows(A (&acc)[ROWS * PER], int s)
{
    static_assert(ROWS <= KS && (ROWS & (ROWS - 1)) == 0 && (KS & (KS - 1)) == 0, "lanes");
    halve_rows<ROWS, PER, 0>(acc, s);
#pragma unroll
    for (int mask = KS / 2; mask >= ROWS; mask /= 2)
#pragma unroll
        for (int p = 0; p < PER; ++p)
            acc[p] += __shfl_xor_sync(0xffffffffu, acc[p], mask);
}

/*
 * Stage rows [b0, b0+ROWS) x columns [0, ncols) of src (row-major, `nrows`
 * rows of ncols, accumulation type, written by other blocks: read through
 * L2 with __ldcg) into dst[ROWS][LD] in shared memory, zero beyond nrows and
 * ncols. The loads of a group are all issued before the first store, so a
 * group costs one L2 round trip, not one per element (16-byte vectors when
 * rows are 16-byte multiples). Call from every thread of the block.
 */
template <typename A, int LD, int ROWS = BC>
__device__ __forceinline__ void stage_rows(A *__restrict__ dst, const A *__restrict__ src,
                                           int64_t nrows, int64_t b0, int64_t ncols, int tid)
{
    typedef typename vec_of<A>::type V;
    constexpr int VEC = vec_of<A>::n, GROUP = 16;
    if (ncols % VEC == 0) {
        constexpr int ROW_V = LD / VEC, NV = ROWS * ROW_V, PER = (NV + NT - 1) / NT;
#pragma unroll 1 /* one group's registers at a time */
        for (int n0 = 0; n0 < PER; n0 += GROUP) {
            V v[GROUP];
#pragma unroll
            for (int n = 0; n < GROUP; ++n) {
                const int e = tid + (n0 + n) * NT;
                const int64_t row = b0 + e / ROW_V, k = (int64_t)(e % ROW_V) * VEC;
                v[n] = V{};
                if (n0 + n < PER && e < NV && row < nrows && k < ncols)
                    v[n] = __ldcg(reinterpret_cast<const V *>(src + row * ncols + k));
            }
#pragma unroll
            for (int n = 0; n < GROUP; ++n) {
                const int e = tid + (n0 + n) * NT;
                if (n0 + n < PER && e < NV)
                    reinterpret_cast<V *>(dst)[e] = v[n];
            }
        }
    } else {
        constexpr int NS = ROWS * LD, PER = (NS + NT - 1) / NT;
#pragma unroll 1
        for (int n0 = 0; n0 < PER; n0 += GROUP) {
            A v[GROUP];
#pragma unroll
            for (int n = 0; n < GROUP; ++n) {
                const int e = tid + (n0 + n) * NT;
                const int64_t row = b0 + e / LD, k = e % LD;
                v[n] = 0;
                if (n0 + n < PER && e < NS && row < nrows && k < ncols)
                    v[n] = __ldcg(src + row * ncols + k);
            }
#pragma unroll
            for (int n = 0; n < GROUP; ++n) {
                const int e = tid + (n0 + n) * NT;
                if (n0 + n < PER && e < NS)
                    dst[e] = v[n];
            }
        }
    }
}

__device__ __forceinline__ void step_barrier()
{
    cg::this_grid().sync(); /* fences device-wide */
}

/* Lane s's registers of unit u for the forward: w[q][*] = W_h[q*H + u, k]
 * for k = (kv*KS + s)*VEC + e (zero where k >= H or the unit is out of
 * range), and the unit's three biases. */
template <typename T, int KS, int KR>
__device__ __forceinline__ void
load_unit_rows(const T *__restrict__ weights, const T *__restrict__ bias, int64_t H, int64_t K,
               int64_t u, bool unit_ok, int s, typename acc_of<T>::type (&w)[3][KR],
               typename acc_of<T>::type &b_i, typename acc_of<T>::type &b_o,
               typename acc_of<T>::type &b_z)
{
    typedef typename acc_of<T>::type A;
    constexpr int VEC = vec_of<A>::n;
#pragma unroll
    for (int q = 0; q < 3; ++q)
#pragma unroll
        for (int kv = 0; kv < KR / VEC; ++kv)
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                const int64_t k = (int64_t)(kv * KS + s) * VEC + e;
                w[q][kv * VEC + e] =
                    (unit_ok && k < H) ? to_acc(weights[(q * H + u) * K + k]) : A(0);
            }
    b_i = unit_ok ? to_acc(bias[u]) : A(0);
    b_o = unit_ok ? to_acc(bias[H + u]) : A(0);
    b_z = unit_ok ? to_acc(bias[2 * H + u]) : A(0);
}

/* The forward step's projection x_t W_x^T of (t, b) for unit u, from gates
 * [T,B,3H] (the persistent kernels' input), in the accumulation type. No
 * __restrict__ here: the kernels write the activations over the same
 * tensor, and a read-only load path would not see them. */
template <typename T, typename A>
__device__ __forceinline__ void load_projection(const T *gates, int64_t B, int64_t H,
                                                int64_t t, int64_t b, int64_t u, A &p_i, A &p_o,
                                                A &p_z)
{
    const T *grow = gates + (t * B + b) * (3 * H);
    p_i = to_acc(grow[u]);
    p_o = to_acc(grow[H + u]);
    p_z = to_acc(grow[2 * H + u]);
}

/* The forward step's outputs of (t, b, u): the activations over the
 * projection in gates, c_t to cells, h_t to output ([T,B,H] each) */
template <typename T, typename A>
__device__ __forceinline__ void store_forward_outputs(T *gates, T *cells, T *output, int64_t B,
                                                      int64_t H, int64_t t, int64_t b, int64_t u,
                                                      A i, A o, A z, A c, A h)
{
    const int64_t BH = B * H;
    store_gates<T>(gates + (t * B + b) * (3 * H), H, u, i, o, z);
    cells[t * BH + b * H + u] = from_acc<T>(c);
    output[t * BH + b * H + u] = from_acc<T>(h);
}

/* The layer's final state of (b, u) as step t's outputs pass: h_n [B,H]
 * takes h at the row's last step (row_last_step), c_n [B,H] c at step
 * T - 1 (a row past its length keeps its state). NULL: not wanted. Written
 * by the recurrence itself, so that no copies follow it: the next time
 * chunk of a stacked layer starts from them. */
template <typename T, typename A>
__device__ __forceinline__ void store_final_state(T *h_n, T *c_n, const int64_t *lengths,
                                                  int64_t steps, int64_t H, int64_t t, int64_t b,
                                                  int64_t u, A c, A h)
{
    if (h_n && t == row_last_step(lengths, b, steps))
        h_n[b * H + u] = from_acc<T>(h);
    if (c_n && t + 1 == steps)
        c_n[b * H + u] = from_acc<T>(c);
}

/* The backward step's dL/dg of (t, b, u) to grad_gates [T,B,3H] */
template <typename T, typename A>
__device__ __forceinline__ void store_grad_gates(T *grad_gates, int64_t B, int64_t H,
                                                 int64_t t, int64_t b, int64_t u, const A (&d)[3])
{
    store_gates<T>(grad_gates + (t * B + b) * (3 * H), H, u, d[0], d[1], d[2]);
}

/* The backward step's inputs of (t, b, u) for the cluster kernels:
 * activations i, o, z, the cell, dL/dh from above, dL/dh_n (in[6]) at the
 * row's last step (lengths[b] - 1, or steps - 1 without lengths), dL/dc_n
 * (in[5]) at the last step, and in[7] = 1 where step t lies within the
 * row's length, else 0. Loads only, but for the row's length: nothing here
 * may use a loaded value, or the thread waits for the load here instead of
 * a step later (a predicated-off add waits on its operands too). */
template <typename T, typename A>
__device__ __forceinline__ void
load_backward_inputs(const T *__restrict__ gates, const T *__restrict__ cells,
                     const T *__restrict__ grad_output, const T *__restrict__ grad_h_n,
                     const T *__restrict__ grad_c_n, const int64_t *__restrict__ lengths,
                     int64_t steps, int64_t B, int64_t H, int64_t t, int64_t b, int64_t u,
                     A (&in)[8])
{
    const int64_t row_end = row_steps(lengths, b, steps);
    const T *arow = gates + (t * B + b) * 3 * H;
    const int64_t jj = (t * B + b) * H + u;
    in[0] = to_acc(arow[u]);
    in[1] = to_acc(arow[H + u]);
    in[2] = to_acc(arow[2 * H + u]);
    in[3] = to_acc(cells[jj]);
    in[4] = to_acc(grad_output[jj]);
    in[5] = 0;
    in[6] = 0;
    in[7] = t < row_end ? A(1) : A(0);
    if (t == row_end - 1)
        in[6] = to_acc(grad_h_n[b * H + u]);
    if (t == steps - 1)
        in[5] = to_acc(grad_c_n[b * H + u]);
}

/* Send this block's tile of one chunk to every block of its cluster: tile
 * [CH][RUNS][W] (W values of the accumulation type per run, a multiple of 16
 * bytes) goes to rows [b0, b0+CH) of `buffer`, run q of row b at
 * buffer[b*LD + q*QS + n*W] (n this block's rank). Call from every thread
 * (after the tile is complete); each sends some of the 16-byte pieces. */
template <typename A, int RUNS, int W, int LD, int CH = BC>
__device__ __forceinline__ void send_tile(const A *tile, A *buffer, uint64_t *bar, int64_t b0,
                                          int64_t QS, int n, int ranks, int tid)
{
#if LLTM_CUDA_HAS_CLUSTERS
    constexpr int PER_RUN = W * (int)sizeof(A) / 16, PER_RANK = CH * RUNS * PER_RUN;
    static_assert(W * sizeof(A) % 16 == 0, "16-byte pieces");
    for (int e = tid; e < PER_RANK * ranks; e += NT) {
        const int rank = e / PER_RANK, piece = e % PER_RANK;
        const int bb = piece / (RUNS * PER_RUN), q = piece / PER_RUN % RUNS, v = piece % PER_RUN;
        const A *src = tile + (bb * RUNS + q) * W + v * (16 / (int)sizeof(A));
        A *dst = buffer + (b0 + bb) * LD + q * QS + (int64_t)n * W + v * (16 / (int)sizeof(A));
        send16(src, dst, bar, rank);
    }
#else
    (void)tile, (void)buffer, (void)bar, (void)b0, (void)QS, (void)n, (void)ranks, (void)tid;
#endif
}


using lltm_seq::allow_smem;

/* One cooperative launch of `blocks` blocks (co-residency: the chooser's) */
template <typename... P, typename... Args>
cudaError_t launch_cooperative(void (*kernel)(P...), int64_t blocks, size_t smem,
                               cudaStream_t stream, Args... args)
{
    void *pointers[] = {(void *)&args...};
    return cudaLaunchCooperativeKernel(kernel, dim3((unsigned)blocks), dim3(NT), pointers, smem,
                                       stream);
}

/* One launch as `clusters` clusters of `blocks` blocks (the grid) of
 * `threads` (NT but for the reduce-scatter backward's small chunks). */
template <typename... P, typename... Args>
cudaError_t launch_cluster(void (*kernel)(P...), int64_t blocks, int64_t clusters, size_t smem,
                           cudaStream_t stream, int threads, Args... args)
{
    const cudaError_t e = lltm_seq::cluster_attributes((const void *)kernel, blocks, smem);
    if (e != cudaSuccess)
        return e;
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t config =
        lltm_seq::cluster_config(blocks, smem, stream, &attr, clusters, threads);
    return cudaLaunchKernelEx(&config, kernel, args...);
}

/* grad_bias[e] = the groups' sums work[g][e] added in group order (the
 * cluster backward's batch groups) */
template <typename T>
__global__ void sum_bias_groups_kernel(int64_t n, int groups,
                                       const typename acc_of<T>::type *__restrict__ work,
                                       T *__restrict__ grad_bias)
{
    const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e < n) {
        typename acc_of<T>::type sum = 0;
        for (int g = 0; g < groups; ++g)
            sum += work[g * n + e];
        grad_bias[e] = from_acc<T>(sum);
    }
}

/* The batch groups' bias sums in the workspace, after the float32 state of
 * the half types (lltm_seq::half_state_bytes); NULL with one group. */
template <typename T>
int bias_groups_work(const lltm_seq::backward_args &a, int64_t groups,
                     typename acc_of<T>::type **work)
{
    typedef typename acc_of<T>::type A;
    *work = NULL;
    if (groups == 1)
        return LLTM_OK;
    if (!a.workspace)
        return LLTM_ERR_ARGUMENT;
    const size_t state = std::is_same<T, A>::value ? 0 : lltm_seq::half_state_bytes(a.B, a.H);
    *work = (A *)((char *)a.workspace + state);
    return LLTM_OK;
}

/* After a backward kernel that ran in groups: grad_bias = the groups' sums
 * (bias_groups_work) added in group order; nothing to do with one group. */
template <typename T>
int sum_bias_groups(const lltm_seq::backward_args &a, int64_t groups,
                    const typename acc_of<T>::type *work, cudaStream_t stream)
{
    if (groups == 1)
        return LLTM_OK;
    LLTM_LAUNCH(pointwise_blocks(3 * a.H, 128), 128, 0, stream, sum_bias_groups_kernel<T>)(
        3 * a.H, (int)groups, work, (T *)a.grad_bias);
    return launch_status(cudaGetLastError());
}

} // namespace

#endif /* LLTM_CORE_CUDA_SEQUENCE_DEVICE_CUH */
