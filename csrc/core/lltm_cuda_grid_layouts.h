/*
 * lltm_cuda_grid_layouts.h - the grid family's layouts (lanes a unit x
 * values a lane) and chunk rows: the chooser (lltm_cuda_sequence_plan.cu)
 * tries them in this order, a tie keeping the first, and the rules
 * (lltm_cuda_rules.c) name a layout by its position. 8x64 and
 * 16x64 run on tensor cores only (lltm_seq::grid_mma_only); float32's TF32
 * build has the first LLTM_GRID_TF32_LAYOUTS. Plain C (no CUDA): both
 * compilers include it.
 */
#ifndef LLTM_CORE_CUDA_GRID_LAYOUTS_H
#define LLTM_CORE_CUDA_GRID_LAYOUTS_H

typedef struct lltm_grid_layout {
    int lanes, values;
} lltm_grid_layout;

#define LLTM_GRID_LAYOUT_COUNT 6
#define LLTM_GRID_TF32_LAYOUTS 4
static const lltm_grid_layout LLTM_GRID_LAYOUTS[LLTM_GRID_LAYOUT_COUNT] = {
    {16, 8}, {16, 32}, {32, 16}, {32, 32}, {8, 64}, {16, 64}};

/* The position of a layout in LLTM_GRID_LAYOUTS; -1 where it is none. */
static inline int lltm_grid_layout_index(int lanes, int values)
{
    for (int k = 0; k < LLTM_GRID_LAYOUT_COUNT; ++k)
        if (LLTM_GRID_LAYOUTS[k].lanes == lanes && LLTM_GRID_LAYOUTS[k].values == values)
            return k;
    return -1;
}

/* The rows of a chunk the grid kernels come in: 16 (lltm_seq::BC), and 4
 * (lltm_seq::GRID_SMALL_CHUNK: fewer multiply-adds a thread at small B). */
#define LLTM_GRID_CHUNK_COUNT 2
static const int LLTM_GRID_CHUNKS[LLTM_GRID_CHUNK_COUNT] = {16, 4};

/* The position of a chunk size in LLTM_GRID_CHUNKS; -1 where it is none. */
static inline int lltm_grid_chunk_index(int chunk)
{
    for (int c = 0; c < LLTM_GRID_CHUNK_COUNT; ++c)
        if (LLTM_GRID_CHUNKS[c] == chunk)
            return c;
    return -1;
}

#endif /* LLTM_CORE_CUDA_GRID_LAYOUTS_H */
