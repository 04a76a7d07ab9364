"""A small driver for compute-sanitizer (memcheck, racecheck) over the CUDA
sequence kernels: every route (cluster; grid in 16-row chunks, B split over
batch groups, and in 4-row chunks, also float32's TF32 build and the half
types' layouts of 64 values a lane; block in 1- and 4-row chunks, one block
a chunk or several chunks a block; per-step, over several blocks of units
and of rows), float32 and bfloat16, sizes with padded units, two to four
16-row chunks, the clusters' batch split (B <= 16) and I = 0; each also
with rows of their own lengths,
sorted longest first; then stacked layers in one launch (lltm::stack_forward /
stack_backward: 2 and 3 layers, every layout, several batch groups, the half
types' layouts on tensor cores); then
lltm.LLTM's stacked layers in time chunks (their backward through
sequence_backward_gates). Run by
scripts/gpu.sh (mode sanitize) as

    compute-sanitizer --tool memcheck --error-exitcode 9 python3 scripts/sanitize_sequence.py

Prints "sanitize driver: N runs ok" when every run finished; the sanitizer's
exit code reports what it found.
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import lltm  # noqa: E402,F401
from lltm import _native  # noqa: E402

CASES = {# B = 13, 2: the batch split (four clusters of 4-row chunks, one)
         # H past 128 (16 blocks of 16 units): clusters of 4-row chunks (B = 13,
         # 2), of 8-row ones (B = 40)
         "cluster16": [(3, 17, 5, 33), (2, 2, 0, 128), (2, 40, 3, 100), (3, 13, 4, 128),
                       (3, 13, 4, 200), (2, 2, 3, 256), (2, 40, 5, 129)],
         "grid": [(3, 17, 5, 33), (2, 3, 4, 129), (2, 2, 3, 600), (2, 64, 8, 300)],
         # 4-row chunks: B = 13 (4 chunks, a group each), 3 (one padded chunk)
         "grid4": [(3, 13, 5, 33), (2, 3, 4, 129), (2, 6, 3, 600)],
         # float32's TF32 build of the grid (16-row chunks; torch's float32
         # matmuls on TF32)
         "grid_tf32": [(3, 17, 5, 33), (2, 3, 4, 129), (2, 64, 8, 300), (2, 6, 3, 600)],
         # the layouts of 64 values a lane (bfloat16: tensor cores only), a
         # lane two rows of a chunk (8x64), units past one block's
         "grid:8x64": [(3, 17, 5, 33), (2, 64, 8, 300), (2, 37, 3, 500)],
         "grid4:8x64": [(3, 13, 5, 33), (2, 6, 3, 500)],
         "grid:16x64": [(3, 17, 5, 33), (2, 64, 8, 300), (2, 20, 3, 1000)],
         "grid4:16x64": [(3, 13, 5, 33), (2, 6, 3, 1000)],
         # H = 64: every unit of the block; B = 300 in 1-row chunks: blocks
         # walking several chunks
         "block1": [(3, 17, 5, 33), (2, 2, 0, 64), (2, 300, 3, 40)],
         "block4": [(3, 13, 5, 64), (2, 3, 4, 7), (2, 600, 3, 50)],
         # B = 70, 300: several blocks of rows in the backward step (bias sums' lines)
         "steps": [(3, 17, 5, 33), (3, 70, 5, 40), (2, 300, 8, 129)]}


def clusters_available() -> bool:
    """Code built for sm_90+ on a Hopper GPU runs cluster plans; compute_80
    PTX JIT-compiled there does not (a forced cluster plan is refused)."""
    x, W, b, h, c = (torch.randn(*s, device="cuda") for s in
                     ((1, 1, 1), (24, 9), (24,), (1, 8), (1, 8)))
    try:
        with lltm.overrides.sequence_plan(family="cluster"):
            torch.ops.lltm.sequence_forward(x, W, b, h, c)
        return True
    except RuntimeError as exc:
        if "no plan of the forced kernel family" not in str(exc):
            raise
        return False


def main() -> int:
    assert torch.cuda.is_available() and _native.has_cuda_kernels(), "needs the CUDA kernels"
    quick = "--quick" in sys.argv  # racecheck is slow: float32 only (x64 layouts: bfloat16)
    runs = 0
    for route, shapes in CASES.items():
        route, _, shape = route.partition(":")
        blocks = int(route[len("cluster"):]) if route.startswith("cluster") else None
        if blocks and not clusters_available():
            print(f"{route}: not run (this build's code has no cluster kernels for this GPU)")
            continue
        tf32 = route.endswith("_tf32")
        name = route[:-len("_tf32")] if tf32 else route
        family = "cluster" if blocks else name.rstrip("0123456789")
        chunk = {"grid": 16, "grid4": 4}.get(name)
        block_chunk = {"block1": 1, "block4": 4}.get(route)
        lltm.overrides.set_sequence_plan(lltm.overrides.SequencePlan(
            family=family, cluster_blocks=blocks, grid_chunk=chunk, block_chunk=block_chunk,
            grid_tf32=True if tf32 else None, grid_shape=shape or None))
        torch.backends.cuda.matmul.allow_tf32 = tf32  # read at each call below, as the plan
        dtypes = ((torch.bfloat16,) if shape else (torch.float32,) if quick or tf32
                  else (torch.float32, torch.bfloat16))
        for dtype in dtypes:
            for T, B, I, H in shapes:
                x, W, b, h, c = (torch.randn(*s, device="cuda", dtype=dtype) for s in
                                 ((T, B, I), (3 * H, I + H), (3 * H,), (B, H), (B, H)))
                out, h_n, c_n, cells, gates = torch.ops.lltm.sequence_forward(x, W, b, h, c)
                grads = torch.ops.lltm.sequence_backward(
                    torch.randn_like(out), torch.randn_like(h_n), torch.randn_like(c_n), x, W,
                    h, out, cells, gates)
                torch.cuda.synchronize()
                assert all(torch.isfinite(t).all() for t in (out, h_n, c_n) + tuple(grads)), \
                    (route, shape, dtype, T, B, I, H)
                runs += 1
                # rows stopping at their own lengths (1 .. T, the first row T),
                # sorted longest first as a packed batch's are: whole chunks of
                # rows stop while others run (the grid kernels skip them)
                lengths = torch.sort(torch.randint(1, T + 1, (B,), device="cuda"),
                                     descending=True).values
                lengths[0] = T
                out, h_n, c_n, cells, gates = torch.ops.lltm.sequence_forward.lengths(
                    x, W, b, h, c, lengths)
                grads = torch.ops.lltm.sequence_backward.lengths(
                    torch.randn_like(out), torch.randn_like(h_n), torch.randn_like(c_n), x, W,
                    h, out, cells, gates, lengths)
                torch.cuda.synchronize()
                assert all(torch.isfinite(t).all() for t in (out, h_n, c_n) + tuple(grads)), \
                    (route, shape, dtype, T, B, I, H, "lengths")
                runs += 1
    lltm.overrides.set_sequence_plan(lltm.overrides.SequencePlan())
    torch.backends.cuda.matmul.allow_tf32 = False
    for dtype in (torch.float32,) if quick else (torch.float32, torch.bfloat16):
        half = dtype != torch.float32 and torch.cuda.get_device_capability()[0] >= 8
        for L, T, B, I, H in STACK_CASES + (STACK_TENSOR_CORE_CASES if half else []):
            assert lltm.overrides.stack_plan_in_force(dtype, L, T, B, I, H) is not None
            runs += run_stack(dtype, L, T, B, I, H)
        for L, T, B, I, H in WAVEFRONT_CASES:
            runs += run_wavefront(dtype, L, T, B, I, H)
    print(f"sanitize driver: {runs} runs ok", flush=True)
    return 0


# (L, T, B, I, H): 32 x 4 (H <= 128) and 32 x 8 layouts, one and several
# batch groups, padded units, I = 0
STACK_CASES = [(3, 3, 5, 4, 20), (2, 3, 13, 0, 130), (3, 2, 9, 5, 256)]
# the half types on tensor cores: 16 units a block, 16-row chunks (one and
# several a block) and 4-row ones
STACK_TENSOR_CORE_CASES = [(3, 3, 64, 4, 256), (2, 2, 300, 3, 256), (3, 2, 40, 5, 100)]


def run_stack(dtype, L, T, B, I, H) -> int:  # noqa: E741
    """The stack's forward and backward, all T steps and rows of their own
    lengths: two runs."""
    args = [torch.randn(*s, device="cuda", dtype=dtype) for s in
            ((T, B, I), (3 * H, H + I), (L - 1, 3 * H, 2 * H), (L, 3 * H), (L, B, H), (L, B, H))]
    lengths = torch.randint(1, T + 1, (B,), device="cuda")
    for extra in ((), (lengths,)):
        fwd = (torch.ops.lltm.stack_forward.lengths if extra
               else torch.ops.lltm.stack_forward.default)
        bwd = (torch.ops.lltm.stack_backward.lengths if extra
               else torch.ops.lltm.stack_backward.default)
        out, h_n, c_n, outputs, cells, gates = fwd(*args, *extra)
        grads = bwd(torch.randn_like(out), torch.randn_like(h_n), torch.randn_like(c_n), args[0],
                    args[1], args[2], args[4], out, outputs, cells, gates, *extra)
        torch.cuda.synchronize()
        assert all(torch.isfinite(t).all() for t in (out, h_n, c_n) + tuple(grads)), \
            ("stack", dtype, L, T, B, I, H, bool(extra))
    return 2


# (L, T, B, I, H) of lltm.LLTM's layers in time chunks on their streams
WAVEFRONT_CASES = [(3, 9, 5, 4, 20), (2, 8, 13, 6, 130)]


def run_wavefront(dtype, L, T, B, I, H) -> int:  # noqa: E741
    """lltm.LLTM's stacked layers in 3 time chunks, forward and backward
    (each chunk's backward through lltm::sequence_backward_gates, each
    layer's dW once), all T steps and rows of their own lengths: two runs."""
    m = lltm.LLTM(I, H, num_layers=L, device="cuda", dtype=dtype)
    x = torch.randn(T, B, I, device="cuda", dtype=dtype, requires_grad=True)
    lengths = torch.randint(1, T + 1, (B,), device="cuda")
    for extra in ({}, {"lengths": lengths}):
        with lltm.overrides.wavefront(3):
            out, (h_n, c_n) = m(x, **extra)
        grads = torch.autograd.grad((out, h_n, c_n), [x, *m.parameters()],
                                    [torch.randn_like(t) for t in (out, h_n, c_n)])
        torch.cuda.synchronize()
        assert all(torch.isfinite(t).all() for t in (out, h_n, c_n) + tuple(grads)), \
            ("wavefront", dtype, L, T, B, I, H, bool(extra))
    return 2


if __name__ == "__main__":
    sys.exit(main())
