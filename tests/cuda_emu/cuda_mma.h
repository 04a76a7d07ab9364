/*
 * cuda_mma.h (fiber emulation, included by cuda_runtime.h) - the warp-level
 * tensor-core operations of csrc/core/lltm_cuda_mma.cuh: ldmatrix.x4 and
 * mma.sync m16n8k16 with float sums, as warp exchanges through the slots of
 * cuda_runtime.h (two warp barriers each, as a shuffle). The fragment
 * layouts are PTX's (lltm_cuda_mma.cuh's notation); the sums run k in order
 * in float, not the hardware's order.
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

/* mma.sync m16n8k16 (row.col, float sums) over the warp's fragments
 * (lltm_cuda_mma.cuh's notation): each lane's c += A B at its own four
 * places, k in order. */
inline void mma_m16n8k16(float (&c)[4], const uint32_t (&a)[4], const uint32_t *b, bool bf16)
{
    auto &frags = g->fragments[current->warp];
    const unsigned lane = current->lane;
    for (int r = 0; r < 4; ++r)
        frags[lane][r] = a[r];
    frags[lane][4] = b[0];
    frags[lane][5] = b[1];
    warp_sync();
    auto value = [&](unsigned from, int reg, int k) {
        return half_bits_value((uint16_t)(frags[from][reg] >> (16 * (k % 2))), bf16);
    };
    for (int p = 0; p < 4; ++p) {
        const int row = (int)lane / 4 + 8 * (p / 2), col = 2 * (int)(lane % 4) + p % 2;
        float sum = 0.0f;
        for (int k = 0; k < 16; ++k) {
            const unsigned a_lane = (unsigned)(row % 8) * 4 + (k % 8) / 2;
            const float x = value(a_lane, row / 8 + 2 * (k / 8), k);
            const float w = value((unsigned)col * 4 + (k % 8) / 2, 4 + k / 8, k);
            sum += x * w;
        }
        c[p] += sum;
    }
    warp_sync();
}

} // namespace emu
