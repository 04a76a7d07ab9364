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

void lltm_pack_f32(int64_t N, int64_t K, const float *b, int64_t b_rs, int64_t b_cs,
                   float *packed)
{
    /* read along b's rows or columns, whichever is contiguous */
    for (int64_t p = 0; p * LLTM_PANEL < N; ++p) {
        float *dst = packed + p * K * LLTM_PANEL;
        for (int64_t j = 0; j < LLTM_PANEL; ++j) {
            const int64_t n = p * LLTM_PANEL + j;
            for (int64_t k = 0; b_rs == 1 && k < K; ++k)
                dst[k * LLTM_PANEL + j] = n < N ? b[k + n * b_cs] : 0.0f;
        }
        for (int64_t k = 0; b_rs != 1 && k < K; ++k)
            for (int64_t j = 0; j < LLTM_PANEL; ++j) {
                const int64_t n = p * LLTM_PANEL + j;
                dst[k * LLTM_PANEL + j] = n < N ? b[k * b_rs + n * b_cs] : 0.0f;
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

/* Panels [lo, hi) of every row on one instruction set: NP panels a tile,
 * MR rows a tile, the last tile of a block with the rows left (R a constant
 * in each case of the switch). */
#define DEFINE_PANELS(ISA, TARGET, MR, NP)                                          \
    TARGET static void panels_##ISA(const lltm_mm *x, int64_t lo, int64_t hi)       \
    {                                                                               \
        for (int64_t b0 = 0; b0 < x->M; b0 += ROW_BLOCK) {                          \
            const int64_t b1 = b0 + ROW_BLOCK < x->M ? b0 + ROW_BLOCK : x->M;       \
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

void lltm_packed_mm_panels_f32(const lltm_mm *x, int64_t lo, int64_t hi)
{
#ifdef LLTM_X86
    const int isa = lltm_cpu_isa();
    if (isa == LLTM_ISA_AVX512)
        return panels_avx512(x, lo, hi);
    if (isa == LLTM_ISA_AVX2)
        return panels_avx2(x, lo, hi);
#endif
    panels_base(x, lo, hi);
}

/* tiles [lo, hi) of lltm_packed_mm_f32's split */
static void tile_range(int64_t lo, int64_t hi, void *vctx)
{
    const lltm_mm *x = (const lltm_mm *)vctx;
    const int64_t np = tile_panels(), panels = (x->N + LLTM_PANEL - 1) / LLTM_PANEL;
    lltm_packed_mm_panels_f32(x, lo * np, hi * np < panels ? hi * np : panels);
}

/* ranges of whole tiles, each at least ~256k multiply-adds (less work would
 * not pay for waking a thread) */
static int split(const lltm_mm *x, lltm_range_body body, lltm_parallel_for pfor)
{
    const int64_t np = tile_panels(), panels = (x->N + LLTM_PANEL - 1) / LLTM_PANEL;
    const int64_t tiles = (panels + np - 1) / np;
    const int64_t grain = (1 << 18) / (x->M * x->K * LLTM_PANEL * np) + 1;
    return pfor(0, tiles, grain, body, (void *)x) == 0 ? LLTM_OK : LLTM_ERR_PARALLEL;
}

int lltm_packed_mm_f32(int64_t M, int64_t N, int64_t K, const float *a, int64_t lda,
                       const float *packed, float *c, int64_t ldc, lltm_parallel_for pfor)
{
    const lltm_mm x = {M, N, K, lda, 1, ldc, K, 0, a, packed, c};
    return split(&x, tile_range, pfor);
}

/* lltm_mm_f32: a block of K_BLOCK rows of b packed at a time, each range of
 * tiles packing its own panels, then adding their share to c. */
#define K_BLOCK 256

typedef struct unpacked_mm {
    lltm_mm mm;
    const float *b;
    int64_t b_rs, b_cs;
} unpacked_mm;

static void unpacked_range(int64_t lo, int64_t hi, void *vctx)
{
    const unpacked_mm *u = (const unpacked_mm *)vctx;
    const int64_t np = tile_panels(), panels = (u->mm.N + LLTM_PANEL - 1) / LLTM_PANEL;
    const int64_t p_hi = hi * np < panels ? hi * np : panels, cols = p_hi * LLTM_PANEL;
    const int64_t n_lo = lo * np * LLTM_PANEL, n_hi = cols < u->mm.N ? cols : u->mm.N;
    lltm_pack_f32(n_hi - n_lo, u->mm.K, u->b + n_lo * u->b_cs, u->b_rs, u->b_cs,
                  (float *)u->mm.packed + n_lo * u->mm.ldp);
    lltm_packed_mm_panels_f32(&u->mm, lo * np, p_hi);
}

size_t lltm_mm_workspace_f32(int64_t N) { return lltm_packed_floats(N, K_BLOCK); }

int lltm_mm_f32(int64_t M, int64_t N, int64_t K, const float *a, int64_t a_rs, int64_t a_cs,
                const float *b, int64_t b_rs, int64_t b_cs, float *c, int64_t ldc, float *work,
                lltm_parallel_for pfor)
{
    for (int64_t k0 = 0; k0 < K; k0 += K_BLOCK) {
        const int64_t kb = K - k0 < K_BLOCK ? K - k0 : K_BLOCK;
        const unpacked_mm u = {{M, N, kb, a_rs, a_cs, ldc, kb, k0 > 0, a + k0 * a_cs, work, c},
                               b + k0 * b_rs, b_rs, b_cs};
        const int status = split(&u.mm, unpacked_range, pfor);
        if (status != LLTM_OK)
            return status;
    }
    return LLTM_OK;
}
