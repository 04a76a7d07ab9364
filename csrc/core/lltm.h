/*
 * lltm.h - the framework-free core of the LLTM recurrent unit.
 *
 * LLTM ("Long-Long-Term Memory") is an LSTM-like cell with no forget gate and
 * an ELU candidate. For one step, with X = [h, x] (state first, then input):
 *
 *     g  = X W^T + b                 g = [g_i | g_o | g_z], each [B,H]
 *     i  = sigmoid(g_i)   o = sigmoid(g_o)   z = elu(g_z)      (alpha = 1)
 *     c' = c + i * z
 *     h' = tanh(c') * o
 *
 * Nothing in this directory knows PyTorch: kernels take raw pointers, sizes,
 * a dtype code and (on the CPU) a parallel-for callback and a matrix-product
 * callback; the CUDA launchers take a stream. The binding (csrc/binding)
 * validates tensors, allocates, provides the callbacks (torch's thread pool,
 * aten::mm) and calls these.
 *
 * Shapes (legend): B batch rows, I input features, H state size, G = 3H.
 * Every array is dense and row-major: [B,G] means element (b, k) sits at
 * b*G + k. Gate blocks in a [.,G] row are ordered i, o, z: column k of block
 * q at q*H + k.
 *
 * Element types: each array has the kernel's dtype unless stated otherwise.
 * Float32 and float64 compute in their own precision (float32's products
 * on TF32 tensor cores where the caller allows it: lltm_cuda_device.tf32);
 * float16 and bfloat16 compute and accumulate in float32 (their
 * "accumulation type"; the other dtypes are their own) and store in their
 * own type, rounded to nearest even.
 *
 * Aliasing: outputs never alias inputs, except where an argument is marked
 * "in/out" (read, then overwritten in place).
 *
 * A training step keeps for the backward the gate activations [B,G] beyond
 * its own inputs (x, h, W) and output c', which the caller keeps anyway.
 *
 * Return codes: LLTM_OK, or a negative lltm_status (lltm_status_string).
 */
#ifndef LLTM_CORE_LLTM_H
#define LLTM_CORE_LLTM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum lltm_dtype {
    LLTM_FLOAT32 = 0,
    LLTM_FLOAT64 = 1,
    LLTM_FLOAT16 = 2,
    LLTM_BFLOAT16 = 3,
} lltm_dtype;

typedef enum lltm_status {
    LLTM_OK = 0,
    LLTM_ERR_DTYPE = -1,      /* dtype not supported by this kernel */
    LLTM_ERR_ARGUMENT = -2,   /* negative size or null pointer */
    LLTM_ERR_PARALLEL = -3,   /* the parallel-for callback failed */
    LLTM_ERR_CUDA = -4,       /* a CUDA launch or call failed */
    LLTM_ERR_GEMM = -5,       /* the matrix-product callback failed */
    LLTM_ERR_NO_MEMORY = -6,  /* a workspace allocation failed */
} lltm_status;

const char *lltm_status_string(int status);

/* Bytes of one element of `dtype`, 0 if unknown. */
size_t lltm_dtype_size(lltm_dtype dtype);

/* ------------------------------------------------------------------------ */
/* CPU                                                                       */
/* ------------------------------------------------------------------------ */

/* A parallel-for: call body(lo, hi, ctx) on disjoint sub-ranges covering
 * [begin, end), each at least `grain` long where possible; return 0 on
 * success. The binding passes torch's thread pool (so torch.set_num_threads
 * applies); tests pass lltm_serial_for. */
typedef void (*lltm_range_body)(int64_t lo, int64_t hi, void *ctx);
typedef int (*lltm_parallel_for)(int64_t begin, int64_t end, int64_t grain,
                                 lltm_range_body body, void *ctx);

int lltm_serial_for(int64_t begin, int64_t end, int64_t grain,
                    lltm_range_body body, void *ctx);

/* The instruction set of the core's own float32 products (lltm_cpu_gemm.c),
 * chosen at the first call by the CPU's features. lltm_cpu_set_isa forces
 * one (LLTM_ISA_AUTO: the best again) for tests and measurements; it returns
 * the set now in use, or LLTM_ERR_ARGUMENT where the CPU lacks it. */
enum { LLTM_ISA_AUTO = 0, LLTM_ISA_BASELINE = 1, LLTM_ISA_AVX2 = 2, LLTM_ISA_AVX512 = 3 };
int lltm_cpu_isa(void);
int lltm_cpu_set_isa(int isa);

/*
 * Cell forward, pointwise part (after the caller computed X W^T).
 *   gates     [B,G]  in/out: in g - b (the matrix product, bias not added);
 *                    out the activations [i | o | z]
 *   bias      [G]
 *   old_cell  [B,H]
 *   new_h     [B,H]  out
 *   new_cell  [B,H]  out
 * dtype: any lltm_dtype.
 */
int lltm_cell_forward_pointwise_cpu(lltm_dtype dtype, int64_t B, int64_t H,
                                    void *gates, const void *bias,
                                    const void *old_cell, void *new_h,
                                    void *new_cell, lltm_parallel_for pfor);

/*
 * Cell backward, pointwise part and bias gradient.
 *   grad_h      [B,H]  dL/dh'
 *   grad_cell   [B,H]  dL/dc' (from outside the step)
 *   new_cell    [B,H]  c' of the forward
 *   gates       [B,G]  activations [i | o | z] saved by the forward
 *   grad_gates  [B,G]  out: dL/dg (pre-activation gate gradients)
 *   grad_old_cell [B,H] out: dL/dc
 *   grad_bias   [G]    out: sum over the batch of grad_gates
 * The caller then forms dL/dX = grad_gates W and dL/dW = grad_gates^T X.
 * dtype: any lltm_dtype (grad_bias summed in the accumulation type).
 */
int lltm_cell_backward_pointwise_cpu(lltm_dtype dtype, int64_t B, int64_t H,
                                     const void *grad_h, const void *grad_cell,
                                     const void *new_cell, const void *gates,
                                     void *grad_gates, void *grad_old_cell,
                                     void *grad_bias, lltm_parallel_for pfor);

/* ------------------------------------------------------------------------ */
/* One layer over a whole sequence (CPU)                                     */
/* ------------------------------------------------------------------------ */
/*
 * Shapes: T steps; x [T,B,I]; W = [W_h | W_x] [G,H+I] (W_h = columns 0..H-1,
 * W_x = columns H..H+I-1); h_0, c_0 [B,H]; outputs h_1..h_T, c_1..c_T.
 * Arrays [T,B,n] are the steps' [B,n] blocks one after another, so they
 * also read as [T*B,n].
 *
 * Forward (lltm_sequence_forward_cpu):
 *   gates[T*B,G] = x[T*B,I] W_x^T             a matrix product a chunk of
 *                                             steps (~512 KB, >= 256 rows)
 *                                             before them, while in cache
 *   for t = 1..T: r[B,G] = h_{t-1} W_h^T      one matrix product per step
 *                 one fused pass: gates[t] + r + b -> activations [i | o | z],
 *                 c_t = c_{t-1} + i z, h_t = tanh(c_t) o
 * Backward (lltm_sequence_backward_cpu), reverse time, dh = dL/dh_T (from
 * h_n), dc = dL/dc_T (from c_n):
 *   for t = T..1: one fused pass: dG[t] [B,G], dc <- dL/dc_{t-1}, bias sums
 *                 dh[B,H] = dG[t] W_h         one matrix product per step
 *   then dW = dG^T [h_{t-1} | x_t] and dx = dG W_x: one large matrix
 *   product each over all T*B rows.
 * float16 / bfloat16 carry c and dL/dc between steps, and sum the bias
 * gradient, in float32 (the saved cells are c rounded to the dtype); the
 * matrix products run in the dtype.
 *
 * Variable lengths: lengths [B] int64, each in [1, T] (NULL: every row runs
 * all T steps). Row b runs its first lengths[b] steps and then stops: at a
 * step t >= lengths[b] its state stays (c_t = c_{t-1}, so h_n and c_n are
 * its state after step lengths[b] - 1), its output h_t and gates are 0;
 * in the backward such a step passes dL/dh and dL/dc through unchanged and
 * has no gate gradient (so no share of dW, db or dx), dL/dh_n enters at
 * step lengths[b] - 1, and grad_output past the row's end is not read. The
 * CPU calls take lengths in host memory, check them (LLTM_ERR_ARGUMENT)
 * and run max(lengths) steps, each step's products over rows 0 .. m-1, m
 * one past the last row still running (rows sorted longest first, as in a
 * packed batch, leave every stopped row out); the CUDA calls take them in device memory,
 * which the host does not read: they run all T steps (a caller cuts T to
 * the longest row), and values out of range give undefined results but
 * no access outside the arrays.
 *
 * What training keeps per step for the backward: the gate activations
 * [B,G] and the cell state c_t [B,H] (16*B*H bytes in float32), beyond x_t
 * and h_t, which the caller keeps anyway (h_{t-1} is read from the output).
 */

/*
 * A matrix product, the caller's (the binding runs aten::mm; tests a naive
 * loop): c [M,N] = a [M,K] b [K,N], every array of `dtype`. Element (m,k)
 * of a sits at a[m*a_rs + k*a_cs], (k,n) of b at b[k*b_rs + n*b_cs], (m,n)
 * of c at c[m*ldc + n] (strides in elements; a transposed operand has row
 * stride 1). c is overwritten and never overlaps a or b. M, N, K >= 1.
 * Returns 0 on success; the core then reports LLTM_ERR_GEMM.
 */
typedef int (*lltm_gemm)(void *ctx, lltm_dtype dtype, int64_t M, int64_t N, int64_t K,
                         const void *a, int64_t a_rs, int64_t a_cs, const void *b,
                         int64_t b_rs, int64_t b_cs, void *c, int64_t ldc);

/* Bytes of workspace the two calls need (0 for an unknown dtype or bad
 * sizes). Forward: W_h^T [H,G] and r [B,G] of the dtype, c [B,H] of the
 * accumulation type; backward: dG [T,B,G], [h_0..h_{T-1}] [T,B,H] and dh
 * [B,H] of the dtype, dc [B,H] and the bias sums [G] of the accumulation
 * type; in float32 also W's blocks packed for the core's own kernel, which
 * runs every float32 product where the CPU has AVX2 or AVX-512 (gemm is then
 * not called); the rest go through the lltm_gemm callback. */
size_t lltm_sequence_forward_workspace_cpu(lltm_dtype dtype, int64_t I, int64_t B, int64_t H);
/* The forward for inference (cells and gates NULL: nothing kept): the same,
 * plus a few steps' input projections (at least one step's, ~512 KB) and
 * one step's cells. */
size_t lltm_sequence_infer_workspace_cpu(lltm_dtype dtype, int64_t T, int64_t I, int64_t B,
                                         int64_t H);
size_t lltm_sequence_backward_workspace_cpu(lltm_dtype dtype, int64_t T, int64_t B, int64_t I,
                                            int64_t H);

/*
 * The arrays of one layer's forward, shared by the CPU and CUDA calls:
 *   input     [T,B,I]
 *   weights   [G,H+I]  (columns: state first, then input)
 *   bias      [G]
 *   h0, c0    [B,H]
 *   output    [T,B,H]  out: h_1..h_T
 *   h_n, c_n  [B,H]    out: h_T, c_T (h0, c0 when T == 0)
 *   cells     [T,B,H]  out: c_1..c_T (kept for the backward)
 *   gates     [T,B,G]  out: the activations [i | o | z] of every step
 *   lengths   [B]      int64, each in [1, T], or NULL (every row T steps)
 * Outputs do not overlap the inputs or each other. Arrays with no elements
 * may be NULL. On the CPU, cells and gates both NULL is a forward for
 * inference: nothing is kept, the input projection runs a few steps at a
 * time in the workspace (lltm_sequence_infer_workspace_cpu), so what a step
 * reads and writes stays in cache; output, h_n and c_n come out the same.
 */
typedef struct lltm_sequence_forward_tensors {
    const void *input, *weights, *bias, *h0, *c0;
    void *output, *h_n, *c_n, *cells, *gates;
    const int64_t *lengths; /* [B] or NULL: see "Variable lengths" above */
} lltm_sequence_forward_tensors;

/*
 * The arrays of one layer's backward, from the forward's results:
 *   grad_output   [T,B,H]  dL/dh_t arriving from the layer's output
 *   grad_h_n      [B,H]    dL/dh_T from h_n
 *   grad_c_n      [B,H]    dL/dc_T from c_n
 *   input         [T,B,I]  as for the forward
 *   weights       [G,H+I]
 *   h0            [B,H]
 *   output        [T,B,H]  h_1..h_T of the forward
 *   cells         [T,B,H]  c_1..c_T of the forward
 *   gates         [T,B,G]  activations of the forward
 *   grad_input    [T,B,I]  out
 *   grad_weights  [G,H+I]  out
 *   grad_bias     [G]      out
 *   grad_h0, grad_c0  [B,H]  out
 *   lengths       [B]      int64 or NULL, as for the forward
 * Outputs do not overlap the inputs or each other. An output may be NULL:
 * that gradient is not wanted, and its work is not done (grad_input: no
 * dx = dG W_x product; grad_weights: no dW products; grad_h0: no dh product
 * at the first step). The others come out the same, bit for bit.
 */
typedef struct lltm_sequence_backward_tensors {
    const void *grad_output, *grad_h_n, *grad_c_n;
    const void *input, *weights, *h0, *output, *cells, *gates;
    void *grad_input, *grad_weights, *grad_bias, *grad_h0, *grad_c0;
    const int64_t *lengths; /* [B] or NULL, the forward's */
    void *grad_gates; /* [T,B,G] out or NULL: dG, for a caller that forms dW */
} lltm_sequence_backward_tensors;

/*
 * Forward and backward over T steps on the CPU. T, B, I >= 0, H >= 1; any
 * lltm_dtype.
 *   workspace  lltm_sequence_forward_workspace_cpu (_infer_workspace_cpu
 *              for inference) / _backward_workspace_cpu bytes, 8-byte
 *              aligned (NULL if 0)
 */
int lltm_sequence_forward_cpu(lltm_dtype dtype, int64_t T, int64_t B, int64_t I, int64_t H,
                              const lltm_sequence_forward_tensors *tensors, void *workspace,
                              lltm_gemm gemm, void *gemm_ctx, lltm_parallel_for pfor);
int lltm_sequence_backward_cpu(lltm_dtype dtype, int64_t T, int64_t B, int64_t I, int64_t H,
                               const lltm_sequence_backward_tensors *tensors, void *workspace,
                               lltm_gemm gemm, void *gemm_ctx, lltm_parallel_for pfor);

/* ------------------------------------------------------------------------ */
/* CUDA, cell (csrc/core/lltm_cuda_cell_*.cu; liblltm_cuda.so only)         */
/* ------------------------------------------------------------------------ */

/*
 * For every CUDA call below: every pointer is a device pointer on the CURRENT
 * device (the caller sets it, e.g. with a device guard) unless stated
 * otherwise; `stream` is a cudaStream_t of that device, passed as void * so
 * this header needs no CUDA header. Kernels are only enqueued: the calls
 * return before the work runs, and a launch failure comes back as
 * LLTM_ERR_CUDA. dtype: any lltm_dtype. Arrays may be NULL where they have no
 * elements (e.g. input when I == 0).
 */

/*
 * Whole cell forward in ONE kernel: g = [h, x] W^T + b, activations, state
 * update. X = [h, x] is read from old_h and input directly.
 *   input     [B,I]
 *   old_h     [B,H]
 *   weights   [G,I+H]  (columns: state first, then input)
 *   bias      [G]
 *   old_cell  [B,H]
 *   new_h     [B,H]  out
 *   new_cell  [B,H]  out
 *   gates     [B,G]  out: the activations [i | o | z] (saved for backward)
 */
int lltm_cell_forward_fused_cuda(lltm_dtype dtype, int64_t B, int64_t I,
                                 int64_t H, const void *input,
                                 const void *old_h, const void *weights,
                                 const void *bias, const void *old_cell,
                                 void *new_h, void *new_cell, void *gates,
                                 void *stream);

/*
 * Whole cell backward in TWO kernels: (1) gate gradients, d_old_cell, the bias
 * gradient and dW = dG^T [h, x]; (2) dX = dG W, split into grad_old_h and
 * grad_input as it is written.
 *   grad_h, grad_cell, new_cell  [B,H]
 *   gates         [B,G]    activations saved by the forward
 *   input         [B,I]
 *   old_h         [B,H]
 *   weights       [G,I+H]
 *   grad_gates    [B,G]    out (workspace): dL/dg
 *   grad_input    [B,I]    out, or NULL: not wanted
 *   grad_weights  [G,I+H]  out, or NULL: not wanted (kernel 1 then runs for
 *                          dG, grad_bias and grad_old_cell alone)
 *   grad_bias     [G]      out
 *   grad_old_h    [B,H]    out, or NULL: not wanted (kernel 2 does not run
 *                          when grad_input is NULL too)
 *   grad_old_cell [B,H]    out
 */
int lltm_cell_backward_fused_cuda(lltm_dtype dtype, int64_t B, int64_t I,
                                  int64_t H, const void *grad_h,
                                  const void *grad_cell, const void *new_cell,
                                  const void *gates, const void *input,
                                  const void *old_h, const void *weights,
                                  void *grad_gates, void *grad_input,
                                  void *grad_weights, void *grad_bias,
                                  void *grad_old_h, void *grad_old_cell,
                                  void *stream);

/* Pieces for running the matrix products elsewhere (cuBLAS through aten::mm):
 * X = [h, x].
 *   old_h [B,H], input [B,I], X [B,I+H] out */
int lltm_concat_state_input_cuda(lltm_dtype dtype, int64_t B, int64_t I,
                                 int64_t H, const void *old_h,
                                 const void *input, void *X, void *stream);

/* Forward pointwise part, as lltm_cell_forward_pointwise_cpu:
 *   gates [B,G] in/out: in X W^T (no bias), out the activations
 *   bias [G], old_cell [B,H], new_h [B,H] out, new_cell [B,H] out */
int lltm_cell_forward_pointwise_cuda(lltm_dtype dtype, int64_t B, int64_t H,
                                     void *gates, const void *bias,
                                     const void *old_cell, void *new_h,
                                     void *new_cell, void *stream);

/* Backward pointwise part: gate gradients, d_old_cell, the bias gradient
 * (fixed-order batch sum) and, if X is not NULL, X = [h, x]; one kernel, and
 * a second that adds the row chunks' bias sums where the batch is split
 * (workspace bytes > 0).
 *   grad_h, grad_cell, new_cell [B,H], gates [B,G], old_h [B,H], input [B,I]
 *   grad_gates [B,G] out, grad_old_cell [B,H] out, grad_bias [G] out,
 *   X [B,I+H] out or NULL
 *   workspace  lltm_cell_backward_pointwise_workspace_cuda bytes, 8-byte
 *              aligned (NULL if 0) */
size_t lltm_cell_backward_pointwise_workspace_cuda(lltm_dtype dtype, int64_t B,
                                                   int64_t H);
int lltm_cell_backward_pointwise_cuda(lltm_dtype dtype, int64_t B, int64_t I,
                                      int64_t H, const void *grad_h,
                                      const void *grad_cell,
                                      const void *new_cell, const void *gates,
                                      const void *old_h, const void *input,
                                      void *grad_gates, void *grad_old_cell,
                                      void *grad_bias, void *X, void *workspace,
                                      void *stream);

/* ------------------------------------------------------------------------ */
/* CUDA, sequence (csrc/core/lltm_cuda_seq*.cu; liblltm_cuda.so only)       */
/* ------------------------------------------------------------------------ */
/*
 * One layer over T steps, as on the CPU (section "One layer over a whole
 * sequence", the same products and what is kept for the backward). The
 * recurrence runs either in ONE persistent kernel per direction (W_h held in
 * registers across all steps; per step the blocks of a thread-block cluster
 * send each other the state through distributed shared memory, or the
 * blocks of a cooperative grid meet at a grid barrier, or, at H <= 64, each
 * block holds every unit and keeps its rows' state to itself) or, for sizes
 * no persistent kernel fits, as per-step kernels between per-step matrix
 * products. Which one, with which layout, is a value: lltm_sequence_plan,
 * chosen once by lltm_sequence_plan_cuda and passed to both directions.
 */

/* What the chooser needs to know of a device (lltm_cuda_device_query fills
 * it for a device ordinal; tests may describe another). The occupancy of
 * each kernel is asked of the CUDA runtime for `device` (once per device,
 * dtype and kernel layout, then cached). */
typedef struct lltm_cuda_device {
    int device;              /* ordinal */
    int major, minor;        /* compute capability */
    int sm_count;            /* streaming multiprocessors */
    int smem_optin;          /* dynamic shared memory a block may opt in to, bytes */
    int cooperative_launch;  /* nonzero: cooperative (grid-synchronized) launches */
    int cluster_launch;      /* nonzero: thread-block clusters (sm_90+), and the
                              * library's code for this device has its cluster
                              * kernels (built for sm_90+, not JIT-compiled from
                              * older PTX) */
    int code_arch;           /* virtual architecture of the library's code that
                              * runs on this device (e.g. 80 for compute_80 PTX) */
    int tf32;                /* nonzero: float32 products may run on TF32
                              * tensor cores (the caller's setting; the binding
                              * follows torch's float32 matmul precision): the
                              * gemm callback's, and from compute capability 8.0
                              * the grid kernels'. device_query leaves it 0. */
} lltm_cuda_device;

int lltm_cuda_device_query(int device, lltm_cuda_device *out);

enum { /* lltm_sequence_plan.family */
    LLTM_SEQ_ANY = 0,     /* options only: let the chooser pick */
    LLTM_SEQ_STEPS = 1,   /* per-step kernels between per-step products */
    LLTM_SEQ_GRID = 2,    /* one cooperative grid a direction */
    LLTM_SEQ_CLUSTER = 3, /* thread-block clusters (compute capability 9.0+) */
    LLTM_SEQ_BLOCK = 4,   /* one block a batch chunk, every unit in it (H <= 64) */
};
enum { /* lltm_sequence_launch.exchange: how blocks pass the state on */
    LLTM_SEQ_EXCHANGE_NONE = 0,           /* per-step kernels */
    LLTM_SEQ_EXCHANGE_GLOBAL = 1,         /* grid: global memory + grid barrier */
    LLTM_SEQ_EXCHANGE_BROADCAST = 2,      /* cluster: every block gets all of it */
    LLTM_SEQ_EXCHANGE_REDUCE_SCATTER = 3, /* cluster backward: each block gets the
                                           * partial dh of its own units */
    LLTM_SEQ_EXCHANGE_LOCAL = 4,          /* block: within one block's shared memory */
};

/*
 * One direction's persistent launch. A block holds U hidden units (the
 * reduce-scatter backward: 256 / lanes, 8 or 16; else 256 / lanes / (chunk
 * / rows)); the lanes of a unit split its k range, `values` k values a lane
 * per gate (W_h in registers: H <= lanes * values). B is cut into chunks of
 * `chunk` rows; a lane group works on `rows` rows of each chunk.
 *   blocks  blocks of one batch group: ceil(H / U) (the cluster's size;
 *           the block family: 1, 4 lanes x 64 units)
 *   groups  batch groups: copies of the blocks, group g taking the chunks
 *           g, g + groups, ... (the grid: one cooperative launch of
 *           blocks * groups; clusters: one cluster each; the block family:
 *           one block each, in one plain launch)
 *   smem    dynamic shared memory a block, bytes
 *   tf32    float32's grid in 16-row chunks: products on TF32 tensor cores
 */
typedef struct lltm_sequence_launch {
    int lanes, values, rows, chunk, exchange, tf32;
    int64_t blocks, groups;
    size_t smem;
} lltm_sequence_launch;

typedef struct lltm_sequence_plan {
    int family;                   /* LLTM_SEQ_STEPS, _GRID, _CLUSTER or _BLOCK */
    lltm_dtype dtype;             /* what it was made for */
    int64_t B, H;
    lltm_sequence_launch forward, backward; /* zero for LLTM_SEQ_STEPS */
    size_t workspace_bytes;       /* for either direction (float16/bfloat16:
                                   * the recurrent state in float32; batch
                                   * groups: their bias sums) */
} lltm_sequence_plan;

/* Constraints on the choice (zero: none), for tests and measurements:
 *   family          LLTM_SEQ_ANY, or one family (LLTM_ERR_ARGUMENT when it
 *                   cannot run these sizes here)
 *   grid_lanes, grid_values   one grid layout (16x8, 16x32, 32x16, 32x32, 8x64, 16x64)
 *                   instead of the cheapest
 *   grid_groups_max at most this many batch groups (the grid layouts'
 *                   groups of blocks; the block family's blocks); the
 *                   clusters run one a batch chunk, so with family
 *                   LLTM_SEQ_CLUSTER it is refused (LLTM_ERR_ARGUMENT)
 *   cluster_blocks  16 (8 units a block; 16 past H = 128), the clusters'
 *                   only size: any other is refused (LLTM_ERR_ARGUMENT)
 *   cluster_chunk   16: no batch split; 4 or 8: the 16-block kernels'
 *                   batch split into clusters of chunks of that many rows
 *   grid_chunk      16 or 4: the grid layouts' chunk rows (0: the cheaper)
 *   block_chunk     1 or 4: the block family's chunk rows (0: the cheaper)
 *   grid_tf32       float32: 1 only the grid's TF32 build (16-row chunks,
 *                   where dev->tf32 allows it), -1 only FFMA (0: the cheaper)
 *   concurrent      0 or 1: the layer has the device to itself; 2: two
 *                   layers of these sizes run at once on it (the two
 *                   directions of a bidirectional layer, on two streams):
 *                   only plans of which two launches are resident together
 *                   (twice the clusters, half the grid's blocks each), so
 *                   that neither waits for the other to finish
 *   eager           nonzero: the call is not being captured into a CUDA
 *                   graph, so the host issues its launches as it runs
 *                   (the per-step family's each step: the rules take it
 *                   later) */
typedef struct lltm_sequence_plan_options {
    int family, grid_lanes, grid_values, grid_groups_max, cluster_blocks, cluster_chunk;
    int concurrent, grid_chunk, block_chunk, eager, grid_tf32;
} lltm_sequence_plan_options;

/*
 * The plan for one layer of T steps of B rows, I inputs, H units on `dev`
 * (options may be NULL): nothing to run (T*B == 0 or H == 0), or family
 * STEPS, gives per-step kernels; else every plan that can run these sizes
 * here (within the options) is ranked by the rules
 * (lltm_sequence_plan_rank_cuda, lltm_cuda_rules.h) and the lowest rank wins (a tie: the
 * first of per-step, clusters, the grid layouts in the order 16x8, 16x32,
 * 32x16, 32x32, 8x64, 16x64, the block family in 1-row chunks, then 4-row
 * ones). Where each family and layout can run: docs/cuda-plans.md (per-step
 * kernels always; float64 past H = 512 only those).
 */
int lltm_sequence_plan_cuda(const lltm_cuda_device *dev, lltm_dtype dtype, int64_t T,
                            int64_t B, int64_t I, int64_t H,
                            const lltm_sequence_plan_options *options,
                            lltm_sequence_plan *plan);

/*
 * How much of the device the launches of `plan` (as lltm_sequence_plan_cuda
 * made it) hold, for layers run side by side on several streams (stacked
 * layers overlapped in time): for the forward [0] and the backward [1], a
 * call launches parts[d] parts that start as they fit and run to the end
 * on their own, resident[d] of which (of any calls) fit at once. The grid
 * family: one part, the whole launch (its blocks meet every step), and how
 * many whole launches fit by its blocks' occupancy; the cluster family: its
 * clusters (a batch group each; they need free SMs within one GPU
 * processing cluster, not only free SMs); the block family: its blocks.
 * resident[d] 0 where not one part fits (a plan made for another device);
 * parts 0 for the per-step family (its launches hold no SMs between steps). */
int lltm_sequence_plan_residency_cuda(const lltm_cuda_device *dev, const lltm_sequence_plan *plan,
                                      int64_t resident[2], int64_t parts[2]);

/*
 * One layer over T steps on the device, forward and backward, as
 * lltm_sequence_forward_cpu / lltm_sequence_backward_cpu (the same tensors
 * and products; T, B, I, H >= 0), with the plan that lltm_sequence_plan_cuda
 * chose for these sizes; the recurrence is the plan's persistent kernel, or
 * per step a product (gemm) and one pointwise kernel.
 * Matrix products: lltm_small_mm_cuda where lltm_small_mm_fits (one launch
 * of the library's kernel, less host time than a library call) and the
 * stream is not being captured into a CUDA graph, else `gemm` (lltm_gemm,
 * device pointers; it must run on `stream`, as aten::mm on torch's current
 * stream does): a captured call and an eager one may differ in rounding.
 *   workspace  lltm_sequence_forward_workspace_cuda /
 *              _backward_workspace_cuda bytes, 256-byte aligned (NULL if 0)
 */
size_t lltm_sequence_forward_workspace_cuda(const lltm_sequence_plan *plan, int64_t T,
                                            int64_t B, int64_t I, int64_t H);
size_t lltm_sequence_backward_workspace_cuda(const lltm_sequence_plan *plan, int64_t T,
                                             int64_t B, int64_t I, int64_t H);
int lltm_sequence_forward_cuda(const lltm_sequence_plan *plan, int64_t T, int64_t B, int64_t I,
                               int64_t H, const lltm_sequence_forward_tensors *tensors,
                               void *workspace, lltm_gemm gemm, void *gemm_ctx, void *stream);
int lltm_sequence_backward_cuda(const lltm_sequence_plan *plan, int64_t T, int64_t B, int64_t I,
                                int64_t H, const lltm_sequence_backward_tensors *tensors,
                                void *workspace, lltm_gemm gemm, void *gemm_ctx, void *stream);

/* The pieces the layer calls, for tests. The arrays are those of
 * lltm_sequence_forward_tensors / _backward_tensors (of weights only W_h,
 * columns 0..H-1, is read).
 * Forward recurrence in one launch (plan->family GRID, CLUSTER or BLOCK,
 * made for dtype, B and H; LLTM_ERR_ARGUMENT otherwise).
 *   gates      [T,B,G]  in/out: in x_t W_x^T of every step, out activations
 *   h_n, c_n   [B,H]    out: the layer's (NULL: not written)
 *   workspace  plan->workspace_bytes, or NULL if that is 0
 */
int lltm_sequence_forward_persistent_cuda(const lltm_sequence_plan *plan, int64_t T,
                                          int64_t B, int64_t I, int64_t H, const void *h0,
                                          const void *c0, const void *weights,
                                          const void *bias, void *gates, void *output,
                                          void *cells, void *h_n, void *c_n, void *workspace,
                                          const int64_t *lengths, void *stream);

/* Backward recurrence in one launch, T >= 1, B >= 1; grad_gates [T,B,G]
 * out: dL/dg of every step; workspace as for the forward. */
int lltm_sequence_backward_persistent_cuda(const lltm_sequence_plan *plan, int64_t T,
                                           int64_t B, int64_t I, int64_t H,
                                           const void *grad_output,
                                           const void *grad_h_n,
                                           const void *grad_c_n, const void *weights,
                                           const void *cells, const void *gates,
                                           void *grad_gates, void *grad_bias,
                                           void *grad_h0, void *grad_c0,
                                           void *workspace, const int64_t *lengths,
                                           void *stream);

/* Per-step kernels, the fused pointwise pass of step t (lengths [B] int64
 * on the device, or NULL: every row runs all T steps).
 * Forward step t: recurrent [B,G] = h_{t-1} W_h^T; gates [B,G] in/out: in
 *   x_t W_x^T (no bias), out the activations; bias [G]; old_cell [B,H]
 *   c_{t-1}; new_h, new_cell [B,H] out: h_t, c_t (rows past their length:
 *   gates 0, h_t 0, c_t = c_{t-1}).
 * Backward step t of T: grad_output [B,H] dL/dh_t from the output; grad_h
 *   [B,H] dL/dh_t through step t+1, grad_h_n [B,H] from h_n (used at each
 *   row's last step, lengths[b] - 1 or T - 1); grad_c_next [B,H] dL/dc_t;
 *   grad_cell [B,H] out: dL/dc_{t-1} (may be grad_c_next: in place; for
 *   rows past their length dL/dc_t, and their gate gradients are 0); cell
 *   [B,H] c_t; gates [B,G] activations; grad_gates [B,G] out. The bias
 *   gradient, without atomics: bias_parts [P,G] of the accumulation type
 *   (float32 for float16/bfloat16), P = lltm_sequence_step_bias_parts(B, H),
 *   one line per block of rows, written at step T - 1 and added to at the
 *   steps after it (so the steps run T - 1 down to 0, as the layer does);
 *   lltm_sequence_bias_sum_cuda sums the lines in order into grad_bias [G]
 *   of the dtype at the end (deterministic). */
int lltm_sequence_forward_step_cuda(lltm_dtype dtype, int64_t B, int64_t H, int64_t t,
                                    const int64_t *lengths, const void *recurrent,
                                    void *gates, const void *bias, const void *old_cell,
                                    void *new_h, void *new_cell, void *stream);
/* The rows of the batch one block of the backward step takes: a multiple
 * of its 8 slices of rows, from 8 (a row a thread) to 64 (8 rows a thread:
 * a thread's rows run one after another), so that the grid of 32-unit
 * blocks x row blocks holds about 4096 blocks (the GPU full at any H; the
 * H100 holds ~1000 such blocks at once) and at most 65535 blocks of rows.
 * The bias sums have one line per block of rows: P =
 * lltm_sequence_step_bias_parts. */
static inline int64_t lltm_sequence_step_rows(int64_t B, int64_t H)
{
    const int64_t unit_blocks = H > 0 ? (H + 31) / 32 : 1;
    const int64_t want = (4096 + unit_blocks - 1) / unit_blocks;
    int64_t rows = ((B + want - 1) / want + 7) / 8 * 8;
    const int64_t fit = ((B + 65534) / 65535 + 7) / 8 * 8;
    rows = rows < 8 ? 8 : rows > 64 ? 64 : rows;
    return rows > fit ? rows : fit;
}
int64_t lltm_sequence_step_bias_parts(int64_t B, int64_t H);
int lltm_sequence_backward_step_cuda(lltm_dtype dtype, int64_t B, int64_t H, int64_t t,
                                     int64_t T, const int64_t *lengths,
                                     const void *grad_output, const void *grad_h,
                                     const void *grad_h_n, const void *grad_c_next,
                                     void *grad_cell, const void *cell, const void *gates,
                                     void *grad_gates, void *bias_parts, void *stream);
/* h_n [B,H] = row b of output [T,B,H] at step lengths[b] - 1 (lengths [B]
 * int64 on the device, each in [1, T]; others are clamped into [1, T]) */
int lltm_sequence_last_state_cuda(lltm_dtype dtype, int64_t T, int64_t B, int64_t H,
                                  const int64_t *lengths, const void *output, void *h_n,
                                  void *stream);
/* grad_bias [G] (dtype) = the sum of bias_parts [P,G] (its accumulation
 * type) over its P lines, in line order */
int lltm_sequence_bias_sum_cuda(lltm_dtype dtype, int64_t P, int64_t G, const void *bias_parts,
                                void *grad_bias, void *stream);

/* Small matrix products, for the binding where a library call (aten::mm:
 * ~40 us of host time on the GPU machine) costs more than the product's GPU
 * time: C [M,N] = A [M,K] B [K,N], element (m,k) of A at a[m*a_rs + k*a_cs],
 * (k,n) of B at b[k*b_rs + n*b_cs], C row-major (row stride ldc); each sum
 * in k order in the accumulation type (deterministic). lltm_small_mm_fits:
 * nonzero for the sizes the rules give it (lltm_cuda_rules.h); the call
 * returns LLTM_ERR_ARGUMENT for the others. */
int lltm_small_mm_fits(int64_t M, int64_t N, int64_t K);
int lltm_small_mm_cuda(lltm_dtype dtype, int64_t M, int64_t N, int64_t K, const void *a,
                       int64_t a_rs, int64_t a_cs, const void *b, int64_t b_rs, int64_t b_cs,
                       void *c, int64_t ldc, void *stream);

/* Stream-ordered device-to-device copy and zero fill; join_rows: `rows`
 * rows of dst [rows, a_bytes + b_bytes] = [a | b], a's rows a_bytes long,
 * b's b_bytes (one launch). */
int lltm_cuda_copy(void *dst, const void *src, size_t bytes, void *stream);
int lltm_cuda_join_rows(void *dst, const void *a, size_t a_bytes, const void *b,
                        size_t b_bytes, size_t rows, void *stream);
int lltm_cuda_zero(void *dst, size_t bytes, void *stream);
/* 1 if `stream` is being captured into a CUDA graph, 0 if not (or unknown) */
int lltm_cuda_stream_capturing(void *stream);

#ifdef __cplusplus
}
#endif

#endif /* LLTM_CORE_LLTM_H */
