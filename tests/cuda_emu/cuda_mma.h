/*
 * cuda_mma.h (fiber emulation, included by cuda_runtime.h) - the warp-level
 * tensor-core operations of csrc/core/lltm_cuda_mma.cuh: ldmatrix.x4,
 * mma.sync m16n8k16 (half types) and m16n8k8 (TF32) with float sums, and
 * cvt.rna.tf32.f32, as warp exchanges through the slots of
 * cuda_runtime.h (two warp barriers each, as a shuffle). The fragment
 * layouts are PTX's (lltm_cuda_mma.cuh's notation); the sums run k in order
 * in float, not the hardware's order; and cp.async's 16-byte copy.
 */
#pragma once

namespace emu {

/* ldmatrix.x4 of 16-bit values: lane l gives the address of row l % 8 of
 * matrix l / 8; register m of lane l gets matrix m's row l / 4, values
 * 2(l % 4) and 2(l % 4) + 1 (the lower in the lower half). */
inline void ldmatrix_x4(uint32_t (&a)[4], const void *row)
{
    auto &slot = g->slots[current->warp];
    memcpy(&slot[current->lane], &row, sizeof(row));
    warp_sync();
    const unsigned lane = current->lane;
    for (int m = 0; m < 4; ++m) {
        const void *src;
        memcpy(&src, &slot[m * 8 + lane / 4], sizeof(src));
        uint16_t pair[2];
        memcpy(pair, (const uint16_t *)src + 2 * (lane % 4), sizeof(pair));
        a[m] = (uint32_t)pair[0] | ((uint32_t)pair[1] << 16);
    }
    warp_sync();
}

inline float half_bits_value(uint16_t bits, bool bf16)
{
    if (bf16) {
        const uint32_t u = (uint32_t)bits << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    _Float16 h;
    memcpy(&h, &bits, 2);
    return (float)h;
}

/* c += A B over K values of k at this lane's four places of C (row l/4
 * and l/4 + 8, columns 2(l%4) and 2(l%4) + 1), k in order, after the warp's
 * A and B registers are exchanged through the slots: a_at(frags, row, k)
 * and b_at(frags, k, col) read an operand from the lane and register that
 * hold it. */
template <typename A, typename B>
inline void warp_mma(float (&c)[4], const uint32_t (&a)[4], const uint32_t *b, int K, A a_at,
                     B b_at)
{
    auto &frags = g->fragments[current->warp];
    const unsigned lane = current->lane;
    for (int r = 0; r < 4; ++r)
        frags[lane][r] = a[r];
    frags[lane][4] = b[0];
    frags[lane][5] = b[1];
    warp_sync();
    for (int p = 0; p < 4; ++p) {
        const int row = (int)lane / 4 + 8 * (p / 2), col = 2 * (int)(lane % 4) + p % 2;
        float sum = 0.0f;
        for (int k = 0; k < K; ++k)
            sum += a_at(frags, row, k) * b_at(frags, k, col);
        c[p] += sum;
    }
    warp_sync();
}

/* mma.sync m16n8k16 (row.col, float sums) over the warp's fragments
 * (lltm_cuda_mma.cuh's notation). */
inline void mma_m16n8k16(float (&c)[4], const uint32_t (&a)[4], const uint32_t *b, bool bf16)
{
    auto half = [bf16](uint32_t reg, int k) {
        return half_bits_value((uint16_t)(reg >> (16 * (k % 2))), bf16);
    };
    warp_mma(
        c, a, b, 16,
        [&](const auto &f, int row, int k) {
            return half(f[(row % 8) * 4 + (k % 8) / 2][row / 8 + 2 * (k / 8)], k);
        },
        [&](const auto &f, int k, int col) {
            return half(f[col * 4 + (k % 8) / 2][4 + k / 8], k);
        });
}

/* cvt.rna.tf32.f32: float bits rounded to TF32's 10 mantissa bits, to
 * nearest, ties away from zero (the low 13 bits then 0) */
inline uint32_t round_tf32(uint32_t bits) { return (bits + 0x1000u) & ~0x1FFFu; }

/* mma.sync m16n8k8 .tf32 (row.col, float sums): A's registers a0 - a3 hold
 * (row l/4, k l%4), (row l/4 + 8, k l%4), (l/4, l%4 + 4), (l/4 + 8, l%4 + 4);
 * B's b0, b1 hold (k l%4, column l/4) and (k l%4 + 4, column l/4); C as
 * m16n8k16's. The operands are taken as TF32 (their low 13 bits dropped). */
inline void mma_m16n8k8_tf32(float (&c)[4], const uint32_t (&a)[4], const uint32_t *b)
{
    auto tf32 = [](uint32_t reg) {
        const uint32_t bits = reg & ~0x1FFFu;
        float f;
        memcpy(&f, &bits, 4);
        return f;
    };
    warp_mma(
        c, a, b, 8,
        [&](const auto &f, int row, int k) {
            return tf32(f[(row % 8) * 4 + k % 4][row / 8 + 2 * (k / 4)]);
        },
        [&](const auto &f, int k, int col) { return tf32(f[col * 4 + k % 4][4 + k / 4]); });
}

/* cp.async of 16 bytes: copied at once (the emulator's threads see the
 * source as written before the last barrier) */
inline void copy_16(void *dst, const void *src) { memcpy(dst, src, 16); }

} // namespace emu
