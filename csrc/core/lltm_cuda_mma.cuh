/*
 * lltm_cuda_mma.cuh - tensor-core products of the persistent kernels on
 * sm_80 and newer: for the half types (float16, bfloat16) the warp-level
 * mma.sync m16n8k16 (inputs in the half type, sums in float), for float32
 * where the caller allows TF32 the m16n8k8 on TF32 (operands rounded to 10
 * mantissa bits, sums in float); their fragment loads, and the staging of
 * rows into shared memory.
 *
 * Notation of one mma, a warp's 16 x 8 tile C += A B over KT values of k
 * (KT = mma_k<T>(): 16 half-type values, 8 TF32 ones; 32 bytes of a row):
 *   A [16 rows][KT], row-major: the batch rows of a chunk (shared memory,
 *     loaded with ldmatrix.x4, which moves 32-bit pairs: a TF32 tile's four
 *     8 x 4 quarters as a half-type tile's four 8 x 8);
 *   B [KT][8 columns]: a weight slice the warp holds in registers for the
 *     whole sequence (two 32-bit registers a lane a tile);
 *   C [16][8] float: lane l holds rows l/4 and l/4 + 8, columns 2(l%4) and
 *     2(l%4) + 1.
 * Half types: lane l's B registers hold k = 2(l%4) + {0, 1} and
 * 2(l%4) + {8, 9} of column l/4, the lower k in the lower 16 bits. TF32:
 * k = l%4 and l%4 + 4. The CPU emulator of the tests (tests/cuda_emu)
 * supplies the warp operations where LLTM_CUDA_EMULATION is defined, and
 * runs the tensor-core kernels.
 */
#ifndef LLTM_CORE_CUDA_MMA_CUH
#define LLTM_CORE_CUDA_MMA_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdint.h>

#include <type_traits>

#include "lltm_cuda_math.cuh"
#include "lltm_cuda_sequence.cuh"

namespace {

using lltm_seq::NT; /* threads per block */

/* Whether the kernels being compiled form their products on tensor cores:
 * float16 and bfloat16 code for sm_80 and newer, and float32 code there of
 * the kernels instantiated for TF32. Decided per architecture at compile
 * time, so that a binary's PTX for an older GPU keeps the FFMA products;
 * the host sizes shared memory for either. */
template <typename T, bool TF32 = false> __host__ __device__ constexpr bool mma_products()
{
#if (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800) || defined(LLTM_CUDA_EMULATION)
    return std::is_same<T, __half>::value || std::is_same<T, __nv_bfloat16>::value ||
           (TF32 && std::is_same<T, float>::value);
#else
    return false;
#endif
}

/* k values of one mma: 16 of a half type, 8 of TF32 (32 bytes of a row) */
template <typename T> __host__ __device__ constexpr int mma_k()
{
    return sizeof(T) == 2 ? 16 : 8;
}

/* float bits rounded to TF32 (cvt.rna: to nearest, ties away from zero) */
__device__ __forceinline__ uint32_t tf32_bits(uint32_t bits)
{
#if defined(LLTM_CUDA_EMULATION)
    return emu::round_tf32(bits);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(__uint_as_float(bits)));
    return r;
#else
    return bits;
#endif
}

__device__ __forceinline__ uint16_t bits_of(__half x) { return __half_as_ushort(x); }
__device__ __forceinline__ uint16_t bits_of(__nv_bfloat16 x) { return __bfloat16_as_ushort(x); }

/* two values of a fragment register, `lo` in the lower half */
template <typename T> __device__ __forceinline__ uint32_t pack_pair(T lo, T hi)
{
    return (uint32_t)bits_of(lo) | ((uint32_t)bits_of(hi) << 16);
}

/* A's four registers of the 16-row tile at `row0` (this lane's address:
 * row l % 16, byte 16 (l / 16) of the tile's 32; 16-byte aligned); TF32:
 * rounded */
template <typename T> __device__ __forceinline__ void load_a_tile(uint32_t (&a)[4], const void *row0)
{
#if defined(LLTM_CUDA_EMULATION)
    emu::ldmatrix_x4(a, row0);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned addr = (unsigned)__cvta_generic_to_shared(row0);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
                 : "r"(addr));
#else
    (void)row0;
    a[0] = a[1] = a[2] = a[3] = 0;
#endif
    if constexpr (sizeof(T) == 4)
#pragma unroll
        for (int r = 0; r < 4; ++r)
            a[r] = tf32_bits(a[r]);
}

/* c += A B, one m16n8k16 tile (m16n8k8 on TF32) */
template <typename T>
__device__ __forceinline__ void mma_tile(float (&c)[4], const uint32_t (&a)[4], const uint32_t *b)
{
#if defined(LLTM_CUDA_EMULATION)
    if constexpr (std::is_same<T, float>::value)
        emu::mma_m16n8k8_tf32(c, a, b);
    else
        emu::mma_m16n8k16(c, a, b, std::is_same<T, __nv_bfloat16>::value);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if constexpr (std::is_same<T, float>::value)
        asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
                     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    else if constexpr (std::is_same<T, __nv_bfloat16>::value)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    (void)c;
    (void)a;
    (void)b;
#endif
}

/*
 * Stage rows [b0, b0+ROWS) x columns [0, KP) of src (half type or float,
 * row-major, `nrows` rows of ncols, written by other blocks: read through
 * L2) into dst[ROWS][LD], zero beyond nrows and ncols. 16-byte vectors
 * where src and its rows are 16-byte aligned (h0 is the caller's tensor,
 * any offset); loads of a group issued before its stores (one L2 round trip
 * a group). Call from every thread of the block.
 */
template <typename T, int KP, int LD, int ROWS>
__device__ __forceinline__ void stage_tile_rows(T *__restrict__ dst, const T *__restrict__ src,
                                                int64_t nrows, int64_t b0, int64_t ncols,
                                                int tid)
{
    constexpr int VN = 16 / (int)sizeof(T); /* values of a vector */
    static_assert((sizeof(T) == 2 || sizeof(T) == 4) && KP % VN == 0 && LD % VN == 0,
                  "16-byte rows");
    constexpr int GROUP = 8;
    if (ncols % VN == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0) {
        constexpr int ROW_V = KP / VN, NV = ROWS * ROW_V, PER = (NV + NT - 1) / NT;
#pragma unroll 1
        for (int n0 = 0; n0 < PER; n0 += GROUP) {
            uint4 v[GROUP];
#pragma unroll
            for (int n = 0; n < GROUP; ++n) {
                const int e = tid + (n0 + n) * NT;
                const int64_t row = b0 + e / ROW_V, k = (int64_t)(e % ROW_V) * VN;
                v[n] = make_uint4(0, 0, 0, 0);
                if (n0 + n < PER && e < NV && row < nrows && k < ncols)
                    v[n] = __ldcg(reinterpret_cast<const uint4 *>(src + row * ncols + k));
            }
#pragma unroll
            for (int n = 0; n < GROUP; ++n) {
                const int e = tid + (n0 + n) * NT;
                if (n0 + n < PER && e < NV)
                    *reinterpret_cast<uint4 *>(dst + (e / ROW_V) * LD + (e % ROW_V) * VN) = v[n];
            }
        }
    } else {
        typedef typename std::conditional<sizeof(T) == 2, uint16_t, uint32_t>::type bits;
        const bits *s_bits = reinterpret_cast<const bits *>(src);
        bits *d_bits = reinterpret_cast<bits *>(dst);
        for (int e = tid; e < ROWS * KP; e += NT) {
            const int64_t row = b0 + e / KP, k = e % KP;
            d_bits[(e / KP) * LD + k] =
                (row < nrows && k < ncols) ? __ldcg(s_bits + row * ncols + k) : (bits)0;
        }
    }
}

/* 16 bytes from global memory (through L2: other blocks wrote them) into
 * shared memory without passing registers (cp.async on sm_80+), so that a
 * thread's copies of several tiles are in flight at once; complete after
 * copy_async_wait. */
__device__ __forceinline__ void copy_async_16(void *dst, const void *src)
{
#if defined(LLTM_CUDA_EMULATION)
    emu::copy_16(dst, src);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned addr = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(addr), "l"(src) : "memory");
#else
    *reinterpret_cast<uint4 *>(dst) = __ldcg(reinterpret_cast<const uint4 *>(src));
#endif
}
/* this thread's copy_async_16 copies are complete (then a block barrier
 * makes every thread's visible) */
__device__ __forceinline__ void copy_async_wait()
{
#if !defined(LLTM_CUDA_EMULATION) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

/* stage_tile_rows with the 16-byte copies asynchronous (copy_async_16):
 * the caller issues several tiles' and waits once (copy_async_wait, then
 * a block barrier); where src or its rows are not 16-byte aligned, as
 * stage_tile_rows, complete on return. */
template <typename T, int KP, int LD, int ROWS>
__device__ __forceinline__ void stage_tile_rows_async(T *__restrict__ dst,
                                                      const T *__restrict__ src, int64_t nrows,
                                                      int64_t b0, int64_t ncols, int tid)
{
    constexpr int VN = 16 / (int)sizeof(T), ROW_V = KP / VN, NV = ROWS * ROW_V;
    static_assert((sizeof(T) == 2 || sizeof(T) == 4) && KP % VN == 0 && LD % VN == 0,
                  "16-byte rows");
    if (ncols % VN != 0 || reinterpret_cast<uintptr_t>(src) % 16 != 0) {
        stage_tile_rows<T, KP, LD, ROWS>(dst, src, nrows, b0, ncols, tid);
        return;
    }
    for (int e = tid; e < NV; e += NT) {
        const int64_t row = b0 + e / ROW_V, k = (int64_t)(e % ROW_V) * VN;
        T *to = dst + (e / ROW_V) * LD + (e % ROW_V) * VN;
        if (row < nrows && k < ncols)
            copy_async_16(to, src + row * ncols + k);
        else
            *reinterpret_cast<uint4 *>(to) = make_uint4(0, 0, 0, 0);
    }
}

/* Rows CH .. BC-1 of `count` staged tiles [BC][LD] (one after another)
 * set to zero: an mma reads all BC rows, a chunk stages its CH. Once, at
 * the start; call from every thread of the block. */
template <typename T, int CH, int LD>
__device__ __forceinline__ void zero_rows_past_chunk(T *tiles, int count, int tid)
{
    using lltm_seq::BC;
    for (int k = 0; k < count; ++k)
        for (int e = CH * LD + tid; e < BC * LD; e += NT)
            tiles[k * BC * LD + e] = from_acc<T>(0.0f);
}

/* This lane's B tiles over its warp's k range [warp*KW, warp*KW + KW):
 * wt[n][kk] holds at(column n*8 + l/4, k) for the k of the layout above
 * (T: the type `at` returns; float: rounded to TF32). */
template <typename T, int KW, int MN, int MK, typename At>
__device__ __forceinline__ void load_b_tiles(int tid, uint32_t (&wt)[MN][MK][2], At at)
{
    const int warp = tid / 32, lane = tid % 32, g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int n = 0; n < MN; ++n)
#pragma unroll
        for (int kk = 0; kk < MK; ++kk) {
            const int col = n * 8 + g;
            const int64_t k0 = (int64_t)warp * KW + kk * mma_k<T>();
            if constexpr (sizeof(T) == 4) {
                wt[n][kk][0] = tf32_bits(__float_as_uint(at(col, k0 + t4)));
                wt[n][kk][1] = tf32_bits(__float_as_uint(at(col, k0 + t4 + 4)));
            } else {
                const int64_t k = k0 + 2 * t4;
                wt[n][kk][0] = pack_pair(at(col, k), at(col, k + 1));
                wt[n][kk][1] = pack_pair(at(col, k + 8), at(col, k + 9));
            }
        }
}

/* B tiles of the forward's gate rows: column n = q*U + j of the block's
 * 3U is row q*H + unit0 + j of W_h (weights [3H, K], W_h its first H
 * columns), k its columns; zero past H. */
template <typename T, int U, int KW, int MN, int MK>
__device__ __forceinline__ void load_gate_tiles(const T *__restrict__ weights, int64_t H,
                                                int64_t K, int64_t unit0, int tid,
                                                uint32_t (&wt)[MN][MK][2])
{
    const T zero = from_acc<T>(0.0f);
    load_b_tiles<T, KW, MN, MK>(tid, wt, [&](int col, int64_t k) {
        const int64_t u = unit0 + col % U;
        return u < H && k < H ? weights[(col / U * H + u) * K + k] : zero;
    });
}

/* B tiles of the backward's unit columns: column n is unit unit0 + n of
 * W_h, k its row r; zero past 3H and H. */
template <typename T, int KW, int MN, int MK>
__device__ __forceinline__ void load_unit_tiles(const T *__restrict__ weights, int64_t H,
                                                int64_t K, int64_t unit0, int tid,
                                                uint32_t (&wt)[MN][MK][2])
{
    const T zero = from_acc<T>(0.0f);
    load_b_tiles<T, KW, MN, MK>(tid, wt, [&](int col, int64_t r) {
        const int64_t u = unit0 + col;
        return u < H && r < 3 * H ? weights[r * K + u] : zero;
    });
}

/* c += this warp's tiles of the chunk staged in a ([BC][LDA], T) times
 * its B tiles, over its k range [warp*KW, warp*KW + KW) */
template <typename T, int KW, int MN, int MK, int LDA>
__device__ __forceinline__ void tile_products(float (&c)[MN][4], const T *a,
                                              const uint32_t (&wt)[MN][MK][2], int tid)
{
    const int warp = tid / 32, lane = tid % 32;
    constexpr int KT = mma_k<T>();
    const T *a_lane = a + (lane & 15) * LDA + warp * KW + (lane >> 4) * (KT / 2);
#pragma unroll
    for (int kk = 0; kk < MK; ++kk) {
        uint32_t tile[4];
        load_a_tile<T>(tile, a_lane + kk * KT);
#pragma unroll
        for (int n = 0; n < MN; ++n)
            mma_tile<T>(c[n], tile, wt[n][kk]);
    }
}

/* this warp's sums c of the chunk's rows as float partial sums in
 * parts[warp][CH][LDP] (NOUT columns of LDP: lltm_seq::mma_parts_ld) */
template <int MN, int CH, int NOUT, int LDP>
__device__ __forceinline__ void store_parts(const float (&c)[MN][4], float *parts, int tid)
{
    static_assert(MN * 8 == NOUT && LDP >= NOUT, "columns");
    const int lane = tid % 32, g = lane >> 2, t4 = lane & 3;
    float *mine = parts + (tid / 32) * CH * LDP;
#pragma unroll
    for (int n = 0; n < MN; ++n) {
        const int col = n * 8 + 2 * t4;
        if (g < CH) {
            mine[g * LDP + col] = c[n][0];
            mine[g * LDP + col + 1] = c[n][1];
        }
        if (g + 8 < CH) {
            mine[(g + 8) * LDP + col] = c[n][2];
            mine[(g + 8) * LDP + col + 1] = c[n][3];
        }
    }
}

/* The chunk staged in a times the warps' B tiles (tile_products), as
 * partial sums in parts (store_parts); returns after the block's barrier,
 * the parts complete. */
template <typename T, int KW, int MN, int MK, int CH, int LDA, int NOUT, int LDP>
__device__ __forceinline__ void chunk_products(const T *a, const uint32_t (&wt)[MN][MK][2],
                                               float *parts, int tid)
{
    float c[MN][4];
#pragma unroll
    for (int n = 0; n < MN; ++n)
        c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.0f;
    tile_products<T, KW, MN, MK, LDA>(c, a, wt, tid);
    store_parts<MN, CH, NOUT, LDP>(c, parts, tid);
    __syncthreads();
}

/* the warps' partial sums of (row, col), added in warp order (deterministic) */
template <int CH, int LDP>
__device__ __forceinline__ float sum_parts(const float *parts, int row, int col)
{
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < NT / 32; ++w)
        sum += parts[(w * CH + row) * LDP + col];
    return sum;
}

} // namespace

#endif /* LLTM_CORE_CUDA_MMA_CUH */
