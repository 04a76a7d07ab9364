/*
 * lltm_cpu_gemm.c - float32 c = a b with b packed in 16-column panels
 * (lltm_cpu_gemm.h): one micro-kernel per instruction set, chosen by the
 * CPU's features at the first call (lltm_cpu_set_isa forces one).
 *
 * A tile is MR rows x NP panels of c held in registers while k runs over all
 * of K: AVX-512 8 rows x 2 panels (16 zmm accumulators), AVX2 6 x 1 (12 ymm),
 * the baseline 4 x 1 in plain C. Rows run in blocks of ROW_BLOCK, within
 * them the panels, so a block of a stays in cache while b's panels stream.
 */
#include "lltm_cpu_gemm.h"

#include <stdatomic.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define LLTM_X86 1
#endif

#define ROW_BLOCK 128

/* Rows [k_lo, k_hi) of a row-major b [.,N] (row k at b + k*b_rs) into the
 * packed form of a b of ldp rows: each row read whole, in order, and copied
 * a panel's width at a time (a panel's walk down k would take one cache
 * line a row, each a miss to memory where rows are far apart). */
static void pack_rows(int64_t N, int64_t k_lo, int64_t k_hi, const float *b, int64_t b_rs,
                      int64_t ldp, float *packed)
{
    for (int64_t k = k_lo; k < k_hi; ++k) {
        const float *row = b + k * b_rs;
        for (int64_t n0 = 0; n0 < N; n0 += LLTM_PANEL) {
            float *dst = packed + (n0 * ldp + k * LLTM_PANEL);
            const int64_t cols = N - n0 < LLTM_PANEL ? N - n0 : LLTM_PANEL;
            memcpy(dst, row + n0, (size_t)cols * sizeof(float));
            memset(dst + cols, 0, (size_t)(LLTM_PANEL - cols) * sizeof(float));
        }
    }
}

void lltm_pack_f32(int64_t N, int64_t K, const float *b, int64_t b_rs, int64_t b_cs,
                   float *packed)
{
    /* read along b's rows or columns, whichever is contiguous */
    if (b_rs != 1 && b_cs == 1) {
        pack_rows(N, 0, K, b, b_rs, K, packed);
        return;
    }
    for (int64_t p = 0; p * LLTM_PANEL < N; ++p) {
        float *dst = packed + p * K * LLTM_PANEL;
        const int64_t n0 = p * LLTM_PANEL, cols = N - n0 < LLTM_PANEL ? N - n0 : LLTM_PANEL;
        if (b_rs == 1) {
            for (int64_t j = 0; j < LLTM_PANEL; ++j)
                for (int64_t k = 0; k < K; ++k)
                    dst[k * LLTM_PANEL + j] = j < cols ? b[k + (n0 + j) * b_cs] : 0.0f;
        } else {
            for (int64_t k = 0; k < K; ++k)
                for (int64_t j = 0; j < LLTM_PANEL; ++j)
                    dst[k * LLTM_PANEL + j] = j < cols ? b[k * b_rs + (n0 + j) * b_cs] : 0.0f;
        }
    }
}

/* One tile: R rows (R <= MR) of c from row r0 of a, panels p .. p+NP-1 (fewer
 * at the end of N). The body is instantiated per instruction set with R a
 * constant (tile_R below), so the accumulators live in registers. */
#define TILE_ARGS const lltm_mm *x, int64_t r0, int64_t p, int two
#define COLS(p_) (x->N - (p_) * LLTM_PANEL < LLTM_PANEL ? x->N - (p_) * LLTM_PANEL : LLTM_PANEL)

/* Baseline: a vector of GCC's extension, 4 SSE registers on plain x86-64. */
typedef float v16 __attribute__((vector_size(64)));

__attribute__((always_inline)) static inline void tile_base(const int R, TILE_ARGS)
{
    (void)two; /* one panel a tile */
    v16 acc[2] = {{0}};
    const int64_t K = x->K, lda = x->lda, a_cs = x->a_cs, cols = COLS(p);
    const float *bp = x->packed + p * x->ldp * LLTM_PANEL, *a = x->a + r0 * lda;
    for (int64_t k = 0; k < K; ++k) {
        v16 b;
        memcpy(&b, bp + k * LLTM_PANEL, sizeof b);
        for (int r = 0; r < R; ++r)
            acc[r] += a[r * lda + k * a_cs] * b;
    }
    for (int r = 0; r < R; ++r) {
        float *c = x->c + (r0 + r) * x->ldc + p * LLTM_PANEL;
        for (int j = 0; j < cols; ++j)
            c[j] = x->accumulate ? c[j] + acc[r][j] : acc[r][j];
    }
}

#ifdef LLTM_X86
__attribute__((target("avx2,fma"), always_inline)) static inline void
tile_avx2(const int R, TILE_ARGS)
{
    (void)two; /* one panel a tile */
    __m256 acc[6][2];
    for (int r = 0; r < R; ++r)
        acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    const int64_t K = x->K, lda = x->lda, a_cs = x->a_cs;
    const float *bp = x->packed + p * x->ldp * LLTM_PANEL, *a = x->a + r0 * lda;
    for (int64_t k = 0; k < K; ++k) {
        const __m256 b0 = _mm256_loadu_ps(bp + k * LLTM_PANEL);
        const __m256 b1 = _mm256_loadu_ps(bp + k * LLTM_PANEL + 8);
        for (int r = 0; r < R; ++r) {
            const __m256 av = _mm256_broadcast_ss(a + r * lda + k * a_cs);
            acc[r][0] = _mm256_fmadd_ps(av, b0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(av, b1, acc[r][1]);
        }
    }
    const __m256i cols = _mm256_set1_epi32((int)COLS(p)), lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i m0 = _mm256_cmpgt_epi32(cols, lane);
    const __m256i m1 = _mm256_cmpgt_epi32(cols, _mm256_add_epi32(lane, _mm256_set1_epi32(8)));
    for (int r = 0; r < R; ++r) {
        float *c = x->c + (r0 + r) * x->ldc + p * LLTM_PANEL;
        if (x->accumulate) {
            acc[r][0] = _mm256_add_ps(acc[r][0], _mm256_maskload_ps(c, m0));
            acc[r][1] = _mm256_add_ps(acc[r][1], _mm256_maskload_ps(c + 8, m1));
        }
        _mm256_maskstore_ps(c, m0, acc[r][0]);
        _mm256_maskstore_ps(c + 8, m1, acc[r][1]);
    }
}

/* Two panels at once where two remain in the range (two), else one. */
__attribute__((target("avx512f"), always_inline)) static inline void
tile_avx512(const int R, TILE_ARGS)
{
    __m512 acc[8][2];
    for (int r = 0; r < R; ++r)
        acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    const int64_t K = x->K, lda = x->lda, a_cs = x->a_cs, ldp = x->ldp;
    const float *bp = x->packed + p * ldp * LLTM_PANEL, *a = x->a + r0 * lda;
    if (two) {
        for (int64_t k = 0; k < K; ++k) {
            const __m512 b0 = _mm512_loadu_ps(bp + k * LLTM_PANEL);
            const __m512 b1 = _mm512_loadu_ps(bp + (ldp + k) * LLTM_PANEL);
            for (int r = 0; r < R; ++r) {
                const __m512 av = _mm512_set1_ps(a[r * lda + k * a_cs]);
                acc[r][0] = _mm512_fmadd_ps(av, b0, acc[r][0]);
                acc[r][1] = _mm512_fmadd_ps(av, b1, acc[r][1]);
            }
        }
    } else {
        for (int64_t k = 0; k < K; ++k) {
            const __m512 b0 = _mm512_loadu_ps(bp + k * LLTM_PANEL);
            for (int r = 0; r < R; ++r)
                acc[r][0] = _mm512_fmadd_ps(_mm512_set1_ps(a[r * lda + k * a_cs]), b0, acc[r][0]);
        }
    }
    const __mmask16 m0 = (__mmask16)((1u << COLS(p)) - 1);
    const __mmask16 m1 = two ? (__mmask16)((1u << COLS(p + 1)) - 1) : 0;
    for (int r = 0; r < R; ++r) {
        float *c = x->c + (r0 + r) * x->ldc + p * LLTM_PANEL;
        if (x->accumulate) {
            acc[r][0] = _mm512_add_ps(acc[r][0], _mm512_maskz_loadu_ps(m0, c));
            if (two)
                acc[r][1] = _mm512_add_ps(acc[r][1], _mm512_maskz_loadu_ps(m1, c + LLTM_PANEL));
        }
        _mm512_mask_storeu_ps(c, m0, acc[r][0]);
        if (two)
            _mm512_mask_storeu_ps(c + LLTM_PANEL, m1, acc[r][1]);
    }
}
#endif

/* Rows [r_lo, r_hi) of panels [lo, hi) on one instruction set: NP panels a
 * tile, MR rows a tile, the last tile of a block with the rows left (R a
 * constant in each case of the switch). */
#define DEFINE_PANELS(ISA, TARGET, MR, NP)                                          \
    TARGET static void panels_##ISA(const lltm_mm *x, int64_t r_lo, int64_t r_hi,   \
                                    int64_t lo, int64_t hi)                         \
    {                                                                               \
        for (int64_t b0 = r_lo; b0 < r_hi; b0 += ROW_BLOCK) {                       \
            const int64_t b1 = b0 + ROW_BLOCK < r_hi ? b0 + ROW_BLOCK : r_hi;       \
            for (int64_t p = lo; p < hi; p += NP)                                   \
                for (int64_t r = b0; r < b1; r += MR) {                             \
                    const int two = p + 1 < hi;                                     \
                    switch (b1 - r < MR ? b1 - r : MR) {                            \
                    case 1: tile_##ISA(1, x, r, p, two); break;                     \
                    case 2: tile_##ISA(2 < MR ? 2 : MR, x, r, p, two); break;       \
                    case 3: tile_##ISA(3 < MR ? 3 : MR, x, r, p, two); break;       \
                    case 4: tile_##ISA(4 < MR ? 4 : MR, x, r, p, two); break;       \
                    case 5: tile_##ISA(5 < MR ? 5 : MR, x, r, p, two); break;       \
                    case 6: tile_##ISA(6 < MR ? 6 : MR, x, r, p, two); break;       \
                    case 7: tile_##ISA(7 < MR ? 7 : MR, x, r, p, two); break;       \
                    default: tile_##ISA(MR, x, r, p, two); break;                   \
                    }                                                               \
                }                                                                   \
        }                                                                           \
    }

DEFINE_PANELS(base, , 2, 1)
#ifdef LLTM_X86
DEFINE_PANELS(avx2, __attribute__((target("avx2,fma"))), 6, 1)
DEFINE_PANELS(avx512, __attribute__((target("avx512f"))), 8, 2)
#endif

static atomic_int chosen = LLTM_ISA_AUTO; /* read by every thread of a product */

static int best_isa(void)
{
#ifdef LLTM_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f"))
        return LLTM_ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return LLTM_ISA_AVX2;
#endif
    return LLTM_ISA_BASELINE;
}

int lltm_cpu_isa(void)
{
    if (chosen == LLTM_ISA_AUTO)
        chosen = best_isa();
    return chosen;
}

int lltm_cpu_set_isa(int isa)
{
    if (isa < LLTM_ISA_AUTO || isa > LLTM_ISA_AVX512)
        return LLTM_ERR_ARGUMENT;
    if (isa > best_isa())
        return LLTM_ERR_ARGUMENT; /* the CPU lacks it */
    chosen = isa == LLTM_ISA_AUTO ? best_isa() : isa;
    return chosen;
}

/* panels of a tile on the ISA in use */
static int64_t tile_panels(void) { return lltm_cpu_isa() == LLTM_ISA_AVX512 ? 2 : 1; }

/* rows [r_lo, r_hi) of panels [lo, hi) on the ISA in use */
static void rows_panels(const lltm_mm *x, int64_t r_lo, int64_t r_hi, int64_t lo, int64_t hi)
{
#ifdef LLTM_X86
    const int isa = lltm_cpu_isa();
    if (isa == LLTM_ISA_AVX512)
        return panels_avx512(x, r_lo, r_hi, lo, hi);
    if (isa == LLTM_ISA_AVX2)
        return panels_avx2(x, r_lo, r_hi, lo, hi);
#endif
    panels_base(x, r_lo, r_hi, lo, hi);
}

void lltm_packed_mm_panels_f32(const lltm_mm *x, int64_t lo, int64_t hi)
{
    rows_panels(x, 0, x->M, lo, hi);
}

/* The split of a product over its threads: items of one block of ROW_BLOCK
 * rows by one tile of panels, the tiles of a row block in a row, so that a
 * thread's range reads a block of a while it is in cache. Splitting rows
 * too keeps both cores busy where c has few columns (the input's gradient
 * and weight gradient at small I, H: a tile or two). */
static int64_t tiles_of(const lltm_mm *x)
{
    const int64_t np = tile_panels(), panels = (x->N + LLTM_PANEL - 1) / LLTM_PANEL;
    return (panels + np - 1) / np;
}

/* items [lo, hi) of the split */
static void item_range(int64_t lo, int64_t hi, void *vctx)
{
    const lltm_mm *x = (const lltm_mm *)vctx;
    const int64_t np = tile_panels(), panels = (x->N + LLTM_PANEL - 1) / LLTM_PANEL;
    const int64_t tiles = tiles_of(x);
    for (int64_t i = lo; i < hi;) {
        const int64_t block = i / tiles, t0 = i % tiles;
        const int64_t t1 = t0 + (hi - i) < tiles ? t0 + (hi - i) : tiles;
        const int64_t r_lo = block * ROW_BLOCK;
        const int64_t r_hi = r_lo + ROW_BLOCK < x->M ? r_lo + ROW_BLOCK : x->M;
        rows_panels(x, r_lo, r_hi, t0 * np, t1 * np < panels ? t1 * np : panels);
        i += t1 - t0;
    }
}

/* each range at least ~256k multiply-adds (less work would not pay for
 * waking a thread) */
static int split(const lltm_mm *x, lltm_parallel_for pfor)
{
    const int64_t tiles = tiles_of(x), blocks = (x->M + ROW_BLOCK - 1) / ROW_BLOCK;
    const int64_t rows = x->M < ROW_BLOCK ? x->M : ROW_BLOCK;
    const int64_t grain = (1 << 18) / (rows * x->K * LLTM_PANEL * tile_panels()) + 1;
    return pfor(0, blocks * tiles, grain, item_range, (void *)x) == 0 ? LLTM_OK
                                                                      : LLTM_ERR_PARALLEL;
}

int lltm_packed_mm_f32(int64_t M, int64_t N, int64_t K, const float *a, int64_t lda,
                       const float *packed, float *c, int64_t ldc, lltm_parallel_for pfor)
{
    const lltm_mm x = {M, N, K, lda, 1, ldc, K, 0, a, packed, c};
    return split(&x, pfor);
}

/* lltm_mm_f32: a block of K_BLOCK rows of b packed at a time, then the
 * block's product added to c. Where a's steps along k are more than 1 KB
 * apart (a_cs > A_STRIDE floats), a's block is laid out as rows along k
 * beside b's: read in place, a tile's k steps fall in a few cache sets and
 * miss L1; closer steps are read in place (the copy would cost more than it
 * saves: 0.6x - 0.7x the time of the copy at dW_h^T of H = 32 - 64 on the
 * machine of docs/performance.md). */
#define K_BLOCK 256
#define K_CHUNK 16 /* rows of k one item of the packing copies */
#define A_STRIDE 256

typedef struct unpacked_mm {
    lltm_mm mm; /* the block's product, on a's laid-out rows or a in place */
    const float *a, *b;
    int64_t a_rs, a_cs, b_rs, b_cs, k0, chunks;
    float *a_rows; /* NULL: a read in place */
} unpacked_mm;

/* items [lo, hi) of a block's packing: first its chunks of K_CHUNK rows of
 * k, in each a's rows laid out and a row-major b's rows packed; then, for
 * a b stored along k, b's panels (one an item). A chunk reads whole rows of
 * dG, x or h in order: its loads stream (the lines of a column of them, a
 * row apart, are each a miss to memory where a panel or row block an item
 * walks k). */
static void pack_range(int64_t lo, int64_t hi, void *vctx)
{
    const unpacked_mm *u = (const unpacked_mm *)vctx;
    const int64_t kb = u->mm.K, M = u->mm.M, N = u->mm.N;
    for (int64_t i = lo; i < hi; ++i) {
        if (i >= u->chunks) {
            const int64_t n0 = (i - u->chunks) * LLTM_PANEL;
            const int64_t cols = N - n0 < LLTM_PANEL ? N - n0 : LLTM_PANEL;
            lltm_pack_f32(cols, kb, u->b + u->k0 * u->b_rs + n0 * u->b_cs, u->b_rs, u->b_cs,
                          (float *)u->mm.packed + n0 * kb);
            continue;
        }
        const int64_t k_lo = i * K_CHUNK, k_hi = k_lo + K_CHUNK < kb ? k_lo + K_CHUNK : kb;
        for (int64_t m = 0; u->a_rows && m < M; ++m) {
            const float *src = u->a + (u->k0 + k_lo) * u->a_cs + m * u->a_rs;
            float *dst = u->a_rows + m * kb;
            for (int64_t k = k_lo; k < k_hi; ++k, src += u->a_cs)
                dst[k] = *src;
        }
        if (u->b_cs == 1)
            pack_rows(N, k_lo, k_hi, u->b + u->k0 * u->b_rs, u->b_rs, kb, (float *)u->mm.packed);
    }
}

size_t lltm_mm_workspace_f32(int64_t M, int64_t N)
{
    return lltm_packed_floats(N, K_BLOCK) + (size_t)M * K_BLOCK;
}

int lltm_mm_f32(int64_t M, int64_t N, int64_t K, const float *a, int64_t a_rs, int64_t a_cs,
                const float *b, int64_t b_rs, int64_t b_cs, float *c, int64_t ldc, float *work,
                lltm_parallel_for pfor)
{
    const int64_t panels = (N + LLTM_PANEL - 1) / LLTM_PANEL;
    const int lay_out = a_cs > A_STRIDE;
    float *a_rows = work + lltm_packed_floats(N, K_BLOCK);
    for (int64_t k0 = 0; k0 < K; k0 += K_BLOCK) {
        const int64_t kb = K - k0 < K_BLOCK ? K - k0 : K_BLOCK;
        const int64_t chunks = lay_out || b_cs == 1 ? (kb + K_CHUNK - 1) / K_CHUNK : 0;
        const unpacked_mm u = {
            lay_out ? (lltm_mm){M, N, kb, kb, 1, ldc, kb, k0 > 0, a_rows, work, c}
                    : (lltm_mm){M, N, kb, a_rs, a_cs, ldc, kb, k0 > 0, a + k0 * a_cs, work, c},
            a, b, a_rs, a_cs, b_rs, b_cs, k0, chunks, lay_out ? a_rows : NULL};
        /* each item ~4k floats moved */
        const int64_t per_chunk = K_CHUNK * ((lay_out ? M : 0) + (b_cs == 1 ? N : 0));
        const int64_t grain = 4096 / (per_chunk > 0 ? per_chunk : LLTM_PANEL * kb) + 1;
        if (pfor(0, chunks + (b_cs == 1 ? 0 : panels), grain, pack_range, (void *)&u) != 0)
            return LLTM_ERR_PARALLEL;
        const int status = split(&u.mm, pfor);
        if (status != LLTM_OK)
            return status;
    }
    return LLTM_OK;
}

/* c = a^T b (dW = dG^T x): where c is wide (N >= WIDE), directly, a's
 * blocks laid out (the copy of dG paid for by N multiply-adds an element);
 * narrower, as the transpose of b^T a, in which dG is b, packed row by row,
 * x the side read in place, and c^T is written back transposed, 16 rows of
 * c an item. At G x N = 384 x 64 over 1,600 rows the transposed route takes
 * 0.65x the time of the direct one, at 1536 x 512 1.19x, and at 3072 x 1024
 * over 100 rows 5.3x (the transpose of c); the two are within 2% at N = 128
 * - 256 for G = 2N - 3N (2 threads, the machine of docs/performance.md). */
#define WIDE 256

typedef struct transposed {
    int64_t M, N, ldc;
    const float *c_t;
    float *c;
} transposed;

static void transpose_range(int64_t lo, int64_t hi, void *vctx)
{
    const transposed *t = (const transposed *)vctx;
    const int64_t m0 = lo * 16, m1 = hi * 16 < t->M ? hi * 16 : t->M;
    for (int64_t n = 0; n < t->N; ++n)
        for (int64_t m = m0; m < m1; ++m)
            t->c[m * t->ldc + n] = t->c_t[n * t->M + m];
}

/* enough for either route, so that the work for N serves every narrower c */
size_t lltm_mm_tn_workspace_f32(int64_t M, int64_t N)
{
    const size_t direct = lltm_mm_workspace_f32(M, N);
    const size_t transposed = lltm_mm_workspace_f32(N, M) + (size_t)(N * M);
    return direct > transposed ? direct : transposed;
}

int lltm_mm_tn_f32(int64_t M, int64_t N, int64_t K, const float *a, const float *b, float *c,
                   int64_t ldc, float *work, lltm_parallel_for pfor)
{
    if (N >= WIDE)
        return lltm_mm_f32(M, N, K, a, 1, M, b, N, 1, c, ldc, work, pfor);
    float *c_t = work + lltm_mm_workspace_f32(N, M); /* [N,M] */
    const int status = lltm_mm_f32(N, M, K, b, 1, N, a, M, 1, c_t, M, work, pfor);
    if (status != LLTM_OK)
        return status;
    const transposed t = {M, N, ldc, c_t, c};
    const int64_t grain = 4096 / (16 * N) + 1; /* ~4k floats an item */
    return pfor(0, (M + 15) / 16, grain, transpose_range, (void *)&t) == 0 ? LLTM_OK
                                                                         : LLTM_ERR_PARALLEL;
}
