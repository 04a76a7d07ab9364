/*
 * lltm_cuda_cell_forward.cu - the fused forward of the CUDA cell: one kernel,
 * its launcher and lltm_cell_forward_fused_cuda
 * (lltm_cuda_cell.cuh describes the cell's kernels).
 */
#include "lltm_cuda_cell.cuh"

namespace {

/*
 * Block: TB rows x TU units (3*TU gate rows of W), KS groups of threads each
 * summing every KS-th k of a chunk (more threads for small problems; the
 * groups' partial sums meet in shared memory at the end). Thread (tx, ty) of
 * a group owns rows ty + i*TY and units tx + j*TX, all three gates of each.
 * Chunks of KC columns of X and W are staged in shared memory (transposed,
 * k-major), the next chunk's global loads in flight in registers while the
 * current one is multiplied.
 */
template <typename T, int TB, int TU, int RB, int RU, int KC, int KS>
__global__ void __launch_bounds__((TB / RB) * (TU / RU) * KS)
forward_fused_kernel(int64_t B, int64_t I, int64_t H, const T *__restrict__ input,
                     const T *__restrict__ old_h, const T *__restrict__ weights,
                     const T *__restrict__ bias, const T *__restrict__ old_cell,
                     T *__restrict__ new_h, T *__restrict__ new_cell, T *__restrict__ gates)
{
    typedef typename acc_of<T>::type A;
    constexpr int TX = TU / RU, TY = TB / RB, GROUP = TX * TY, NT = GROUP * KS;
    constexpr int GU = 3 * TU;
    constexpr int LX = (TB * KC + NT - 1) / NT, LW = (GU * KC + NT - 1) / NT;
    __shared__ A xs[KC][TB + 1];
    __shared__ A ws[KC][GU + 1];
    __shared__ A partial[KS > 1 ? (KS - 1) * GROUP * RB * 3 * RU : 1];

    const int tid = threadIdx.x;
    const int split = tid / GROUP, tx = tid % TX, ty = (tid / TX) % TY;
    const int64_t b0 = (int64_t)blockIdx.x * TB, u0 = (int64_t)blockIdx.y * TU;
    const int64_t K = I + H;

    A acc[RB][3][RU];
#pragma unroll
    for (int i = 0; i < RB; ++i)
#pragma unroll
        for (int g = 0; g < 3; ++g)
#pragma unroll
            for (int j = 0; j < RU; ++j)
                acc[i][g][j] = 0;

    /* The epilogue's inputs (bias, old_cell) are loaded now, by the threads
     * that finish the step, so their latency overlaps the products instead of
     * adding a global round trip at the end. */
    A bias_r[3][RU], c_prev[RB][RU];
#pragma unroll
    for (int j = 0; j < RU; ++j) {
        const int64_t u = u0 + tx + j * TX;
        const bool ok = split == 0 && u < H;
#pragma unroll
        for (int g = 0; g < 3; ++g)
            bias_r[g][j] = ok ? to_acc(bias[g * H + u]) : A(0);
#pragma unroll
        for (int i = 0; i < RB; ++i) {
            const int64_t b = b0 + ty + i * TY;
            c_prev[i][j] = (ok && b < B) ? to_acc(old_cell[b * H + u]) : A(0);
        }
    }

    A xr[LX], wr[LW];
    auto fetch = [&](int64_t k0) {
#pragma unroll
        for (int l = 0; l < LX; ++l) {
            const int e = tid + l * NT, kk = e % KC, bb = e / KC;
            const int64_t b = b0 + bb, k = k0 + kk;
            xr[l] = (e < TB * KC && b < B && k < K) ? load_x(old_h, input, I, H, b, k) : A(0);
        }
#pragma unroll
        for (int l = 0; l < LW; ++l) {
            const int e = tid + l * NT, kk = e % KC, r = e / KC;
            const int g = r / TU;
            const int64_t u = u0 + r % TU, k = k0 + kk;
            wr[l] = (e < GU * KC && u < H && k < K) ? to_acc(weights[(g * H + u) * K + k]) : A(0);
        }
    };
    fetch(0);
    for (int64_t k0 = 0; k0 < K; k0 += KC) {
#pragma unroll
        for (int l = 0; l < LX; ++l) {
            const int e = tid + l * NT;
            if (e < TB * KC)
                xs[e % KC][e / KC] = xr[l];
        }
#pragma unroll
        for (int l = 0; l < LW; ++l) {
            const int e = tid + l * NT;
            if (e < GU * KC)
                ws[e % KC][e / KC] = wr[l];
        }
        __syncthreads();
        if (k0 + KC < K)
            fetch(k0 + KC);
#pragma unroll 4
        for (int kk = split; kk < KC; kk += KS) {
            A xv[RB], wv[3][RU];
#pragma unroll
            for (int i = 0; i < RB; ++i)
                xv[i] = xs[kk][ty + i * TY];
#pragma unroll
            for (int g = 0; g < 3; ++g)
#pragma unroll
                for (int j = 0; j < RU; ++j)
                    wv[g][j] = ws[kk][g * TU + tx + j * TX];
#pragma unroll
            for (int i = 0; i < RB; ++i)
#pragma unroll
                for (int g = 0; g < 3; ++g)
#pragma unroll
                    for (int j = 0; j < RU; ++j)
                        acc[i][g][j] += xv[i] * wv[g][j];
        }
        __syncthreads();
    }

    if (KS > 1 && !add_split_sums<KS, GROUP, RB * 3 * RU>(&acc[0][0][0], partial, tid, split))
        return;

#pragma unroll
    for (int j = 0; j < RU; ++j) {
        const int64_t u = u0 + tx + j * TX;
        if (u >= H)
            continue;
#pragma unroll
        for (int i = 0; i < RB; ++i) {
            const int64_t b = b0 + ty + i * TY;
            if (b < B)
                forward_unit<T, A>(acc[i][0][j] + bias_r[0][j], acc[i][1][j] + bias_r[1][j],
                                   acc[i][2][j] + bias_r[2][j], c_prev[i][j], b, u, H, new_h,
                                   new_cell, gates);
        }
    }
}


/* One launch of forward_fused_kernel with these tiles over the step. */
template <typename T, int TB, int TU, int RB, int RU, int KC, int KS>
int launch_forward(int64_t B, int64_t I, int64_t H, const T *x, const T *h, const T *W,
                   const T *b, const T *c, T *h_out, T *c_out, T *g_out, cudaStream_t stream)
{
    return launch_tiles(forward_fused_kernel<T, TB, TU, RB, RU, KC, KS>, ceil_div(B, TB),
                        ceil_div(H, TU), (TB / RB) * (TU / RU) * KS, stream, B, I, H, x, h, W,
                        b, c, h_out, c_out, g_out);
}

template <typename T>
int forward_fused(int64_t B, int64_t I, int64_t H, const void *input, const void *old_h,
                  const void *weights, const void *bias, const void *old_cell, void *new_h,
                  void *new_cell, void *gates, cudaStream_t stream)
{
    const T *x = (const T *)input, *h = (const T *)old_h, *W = (const T *)weights,
            *b = (const T *)bias, *c = (const T *)old_cell;
    T *h_out = (T *)new_h, *c_out = (T *)new_cell, *g_out = (T *)gates;
    /* Chunks of K as long as shared memory allows (48 KB static): a small K
     * then takes one round trip to global memory. */
    constexpr int KC = sizeof(typename acc_of<T>::type) == 8 ? 96 : 192;
    switch (lltm_forward_tiles(B, H)) {
    case LLTM_TILES_LARGE:
        return launch_forward<T, 64, 32, 4, 2, 32, 1>(B, I, H, x, h, W, b, c, h_out, c_out,
                                                      g_out, stream);
    case LLTM_TILES_MEDIUM:
        /* the whole batch (up to 16 rows) in one tile row, 4 units: W read
         * once; K split 8 ways (dev/timing/cell_tiles.cu, H100,
         * B16/I256/H512: 9.3 us against 13.7 for the small tiles) */
        return launch_forward<T, 16, 4, 1, 1, KC, 8>(B, I, H, x, h, W, b, c, h_out, c_out,
                                                     g_out, stream);
    default:
        /* 8 rows x 2 units, many blocks, K split 16 ways: the shortest
         * latency of the configurations dev/timing/cell_tiles.cu timed on
         * the H100 (3.2-3.45 us per launch by graph replay at B16/I32/H128
         * in three runs, against 4.43-4.45 for 16 x 4 tiles) */
        return launch_forward<T, 8, 2, 1, 1, KC, 16>(B, I, H, x, h, W, b, c, h_out, c_out,
                                                     g_out, stream);
    }
}

} // namespace

extern "C" {

int lltm_cell_forward_fused_cuda(lltm_dtype dtype, int64_t B, int64_t I, int64_t H,
                                 const void *input, const void *old_h, const void *weights,
                                 const void *bias, const void *old_cell, void *new_h,
                                 void *new_cell, void *gates, void *stream)
{
    if (bad_sizes(B, I, H))
        return LLTM_ERR_ARGUMENT;
    if (B == 0 || H == 0)
        return LLTM_OK;
    LLTM_DISPATCH(dtype, forward_fused<T>(B, I, H, input, old_h, weights, bias, old_cell, new_h,
                                          new_cell, gates, (cudaStream_t)stream));
}

} /* extern "C" */
