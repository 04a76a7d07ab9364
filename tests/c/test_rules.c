/*
 * test_rules.c - the rules of the CUDA routes (csrc/core/lltm_cuda_rules.c),
 * under AddressSanitizer: ranks deterministic and defined for every family;
 * the block family first at H <= 64 and never above; the per-step family
 * first past the widest persistent layout, never first in an eager call
 * where it is not first under capture, and first at every larger batch once
 * it is; the cell's route cuBLAS at every larger batch once it is, and the
 * fused kernels at one row of a narrow layer; tensor cores for the grid only
 * where the device and dtype have them; lltm.LLTM's stacked launch and time
 * chunks where their rules say, at the sizes of the measurements behind them.
 */
#include "test_util.h"
#include "../../csrc/core/lltm_cuda_rules.h"

static lltm_cuda_device device(int major, int tf32)
{
    lltm_cuda_device dev;
    memset(&dev, 0, sizeof dev);
    dev.major = major;
    dev.sm_count = 132;
    dev.smem_optin = 232448;
    dev.cooperative_launch = dev.cluster_launch = major >= 9;
    dev.code_arch = major * 10;
    dev.tf32 = tf32;
    return dev;
}

static lltm_sequence_plan plan_of(int family, lltm_dtype dtype, int64_t B, int64_t H, int lanes,
                                  int values, int chunk)
{
    lltm_sequence_plan p;
    memset(&p, 0, sizeof p);
    p.family = family;
    p.dtype = dtype;
    p.B = B;
    p.H = H;
    p.forward.lanes = p.backward.lanes = lanes;
    p.forward.values = p.backward.values = values;
    p.forward.rows = p.backward.rows = p.forward.chunk = p.backward.chunk = chunk;
    p.forward.groups = p.backward.groups = 1;
    return p;
}

static const lltm_dtype DTYPES[] = {LLTM_FLOAT32, LLTM_FLOAT64, LLTM_FLOAT16, LLTM_BFLOAT16};
static const char *NAMES[] = {"float32", "float64", "float16", "bfloat16"};

/* the stacked launch's rule for float32 layers whose plan alone is `family`
 * in `groups` batch groups, and for the half types on tensor cores */
static void stack_rules(const lltm_cuda_device *h100, const lltm_cuda_device *t4)
{
    static const struct { int eager, L; int64_t B, H; int family, groups, want; } f32[] = {
        {1, 3, 16, 256, LLTM_SEQ_GRID, 4, 1}, {1, 3, 32, 256, LLTM_SEQ_GRID, 8, 0},
        {1, 2, 64, 64, LLTM_SEQ_BLOCK, 64, 1}, {0, 3, 16, 256, LLTM_SEQ_GRID, 4, 1},
        {0, 2, 8, 192, LLTM_SEQ_GRID, 2, 1}, {0, 3, 1, 256, LLTM_SEQ_GRID, 1, 0},
        {0, 2, 1, 256, LLTM_SEQ_GRID, 1, 1}, {0, 3, 32, 256, LLTM_SEQ_GRID, 8, 0},
        {0, 3, 16, 128, LLTM_SEQ_CLUSTER, 4, 0}};
    for (size_t k = 0; k < sizeof f32 / sizeof f32[0]; ++k) {
        lltm_sequence_plan layer = plan_of(f32[k].family, LLTM_FLOAT32, f32[k].B, f32[k].H, 16,
                                           32, 16);
        layer.forward.groups = f32[k].groups;
        check(lltm_stack_rule_cuda(h100, LLTM_FLOAT32, f32[k].L, f32[k].B, f32[k].H,
                                   f32[k].eager, &layer) == f32[k].want,
              "float32: the stacked launch where the layer's plan says", f32[k].B, f32[k].H,
              "float32");
    }
    static const struct { int eager; int64_t B, H; int want; } half[] = {
        {0, 16, 256, 0}, {0, 32, 256, 1}, {0, 128, 256, 1}, {0, 256, 256, 0}, {0, 64, 128, 1},
        {0, 256, 128, 1}, {0, 512, 64, 0}, {0, 64, 64, 0}, {1, 128, 256, 1}, {1, 256, 256, 0},
        {1, 16, 64, 1}};
    for (size_t k = 0; k < sizeof half / sizeof half[0]; ++k) {
        lltm_sequence_plan layer = plan_of(LLTM_SEQ_GRID, LLTM_BFLOAT16, half[k].B, half[k].H,
                                           16, 32, 16);
        layer.forward.groups = 4;
        check(lltm_stack_rule_cuda(h100, LLTM_BFLOAT16, 3, half[k].B, half[k].H, half[k].eager,
                                   &layer) == half[k].want,
              "half types on tensor cores: by B x H and H", half[k].B, half[k].H, "bfloat16");
        /* without tensor cores the half types follow float32's rule */
        const int f32_rule = half[k].eager ? half[k].B * half[k].H <= 4096 : 1;
        check(lltm_stack_rule_cuda(t4, LLTM_BFLOAT16, 3, half[k].B, half[k].H, half[k].eager,
                                   &layer) == f32_rule,
              "half types without tensor cores: float32's rule", half[k].B, half[k].H,
              "bfloat16");
    }
    check(!lltm_stack_rule_cuda(h100, LLTM_FLOAT32, 3, 16, 256, 0, NULL),
          "captured float32 without a layer plan: no stacked launch", 16, 256, "float32");
}

/* the time chunks: the per-step family and persistent plans of which two
 * layers fit at once in 4 chunks; 1.5 - 2 layers in 3; a grid on tensor
 * cores holding one layer in 4 planned for two layers at once; else, and
 * eagerly, one call a layer; no chunk under 8 steps */
static void wavefront_rules(const lltm_cuda_device *h100)
{
    int chunks, sharing;
    const int64_t none[2] = {0, 0};
    lltm_sequence_plan steps = plan_of(LLTM_SEQ_STEPS, LLTM_FLOAT32, 16, 256, 0, 0, 0);
    lltm_wavefront_rule_cuda(h100, &steps, none, none, 100, 0, &chunks, &sharing);
    check(chunks == 4 && sharing == 1, "per-step: 4 chunks", 16, 256, "float32");
    lltm_wavefront_rule_cuda(h100, &steps, none, none, 20, 0, &chunks, &sharing);
    check(chunks == 2, "no chunk under 8 steps", 16, 256, "float32");
    lltm_wavefront_rule_cuda(h100, &steps, none, none, 100, 1, &chunks, &sharing);
    check(chunks == 1 && sharing == 1, "eager: one call a layer", 16, 256, "float32");
    lltm_wavefront_rule_cuda(h100, NULL, none, none, 100, 0, &chunks, &sharing);
    check(chunks == 1 && sharing == 1, "no plan: one call a layer", 16, 256, "float32");
    const lltm_sequence_plan cluster = plan_of(LLTM_SEQ_CLUSTER, LLTM_BFLOAT16, 64, 128, 4, 2, 16);
    static const struct { int64_t resident[2], parts[2]; int want; } held[] = {
        {{14, 7}, {4, 4}, 3}, {{8, 8}, {4, 4}, 4}, {{5, 5}, {4, 4}, 1}};
    for (size_t k = 0; k < sizeof held / sizeof held[0]; ++k) {
        lltm_wavefront_rule_cuda(h100, &cluster, held[k].resident, held[k].parts, 100, 0,
                                 &chunks, &sharing);
        check(chunks == held[k].want && sharing == 1, "persistent: by the layers held at once",
              64, 128, "bfloat16");
    }
    const int64_t one[2] = {1, 1}, two[2] = {2, 2};
    lltm_sequence_plan grid = plan_of(LLTM_SEQ_GRID, LLTM_BFLOAT16, 64, 256, 16, 32, 16);
    lltm_wavefront_rule_cuda(h100, &grid, one, one, 100, 0, &chunks, &sharing);
    check(chunks == 4 && sharing == 2, "a grid on tensor cores: 4 chunks for two layers", 64, 256,
          "bfloat16");
    grid.dtype = LLTM_FLOAT32;
    lltm_wavefront_rule_cuda(h100, &grid, one, one, 100, 0, &chunks, &sharing);
    check(chunks == 1 && sharing == 1, "a grid on FFMA holding one layer: one call a layer", 64,
          256, "float32");
    lltm_wavefront_rule_cuda(h100, &grid, two, one, 100, 0, &chunks, &sharing);
    check(chunks == 4 && sharing == 1, "two grids at once: 4 chunks", 64, 256, "float32");
}

int main(void)
{
    const lltm_cuda_device h100 = device(9, 0), a100_tf32 = device(8, 1), t4 = device(7, 0);
    for (int d = 0; d < 4; ++d) {
        const lltm_dtype dt = DTYPES[d];
        for (int64_t H = 1; H <= 4096; H *= 2) {
            int steps_first_at = -1, cublas_at = -1;
            for (int64_t B = 1; B <= 8192; B *= 2) {
                const lltm_sequence_plan steps = plan_of(LLTM_SEQ_STEPS, dt, B, H, 0, 0, 0);
                const lltm_sequence_plan block = plan_of(LLTM_SEQ_BLOCK, dt, B, H, 2, 32, 1);
                const lltm_sequence_plan block4 = plan_of(LLTM_SEQ_BLOCK, dt, B, H, 4, 16, 4);
                const lltm_sequence_plan grid = plan_of(LLTM_SEQ_GRID, dt, B, H, 16, 32, 16);
                const lltm_sequence_plan grid4 = plan_of(LLTM_SEQ_GRID, dt, B, H, 16, 32, 4);
                const lltm_sequence_plan cluster = plan_of(LLTM_SEQ_CLUSTER, dt, B, H, 4, 2, 16);
                const lltm_sequence_plan *all[] = {&steps, &block, &block4, &grid, &grid4,
                                                   &cluster};
                for (int k = 0; k < 6; ++k)
                    for (int eager = 0; eager < 2; ++eager) {
                        const int64_t r = lltm_sequence_plan_rank_cuda(&h100, all[k], eager, 1);
                        check(r >= 0 && r < LLTM_RANK_NONE &&
                                  r == lltm_sequence_plan_rank_cuda(&h100, all[k], eager, 1),
                              "a rank defined and deterministic", B, H, NAMES[d]);
                    }
                const int block_best = lltm_sequence_plan_rank_cuda(&h100, &block, 0, 1) <
                                           lltm_sequence_plan_rank_cuda(&h100, &steps, 0, 1) &&
                                       lltm_sequence_plan_rank_cuda(&h100, &block, 0, 1) <
                                           lltm_sequence_plan_rank_cuda(&h100, &grid, 0, 1);
                check(block_best == (H <= 64), "the block family first at H <= 64 only", B, H,
                      NAMES[d]);
                const int first = lltm_sequence_plan_rank_cuda(&h100, &steps, 0, 1) <
                                  lltm_sequence_plan_rank_cuda(&h100, &grid, 0, 1);
                const int first_eager = lltm_sequence_plan_rank_cuda(&h100, &steps, 1, 1) <
                                        lltm_sequence_plan_rank_cuda(&h100, &grid, 1, 1);
                if (H > 64) {
                    check(!first_eager || first, "eager: per-step first only where captured",
                          B, H, NAMES[d]);
                    check(H <= 1024 || first, "per-step first past H = 1024", B, H, NAMES[d]);
                    check(!first || lltm_sequence_plan_rank_cuda(&h100, &steps, 0, 2) <
                                        lltm_sequence_plan_rank_cuda(&h100, &grid, 0, 2),
                          "per-step first for two layers at once where for one", B, H,
                          NAMES[d]);
                    if (first && steps_first_at < 0)
                        steps_first_at = (int)B;
                    check(first || steps_first_at < 0, "per-step first at every larger batch",
                          B, H, NAMES[d]);
                }
                const int route = lltm_cell_route_cuda(&h100, dt, B, H / 2, H);
                check(route == LLTM_CELL_CUBLAS || route == LLTM_CELL_FUSED, "a cell route", B,
                      H, NAMES[d]);
                if (route == LLTM_CELL_CUBLAS && cublas_at < 0)
                    cublas_at = (int)B;
                check(route == LLTM_CELL_CUBLAS || cublas_at < 0,
                      "the cell on cuBLAS at every larger batch", B, H, NAMES[d]);
                check(B > 1 || H > 128 || route == LLTM_CELL_FUSED,
                      "the cell fused at one row of a narrow layer", B, H, NAMES[d]);
            }
        }
        const int half = dt == LLTM_FLOAT16 || dt == LLTM_BFLOAT16;
        check(lltm_cuda_grid_tensor_cores(&h100, dt) == half, "tensor cores on sm_90", 0, 0,
              NAMES[d]);
        check(lltm_cuda_grid_tensor_cores(&a100_tf32, dt) == (half || dt == LLTM_FLOAT32),
              "TF32 where allowed on sm_80", 0, 0, NAMES[d]);
        check(!lltm_cuda_grid_tensor_cores(&t4, dt), "none below sm_80", 0, 0, NAMES[d]);
    }
    stack_rules(&h100, &t4);
    wavefront_rules(&h100);
    check(lltm_sequence_plan_rank_cuda(NULL, NULL, 0, 1) == LLTM_RANK_NONE, "no plan, no rank", 0, 0,
          "");
    printf("test_rules: %d passed, %d failed\n", passed, failed);
    return failed != 0;
}
