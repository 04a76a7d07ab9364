/*
 * test_rules.c - the rules of the CUDA routes (csrc/core/lltm_cuda_rules.c),
 * under AddressSanitizer: ranks deterministic and defined for every family;
 * the block family first at H <= 64 and never above; the per-step family
 * first past the widest persistent layout, never first in an eager call
 * where it is not first under capture, and first at every larger batch once
 * it is; the cell's route cuBLAS at every larger batch once it is, and the
 * fused kernels at one row of a narrow layer; tensor cores for the grid only
 * where the device and dtype have them.
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
    check(lltm_sequence_plan_rank_cuda(NULL, NULL, 0, 1) == LLTM_RANK_NONE, "no plan, no rank", 0, 0,
          "");
    printf("test_rules: %d passed, %d failed\n", passed, failed);
    return failed != 0;
}
