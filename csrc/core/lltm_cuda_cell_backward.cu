/*
 * lltm_cuda_cell_backward.cu - the fused backward of the CUDA cell: its two
 * kernels, their launcher and lltm_cell_backward_fused_cuda
 * (lltm_cuda_cell.cuh describes the cell's kernels).
 */
#include "lltm_cuda_cell.cuh"

namespace {

/*
 * dW tile: TU units (rows g*H + u of dW for g = 0..2) x TK columns, summed
 * over the batch in chunks of BC rows. Per chunk the block first forms the
 * gate gradients of its units for those rows (shared memory ds[BC][3TU]) and
 * stages X (xs[BC][TK]); thread (tr, tc) owns dW rows tr + i*TR and columns
 * tc + j*TC. Blocks of the first column tile also write dG, d_old_cell and
 * the bias gradient of their units (every column tile needs dG, but only one
 * writes it). With grad_weights NULL only the first column tile runs (the
 * caller launches one), for dG, d_old_cell and the bias gradient.
 */
template <typename T, int TU, int TK, int RR, int RC, int BC>
__global__ void __launch_bounds__((3 * TU / RR) * (TK / RC))
backward_weights_kernel(int64_t B, int64_t I, int64_t H, const T *__restrict__ grad_h,
                        const T *__restrict__ grad_cell, const T *__restrict__ new_cell,
                        const T *__restrict__ gates, const T *__restrict__ input,
                        const T *__restrict__ old_h, T *__restrict__ grad_gates,
                        T *__restrict__ grad_old_cell, T *__restrict__ grad_bias,
                        T *__restrict__ grad_weights)
{
    typedef typename acc_of<T>::type A;
    constexpr int GU = 3 * TU, TR = GU / RR, TC = TK / RC, NT = TR * TC;
    __shared__ A ds[BC][GU];
    __shared__ A xs[BC][TK];

    const int tid = threadIdx.x, tc = tid % TC, tr = tid / TC;
    const int64_t u0 = (int64_t)blockIdx.y * TU, k0 = (int64_t)blockIdx.x * TK;
    const int64_t K = I + H;
    const bool first_tile = blockIdx.x == 0;

    A acc[RR][RC];
#pragma unroll
    for (int i = 0; i < RR; ++i)
#pragma unroll
        for (int j = 0; j < RC; ++j)
            acc[i][j] = 0;
    A bias_sum = 0; /* threads tid < GU: bias gradient of gate row tid */

    for (int64_t c0 = 0; c0 < B; c0 += BC) {
        for (int e = tid; e < BC * TU; e += NT) {
            const int bb = e / TU, uu = e % TU;
            const int64_t b = c0 + bb, u = u0 + uu;
            A d[3] = {0, 0, 0}, dc;
            if (b < B && u < H) {
                backward_unit<T, A>(b, u, H, grad_h, grad_cell, new_cell, gates, d, &dc);
                if (first_tile) {
                    store_gates<T>(grad_gates + b * 3 * H, H, u, d[0], d[1], d[2]);
                    grad_old_cell[b * H + u] = from_acc<T>(dc);
                }
            }
            ds[bb][uu] = d[0];
            ds[bb][TU + uu] = d[1];
            ds[bb][2 * TU + uu] = d[2];
        }
        for (int e = tid; e < BC * TK; e += NT) {
            const int bb = e / TK, kk = e % TK;
            const int64_t b = c0 + bb, k = k0 + kk;
            xs[bb][kk] = (b < B && k < K) ? load_x(old_h, input, I, H, b, k) : A(0);
        }
        __syncthreads();
        if (first_tile && tid < GU) {
            for (int bb = 0; bb < BC; ++bb)
                bias_sum += ds[bb][tid];
        }
#pragma unroll 4
        for (int bb = 0; bb < BC; ++bb) {
            A dv[RR], xv[RC];
#pragma unroll
            for (int i = 0; i < RR; ++i)
                dv[i] = ds[bb][tr + i * TR];
#pragma unroll
            for (int j = 0; j < RC; ++j)
                xv[j] = xs[bb][tc + j * TC];
#pragma unroll
            for (int i = 0; i < RR; ++i)
#pragma unroll
                for (int j = 0; j < RC; ++j)
                    acc[i][j] += dv[i] * xv[j];
        }
        __syncthreads();
    }

    if (first_tile && tid < GU) {
        const int64_t u = u0 + tid % TU;
        if (u < H)
            grad_bias[(tid / TU) * H + u] = from_acc<T>(bias_sum);
    }
    if (grad_weights == nullptr)
        return;
#pragma unroll
    for (int i = 0; i < RR; ++i) {
        const int r = tr + i * TR;
        const int64_t u = u0 + r % TU;
        if (u >= H)
            continue;
        T *wrow = grad_weights + ((r / TU) * H + u) * K;
#pragma unroll
        for (int j = 0; j < RC; ++j) {
            const int64_t k = k0 + tc + j * TC;
            if (k < K)
                wrow[k] = from_acc<T>(acc[i][j]);
        }
    }
}

/*
 * dX = dG W: [B, K] = [B, G] x [G, K]. Block: TB rows x TK columns, KS thread
 * groups splitting each chunk of GC gate rows. Thread (tc, tb) owns rows
 * tb + i*TY, columns tc + j*TX. Column k < H goes to grad_old_h, the rest to
 * grad_input (no [B, K] intermediate); either may be NULL (not written).
 */
template <typename T, int TB, int TK, int RB, int RC, int GC, int KS>
__global__ void __launch_bounds__((TB / RB) * (TK / RC) * KS)
backward_inputs_kernel(int64_t B, int64_t I, int64_t H, const T *__restrict__ grad_gates,
                       const T *__restrict__ weights, T *__restrict__ grad_input,
                       T *__restrict__ grad_old_h)
{
    typedef typename acc_of<T>::type A;
    constexpr int TX = TK / RC, TY = TB / RB, GROUP = TX * TY, NT = GROUP * KS;
    constexpr int LD = (TB * GC + NT - 1) / NT, LW = (GC * TK + NT - 1) / NT;
    __shared__ A dsm[GC][TB + 1];
    __shared__ A wsm[GC][TK];
    __shared__ A partial[KS > 1 ? (KS - 1) * GROUP * RB * RC : 1];

    const int tid = threadIdx.x;
    const int split = tid / GROUP, tx = tid % TX, ty = (tid / TX) % TY;
    const int64_t b0 = (int64_t)blockIdx.x * TB, k0 = (int64_t)blockIdx.y * TK;
    const int64_t K = I + H, G = 3 * H;

    A acc[RB][RC];
#pragma unroll
    for (int i = 0; i < RB; ++i)
#pragma unroll
        for (int j = 0; j < RC; ++j)
            acc[i][j] = 0;

    A dr[LD], wr[LW];
    auto fetch = [&](int64_t g0) {
#pragma unroll
        for (int l = 0; l < LD; ++l) {
            const int e = tid + l * NT, gg = e % GC, bb = e / GC;
            const int64_t b = b0 + bb, g = g0 + gg;
            dr[l] = (e < TB * GC && b < B && g < G) ? to_acc(grad_gates[b * G + g]) : A(0);
        }
#pragma unroll
        for (int l = 0; l < LW; ++l) {
            const int e = tid + l * NT, kk = e % TK, gg = e / TK;
            const int64_t g = g0 + gg, k = k0 + kk;
            wr[l] = (e < GC * TK && g < G && k < K) ? to_acc(weights[g * K + k]) : A(0);
        }
    };
    fetch(0);
    for (int64_t g0 = 0; g0 < G; g0 += GC) {
#pragma unroll
        for (int l = 0; l < LD; ++l) {
            const int e = tid + l * NT;
            if (e < TB * GC)
                dsm[e % GC][e / GC] = dr[l];
        }
#pragma unroll
        for (int l = 0; l < LW; ++l) {
            const int e = tid + l * NT;
            if (e < GC * TK)
                wsm[e / TK][e % TK] = wr[l];
        }
        __syncthreads();
        if (g0 + GC < G)
            fetch(g0 + GC);
#pragma unroll 4
        for (int gg = split; gg < GC; gg += KS) {
            A dv[RB], wv[RC];
#pragma unroll
            for (int i = 0; i < RB; ++i)
                dv[i] = dsm[gg][ty + i * TY];
#pragma unroll
            for (int j = 0; j < RC; ++j)
                wv[j] = wsm[gg][tx + j * TX];
#pragma unroll
            for (int i = 0; i < RB; ++i)
#pragma unroll
                for (int j = 0; j < RC; ++j)
                    acc[i][j] += dv[i] * wv[j];
        }
        __syncthreads();
    }

    if (KS > 1 && !add_split_sums<KS, GROUP, RB * RC>(&acc[0][0], partial, tid, split))
        return;

#pragma unroll
    for (int i = 0; i < RB; ++i) {
        const int64_t b = b0 + ty + i * TY;
        if (b >= B)
            continue;
#pragma unroll
        for (int j = 0; j < RC; ++j) {
            const int64_t k = k0 + tx + j * TX;
            if (k < H) {
                if (grad_old_h != nullptr)
                    grad_old_h[b * H + k] = from_acc<T>(acc[i][j]);
            } else if (k < K && grad_input != nullptr) {
                grad_input[b * I + (k - H)] = from_acc<T>(acc[i][j]);
            }
        }
    }
}


/* One launch of backward_weights_kernel with these tiles (one column tile
 * when dW is not wanted: dG, d_old_cell and d_bias alone). */
template <typename T, int TU, int TK, int RR, int RC, int BC>
int launch_weights(int64_t B, int64_t I, int64_t H, const T *gh, const T *gc, const T *cn,
                   const T *act, const T *x, const T *h, T *dg, T *dc, T *db, T *dW,
                   cudaStream_t stream)
{
    return launch_tiles(backward_weights_kernel<T, TU, TK, RR, RC, BC>,
                        dW ? ceil_div(I + H, TK) : 1, ceil_div(H, TU), (3 * TU / RR) * (TK / RC),
                        stream, B, I, H, gh, gc, cn, act, x, h, dg, dc, db, dW);
}

/* One launch of backward_inputs_kernel with these tiles. */
template <typename T, int TB, int TK, int RB, int RC, int GC, int KS>
int launch_inputs(int64_t B, int64_t I, int64_t H, const T *dg, const T *W, T *dx, T *dh,
                  cudaStream_t stream)
{
    return launch_tiles(backward_inputs_kernel<T, TB, TK, RB, RC, GC, KS>, ceil_div(B, TB),
                        ceil_div(I + H, TK), (TB / RB) * (TK / RC) * KS, stream, B, I, H, dg, W,
                        dx, dh);
}

template <typename T>
int weights_step(int64_t B, int64_t I, int64_t H, const T *gh, const T *gc, const T *cn,
                 const T *act, const T *x, const T *h, T *dg, T *dc, T *db, T *dW,
                 cudaStream_t stream)
{
    switch (lltm_weights_tiles(I, H)) {
    case LLTM_TILES_LARGE:
        return launch_weights<T, 32, 128, 6, 8, 16>(B, I, H, gh, gc, cn, act, x, h, dg, dc, db,
                                                    dW, stream);
    case LLTM_TILES_MEDIUM:
        /* dev/timing/cell_tiles.cu, H100: 5.3 us at B16/I256/H512 against
         * 9.5 for the small tiles, 4.6 against 7.6 at B1 */
        return launch_weights<T, 16, 64, 3, 4, 16>(B, I, H, gh, gc, cn, act, x, h, dg, dc, db,
                                                   dW, stream);
    default:
        /* timed by dev/timing/cell_tiles.cu on the H100 at B16/I32/H128:
         * 2.78 us per launch against 3.12 for 32-column tiles */
        return launch_weights<T, 8, 16, 3, 1, 16>(B, I, H, gh, gc, cn, act, x, h, dg, dc, db,
                                                  dW, stream);
    }
}

template <typename T>
int inputs_step(int64_t B, int64_t I, int64_t H, const T *dg, const T *W, T *dx, T *dh,
                cudaStream_t stream)
{
    /* gate rows staged in shared memory as far as its 48 KB allow */
    constexpr bool wide = sizeof(typename acc_of<T>::type) == 8;
    switch (lltm_inputs_tiles(B, I, H)) {
    case LLTM_TILES_LARGE:
        return launch_inputs<T, 32, 64, 2, 4, 32, 1>(B, I, H, dg, W, dx, dh, stream);
    case LLTM_TILES_MEDIUM:
        /* 16 rows x 8 columns, gate rows split 8 ways (dev/timing/cell_tiles.cu,
         * H100, B16/I256/H512: 11.2 us against 18.8 for the small tiles) */
        return launch_inputs<T, 16, 8, 2, 1, wide ? 96 : 192, 8>(B, I, H, dg, W, dx, dh, stream);
    default:
        /* 8 rows x 4 columns, gate rows split 8 ways: 3.18 us per launch
         * against 6.54 for 16 x 8 tiles (dev/timing/cell_tiles.cu, H100,
         * B16/I32/H128) */
        return launch_inputs<T, 8, 4, 1, 1, wide ? 128 : 384, 8>(B, I, H, dg, W, dx, dh, stream);
    }
}

template <typename T>
int backward_fused(int64_t B, int64_t I, int64_t H, const void *grad_h, const void *grad_cell,
                   const void *new_cell, const void *gates, const void *input,
                   const void *old_h, const void *weights, void *grad_gates, void *grad_input,
                   void *grad_weights, void *grad_bias, void *grad_old_h, void *grad_old_cell,
                   cudaStream_t stream)
{
    const T *W = (const T *)weights;
    T *dg = (T *)grad_gates, *dx = (T *)grad_input, *dh = (T *)grad_old_h;
    /* dG, d_old_cell, d_bias, dW: needed even for B == 0 (zero gradients). */
    if (H > 0) {
        const int status = weights_step<T>(
            B, I, H, (const T *)grad_h, (const T *)grad_cell, (const T *)new_cell,
            (const T *)gates, (const T *)input, (const T *)old_h, dg, (T *)grad_old_cell,
            (T *)grad_bias, (T *)grad_weights, stream);
        if (status != LLTM_OK)
            return status;
    }
    /* dX = dG W; with H == 0 this writes zeros into grad_input. */
    if (B > 0 && I + H > 0 && (dx != nullptr || dh != nullptr))
        return inputs_step<T>(B, I, H, dg, W, dx, dh, stream);
    return LLTM_OK;
}

} // namespace

extern "C" {

int lltm_cell_backward_fused_cuda(lltm_dtype dtype, int64_t B, int64_t I, int64_t H,
                                  const void *grad_h, const void *grad_cell,
                                  const void *new_cell, const void *gates, const void *input,
                                  const void *old_h, const void *weights, void *grad_gates,
                                  void *grad_input, void *grad_weights, void *grad_bias,
                                  void *grad_old_h, void *grad_old_cell, void *stream)
{
    if (bad_sizes(B, I, H))
        return LLTM_ERR_ARGUMENT;
    LLTM_DISPATCH(dtype, backward_fused<T>(B, I, H, grad_h, grad_cell, new_cell, gates, input,
                                           old_h, weights, grad_gates, grad_input, grad_weights,
                                           grad_bias, grad_old_h, grad_old_cell,
                                           (cudaStream_t)stream));
}

} /* extern "C" */
