/*
 * lltm_cuda_util.cu - small generic pieces the binding uses around the
 * sequence kernels (lltm.h): a deterministic small matrix product that
 * costs one launch, stream-ordered copies (rows of two arrays joined side
 * by side too) and zero fills, whether a stream is being captured.
 */
#include "lltm_cuda_rules.h"
#include "lltm.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdint.h>

#include "lltm_cuda_launch.cuh"
#include "lltm_cuda_math.cuh"

namespace {

/* C[M,N] = A[M,K] B[K,N] for the binding's small products (see
 * lltm_small_mm_cuda): a 32 x 32 tile of C a block, 2 x 2 a thread, k in
 * steps of 32 through shared memory, each sum in k order in the
 * accumulation type (deterministic). The tiles are loaded along whichever
 * of an operand's strides is 1, so the loads coalesce for A and A^T alike. */
constexpr int MM_TILE = 32;
template <typename T>
__global__ void __launch_bounds__(256)
small_mm_kernel(int64_t M, int64_t N, int64_t K, const T *__restrict__ a, int64_t a_rs,
                int64_t a_cs, const T *__restrict__ b, int64_t b_rs, int64_t b_cs,
                T *__restrict__ c, int64_t ldc)
{
    typedef typename acc_of<T>::type A;
    __shared__ A as[MM_TILE][MM_TILE + 1], bs[MM_TILE][MM_TILE + 1]; /* as[m][k], bs[k][n] */
    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    const int64_t m0 = (int64_t)blockIdx.x * MM_TILE, n0 = (int64_t)blockIdx.y * MM_TILE;
    const bool a_by_m = a_rs == 1, b_by_k = b_rs == 1 && b_cs != 1;
    A acc[2][2] = {{0, 0}, {0, 0}};
    for (int64_t k0 = 0; k0 < K; k0 += MM_TILE) {
        for (int e = tid; e < MM_TILE * MM_TILE; e += 256) {
            const int inner = e % MM_TILE, outer = e / MM_TILE;
            const int i = a_by_m ? inner : outer, ka = a_by_m ? outer : inner;
            const int64_t m = m0 + i, k = k0 + ka;
            as[i][ka] = (m < M && k < K) ? to_acc(a[m * a_rs + k * a_cs]) : A(0);
            const int kb = b_by_k ? inner : outer, j = b_by_k ? outer : inner;
            const int64_t kk = k0 + kb, n = n0 + j;
            bs[kb][j] = (kk < K && n < N) ? to_acc(b[kk * b_rs + n * b_cs]) : A(0);
        }
        __syncthreads();
#pragma unroll 8
        for (int k = 0; k < MM_TILE; ++k) {
            const A a0 = as[2 * ty][k], a1 = as[2 * ty + 1][k];
            const A b0 = bs[k][2 * tx], b1 = bs[k][2 * tx + 1];
            acc[0][0] += a0 * b0;
            acc[0][1] += a0 * b1;
            acc[1][0] += a1 * b0;
            acc[1][1] += a1 * b1;
        }
        __syncthreads();
    }
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int q = 0; q < 2; ++q) {
            const int64_t m = m0 + 2 * ty + r, n = n0 + 2 * tx + q;
            if (m < M && n < N)
                c[m * ldc + n] = from_acc<T>(acc[r][q]);
        }
}

template <typename T>
int small_mm(int64_t M, int64_t N, int64_t K, const void *a, int64_t a_rs, int64_t a_cs,
             const void *b, int64_t b_rs, int64_t b_cs, void *c, int64_t ldc,
             cudaStream_t stream)
{
    const dim3 grid((unsigned)ceil_div(M, MM_TILE), (unsigned)ceil_div(N, MM_TILE));
    LLTM_LAUNCH(grid, 256, 0, stream, small_mm_kernel<T>)(M, N, K, (const T *)a, a_rs, a_cs,
                                                 (const T *)b, b_rs, b_cs, (T *)c, ldc);
    return launch_status(cudaGetLastError());
}

/* dst row r = [row r of a | row r of b] (lltm_cuda_join_rows), in units
 * of U: one unit a thread, grid-stride */
template <typename U>
__global__ void __launch_bounds__(256)
join_rows_kernel(U *__restrict__ dst, const U *__restrict__ a, int64_t na,
                 const U *__restrict__ b, int64_t nb, int64_t rows)
{
    const int64_t n = na + nb, total = rows * n;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / n, c = i - r * n;
        dst[i] = c < na ? a[r * na + c] : b[r * nb + (c - na)];
    }
}

template <typename U>
int join_rows(void *dst, const void *a, size_t a_bytes, const void *b, size_t b_bytes,
              size_t rows, cudaStream_t stream)
{
    const int64_t na = (int64_t)(a_bytes / sizeof(U)), nb = (int64_t)(b_bytes / sizeof(U));
    LLTM_LAUNCH(pointwise_blocks((int64_t)rows * (na + nb), 256), 256, 0, stream,
                join_rows_kernel<U>)((U *)dst, (const U *)a, na, (const U *)b, nb, (int64_t)rows);
    return launch_status(cudaGetLastError());
}

} // namespace

extern "C" {

int lltm_cuda_stream_capturing(void *stream)
{
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing((cudaStream_t)stream, &status) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return status != cudaStreamCaptureStatusNone;
}

int lltm_small_mm_fits(int64_t M, int64_t N, int64_t K)
{
    return M >= 0 && N >= 0 && K >= 0 && K <= LLTM_SMALL_MM_MAX_K && N <= 65535LL * MM_TILE &&
           (double)M * (double)N * (double)K <= (double)LLTM_SMALL_MM_MAX_PRODUCT;
}

int lltm_small_mm_cuda(lltm_dtype dtype, int64_t M, int64_t N, int64_t K, const void *a,
                       int64_t a_rs, int64_t a_cs, const void *b, int64_t b_rs, int64_t b_cs,
                       void *c, int64_t ldc, void *stream)
{
    if (!lltm_small_mm_fits(M, N, K))
        return LLTM_ERR_ARGUMENT;
    if (M == 0 || N == 0)
        return LLTM_OK;
    LLTM_DISPATCH(dtype, small_mm<T>(M, N, K, a, a_rs, a_cs, b, b_rs, b_cs, c, ldc,
                                     (cudaStream_t)stream));
}

int lltm_cuda_copy(void *dst, const void *src, size_t bytes, void *stream)
{
    if (bytes == 0)
        return LLTM_OK;
    return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, (cudaStream_t)stream) ==
                   cudaSuccess
               ? LLTM_OK
               : (cudaGetLastError(), LLTM_ERR_CUDA);
}

int lltm_cuda_join_rows(void *dst, const void *a, size_t a_bytes, const void *b,
                        size_t b_bytes, size_t rows, void *stream)
{
    if (rows == 0 || a_bytes + b_bytes == 0)
        return LLTM_OK;
    if (!dst || (a_bytes && !a) || (b_bytes && !b))
        return LLTM_ERR_ARGUMENT;
    /* the widest unit (16 bytes down to 1) that every row and address is a
     * multiple of */
    const uintptr_t bits = (uintptr_t)dst | (uintptr_t)a | (uintptr_t)b | a_bytes | b_bytes;
    cudaStream_t s = (cudaStream_t)stream;
    if (bits % 16 == 0)
        return join_rows<uint4>(dst, a, a_bytes, b, b_bytes, rows, s);
    if (bits % 8 == 0)
        return join_rows<uint64_t>(dst, a, a_bytes, b, b_bytes, rows, s);
    if (bits % 4 == 0)
        return join_rows<uint32_t>(dst, a, a_bytes, b, b_bytes, rows, s);
    if (bits % 2 == 0)
        return join_rows<uint16_t>(dst, a, a_bytes, b, b_bytes, rows, s);
    return join_rows<uint8_t>(dst, a, a_bytes, b, b_bytes, rows, s);
}

int lltm_cuda_zero(void *dst, size_t bytes, void *stream)
{
    if (bytes == 0)
        return LLTM_OK;
    return cudaMemsetAsync(dst, 0, bytes, (cudaStream_t)stream) == cudaSuccess
               ? LLTM_OK
               : (cudaGetLastError(), LLTM_ERR_CUDA);
}

} /* extern "C" */
