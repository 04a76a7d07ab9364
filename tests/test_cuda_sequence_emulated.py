"""The CUDA sequence kernels (csrc/core/lltm_cuda_seq*.cu) run on the CPU
through a fiber emulation (tests/cuda_emu: every thread of the grid is a
fiber, so the per-step grid and cluster barriers, block barriers and warp
shuffles all work), against the reference loop of cells in float64.

No GPU needed: CI checks, for every persistent plan and every dtype, at odd
sizes (H not a multiple of a block's units, B beyond one 16-row chunk, I = 0),
the kernels' indexing, padding, reductions and barriers, that every output
element is written and nothing outside the outputs is, and the per-step
kernels of the fallback. The cluster plan runs with its state exchanged
through the emulated distributed shared memory (st.async into every block,
counted on transaction barriers) under a schedule that lets some threads
lag. Timing and the memory model are not emulated:
tests/test_cuda_sequence.py runs the real thing on a GPU. The whole layer
through the core's entry points: tests/test_cuda_layer_emulated.py.
"""

import ctypes
import shutil

import pytest
import torch

from guarded import Guarded, as_ptr
from sequence_emu import (ANY, BLOCK, CLUSTER, CORE, DTYPE_CODES, EXCHANGE_BROADCAST,
                          EXCHANGE_LOCAL, EXCHANGE_REDUCE_SCATTER, GRID, PLANS, STEPS, assert_close_to, device,
                          layer_inputs, make_plan, random_lengths, reference_layer, weight_grads)

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


def _run_case(lib, options, dtype, T, B, I, H, check_plan=None, lengths=None):
    """The chooser's plan for `options` (a dict of lltm_sequence_plan_options),
    run forward and backward against the reference; lengths: see reference_layer."""
    status, plan = make_plan(lib, dtype, T, B, I, H, **options)
    assert status == 0, f"no plan for {options}"
    assert plan.family in (GRID, CLUSTER, BLOCK)
    if check_plan:
        check_plan(plan)
    plan_ref = ctypes.byref(plan)
    (x, W, b, h0, c0), ref_args = layer_inputs(T, B, I, H, dtype)
    out_r, h_r, c_r, cells_r, acts_r, backward = reference_layer(*ref_args, lengths)
    lengths_ptr = None if lengths is None else as_ptr(lengths)
    ws_bytes = plan.workspace_bytes
    workspace = torch.full((max(1, ws_bytes // 4),), float("nan"), dtype=torch.float32)
    ws_ptr = as_ptr(workspace) if ws_bytes else None

    # forward: gates enter holding x W_x^T (rounded to dtype, as cuBLAS returns it)
    proj = (x.double().reshape(T * B, I) @ W.double()[:, H:].t()).reshape(T, B, 3 * H)
    gates = Guarded((T, B, 3 * H), dtype, fill=proj.to(dtype))
    output, cells = Guarded((T, B, H), dtype), Guarded((T, B, H), dtype)
    h_n, c_n = Guarded((B, H), dtype), Guarded((B, H), dtype)
    status = lib.lltm_sequence_forward_persistent_cuda(
        plan_ref, T, B, I, H, as_ptr(h0), as_ptr(c0), as_ptr(W), as_ptr(b), gates.ptr, output.ptr,
        cells.ptr, h_n.ptr, c_n.ptr, ws_ptr, lengths_ptr, None)
    assert status == 0, f"forward status {status}"
    assert_close_to("output", output.check("output"), out_r, dtype)
    assert_close_to("cells", cells.check("cells"), cells_r, dtype)
    assert_close_to("gates", gates.check("gates"), acts_r, dtype)
    # the final state, written by the recurrence: each row's own last step
    assert_close_to("h_n", h_n.check("h_n"), h_r, dtype)
    assert_close_to("c_n", c_n.check("c_n"), c_r, dtype)
    rows = torch.arange(B)
    last = (lengths.long() - 1) if lengths is not None else torch.full((B,), T - 1)
    assert torch.equal(h_n.value, output.value[last, rows]), "h_n is not the output's last step"
    assert torch.equal(c_n.value, cells.value[T - 1]), "c_n is not the last step's cell"

    # backward, from the kernel's own saved state (what the op does)
    grads_in = [torch.randn(T, B, H, dtype=torch.float64), torch.randn(B, H, dtype=torch.float64),
                torch.randn(B, H, dtype=torch.float64)]
    go, ghn, gcn = [t.to(dtype) for t in grads_in]
    d_x, d_W, d_b, d_h0, d_c0 = backward(go.double(), ghn.double(), gcn.double())
    dG = Guarded((T, B, 3 * H), dtype)
    db, dh0, dc0 = Guarded((3 * H,), dtype), Guarded((B, H), dtype), Guarded((B, H), dtype)
    workspace.fill_(float("nan"))
    status = lib.lltm_sequence_backward_persistent_cuda(
        plan_ref, T, B, I, H, as_ptr(go), as_ptr(ghn), as_ptr(gcn), as_ptr(W), as_ptr(cells.value),
        as_ptr(gates.value), dG.ptr, db.ptr, dh0.ptr, dc0.ptr, ws_ptr, lengths_ptr, None)
    assert status == 0, f"backward status {status}"
    dW, dx = weight_grads(dG.check("grad_gates"), x, W, h0, output.value, H)
    assert_close_to("grad_bias", db.check("grad_bias"), d_b, dtype)
    assert_close_to("grad_h0", dh0.check("grad_h0"), d_h0, dtype)
    assert_close_to("grad_c0", dc0.check("grad_c0"), d_c0, dtype)
    assert_close_to("grad_weights", dW, d_W, dtype)
    assert_close_to("grad_input", dx, d_x, dtype)


CASES = [  # (T, B, I, H): batch 1, B past one 16-row chunk, H off the block's units, I = 0,
    # H a multiple of 4 (16-byte staging loads), T = 1, B past one 8-row chunk
    (3, 1, 2, 5), (4, 3, 5, 17), (2, 18, 3, 9), (2, 2, 0, 3), (3, 19, 4, 12), (1, 4, 3, 10),
    (3, 13, 2, 11),
]


def _has_kernels(plan, dtype):
    """float64 has no grid layout of 32 values a lane (the registers that
    hold W_h); those of 64 are the half types' only (tensor cores)."""
    values = PLANS[plan].get("grid_values")
    return not ((dtype == torch.float64 and values == 32)
                or (values == 64 and dtype not in (torch.float16, torch.bfloat16)))


PLAN_DTYPES = [(plan, dtype) for plan in PLANS for dtype in DTYPE_CODES
               if _has_kernels(plan, dtype)]


@pytest.mark.parametrize("plan,dtype", PLAN_DTYPES,
                         ids=[f"{p}-{str(d).split('.')[-1]}" for p, d in PLAN_DTYPES])
@pytest.mark.parametrize("T,B,I,H", CASES)
def test_persistent_kernels(emu, plan, dtype, T, B, I, H):
    _run_case(emu, PLANS[plan], dtype, T, B, I, H)


@pytest.mark.parametrize("plan,dtype", PLAN_DTYPES,
                         ids=[f"{p}-{str(d).split('.')[-1]}" for p, d in PLAN_DTYPES])
@pytest.mark.parametrize("T,B,I,H", [(5, 19, 3, 12), (4, 3, 2, 17)])
def test_persistent_kernels_lengths(emu, plan, dtype, T, B, I, H):
    """Rows stopping at their own lengths inside every persistent kernel:
    state kept, output and gates 0 beyond each row's length; backward:
    dL/dh_n entering at each row's last step, dL/dc passing the later steps,
    no gate gradient there."""
    _run_case(emu, PLANS[plan], dtype, T, B, I, H, lengths=random_lengths(T, B))


@pytest.mark.parametrize("plan", ["cluster_32_4", "cluster_32_4_split8", "grid_16_8"])
def test_persistent_kernels_lengths_batch_groups(emu, plan):
    """Lengths with the batch split into clusters / groups of chunks."""
    options = dict(PLANS[plan], grid_groups_max=0) if plan.startswith("grid") else PLANS[plan]
    _run_case(emu, options, torch.float32, 4, 13, 3, 61 if plan.startswith("cluster") else 20,
              lengths=random_lengths(4, 13))


GRID_PLANS = [p for p in PLANS if PLANS[p]["family"] == GRID]


@pytest.mark.parametrize("groups", [1, 0], ids=["one-group", "groups"])
@pytest.mark.parametrize("plan", GRID_PLANS)
def test_grid_chunks_that_stopped(emu, plan, groups):
    """Lengths sorted longest first, as a packed batch's are: whole chunks of
    rows stop while others run, and the grid kernels form no product for
    them (forward: h_{t-1} W_h; backward: dG_{t+1} W_h), one group of blocks
    or the chunks spread over several."""
    T, B = 9, 37
    longer = torch.sort(torch.randint(4, T + 1, (B - 8,)), descending=True).values
    longer[0] = T
    short = torch.tensor([3, 3, 2, 2, 2, 1, 1, 1])  # chunks that stop early
    lengths = torch.cat([longer, short]).to(torch.int64)
    dtype = torch.float32 if _has_kernels(plan, torch.float32) else torch.bfloat16
    _run_case(emu, dict(PLANS[plan], grid_groups_max=groups), dtype, T, B, 3, 20,
              lengths=lengths)


@pytest.mark.parametrize("groups", [1, 0], ids=["one-group", "groups"])
@pytest.mark.parametrize("plan", [p for p in GRID_PLANS if PLANS[p]["grid_values"] == 64])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_grid_layouts_of_64_values(emu, plan, dtype, groups):
    """The layouts of 64 values a lane (tensor cores only), whose lanes take
    two rows of a 16-row chunk (8x64) and whose threads two (row, unit)
    pairs of the backward: H past one block's units (32 and 16 a block),
    16-row chunks full and partial, rows of their own lengths; float32 and
    float64 have no kernels of them."""
    lengths = random_lengths(4, 37)
    _run_case(emu, dict(PLANS[plan], grid_groups_max=groups), dtype, 4, 37, 5, 70,
              lengths=lengths)
    _run_case(emu, dict(PLANS[plan], grid_groups_max=groups), dtype, 3, 16, 3, 33)
    for refused in (torch.float32, torch.float64):
        status, _ = make_plan(emu, refused, 4, 16, 3, 33, **PLANS[plan])
        assert status != 0


@pytest.mark.parametrize("plan,H", [("cluster_32_4", 128),
                                    ("cluster_32_4", 61), ("cluster_32_4", 124),
                                    ("cluster_32_4_nosplit", 128),
                                    ("grid_16_32", 40),
                                    ("grid_32_32", 70)])
def test_persistent_kernels_larger_h(emu, plan, H):
    """Several blocks, the last one partly padded (or exactly full); the
    cluster family at H = 128: 16 blocks (a non-portable cluster)."""
    _run_case(emu, PLANS[plan], torch.float32, 4, 5, 7, H)


@pytest.mark.parametrize("plan,chunk", [("cluster_32_4", 4), ("cluster_32_4_split8", 8)])
@pytest.mark.parametrize("B,H", [(16, 128), (13, 61), (6, 8)])
def test_cluster_batch_split(emu, plan, chunk, B, H):
    """The 16-block kernels at B <= 16: a cluster a chunk of 4 rows (or 8),
    the last one partly padded at B = 13 and 6, each exchanging only its own
    rows; the backward's bias sums of the clusters added through the
    workspace."""
    def check(p):
        groups = -(-B // chunk)
        assert (p.forward.chunk, p.forward.groups) == (chunk, groups)
        assert (p.backward.chunk, p.backward.groups) == (chunk, groups)
        assert p.backward.exchange == EXCHANGE_REDUCE_SCATTER
    _run_case(emu, PLANS[plan], torch.float32, 3, B, 5, H, check)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lengths", [False, True])
def test_cluster_batch_groups(emu, dtype, lengths):
    """The 16-block kernels at 16 < B <= 64: a cluster a 16-row chunk (B =
    37: 3 clusters, the last chunk partial), the bias sums of the clusters
    added through the workspace; with per-row lengths too."""
    T, B = 4, 37

    def check(p):
        assert (p.forward.chunk, p.forward.groups) == (16, 3)
        assert (p.backward.chunk, p.backward.groups) == (16, 3)
    _run_case(emu, PLANS["cluster_32_4_nosplit"], dtype, T, B, 5, 40, check,
              lengths=random_lengths(T, B) if lengths else None)


@pytest.mark.parametrize("groups", [1, 3, None])
@pytest.mark.parametrize("plan,dtype", [("grid_16_8", torch.float32), ("grid_16_8", torch.float64),
                                        ("grid_16_32", torch.bfloat16),
                                        ("grid_32_32", torch.float16)])
def test_grid_batch_groups(emu, plan, dtype, groups):
    """The grid layouts share B's 16-row chunks out over batch groups of
    blocks: B = 50 is 4 chunks, the last one partial; 3 groups (capped by
    grid_groups_max) take 2, 1 and 1 of them, None: one group a chunk,
    1: every block takes every chunk. The bias gradient is summed over the
    groups through the workspace."""
    options = dict(PLANS[plan], grid_groups_max=groups or 0, grid_chunk=16)

    def check(p):
        assert p.forward.groups == p.backward.groups == (groups or 4)
    _run_case(emu, options, dtype, 3, 50, 5, 20, check)


@pytest.mark.parametrize("groups", [1, 3, None])
@pytest.mark.parametrize("lengths", [False, True])
@pytest.mark.parametrize("plan,dtype", [("grid_16_8_c4", torch.float32),
                                        ("grid_32_32_c4", torch.bfloat16),
                                        ("grid_16_8_c4", torch.float64)])
def test_grid_small_chunks(emu, plan, dtype, groups, lengths):
    """The grid layouts in 4-row chunks: B = 13 is 4 chunks, the last one
    of a row; 3 groups take 2, 1 and 1 of them (a group walking two small
    chunks), None: one group a chunk, 1: one group walking all four; with
    per-row lengths too."""
    T, B = 4, 13
    options = dict(PLANS[plan], grid_groups_max=groups or 0)

    def check(p):
        assert (p.forward.chunk, p.forward.rows, p.backward.chunk) == (4, 4, 4)
        assert p.forward.groups == p.backward.groups == (groups or 4)
    _run_case(emu, options, dtype, T, B, 5, 20, check,
              lengths=random_lengths(T, B) if lengths else None)


@pytest.mark.parametrize("groups", [1, 3, None])
@pytest.mark.parametrize("lengths", [False, True])
@pytest.mark.parametrize("chunk,dtype,H", [(1, torch.float32, 64), (4, torch.float32, 61),
                                           (4, torch.bfloat16, 64), (1, torch.float64, 33)])
def test_block_family(emu, chunk, dtype, H, groups, lengths):
    """The block family at its largest H (every unit in one block, the k
    range split over 2 lanes, or 4) and one below it, B = 13: 13 one-row chunks or
    4 four-row ones (the last of one row) over 1 block, 3 (blocks walking
    several chunks) or one a chunk; the bias sums of the blocks added in
    order through the workspace; with per-row lengths too."""
    T, B = 4, 13
    options = dict(family=BLOCK, block_chunk=chunk, grid_groups_max=groups or 0)

    def check(p):
        chunks = -(-B // chunk)
        lanes = 2 if chunk == 1 and dtype != torch.float64 else 4  # a unit's lanes
        for launch in (p.forward, p.backward):
            assert (launch.lanes, launch.values, launch.rows, launch.chunk) == (lanes, 64 // lanes,
                                                                                chunk, chunk)
            assert (launch.exchange, launch.blocks, launch.groups) == (EXCHANGE_LOCAL, 1,
                                                                     groups or chunks)
        assert (p.workspace_bytes > 0) == ((groups or chunks) > 1 or dtype == torch.bfloat16)
    _run_case(emu, options, dtype, T, B, 5, H, check,
              lengths=random_lengths(T, B) if lengths else None)


def test_block_family_limits(emu):
    """No block plan past 64 units or for a chunk the family has not."""
    f32 = torch.float32
    assert make_plan(emu, f32, 10, 4, 3, 65, family=BLOCK)[0] != 0
    assert make_plan(emu, f32, 10, 4, 3, 64, family=BLOCK, block_chunk=2)[0] != 0
    assert make_plan(emu, f32, 10, 4, 3, 64, family=GRID, block_chunk=2)[0] != 0
    status, plan = make_plan(emu, f32, 10, 4, 3, 64, family=BLOCK)
    assert status == 0 and plan.family == BLOCK


@pytest.mark.parametrize("plan", [p for p in PLANS if p.startswith("cluster")])
@pytest.mark.parametrize("dtype,B", [(torch.float32, 64), (torch.float64, 32),
                                     (torch.bfloat16, 49)])
def test_cluster_plan_most_rows(emu, plan, dtype, B):
    """The cluster family keeps every row's state in shared memory: the most
    rows it takes (4 chunks of 16 in 4-byte state, 2 in float64)."""
    _run_case(emu, PLANS[plan], dtype, 3, B, 3, 24)


def _family(lib, dtype, B, H, **options):
    status, plan = make_plan(lib, dtype, 100, B, max(1, H // 2), H, **options)
    return status, plan.family


def test_plan_choice(emu):
    """The rules' picks (csrc/core/lltm_cuda_rules.c) on the emulated H100 at
    T = 100, I = H/2, and the options:
    a forced family or layout is obeyed, or refused where it cannot run."""
    f32, f64, bf16 = torch.float32, torch.float64, torch.bfloat16
    def grid(dtype, B, H, **options):
        status, plan = make_plan(emu, dtype, 100, B, max(1, H // 2), H, **options)
        assert status == 0 and plan.family == GRID
        assert (plan.forward.lanes, plan.forward.values) == (plan.backward.lanes,
                                                             plan.backward.values)
        assert (plan.forward.chunk, plan.forward.groups) == (plan.backward.chunk,
                                                             plan.backward.groups)
        return plan.forward.lanes, plan.forward.values, plan.forward.groups, plan.forward.chunk
    # clusters where a batch of at most 16 rows splits into 4-row clusters
    assert _family(emu, f32, 16, 128) == (0, CLUSTER)
    # H <= 64: one block a batch chunk, in 1-row chunks (H100 float32 B16/H64:
    # 178 us against 231 for the 16-block clusters), 4-row chunks where the
    # rows are many (B1024/H64: 799 us against 999 in 1-row chunks, 2,831
    # for the grid in 4-row chunks)
    def block(dtype, B, H):
        status, plan = make_plan(emu, dtype, 100, B, max(1, H // 2), H)
        assert status == 0 and plan.family == BLOCK
        assert (plan.forward.chunk, plan.forward.groups) == (plan.backward.chunk,
                                                             plan.backward.groups)
        return plan.forward.chunk, plan.forward.groups
    assert block(bf16, 1, 64) == (1, 1)
    assert block(f32, 16, 64) == (1, 16)
    assert block(f32, 256, 64) == (1, 256)  # two 128-thread blocks an SM
    assert block(f32, 1024, 64) == (4, 132)
    assert block(f64, 16, 33) == (1, 16)
    assert _family(emu, f32, 16, 65) == (0, CLUSTER)  # past the block's 64 units
    # 16 < B <= 64: a 16-block cluster a 16-row chunk, side by side (float32
    # B64/H128: 481 us, against 1,358 for one cluster walking the 4 chunks
    # and 765 for the 16x8 grid's 4 batch groups)
    for dtype, B, H, groups in ((f32, 64, 128, 4), (bf16, 64, 100, 4), (f32, 17, 128, 2),
                                (f32, 48, 100, 3)):
        status, plan = make_plan(emu, dtype, 100, B, H // 2, H)
        assert status == 0 and plan.family == CLUSTER
        assert (plan.forward.chunk, plan.forward.groups) == (16, groups)
        assert (plan.backward.chunk, plan.backward.groups) == (16, groups)
    # beyond the clusters' 64 rows: the grid, 16x8 in 16-row chunks (float32
    # on FFMA takes 4-row chunks from H = 256: lltm_cuda_rules.c)
    assert grid(f32, 65, 128) == (16, 8, 5, 16)
    assert grid(f32, 64, 512) == (16, 32, 4, 16)  # 32 unit blocks x 4 batch groups
    assert grid(f32, 32, 512) == (16, 32, 4, 4)  # 32 unit blocks x 4 groups of 2 chunks
    # 4-row chunks where they cut a thread's multiply-adds a step: at small B
    # (B = 16 at H = 256: 4 groups of a quarter of them, not 1 group of 16
    # rows; H100 float32: 600 us against 1,102) and at B = 64, H = 256 (8
    # groups of 16 blocks walking 2 chunks: 1,186 us against 1,303 for 4
    # groups of 32 blocks and one 16-row chunk)
    assert grid(f32, 16, 256, family=GRID) == (32, 16, 4, 4)
    assert grid(f32, 64, 256) == (16, 32, 8, 4)
    assert grid(f32, 256, 64, family=GRID) == (16, 8, 16, 16)  # H200: 784 us against 859
    # bfloat16 (tensor cores) B1/H256: 4-row chunks (32x16 in 16-row ones 688 us
    # against 519 - 528 in 4-row ones); of the two layouts within 3% of each
    # other in 4-row chunks (B1/H512: 32x16 487 us, 16x32 501; B16/H256: 495,
    # 500), 16x32, in half the blocks
    assert grid(bf16, 1, 256, family=GRID) == (16, 32, 1, 4)
    assert grid(f32, 4, 1024) == (32, 32, 1, 4)
    assert grid(f32, 16, 256, family=GRID, grid_chunk=16) == (32, 16, 1, 16)
    # 128 < H <= 256 and B <= 56: 16-block clusters of 16 units, a cluster a
    # 4-row chunk (8-row past 28 rows), where the grid's step is slower (H100
    # graph replay, T 100: float32 B16/H256 392 us against 595, bfloat16
    # B1/H256 315 against 502, B48/H256 491 against 590); past 56 rows the grid
    for dtype, B, H, chunk in ((f32, 16, 256, 4), (bf16, 1, 256, 4), (bf16, 48, 256, 8),
                               (f32, 32, 160, 8)):
        status, plan = make_plan(emu, dtype, 100, B, H // 2, H)
        assert status == 0 and plan.family == CLUSTER
        assert (plan.forward.chunk, plan.forward.blocks) == (chunk, -(-H // 16))
    assert grid(bf16, 64, 256)[3] == 4
    assert grid(f32, 64, 256, family=GRID, grid_chunk=4)[2:] == (8, 4)  # forced: 2 passes
    assert make_plan(emu, f32, 100, 16, 128, 256, grid_chunk=8)[0] != 0  # no such chunk
    # large B x H: per-step products (cuBLAS) beat a grid walking many chunks
    assert _family(emu, f32, 1024, 1024) == (0, STEPS)
    assert _family(emu, bf16, 256, 1024) == (0, STEPS)
    assert _family(emu, f32, 64, 1025) == (0, STEPS)  # no persistent plan holds H
    assert _family(emu, f64, 8, 600) == (0, STEPS)
    # float64 past H = 512: its widest grid layout, 32x16, holds 512 units,
    # and no cluster plan holds more; the per-step family
    for B, H in ((1, 513), (64, 1024)):
        assert _family(emu, f64, B, H) == (0, STEPS)
        assert _family(emu, f64, B, H, family=GRID)[0] != 0
    # forced
    assert grid(f32, 16, 100, family=GRID)[:2] == (16, 8)  # grid asked for: its cheapest
    assert grid(f64, 64, 512, family=GRID)[:3] == (32, 16, 2)  # no 16x32 in float64
    assert grid(f32, 64, 1024, family=GRID)[:2] == (32, 32)
    assert _family(emu, f32, 16, 100, family=STEPS) == (0, STEPS)  # steps asked for
    assert _family(emu, f32, 16, 300, family=CLUSTER)[0] != 0  # no cluster plan that large
    assert _family(emu, f32, 16, 100, family=GRID, grid_lanes=32, grid_values=32)[0] == 0
    assert _family(emu, f64, 16, 100, family=GRID, grid_lanes=32, grid_values=32)[0] != 0
    # the cluster family holds every row's state in shared memory
    assert _family(emu, f32, 64, 128, family=CLUSTER) == (0, CLUSTER)
    assert _family(emu, bf16, 64, 100, family=CLUSTER) == (0, CLUSTER)
    assert _family(emu, f64, 32, 128, family=CLUSTER) == (0, CLUSTER)
    assert _family(emu, f64, 33, 128, family=CLUSTER)[0] != 0
    assert _family(emu, f32, 65, 128, family=CLUSTER)[0] != 0
    # nothing to run
    assert _family(emu, f32, 0, 128) == (0, STEPS)
    assert _family(emu, f32, 16, 0) == (0, STEPS)


def test_residency(emu):
    """How much of the device a plan's launches hold (the emulated H100: 132
    SMs, one 256-thread block an SM, two of 128, 7 clusters of 8 or 16
    blocks): per direction, the parts a call launches (the grid's whole
    launch; the cluster family's clusters, the block family's blocks) and
    how many fit at once; parts 0 for the per-step family."""
    f32, bf16 = torch.float32, torch.bfloat16

    def residency(dtype, B, H, **options):
        status, p = make_plan(emu, dtype, 100, B, H // 2, H, **options)
        assert status == 0
        resident, parts = (ctypes.c_int64 * 2)(-1, -1), (ctypes.c_int64 * 2)(-1, -1)
        assert emu.lltm_sequence_plan_residency_cuda(ctypes.byref(device(emu)), ctypes.byref(p),
                                                     resident, parts) == 0
        return p, list(zip(resident, parts))
    p, r = residency(f32, 1, 256, family=GRID, grid_lanes=32, grid_values=32)
    assert p.forward.blocks * p.forward.groups == 32 and r == [(4, 1)] * 2  # 132 // 32 grids
    p, r = residency(f32, 16, 1024, family=GRID)
    assert p.forward.blocks * p.forward.groups == 128 and r == [(1, 1)] * 2  # one grid
    # 4 clusters of 16 blocks: 7 clusters fit, not 8 (128 blocks on 132 SMs)
    p, r = residency(f32, 64, 128, family=CLUSTER)
    assert (p.forward.blocks, p.forward.groups) == (16, 4) and r == [(7, 4)] * 2
    p, r = residency(f32, 16, 128, family=CLUSTER, cluster_chunk=16)  # one cluster of 16
    assert (p.forward.blocks, p.forward.groups) == (16, 1) and r == [(7, 1)] * 2
    # a backward that broadcasts dG (8 blocks of 16 units) has no kernel in
    # the library: none resident
    b = p.backward
    b.exchange, b.lanes, b.values, b.blocks = EXCHANGE_BROADCAST, 16, 8, 8
    resident, parts = (ctypes.c_int64 * 2)(-1, -1), (ctypes.c_int64 * 2)(-1, -1)
    assert emu.lltm_sequence_plan_residency_cuda(ctypes.byref(device(emu)), ctypes.byref(p),
                                                 resident, parts) == 0
    assert list(zip(resident, parts)) == [(7, 1), (0, 1)]
    p, r = residency(bf16, 16, 64, family=BLOCK, block_chunk=1)  # 16 blocks of 128 threads
    assert p.forward.groups == 16 and r == [(264, 16)] * 2
    p, r = residency(f32, 1024, 64, family=BLOCK, block_chunk=4)  # 256 threads a block
    assert p.forward.groups == 132 and r == [(132, 132)] * 2
    p, r = residency(f32, 300, 64, family=BLOCK, block_chunk=4)
    assert p.forward.groups == 75 and r == [(132, 75)] * 2  # a second layer's 75: 57 fit
    assert residency(f32, 16, 100, family=STEPS)[1] == [(0, 0)] * 2
    status, p = make_plan(emu, f32, 100, 16, 50, 100)
    resident, parts = (ctypes.c_int64 * 2)(), (ctypes.c_int64 * 2)()
    assert emu.lltm_sequence_plan_residency_cuda(ctypes.byref(device(emu)), None, resident,
                                                 parts) != 0
    assert emu.lltm_sequence_plan_residency_cuda(ctypes.byref(device(emu)), ctypes.byref(p),
                                                 None, parts) != 0


def test_plan_layouts(emu):
    """The whole plan of the cluster family (H100's properties)."""
    status, p = make_plan(emu, torch.float32, 100, 16, 32, 128)
    assert status == 0 and p.family == CLUSTER and (p.B, p.H) == (16, 128)
    fwd, bwd = p.forward, p.backward
    # 16 blocks of 8 units; B <= 16: a cluster per 4-row chunk, 8 lanes a unit on 1 row
    assert (fwd.lanes, fwd.values, fwd.rows, fwd.chunk, fwd.blocks, fwd.groups) == (8, 16, 1, 4, 16, 4)
    assert (bwd.exchange, bwd.chunk, bwd.blocks, bwd.groups) == (EXCHANGE_REDUCE_SCATTER, 4, 16, 4)
    assert p.workspace_bytes == 4 * 3 * 128 * 4  # the 4 clusters' bias sums
    status, p = make_plan(emu, torch.float32, 100, 64, 32, 128, family=CLUSTER)
    assert (p.forward.lanes, p.forward.values, p.forward.rows, p.forward.chunk) == (4, 32, 2, 16)
    assert (p.forward.groups, p.backward.chunk, p.backward.groups) == (4, 16, 4)
    assert p.workspace_bytes == 4 * 3 * 128 * 4  # the 4 clusters' bias sums
    # a cluster a batch chunk: no cap on the clusters' groups
    for B in (64, 16):
        assert make_plan(emu, torch.float32, 100, B, 32, 128, family=CLUSTER,
                         grid_groups_max=1)[0] != 0
    status, p = make_plan(emu, torch.float64, 100, 16, 32, 128, family=CLUSTER)
    assert (p.forward.lanes, p.forward.values, p.forward.rows, p.forward.chunk) == (32, 4, 16, 16)
    assert p.backward.exchange == EXCHANGE_REDUCE_SCATTER and p.backward.groups == 1
    # clusters of 16 blocks only: any other size is refused, also where no
    # cluster plan would be made
    for blocks in (8, 4, 32):
        for B, H, family in ((16, 128, CLUSTER), (16, 128, ANY), (4, 200, CLUSTER),
                             (256, 512, GRID)):
            status, _ = make_plan(emu, torch.float32, 100, B, 32, H, family=family,
                                  cluster_blocks=blocks)
            assert status != 0, (blocks, B, H, family)
    for B, H in ((16, 128), (64, 128), (16, 256)):
        status, forced = make_plan(emu, torch.float32, 100, B, 32, H, family=CLUSTER,
                                   cluster_blocks=16)
        status_free, free = make_plan(emu, torch.float32, 100, B, 32, H, family=CLUSTER)
        assert status == status_free == 0 and bytes(forced) == bytes(free)
    # a plan is for its sizes only
    ws = torch.empty(1)
    assert emu.lltm_sequence_forward_persistent_cuda(ctypes.byref(p), 2, 15, 32, 128, *[None] * 4,
                                                     *[as_ptr(ws)] * 5, None, None, None) != 0


def test_plan_for_two_concurrent_layers(emu):
    """concurrent=2 (both directions of a layer at once): only plans of which
    two launches are resident together (the emulated H100 holds 7 clusters
    of 16 blocks: two 4-cluster launches do not fit, two 2-cluster ones do;
    a grid gets half the resident blocks); concurrent=1 is the default;
    other values are refused."""
    f32 = torch.float32
    status, alone = make_plan(emu, f32, 100, 16, 32, 128)
    assert status == 0 and (alone.forward.groups, alone.backward.groups) == (4, 4)
    status, one = make_plan(emu, f32, 100, 16, 32, 128, concurrent=1)
    assert status == 0 and bytes(one) == bytes(alone)
    status, two = make_plan(emu, f32, 100, 16, 32, 128, concurrent=2)
    assert status == 0 and two.family in (CLUSTER, GRID)
    if two.family == CLUSTER:
        assert 2 * two.forward.groups <= 7 and 2 * two.backward.groups <= 7
    # the 16-block kernels forced: the batch split into 8-row chunks (2 clusters)
    status, split = make_plan(emu, f32, 100, 16, 32, 128, family=CLUSTER, cluster_blocks=16,
                              concurrent=2)
    assert status == 0 and (split.forward.chunk, split.forward.groups) == (8, 2)
    assert (split.backward.chunk, split.backward.groups) == (8, 2)
    # a grid: half the blocks each (B = 64, H = 256: 4 batch groups alone, 2 shared)
    status, g1 = make_plan(emu, f32, 100, 64, 64, 256, family=GRID, grid_lanes=32,
                           grid_values=32)
    status2, g2 = make_plan(emu, f32, 100, 64, 64, 256, family=GRID, grid_lanes=32,
                            grid_values=32, concurrent=2)
    assert status == status2 == 0
    assert g1.forward.groups == 4 and g2.forward.groups == 2
    assert 2 * g2.forward.blocks * g2.forward.groups <= 132
    # B = 64: 4 clusters of 16-row chunks a launch, 8 for two: none fits
    assert make_plan(emu, f32, 100, 64, 32, 128, family=CLUSTER, concurrent=2)[0] != 0
    for bad in (-1, 3):
        assert make_plan(emu, f32, 100, 16, 32, 128, concurrent=bad)[0] != 0


@pytest.mark.parametrize("T,B,I,H", [(7, 16, 5, 128), (5, 13, 3, 100)])
def test_persistent_kernels_planned_for_two_layers(emu, T, B, I, H):
    """The plans made for two concurrent layers run correctly (forward and
    backward against the reference), with and without lengths."""
    _run_case(emu, dict(concurrent=2), torch.float32, T, B, I, H)
    _run_case(emu, dict(family=CLUSTER, cluster_blocks=16, concurrent=2), torch.float32, T, B,
              I, H, lengths=random_lengths(T, B))


def test_device_query_reports_the_code_that_runs(emu):
    """The emulated H100 runs sm_90 code: clusters there. (On a real H100
    running the library's compute_80 PTX the query clears cluster_launch;
    tests/test_cuda_sequence.py checks the plan there.)"""
    dev = device(emu)
    assert (dev.major, dev.cluster_launch, dev.code_arch) == (9, 1, 90)


@pytest.mark.parametrize("major,cluster", [(8, 0), (8, 1), (9, 0)])
def test_plan_without_clusters(emu, major, cluster):
    """Devices before compute capability 9.0 (or without cluster launch, as
    a Hopper GPU running code JIT-compiled from compute_80 PTX reports) get
    the grid family where an H100 gets clusters, and run it; the block
    family (H <= 64) needs no clusters and is theirs too."""
    dev = device(emu, major=major, cluster_launch=cluster)
    status, p = make_plan(emu, torch.float32, 100, 16, 50, 100, dev=dev)
    assert status == 0 and p.family == GRID
    status, _ = make_plan(emu, torch.float32, 3, 16, 5, 24, dev=dev, family=CLUSTER)
    assert status != 0
    status, p = make_plan(emu, torch.float32, 100, 16, 5, 24, dev=dev)
    assert status == 0 and p.family == BLOCK


@pytest.mark.parametrize("with_lengths", [False, True], ids=["all_T", "lengths"])
@pytest.mark.parametrize("dtype", list(DTYPE_CODES), ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("B,H", [(4, 6), (70, 40)], ids=["small", "blocks"])
def test_per_step_kernels(emu, dtype, with_lengths, B, H):
    """The per-step family: the layer's time loop, with torch's matmul
    standing in for aten::mm on the GPU; with lengths, rows stopping at their
    own, h_n gathered from each row's last step. B=70, H=40: two blocks of
    units, several blocks of rows (the last one short), so several lines of
    bias sums."""
    T, I = 3, 3
    code = DTYPE_CODES[dtype]
    lengths = random_lengths(T, B) if with_lengths else None
    lengths_ptr = None if lengths is None else as_ptr(lengths)
    (x, W, b, h0, c0), ref_args = layer_inputs(T, B, I, H, dtype)
    out_r, h_r, c_r, cells_r, acts_r, backward = reference_layer(*ref_args, lengths)
    Wd = W.double()
    gates = (x.double() @ Wd[:, H:].t()).to(dtype)
    output, cells = Guarded((T, B, H), dtype), Guarded((T, B, H), dtype)
    for t in range(T):
        h_prev = h0 if t == 0 else output.value[t - 1]
        c_prev = c0 if t == 0 else cells.value[t - 1]
        recurrent = (h_prev.double() @ Wd[:, :H].t()).to(dtype).contiguous()
        g_t = gates[t]
        status = emu.lltm_sequence_forward_step_cuda(
            code, B, H, t, lengths_ptr, as_ptr(recurrent), as_ptr(g_t), as_ptr(b), as_ptr(c_prev),
            ctypes.c_void_p(output.value[t].data_ptr()), ctypes.c_void_p(cells.value[t].data_ptr()),
            None)
        assert status == 0
    assert_close_to("output", output.check("output"), out_r, dtype)
    assert_close_to("cells", cells.check("cells"), cells_r, dtype)
    assert_close_to("gates", gates, acts_r, dtype)
    if lengths is not None:
        h_n = Guarded((B, H), dtype)
        assert emu.lltm_sequence_last_state_cuda(code, T, B, H, lengths_ptr, as_ptr(output.value),
                                                 h_n.ptr, None) == 0
        assert_close_to("h_n", h_n.check("h_n"), h_r, dtype)

    go = torch.randn(T, B, H, dtype=torch.float64).to(dtype)
    ghn, gcn = [torch.randn(B, H, dtype=torch.float64).to(dtype) for _ in range(2)]
    d_x, d_W, d_b, d_h0, d_c0 = backward(go.double(), ghn.double(), gcn.double())
    acc_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    # the bias sums' lines: written at the first step (NaN before), added to after
    parts = emu.lltm_sequence_step_bias_parts(B, H)
    assert parts >= 1
    bias_parts = torch.full((parts, 3 * H), float("nan"), dtype=acc_dtype)
    dG = Guarded((T, B, 3 * H), dtype)
    dc = torch.empty_like(gcn)  # out of place at the first step, in place after
    dc_next = gcn
    dh = torch.full_like(ghn, float("nan"))  # not read at the last step
    for t in reversed(range(T)):
        status = emu.lltm_sequence_backward_step_cuda(
            code, B, H, t, T, lengths_ptr, as_ptr(go[t]), as_ptr(dh), as_ptr(ghn),
            as_ptr(dc_next), as_ptr(dc), as_ptr(cells.value[t]), as_ptr(gates[t]),
            ctypes.c_void_p(dG.value[t].data_ptr()), as_ptr(bias_parts), None)
        assert status == 0
        dc_next = dc
        dh = (dG.value[t].double() @ Wd[:, :H]).to(dtype).contiguous()
    db = Guarded((3 * H,), dtype)
    assert emu.lltm_sequence_bias_sum_cuda(code, parts, 3 * H, as_ptr(bias_parts), db.ptr,
                                           None) == 0
    db = db.check("grad_bias")
    dW, dx = weight_grads(dG.check("grad_gates"), x, W, h0, output.value, H)
    assert_close_to("grad_bias", db, d_b, dtype)
    assert_close_to("grad_h0", dh, d_h0, dtype)
    assert_close_to("grad_c0", dc, d_c0, dtype)
    assert_close_to("grad_weights", dW, d_W, dtype)
    assert_close_to("grad_input", dx, d_x, dtype)


def test_core_reads_no_environment():
    """Plans are values: nothing under csrc/core reads the environment."""
    readers = [p.name for p in sorted(CORE.iterdir())
               if p.suffix in (".c", ".h", ".cu", ".cuh") and "getenv" in p.read_text()]
    assert readers == []
