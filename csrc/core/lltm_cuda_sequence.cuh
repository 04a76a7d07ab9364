/*
 * lltm_cuda_sequence.cuh - the host-side interface between the parts of the
 * CUDA sequence code (internal; the public API is lltm.h):
 *
 *   lltm_cuda_sequence_plan.cu        the plan chooser (occupancy, costs)
 *   lltm_cuda_sequence_plan_cluster.cu   its cluster family's shapes
 *   lltm_cuda_sequence.cu             one layer (the time loop, the products
 *                                     around it) and the persistent launches
 *   lltm_cuda_seq_grid_<dtype>.cu     grid kernels of one dtype
 *   lltm_cuda_seq_cfwd_<dtype>.cu     cluster forward kernels of one dtype
 *   lltm_cuda_seq_cbwd_<dtype>.cu     cluster backward kernels of one dtype
 *   lltm_cuda_seq_block_<dtype>.cu    block kernels of one dtype
 *   lltm_cuda_sequence_steps.cu       per-step kernels (fallback), convert
 *   lltm_cuda_util.cu                 small products, copies, zero fills,
 *                                     whether a stream is being captured
 *   lltm_cuda_seq_stack.cu            stacked layers in one launch
 *                                     (lltm_stack.h): plan, launches, the
 *                                     products around them
 *   lltm_cuda_seq_stack_<dtype>.cu    stacked-layer kernels of one dtype
 * with the kernels in headers: lltm_cuda_sequence_device.cuh (shared device
 * helpers), _grid.cuh, _cluster_forward.cuh, _cluster_backward.cuh,
 * _block.cuh, _stack.cuh.
 *
 * Each kernel family x dtype is its own translation unit (they compile in
 * parallel); it exports a launcher that takes one direction's launch of the
 * plan and a kernel lookup for the chooser's occupancy queries (NULL where
 * the library has no kernel of that layout).
 */
#ifndef LLTM_CORE_CUDA_SEQUENCE_CUH
#define LLTM_CORE_CUDA_SEQUENCE_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "lltm.h"

namespace lltm_seq {

constexpr int NT = 256;   /* threads per block of every persistent kernel */
constexpr int BC = 16;    /* batch rows per chunk of the persistent kernels */
constexpr int GRID_SMALL_CHUNK = 4; /* the grid kernels' other chunk, for small B */
constexpr int RS_UNITS = 8; /* units a block of the reduce-scatter backward */
constexpr int CLUSTER_RANKS = 16; /* blocks of the 16-block (non-portable) clusters */
constexpr int CLUSTER_MAX_H = CLUSTER_RANKS * RS_UNITS; /* the cluster kernels' H: 128 */
/* The 16-block clusters past it (H <= 256): 16 units a block, their
 * forward in 4- or 8-row chunks, their backward the reduce-scatter's */
constexpr int WIDE_UNITS = 16;
constexpr int WIDE_MAX_H = CLUSTER_RANKS * WIDE_UNITS;
constexpr int BLOCK_UNITS = 64;    /* the block kernels' H (all units in one block) */
constexpr int BLOCK_CHUNKS[] = {1, 4}; /* their chunk rows, in the order the chooser tries them */
constexpr int NUM_BLOCK_CHUNKS = 2;
/* The position of a chunk size in BLOCK_CHUNKS; -1 where it is none */
constexpr int block_chunk_index(int chunk)
{
    for (int c = 0; c < NUM_BLOCK_CHUNKS; ++c)
        if (BLOCK_CHUNKS[c] == chunk)
            return c;
    return -1;
}
/* Lanes a unit in the block kernels (acc: bytes of the accumulation type):
 * 2 in 1-row chunks (128 threads: each lane 96 weights, one shuffle to add
 * a unit's halves; a step is one thread's chain of math, and fewer warps
 * issue it), 4 in 4-row chunks (each lane ends with its own row) and in
 * float64 (96 doubles a lane would take 192 registers). */
__host__ __device__ constexpr int block_lanes(size_t acc, int chunk)
{
    return chunk == 1 && acc == 4 ? 2 : 4;
}

/* lengths [B] (device memory) or NULL: row b stops after lengths[b] of the
 * `steps` steps (lltm.h) */
struct forward_args {
    int64_t steps, B, I, H;
    const void *h0, *c0, *weights, *bias;
    void *gates, *output, *cells, *workspace;
    const int64_t *lengths;
    void *h_n, *c_n; /* NULL: not written */
};

struct backward_args {
    int64_t steps, B, I, H;
    const void *grad_output, *grad_h_n, *grad_c_n, *weights, *cells, *gates;
    void *grad_gates, *grad_bias, *grad_h0, *grad_c0, *workspace;
    const int64_t *lengths;
};

/* Bytes of the float32 recurrent state of a half type (forward: h [2,B,H]
 * + c [B,H]; backward: dG [2,B,3H] + dc [B,H]). The batch groups' bias sums
 * follow it in the workspace. */
inline size_t half_state_bytes(int64_t B, int64_t H) { return (size_t)(7 * B * H) * sizeof(float); }

/* half_state_bytes of `dtype`: 0 for float32/float64, which keep no such state */
inline size_t half_state_bytes(lltm_dtype dtype, int64_t B, int64_t H)
{
    return dtype == LLTM_FLOAT16 || dtype == LLTM_BFLOAT16 ? half_state_bytes(B, H) : 0;
}

/* Workspace regions start at multiples of WORKSPACE_ALIGN bytes: `bytes`
 * rounded up to the next region */
constexpr size_t WORKSPACE_ALIGN = 256;
inline size_t round_up(size_t bytes)
{
    return (bytes + WORKSPACE_ALIGN - 1) / WORKSPACE_ALIGN * WORKSPACE_ALIGN;
}

/* bytes of the accumulation type (float for the half types) */
inline size_t acc_bytes(lltm_dtype dtype) { return dtype == LLTM_FLOAT64 ? 8 : 4; }
/* bytes of the dtype's own values */
inline size_t elem_bytes(lltm_dtype dtype)
{
    return dtype == LLTM_FLOAT64 ? 8 : dtype == LLTM_FLOAT32 ? 4 : 2;
}

/* The grid kernels on tensor cores (lltm_cuda_mma.cuh; the half types, and
 * float32 on TF32): a chunk staged as 16 rows (the A tiles; rows past the
 * chunk stay 0) of `cols` values + 16 bytes (ldmatrix then reads the 8 rows
 * of a tile on different banks), then each warp's float partial sums of the
 * chunk's rows x `outs` columns; `mma` = bytes of a staged value (2, or 4 on
 * TF32; 0: the kernel has no tensor-core products). A binary whose code for
 * the GPU is older PTX runs the FFMA kernels instead: the kernels get the
 * larger of the two sizes. */
constexpr int MMA_ROW_PAD_BYTES = 16;
/* The row stride (floats) of the warps' partial sums of `outs` columns,
 * padded to `bank` modulo 32 banks. Unpadded, 3U or U columns put up to
 * eight lanes of a warp on one bank: its fragment stores (rows l/4,
 * columns 2(l%4)) at 3U = 96 or U = 32, and the forward's sums (a warp
 * reads KS rows of 32 / KS units) at every layout. The strides of
 * mma_parts_bank meet on a bank at most twice for either. */
__host__ __device__ constexpr int mma_parts_ld(int outs, int bank)
{
    return outs + ((bank - outs % 32) % 32 + 32) % 32;
}
/* forward: KS rows a warp reads need an odd stride at KS = 32; backward:
 * whole rows of U, four a warp at U = 8 */
__host__ __device__ constexpr int mma_parts_bank(bool forward, int ks)
{
    return forward ? (ks == 32 ? 5 : 4) : (NT / ks == 8 ? 8 : 4);
}
/* one staged tile [BC][cols + pad] of `mma`-byte values, and the warps'
 * partial sums of a chunk's `ch` rows (`outs`: their row stride) */
inline size_t mma_tile_bytes(int cols, size_t mma)
{
    return (size_t)BC * (cols * mma + MMA_ROW_PAD_BYTES);
}
inline size_t mma_parts_bytes(int ch, int outs)
{
    return (size_t)(NT / 32) * ch * outs * sizeof(float);
}
inline size_t grid_mma_smem(int cols, int ch, int outs, size_t mma)
{
    return mma_tile_bytes(cols, mma) + mma_parts_bytes(ch, outs);
}
inline size_t max_size(size_t a, size_t b) { return a > b ? a : b; }
/* The grid layouts that exist on tensor cores only (64 values a lane: an
 * FFMA build would hold 3 x 64 weights a thread): 8x64 and 16x64, whose
 * blocks take 32 and 16 units, half the blocks of 16x32 and 32x32, so that
 * two layers' grids fit the GPU at once. Half types only (TF32's m16n8k8
 * takes twice the weight registers of a k range). */
__host__ __device__ constexpr bool grid_mma_only(int kr) { return kr > 32; }
/* bytes of a value the grid kernels of `dtype` stage for tensor cores (tf32:
 * float32's kernels on TF32) */
inline size_t grid_mma_bytes(lltm_dtype dtype, bool tf32)
{
    return dtype == LLTM_FLOAT16 || dtype == LLTM_BFLOAT16 ? 2
           : dtype == LLTM_FLOAT32 && tf32                 ? 4
                                                           : 0;
}

/* Dynamic shared memory of each kernel, acc = bytes of its accumulation
 * type (mma: grid_mma_bytes); rows = the batch rows of one group, padded to
 * whole chunks. */
inline size_t grid_forward_smem(size_t acc, size_t mma, int ks, int kr, int ch)
{
    const size_t ffma = grid_mma_only(kr) ? 0 : (size_t)ch * ks * kr * acc;
    const int parts = mma_parts_ld(NT / ks * 3, mma_parts_bank(true, ks));
    return mma ? max_size(ffma, grid_mma_smem(ks * kr, ch, parts, mma)) : ffma;
}
inline size_t grid_backward_smem(size_t acc, size_t mma, int ks, int kr, int ch)
{
    const size_t ffma = grid_mma_only(kr) ? 0 : (size_t)ch * ks * 3 * kr * acc;
    const int parts = mma_parts_ld(NT / ks, mma_parts_bank(false, ks));
    return mma ? max_size(ffma, grid_mma_smem(3 * ks * kr, ch, parts, mma)) : ffma;
}
/* vec: values of a 16-byte vector (16 / acc) */
inline size_t cluster_forward_smem(size_t acc, int ks, int kr, int units, int64_t rows, int ch)
{
    const int64_t vec = 16 / (int64_t)acc;
    return 16 + acc * (size_t)(2 * rows * (ks * kr + vec) + 2 * ch * units + rows * units);
}
/* Threads a block of the reduce-scatter backward (`units` a block, 16
 * blocks): its product step covers a chunk's rows x 16 * units / (16 /
 * acc) pieces of 16 bytes, one a thread, NT at most. A 4-row chunk of 8
 * units (4-byte types) takes 128: with NT, half the threads had no work,
 * and at ~170 - 185 registers a thread one block filled an SM, so two
 * directions' clusters of 4-row chunks (eight of 16 blocks) did not fit an
 * H100 at once; two 128-thread blocks share an SM. */
constexpr int cluster_backward_rs_threads(size_t acc, int ch, int units = RS_UNITS)
{
    const int pieces = ch * CLUSTER_RANKS * units * (int)acc / 16;
    return pieces < NT ? pieces : NT;
}
inline size_t cluster_backward_rs_smem(size_t acc, int64_t rows, int ch, int units = RS_UNITS)
{
    const int64_t U = units;
    return 16 + acc * (size_t)(2 * CLUSTER_RANKS * rows * U + 2 * ch * 3 * U + rows * U);
}

/* rows: one block's rows, padded to whole chunks (lltm_cuda_sequence_block.cuh) */
inline size_t block_forward_smem(size_t acc, int64_t rows)
{
    const int64_t vec = 16 / (int64_t)acc;
    return acc * (size_t)(2 * rows * (BLOCK_UNITS + vec) + rows * BLOCK_UNITS);
}
inline size_t block_backward_smem(size_t acc, int64_t rows)
{
    const int64_t vec = 16 / (int64_t)acc;
    return acc * (size_t)(2 * rows * (3 * BLOCK_UNITS + vec) + rows * BLOCK_UNITS);
}

/* The rows one batch group takes: ceil(chunks / groups) chunks of ch rows */
inline int64_t group_rows(int64_t B, int ch, int64_t groups)
{
    return ((B + ch - 1) / ch + groups - 1) / groups * ch;
}

/* The per-family, per-dtype units, each defined in its family's header and
 * instantiated by its lltm_cuda_seq_<family>_<dtype>.cu. Kernel lookups:
 * the kernel function for the chooser's occupancy queries (NULL: not in the
 * library). Launchers (Args: forward_args or backward_args):
 * LLTM_ERR_ARGUMENT for a layout the library has no kernel of. */
template <typename T>
const void *grid_kernel(bool forward, int lanes, int values, int chunk, bool tf32);
template <typename T, typename Args>
int grid_run(const lltm_sequence_launch &l, const Args &a, cudaStream_t stream);
template <typename T> const void *cluster_forward_kernel(const lltm_sequence_launch &l);
template <typename T>
int cluster_forward(const lltm_sequence_launch &l, const forward_args &a, cudaStream_t stream);
template <typename T> const void *cluster_backward_kernel(const lltm_sequence_launch &l);
template <typename T>
int cluster_backward(const lltm_sequence_launch &l, const backward_args &a, cudaStream_t stream);
template <typename T> const void *block_kernel(bool forward, int chunk);
template <typename T, typename Args>
int block_run(const lltm_sequence_launch &l, const Args &a, cudaStream_t stream);

/* The layer's pieces around its recurrence (lltm_cuda_sequence.cu), shared
 * with the stacked layers (lltm_cuda_seq_stack.cu); products through the
 * library's small kernel or the caller's gemm as lltm.h says:
 *   input_projection  gates [T*B,G] = x [T*B,I] W_x^T (zero where I = 0)
 *   weight_grads      grad_weights [G,H+I] = dG^T [h_prev | x] through hx
 *                     [T*B,H+I] (workspace), grad_input [T*B,I] = dG W_x;
 *                     either NULL: not formed */
int input_projection(lltm_dtype dtype, int64_t TB, int64_t I, int64_t H, const void *input,
                     const void *weights, void *gates, lltm_gemm gemm, void *gemm_ctx,
                     void *stream);
int weight_grads(lltm_dtype dtype, int64_t T, int64_t B, int64_t I, int64_t H, const void *dG,
                 const void *h0, const void *output, const void *input, const void *weights,
                 void *hx, void *grad_weights, void *grad_input, lltm_gemm gemm, void *gemm_ctx,
                 void *stream);

/* How many blocks of `kernel` (smem bytes each, `threads` a block) run at
 * once on `dev` (blocks per SM x SMs; 0 where the kernel is not in the
 * library, or for a cooperative grid without cooperative launch); raises
 * the kernel's dynamic shared-memory limit as needed
 * (lltm_cuda_sequence_plan.cu). */
int64_t max_resident_blocks(const void *kernel, size_t smem, const lltm_cuda_device &dev,
                            bool cooperative = true, int threads = NT);

/* The chooser's caches of occupancy answers: per device ordinal below
 * MAX_DEVICES, dtype and, where it matters, how many layers run at once
 * (lltm_sequence_plan_options.concurrent: 1 or MAX_CONCURRENT). */
constexpr int MAX_DEVICES = 64, NUM_DTYPES = 4, MAX_CONCURRENT = 2;
inline bool cached_device(const lltm_cuda_device &dev)
{
    return dev.device >= 0 && dev.device < MAX_DEVICES;
}

/* The cluster family's plan for B rows of H units on `dev` in chunks of
 * `chunk` rows (lltm_sequence_plan_options.cluster_chunk; 0: its own
 * choice), `concurrent` launches of each kernel at once: false where none
 * fits, else true with plan's family and both launches set
 * (lltm_cuda_sequence_plan_cluster.cu). */
bool cluster_plan(const lltm_cuda_device &dev, lltm_dtype dtype, int64_t B, int64_t H, int chunk,
                  int concurrent, lltm_sequence_plan *plan);
/* How many clusters of launch l (a cluster a batch group) run at once on
 * `dev` (0: none, or no such kernel in the library) */
int64_t cluster_launch_resident(lltm_dtype dtype, bool forward, const lltm_sequence_launch &l,
                                const lltm_cuda_device &dev);

/* Sizes no kernel takes (negative, or past what int64_t indexing holds) */
inline bool bad_sizes(int64_t steps, int64_t B, int64_t I, int64_t H)
{
    const int64_t big = (int64_t)1 << 40;
    return steps < 0 || B < 0 || I < 0 || H < 0 || steps > big || B > big || I > big ||
           H > ((int64_t)1 << 29) || (B > 0 && steps > big / B) ||
           (B > 0 && H > 0 && steps * B > big / (3 * H));
}

/* The kernel's dynamic shared-memory limit raised past the default 48 KB
 * (only there: a lower limit would refuse a later launch of the same kernel
 * with more) */
inline int allow_smem(const void *kernel, size_t smem)
{
    if (smem > 48 * 1024 &&
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) !=
            cudaSuccess) {
        cudaGetLastError();
        return LLTM_ERR_CUDA;
    }
    return LLTM_OK;
}

/* Launch attributes shared by the launchers and the chooser: the dynamic
 * shared-memory limit past 48 KB, a non-portable cluster size past 8. */
constexpr int PORTABLE_CLUSTER_BLOCKS = 8;
inline cudaError_t cluster_attributes(const void *kernel, int64_t blocks, size_t smem)
{
    cudaError_t e = cudaSuccess;
    if (smem > 48 * 1024)
        e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e == cudaSuccess && blocks > PORTABLE_CLUSTER_BLOCKS)
        e = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    return e;
}

/* The launch of `clusters` clusters of `blocks` blocks of `threads`, smem
 * bytes each, on `stream`; *attr holds the cluster size. */
inline cudaLaunchConfig_t cluster_config(int64_t blocks, size_t smem, cudaStream_t stream,
                                         cudaLaunchAttribute *attr, int64_t clusters = 1,
                                         int threads = NT)
{
    attr->id = cudaLaunchAttributeClusterDimension;
    attr->val.clusterDim.x = (unsigned)blocks;
    attr->val.clusterDim.y = 1;
    attr->val.clusterDim.z = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3((unsigned)(blocks * clusters));
    config.blockDim = dim3((unsigned)threads);
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    config.attrs = attr;
    config.numAttrs = 1;
    return config;
}

} // namespace lltm_seq

#endif /* LLTM_CORE_CUDA_SEQUENCE_CUH */
