/*
 * test_cost.c - the cost model of the CUDA routes (csrc/core/lltm_cuda_cost.c),
 * under AddressSanitizer: every cost finite and positive for valid plans and
 * sizes, infinite for invalid ones; more steps, rows or units never cheaper;
 * fewer SMs make the products dearer and leave the persistent kernels' per-
 * step terms alone; tensor cores only where the device has them for the
 * dtype, TF32 for float32 only where the caller allows it; the cell's
 * choice is one of its routes and the cheaper of the two.
 */
#include "test_util.h"

static lltm_cuda_device h100(void)
{
    lltm_cuda_device dev;
    memset(&dev, 0, sizeof dev);
    dev.major = 9;
    dev.sm_count = 132;
    dev.smem_optin = 232448;
    dev.cooperative_launch = dev.cluster_launch = 1;
    dev.code_arch = 90;
    return dev;
}

static lltm_sequence_plan grid_plan(lltm_dtype dtype, int64_t B, int64_t H, int lanes, int values,
                                    int64_t groups)
{
    lltm_sequence_plan p;
    memset(&p, 0, sizeof p);
    p.family = LLTM_SEQ_GRID;
    p.dtype = dtype;
    p.B = B;
    p.H = H;
    p.forward.lanes = p.backward.lanes = lanes;
    p.forward.values = p.backward.values = values;
    p.forward.rows = p.backward.rows = p.forward.chunk = p.backward.chunk = 16;
    p.forward.exchange = p.backward.exchange = LLTM_SEQ_EXCHANGE_GLOBAL;
    p.forward.blocks = p.backward.blocks = (H + 256 / lanes - 1) / (256 / lanes);
    p.forward.groups = p.backward.groups = groups;
    return p;
}

/* the block family: one block a batch group, chunks of `chunk` rows */
static lltm_sequence_plan block_plan(lltm_dtype dtype, int64_t B, int64_t H, int chunk,
                                     int64_t groups)
{
    lltm_sequence_plan p;
    memset(&p, 0, sizeof p);
    p.family = LLTM_SEQ_BLOCK;
    p.dtype = dtype;
    p.B = B;
    p.H = H;
    p.forward.lanes = p.backward.lanes = chunk == 1 ? 2 : 4;
    p.forward.values = p.backward.values = 64 / p.forward.lanes;
    p.forward.rows = p.backward.rows = p.forward.chunk = p.backward.chunk = chunk;
    p.forward.exchange = p.backward.exchange = LLTM_SEQ_EXCHANGE_LOCAL;
    p.forward.blocks = p.backward.blocks = 1;
    p.forward.groups = p.backward.groups = groups;
    return p;
}

static int good(double us) { return isfinite(us) && us > 0; }

int main(void)
{
    const lltm_cuda_device dev = h100();
    const lltm_dtype dtypes[] = {LLTM_FLOAT32, LLTM_FLOAT64, LLTM_FLOAT16, LLTM_BFLOAT16};
    const char *names[] = {"float32", "float64", "float16", "bfloat16"};
    for (int d = 0; d < 4; ++d) {
        const lltm_dtype dt = dtypes[d];
        lltm_sequence_plan steps;
        memset(&steps, 0, sizeof steps);
        steps.family = LLTM_SEQ_STEPS;
        steps.dtype = dt;
        for (int64_t B = 1; B <= 1024; B *= 4)
            for (int64_t H = 16; H <= 2048; H *= 2) {
                const lltm_sequence_plan g = grid_plan(dt, B, H, 32, 32, 1);
                const double s = lltm_sequence_plan_cost_cuda(&dev, &steps, 100, B, H / 2, H);
                const double c = lltm_sequence_plan_cost_cuda(&dev, &g, 100, B, H / 2, H);
                check(good(s) && good(c), "finite positive costs", B, H, names[d]);
                check(lltm_sequence_plan_cost_cuda(&dev, &steps, 200, B, H / 2, H) > s &&
                          lltm_sequence_plan_cost_cuda(&dev, &g, 200, B, H / 2, H) > c,
                      "more steps cost more", B, H, names[d]);
                check(lltm_sequence_plan_cost_cuda(&dev, &steps, 100, 2 * B, H / 2, H) >= s &&
                          lltm_sequence_plan_cost_cuda(&dev, &steps, 100, B, H, 2 * H) >= s,
                      "more rows or units never cheaper", B, H, names[d]);
                const double fused =
                    lltm_cell_route_cost_cuda(&dev, dt, LLTM_CELL_FUSED, B, H / 2, H);
                const double cublas =
                    lltm_cell_route_cost_cuda(&dev, dt, LLTM_CELL_CUBLAS, B, H / 2, H);
                const int route = lltm_cell_route_cuda(&dev, dt, B, H / 2, H);
                check(good(fused) && good(cublas), "finite positive cell costs", B, H, names[d]);
                check(route == (cublas < fused ? LLTM_CELL_CUBLAS : LLTM_CELL_FUSED),
                      "the cell takes the cheaper route", B, H, names[d]);
            }
        /* the block family: a block walking more chunks costs more a step */
        for (int chunk = 1; chunk <= 4; chunk *= 4)
            for (int64_t B = 1; B <= 1024; B *= 4) {
                const lltm_sequence_plan one = block_plan(dt, B, 64, chunk, 1);
                const int64_t chunks = (B + chunk - 1) / chunk;
                const lltm_sequence_plan many = block_plan(dt, B, 64, chunk, chunks);
                const double c1 = lltm_sequence_plan_cost_cuda(&dev, &one, 100, B, 32, 64);
                const double cm = lltm_sequence_plan_cost_cuda(&dev, &many, 100, B, 32, 64);
                check(good(c1) && good(cm), "finite positive block costs", B, chunk, names[d]);
                check(lltm_sequence_plan_cost_cuda(&dev, &many, 200, B, 32, 64) > cm,
                      "more steps cost more (block)", B, chunk, names[d]);
                check(B <= chunk ? c1 == cm : c1 > cm,
                      "one block walking every chunk costs more than a block a chunk", B,
                      chunk, names[d]);
            }
        /* half the SMs: products dearer, a persistent step's terms unchanged */
        lltm_cuda_device half = dev;
        half.sm_count = 66;
        const lltm_sequence_plan g = grid_plan(dt, 64, 256, 16, 32, 4);
        check(lltm_sequence_plan_cost_cuda(&half, &steps, 100, 64, 128, 256) >
                  lltm_sequence_plan_cost_cuda(&dev, &steps, 100, 64, 128, 256),
              "fewer SMs: dearer products", 64, 256, names[d]);
        const double g1 = lltm_sequence_plan_cost_cuda(&dev, &g, 1000, 64, 128, 256) -
                          lltm_sequence_plan_cost_cuda(&dev, &g, 999, 64, 128, 256);
        const double g2 = lltm_sequence_plan_cost_cuda(&half, &g, 1000, 64, 128, 256) -
                          lltm_sequence_plan_cost_cuda(&half, &g, 999, 64, 128, 256);
        check(g2 > g1 * 0.999, "fewer SMs: a grid step no cheaper", 64, 256, names[d]);
    }
    /* tensor cores: bfloat16 products from compute capability 8.0, float16 from 7.0 */
    lltm_cuda_device volta = dev;
    volta.major = 7;
    check(lltm_cell_route_cost_cuda(&volta, LLTM_BFLOAT16, LLTM_CELL_CUBLAS, 256, 512, 1024) >
              lltm_cell_route_cost_cuda(&dev, LLTM_BFLOAT16, LLTM_CELL_CUBLAS, 256, 512, 1024),
          "no bfloat16 tensor cores before 8.0", 256, 1024, "bfloat16");
    check(lltm_cell_route_cost_cuda(&volta, LLTM_FLOAT16, LLTM_CELL_CUBLAS, 256, 512, 1024) ==
              lltm_cell_route_cost_cuda(&dev, LLTM_FLOAT16, LLTM_CELL_CUBLAS, 256, 512, 1024),
          "float16 tensor cores from 7.0", 256, 1024, "float16");
    /* the grid's products on tensor cores: the half types on 8.0+, where the
     * library's code is for 8.0+ too; a pass over a chunk costs a latency
     * of its own there (a layer planned in half the batch groups, twice the
     * passes: 1.42x measured at bfloat16 B256/H128) */
    {
        lltm_cuda_device ptx75 = dev;
        ptx75.code_arch = 75;
        for (int d = 0; d < 4; ++d) {
            const int half = dtypes[d] == LLTM_FLOAT16 || dtypes[d] == LLTM_BFLOAT16;
            check(lltm_cuda_grid_tensor_cores(&dev, dtypes[d]) == half,
                  "grid tensor cores: the half types on 8.0+", 0, 0, names[d]);
            check(!lltm_cuda_grid_tensor_cores(&volta, dtypes[d]) &&
                      !lltm_cuda_grid_tensor_cores(&ptx75, dtypes[d]),
                  "no grid tensor cores before 8.0, nor from older code", 0, 0, names[d]);
        }
        check(!lltm_cuda_grid_tensor_cores(NULL, LLTM_BFLOAT16), "no device: none", 0, 0,
              "bfloat16");
        const lltm_sequence_plan whole = grid_plan(LLTM_BFLOAT16, 256, 128, 16, 8, 16);
        const lltm_sequence_plan halved = grid_plan(LLTM_BFLOAT16, 256, 128, 16, 8, 8);
        const double ratio = lltm_sequence_plan_cost_cuda(&dev, &halved, 100, 256, 64, 128) /
                             lltm_sequence_plan_cost_cuda(&dev, &whole, 100, 256, 64, 128);
        check(ratio > 1.3 && ratio < 1.6, "tensor cores: twice the passes, 1.3x - 1.6x", 256,
              128, "bfloat16");
        /* float32's grid on TF32: where the caller allows it (dev.tf32), on
         * 8.0+ and code for 8.0+; a plan of its TF32 build costed by its own
         * passes (H100 B64/H512 16x32, 4 groups: 1,182 us against 1,675 for
         * the FFMA build), one of its FFMA build as before */
        lltm_cuda_device allowed = dev, volta_allowed = volta, ptx_allowed = ptx75;
        allowed.tf32 = volta_allowed.tf32 = ptx_allowed.tf32 = 1;
        check(lltm_cuda_grid_tensor_cores(&allowed, LLTM_FLOAT32) &&
                  !lltm_cuda_grid_tensor_cores(&dev, LLTM_FLOAT32) &&
                  !lltm_cuda_grid_tensor_cores(&volta_allowed, LLTM_FLOAT32) &&
                  !lltm_cuda_grid_tensor_cores(&ptx_allowed, LLTM_FLOAT32) &&
                  !lltm_cuda_grid_tensor_cores(&allowed, LLTM_FLOAT64),
              "grid TF32: float32 where allowed, on 8.0+", 0, 0, "float32");
        lltm_sequence_plan ffma = grid_plan(LLTM_FLOAT32, 64, 512, 16, 32, 4), on = ffma;
        on.forward.tf32 = on.backward.tf32 = 1;
        const double us_ffma = lltm_sequence_plan_cost_cuda(&allowed, &ffma, 100, 64, 256, 512);
        const double us_on = lltm_sequence_plan_cost_cuda(&allowed, &on, 100, 64, 256, 512);
        check(us_on < 0.8 * us_ffma && us_on > 0.5 * us_ffma, "TF32 grid: 0.5x - 0.8x FFMA's",
              64, 512, "float32");
        check(lltm_sequence_plan_cost_cuda(&dev, &ffma, 100, 64, 256, 512) >= us_ffma,
              "FFMA grid: its products at the TF32 rate where allowed", 64, 512, "float32");
        /* the layouts of 64 values a lane: their own passes (H100 bfloat16
         * B64/H256: 8x64 in 16 groups of 4-row chunks, 600 us, against
         * 16x32 in 4 groups of 16-row ones, 788); no TF32 build of them */
        lltm_sequence_plan x64 = grid_plan(LLTM_BFLOAT16, 64, 256, 8, 64, 16);
        x64.forward.rows = x64.backward.rows = x64.forward.chunk = x64.backward.chunk = 4;
        const lltm_sequence_plan x32 = grid_plan(LLTM_BFLOAT16, 64, 256, 16, 32, 4);
        const double us_x64 = lltm_sequence_plan_cost_cuda(&dev, &x64, 100, 64, 128, 256);
        const double us_x32 = lltm_sequence_plan_cost_cuda(&dev, &x32, 100, 64, 128, 256);
        check(us_x64 < 0.9 * us_x32 && us_x64 > 0.6 * us_x32, "8x64: 0.6x - 0.9x 16x32's", 64,
              256, "bfloat16");
        /* a layout or chunk size with no kernel costs no finite time */
        const lltm_sequence_plan none = grid_plan(LLTM_BFLOAT16, 64, 256, 8, 8, 4);
        check(isinf(lltm_sequence_plan_cost_cuda(&dev, &none, 100, 64, 128, 256)),
              "no 8x8 layout", 64, 256, "bfloat16");
        lltm_sequence_plan eight = x32;
        eight.forward.chunk = eight.backward.chunk = eight.forward.rows = eight.backward.rows = 8;
        check(isinf(lltm_sequence_plan_cost_cuda(&dev, &eight, 100, 64, 128, 256)),
              "no 8-row chunks", 64, 256, "bfloat16");
        lltm_sequence_plan x64_tf32 = grid_plan(LLTM_FLOAT32, 64, 256, 8, 64, 4);
        x64_tf32.forward.tf32 = x64_tf32.backward.tf32 = 1;
        check(isinf(lltm_sequence_plan_cost_cuda(&allowed, &x64_tf32, 100, 64, 128, 256)),
              "no TF32 build of the 64-value layouts", 64, 256, "float32");
    }
    /* TF32: float32 products at the TF32 rate only where the caller allows
     * it (dev.tf32) and the device has it (8.0+); other dtypes unchanged */
    lltm_cuda_device tf32 = dev, volta_tf32 = volta;
    tf32.tf32 = volta_tf32.tf32 = 1;
    for (int d = 0; d < 4; ++d) {
        lltm_sequence_plan steps;
        memset(&steps, 0, sizeof steps);
        steps.family = LLTM_SEQ_STEPS;
        steps.dtype = dtypes[d];
        const double off = lltm_sequence_plan_cost_cuda(&dev, &steps, 100, 256, 512, 1024);
        const double on = lltm_sequence_plan_cost_cuda(&tf32, &steps, 100, 256, 512, 1024);
        const double cell_off =
            lltm_cell_route_cost_cuda(&dev, dtypes[d], LLTM_CELL_CUBLAS, 256, 512, 1024);
        const double cell_on =
            lltm_cell_route_cost_cuda(&tf32, dtypes[d], LLTM_CELL_CUBLAS, 256, 512, 1024);
        if (dtypes[d] == LLTM_FLOAT32)
            check(on < 0.5 * off && cell_on < cell_off, "TF32 products cheaper", 256, 1024,
                  names[d]);
        else
            check(on == off && cell_on == cell_off, "TF32 leaves other dtypes alone", 256, 1024,
                  names[d]);
        check(lltm_sequence_plan_cost_cuda(&volta_tf32, &steps, 100, 256, 512, 1024) ==
                  lltm_sequence_plan_cost_cuda(&volta, &steps, 100, 256, 512, 1024),
              "no TF32 before 8.0", 256, 1024, names[d]);
    }
    /* Where the per-step family and the persistent grid trade places, as
     * measured on the H100 (T = 100, I = H/2, us of one forward + backward,
     * docs/performance.md): per-step kernels at large B x H in bfloat16
     * (B256/H1024: 3,247 against the 32x32 grid's 21,662; B1024/H256: 2,334
     * against 16x32's 10,718) and in float32 on TF32; the grid at small B or
     * H (float32 B1/H1024: 1,522 against 2,000; bfloat16 B64/H128, 16x8:
     * 769 against 982). */
    {
        struct {
            lltm_dtype dtype;
            int tf32;
            int64_t B, H;
            int lanes, values, groups;
            int steps_cheaper;
        } cases[] = {
            {LLTM_BFLOAT16, 0, 256, 1024, 32, 32, 1, 1},
            {LLTM_BFLOAT16, 0, 1024, 256, 16, 32, 8, 1},
            {LLTM_FLOAT32, 1, 256, 1024, 32, 32, 1, 1},
            {LLTM_FLOAT32, 1, 1024, 512, 16, 32, 4, 1},
            {LLTM_FLOAT32, 0, 1, 1024, 32, 32, 1, 0},
            {LLTM_BFLOAT16, 0, 64, 128, 16, 8, 4, 0},
            {LLTM_FLOAT32, 0, 16, 512, 32, 16, 1, 0},
        };
        for (size_t k = 0; k < sizeof cases / sizeof cases[0]; ++k) {
            lltm_cuda_device d = dev;
            d.tf32 = cases[k].tf32;
            lltm_sequence_plan steps;
            memset(&steps, 0, sizeof steps);
            steps.family = LLTM_SEQ_STEPS;
            steps.dtype = cases[k].dtype;
            const int64_t B = cases[k].B, H = cases[k].H;
            const lltm_sequence_plan g = grid_plan(cases[k].dtype, B, H, cases[k].lanes,
                                                   cases[k].values, cases[k].groups);
            const double s_us = lltm_sequence_plan_cost_cuda(&d, &steps, 100, B, H / 2, H);
            const double g_us = lltm_sequence_plan_cost_cuda(&d, &g, 100, B, H / 2, H);
            const char *what = cases[k].tf32                        ? "float32 on TF32"
                               : cases[k].dtype == LLTM_FLOAT32 ? "float32"
                                                                : "bfloat16";
            check((s_us < g_us) == cases[k].steps_cheaper,
                  cases[k].steps_cheaper ? "per-step kernels cheaper than the grid"
                                         : "the grid cheaper than per-step kernels",
                  B, H, what);
        }
    }
    /* invalid questions */
    lltm_sequence_plan none;
    memset(&none, 0, sizeof none);
    none.dtype = LLTM_FLOAT32;
    check(isinf(lltm_sequence_plan_cost_cuda(NULL, &none, 1, 1, 1, 1)) &&
              isinf(lltm_sequence_plan_cost_cuda(&dev, NULL, 1, 1, 1, 1)) &&
              isinf(lltm_sequence_plan_cost_cuda(&dev, &none, 1, 1, 1, 1)) &&
              isinf(lltm_sequence_plan_cost_cuda(&dev, &none, -1, 1, 1, 1)) &&
              isinf(lltm_cell_route_cost_cuda(&dev, LLTM_FLOAT32, 7, 1, 1, 1)) &&
              isinf(lltm_cell_route_cost_cuda(NULL, LLTM_FLOAT32, LLTM_CELL_FUSED, 1, 1, 1)),
          "invalid plans and routes cost infinity", 1, 1, "float32");
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
