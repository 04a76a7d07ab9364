/*
 * lltm_cuda_cell_tiles.h - the tile configuration each fused CUDA cell
 * kernel takes for a step's sizes: lltm_cuda_cell_forward.cu and
 * lltm_cuda_cell_backward.cu launch by it.
 * Plain C (no CUDA): both compilers include it.
 *
 *   small   8-row tiles over 2 - 8 units or 4 - 16 columns, the reduction
 *           split inside the block: many blocks, for latency-bound sizes
 *   medium  16-row tiles (a batch of up to 16 in one tile row) over 4 - 16
 *           units or 8 - 64 columns: each block reads a larger piece of W,
 *           and the operand all blocks share (X, dG) is read by fewer of them
 *   large   big register tiles, for throughput-bound sizes
 *
 * Which a kernel takes: the rule and its thresholds in lltm_cuda_rules.h.
 */
#ifndef LLTM_CORE_CUDA_CELL_TILES_H
#define LLTM_CORE_CUDA_CELL_TILES_H

#include "lltm_cuda_rules.h"

enum { LLTM_TILES_SMALL = 0, LLTM_TILES_MEDIUM = 1, LLTM_TILES_LARGE = 2 };

/* the most blocks a launch takes along grid y */
#define LLTM_CUDA_MAX_GRID_Y 65535

static inline int64_t lltm_tiles_ceil_div(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

static inline int lltm_tiles_pick(int64_t large_blocks, int64_t small_blocks, int rows_ok)
{
    if (large_blocks >= LLTM_CUDA_LARGE_TILE_MIN_BLOCKS)
        return LLTM_TILES_LARGE;
    if (small_blocks >= LLTM_CUDA_MEDIUM_TILE_MIN_BLOCKS && rows_ok)
        return LLTM_TILES_MEDIUM;
    return LLTM_TILES_SMALL;
}

/* g = X W^T with the step's pointwise part: tiles of rows x units (large
 * 64 x 32, medium 16 x 4, small 8 x 2). */
static inline int lltm_forward_tiles(int64_t B, int64_t H)
{
    return lltm_tiles_pick(lltm_tiles_ceil_div(B, 64) * lltm_tiles_ceil_div(H, 32),
                           lltm_tiles_ceil_div(B, 8) * lltm_tiles_ceil_div(H, 2),
                           B >= LLTM_CUDA_MEDIUM_TILE_MIN_ROWS);
}

/* dW = dG^T X: tiles of units x columns (large 32 x 128, medium 16 x 64,
 * small 8 x 16), each over the whole batch. */
static inline int lltm_weights_tiles(int64_t I, int64_t H)
{
    const int64_t K = I + H;
    return lltm_tiles_pick(lltm_tiles_ceil_div(H, 32) * lltm_tiles_ceil_div(K, 128),
                           lltm_tiles_ceil_div(H, 8) * lltm_tiles_ceil_div(K, 16), 1);
}

/* dX = dG W: tiles of rows x columns (large 32 x 64, medium 16 x 8, small
 * 8 x 4); never a configuration whose column tiles pass the grid's y limit
 * (the large ones then). */
static inline int lltm_inputs_tiles(int64_t B, int64_t I, int64_t H)
{
    const int64_t K = I + H;
    if (lltm_tiles_ceil_div(K, 8) > LLTM_CUDA_MAX_GRID_Y)
        return LLTM_TILES_LARGE;
    const int tiles = lltm_tiles_pick(lltm_tiles_ceil_div(B, 32) * lltm_tiles_ceil_div(K, 64),
                                      lltm_tiles_ceil_div(B, 8) * lltm_tiles_ceil_div(K, 4),
                                      B >= LLTM_CUDA_MEDIUM_TILE_MIN_ROWS);
    return tiles == LLTM_TILES_SMALL && lltm_tiles_ceil_div(K, 4) > LLTM_CUDA_MAX_GRID_Y
               ? LLTM_TILES_MEDIUM
               : tiles;
}

#endif /* LLTM_CORE_CUDA_CELL_TILES_H */
