"""The native LLTM cell on CUDA against the float64 reference (on the CPU).

Both routes of the CUDA binding are tested (see csrc/binding/cell_cuda.c):
"fused" (own kernels, forward 1 launch, backward 2) and "cublas" (aten::mm
around pointwise kernels), plus the automatic choice.

Tolerances against float64, elementwise |got - ref| <= tol * (|ref| + max|ref|)
(products sum many terms: their rounding scales with the largest terms), and
for the half types, over >= 64 elements, also ||got - ref|| / ||ref|| <= tol/2:
    float64 1e-10, float32 1e-4 (TF32 off, torch's default), float16 1e-2,
    bfloat16 4e-2 (inputs, saved activations and outputs rounded to 8 bits).
Skipped without a GPU.
"""

import pytest
import torch

import lltm
from lltm import _native, reference
from conftest import TOL, assert_close, cell_inputs

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or not _native.has_cuda_kernels(),
    reason="needs a CUDA GPU and the CUDA kernels (liblltm_cuda.so)")

POLICIES = ["auto", "fused", "cublas"]
SHAPES = [  # (B, I, H): batch 1 and 3, H not a multiple of 32, I > H and I < H
    (1, 1, 1), (1, 5, 3), (3, 7, 5), (3, 2, 33), (16, 32, 128), (5, 300, 17), (64, 17, 65),
    (2, 0, 4), (7, 128, 7),
]
# Big enough for the large tile configurations of every fused kernel, with
# ragged edges everywhere.
LARGE_SHAPE = (300, 100, 777)
# The medium tiles of every fused kernel (csrc/core/lltm_cuda_cell_tiles.h),
# 13 of a tile's 16 rows, ragged units and columns.
MEDIUM_SHAPE = (13, 150, 257)


def matmul_policy(name):
    return lltm.overrides.matmul(name)


def check_step(B, I, H, dtype, device="cuda", make_args=None):
    """Forward and backward of one step against the float64 CPU reference,
    with random upstream gradients."""
    args64 = cell_inputs(B, I, H, torch.float64)
    args = [a.to(device=device, dtype=dtype) for a in args64]
    if make_args is not None:
        args = make_args(args)
    args = [a.detach().requires_grad_() for a in args]
    # The reference sees exactly the (rounded) inputs of the kernel.
    ref_args = [a.detach().double().cpu().requires_grad_() for a in args]
    new_h, new_cell = lltm.functional.lltm_cell(*args)
    r_h, r_c = reference.lltm_cell(*ref_args)
    up_h, up_c = torch.randn(B, H, dtype=torch.float64), torch.randn(B, H, dtype=torch.float64)
    torch.autograd.backward((new_h, new_cell), (up_h.to(device, dtype), up_c.to(device, dtype)))
    torch.autograd.backward((r_h, r_c), (up_h, up_c))
    for name, got, want in (("new_h", new_h, r_h), ("new_cell", new_cell, r_c)):
        assert got.dtype == dtype and got.device == args[0].device and got.shape == want.shape
        assert_close(name, got, want, dtype)
    for name, a, r in zip(("input", "weights", "bias", "old_h", "old_cell"), args, ref_args):
        assert a.grad.dtype == dtype and a.grad.shape == a.shape, name
        assert_close(f"grad {name}", a.grad, r.grad, dtype)


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("B,I,H", SHAPES)
def test_matches_reference(policy, dtype, B, I, H):
    with matmul_policy(policy):
        check_step(B, I, H, dtype)


@pytest.mark.parametrize("policy", ["fused", "cublas"])
@pytest.mark.parametrize("dtype", list(TOL))
def test_matches_reference_large(policy, dtype):
    with matmul_policy(policy):
        check_step(*LARGE_SHAPE, dtype)


@pytest.mark.parametrize("dtype", list(TOL))
def test_matches_reference_medium_tiles(dtype):
    with matmul_policy("fused"):
        check_step(*MEDIUM_SHAPE, dtype)


def test_bias_1x3h_and_non_contiguous_inputs():
    def make(args):
        x, W, b, h, c = args
        return [x.t().contiguous().t(),            # column-major
                W.t().contiguous().t(),
                b.reshape(1, -1).clone(),         # the tutorial's [1, 3H]
                torch.cat([h, h], dim=1)[:, ::2],  # strided view
                c.expand(2, *c.shape)[1]]          # a view into an expanded tensor
    for policy in ("fused", "cublas"):
        with matmul_policy(policy):
            check_step(5, 9, 11, torch.float64, make_args=make)


@pytest.mark.parametrize("policy", ["fused", "cublas"])
def test_stride_zero_upstream_gradients(policy):
    """.sum().backward() hands the backward expanded (stride-0) gradients."""
    with matmul_policy(policy):
        args = [a.cuda().requires_grad_() for a in cell_inputs(4, 6, 9)]
        ref_args = [a.detach().cpu().requires_grad_() for a in args]
        h, c = lltm.functional.lltm_cell(*args)
        (h.sum() + c.sum()).backward()
        rh, rc = reference.lltm_cell(*ref_args)
        (rh.sum() + rc.sum()).backward()
        for a, r in zip(args, ref_args):
            assert_close("grad", a.grad, r.grad, torch.float64)


@pytest.mark.parametrize("policy", ["fused", "cublas"])
@pytest.mark.parametrize("B,I,H", [(1, 2, 3), (3, 4, 5), (2, 6, 2)])
def test_gradcheck_float64(policy, B, I, H):
    with matmul_policy(policy):
        args = [a.cuda().requires_grad_() for a in cell_inputs(B, I, H)]
        assert torch.autograd.gradcheck(lltm.functional.lltm_cell, args)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_opcheck(dtype):
    for policy in ("fused", "cublas"):
        with matmul_policy(policy):
            args = [a.requires_grad_() for a in cell_inputs(3, 5, 7, dtype, device="cuda")]
            torch.library.opcheck(torch.ops.lltm.cell_forward.default, args)
            x, W, b, h, c = cell_inputs(3, 5, 7, dtype, device="cuda")
            new_h, new_cell, gates = torch.ops.lltm.cell_forward(x, W, b, h, c)
            bw = (torch.randn_like(new_h), torch.randn_like(new_cell), new_cell, gates, x, h, W)
            torch.library.opcheck(torch.ops.lltm.cell_backward.default, bw)


def _step_loss(cell, x, h, c):
    h1, c1 = cell(x, (h, c))
    h2, c2 = cell(x, (h1, c1))
    return (h2 * h2).sum() + c2.sum()


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_torch_compile(mode):
    torch._dynamo.reset()
    cell = lltm.LLTMCell(6, 5, dtype=torch.float64, device="cuda")
    kwargs = {"fullgraph": True} if mode is None else {"mode": mode, "fullgraph": True}
    compiled = torch.compile(_step_loss, **kwargs)
    for _ in range(3):  # reduce-overhead records a graph after warm-up runs
        x, h, c = (torch.randn(4, n, dtype=torch.float64, device="cuda") for n in (6, 5, 5))
        cell.zero_grad()
        loss = compiled(cell, x, h, c)
        loss.backward()
        got = [loss.detach().clone()] + [p.grad.clone() for p in cell.parameters()]
        cell.zero_grad()
        loss_e = _step_loss(cell, x, h, c)
        loss_e.backward()
        want = [loss_e.detach()] + [p.grad for p in cell.parameters()]
        for g, w in zip(got, want):
            assert_close("compiled", g, w, torch.float64)


@pytest.mark.parametrize("policy", ["fused", "cublas"])
def test_side_stream(policy):
    """Inputs written on a side stream behind a long sleep: the op must run
    after them on that (current) stream, not on the default stream."""
    with matmul_policy(policy):
        args64 = cell_inputs(64, 96, 160, torch.float32, device="cuda")
        staged = [torch.empty_like(a) for a in args64]
        side = torch.cuda.Stream()
        torch.cuda.synchronize()
        with torch.cuda.stream(side):
            torch.cuda._sleep(50_000_000)  # ~25 ms of GPU time before the copies
            for s, a in zip(staged, args64):
                s.copy_(a)
            new_h, new_cell, gates = torch.ops.lltm.cell_forward(*staged)
            grads = torch.ops.lltm.cell_backward(torch.ones_like(new_h), torch.ones_like(new_cell),
                                                 new_cell, gates, staged[0], staged[3], staged[1])
        side.synchronize()
        want_h, want_c, want_g = torch.ops.lltm.cell_forward(*args64)
        want_grads = torch.ops.lltm.cell_backward(torch.ones_like(want_h), torch.ones_like(want_c),
                                                  want_c, want_g, args64[0], args64[3], args64[1])
        torch.testing.assert_close(new_h, want_h)
        torch.testing.assert_close(new_cell, want_c)
        for g, w in zip(grads, want_grads):
            torch.testing.assert_close(g, w)


@pytest.mark.parametrize("policy", ["fused", "cublas"])
def test_cuda_graph_capture_and_replay(policy):
    with matmul_policy(policy):
        static = [a.cuda() for a in cell_inputs(16, 32, 128, torch.float32)]
        up_h, up_c = torch.randn(16, 128, device="cuda"), torch.randn(16, 128, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up outside the capture
            for _ in range(2):
                torch.ops.lltm.cell_forward(*static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            new_h, new_cell, gates = torch.ops.lltm.cell_forward(*static)
            grads = torch.ops.lltm.cell_backward(up_h, up_c, new_cell, gates, static[0],
                                                 static[3], static[1])
        for _ in range(3):
            fresh = cell_inputs(16, 32, 128, torch.float32, device="cuda")
            for s, f in zip(static, fresh):
                s.copy_(f)
            up_h.normal_()
            up_c.normal_()
            graph.replay()
            torch.cuda.synchronize()
            want_h, want_c, want_g = torch.ops.lltm.cell_forward(*fresh)
            want_grads = torch.ops.lltm.cell_backward(up_h, up_c, want_c, want_g, fresh[0],
                                                      fresh[3], fresh[1])
            torch.testing.assert_close(new_h, want_h)
            torch.testing.assert_close(new_cell, want_c)
            for g, w in zip(grads, want_grads):
                torch.testing.assert_close(g, w)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("policy", ["fused", "cublas"])
def test_second_device(policy):
    """Tensors on cuda:1 while cuda:0 is current: kernels run on cuda:1."""
    with matmul_policy(policy), torch.cuda.device(0):
        check_step(5, 7, 33, torch.float32, device="cuda:1")
        assert torch.cuda.current_device() == 0


@pytest.mark.parametrize("policy", ["fused", "cublas"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_outputs_fully_written(policy, dtype):
    """Poison: fill the caching allocator's free blocks with NaN, so outputs
    allocated uninitialised start as NaN; none may survive."""
    B, I, H = 3, 7, 33
    with matmul_policy(policy):
        for _ in range(3):
            torch.cuda.synchronize()
            poison = [torch.full((n,), float("nan"), dtype=dtype, device="cuda")
                      for n in (B * H, B * 3 * H, 3 * H * (I + H), 3 * H, B * I, B * (I + H))
                      for _ in range(4)]
            del poison
            x, W, b, h, c = cell_inputs(B, I, H, dtype, device="cuda")
            new_h, new_cell, gates = torch.ops.lltm.cell_forward(x, W, b, h, c)
            grads = torch.ops.lltm.cell_backward(torch.randn_like(new_h), torch.randn_like(new_cell),
                                                 new_cell, gates, x, h, W)
            for name, t in zip(["new_h", "new_cell", "gates", "grad_input", "grad_weights",
                                "grad_bias", "grad_old_h", "grad_old_cell"],
                               [new_h, new_cell, gates, *grads]):
                assert not torch.isnan(t).any(), f"{name} has unwritten (NaN) elements"


@pytest.mark.parametrize("policy", ["fused", "cublas"])
def test_backward_is_deterministic(policy):
    """Bitwise the same twice (B = 200: the cuBLAS route's bias gradient adds
    the sums of seven row chunks)."""
    with matmul_policy(policy):
        x, W, b, h, c = cell_inputs(200, 48, 96, torch.float32, device="cuda")
        new_h, new_cell, gates = torch.ops.lltm.cell_forward(x, W, b, h, c)
        gh, gc = torch.randn_like(new_h), torch.randn_like(new_cell)
        first = torch.ops.lltm.cell_backward(gh, gc, new_cell, gates, x, h, W)
        second = torch.ops.lltm.cell_backward(gh, gc, new_cell, gates, x, h, W)
        for a, b_ in zip(first, second):
            assert torch.equal(a, b_)


def test_errors():
    x, W, b, h, c = cell_inputs(3, 4, 5, torch.float32, device="cuda")
    with pytest.raises(RuntimeError, match="one device"):
        torch.ops.lltm.cell_forward(x.cpu(), W, b, h, c)
    with pytest.raises(RuntimeError, match="one device"):
        torch.ops.lltm.cell_forward(x, W, b, h, c.cpu())
    with pytest.raises(RuntimeError, match="one dtype"):
        torch.ops.lltm.cell_forward(x, W.double(), b, h, c)
    with pytest.raises(RuntimeError, match="3H|I\\+H"):
        torch.ops.lltm.cell_forward(x, W[:, 1:], b, h, c)
    with pytest.raises(RuntimeError, match="dtype"):
        torch.ops.lltm.cell_forward(*(t.int() for t in (x, W, b, h, c)))
    new_h, new_cell, gates = torch.ops.lltm.cell_forward(x, W, b, h, c)
    with pytest.raises(RuntimeError, match="one device"):
        torch.ops.lltm.cell_backward(new_h, new_cell, new_cell, gates.cpu(), x, h, W)
    # The op still works after the errors (nothing left half-done).
    torch.ops.lltm.cell_forward(x, W, b, h, c)
    torch.cuda.synchronize()


def _kernel_launches(fn):
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events()
            if e.device_type == torch.autograd.DeviceType.CUDA and "memcpy" not in e.name.lower()
            and "memset" not in e.name.lower()]


@pytest.mark.parametrize("policy", ["fused", "cublas"])
def test_kernel_launch_counts(policy):
    """Launches of one forward and one backward through autograd at
    B16/I32/H128 (torch.profiler), upstream gradients contiguous. Fused:
    1 + 2. cuBLAS: 3 + 4 (our concat / pointwise kernels and one GEMM per
    product; cuBLAS may add a split-K reduction kernel to a GEMM, not counted).
    Printed for the record (pytest -s)."""
    with matmul_policy(policy):
        args = [a.requires_grad_() for a in cell_inputs(16, 32, 128, torch.float32, device="cuda")]
        up = (torch.randn(16, 128, device="cuda"), torch.randn(16, 128, device="cuda"))
        for _ in range(2):  # warm-up (cuBLAS handles, lazy module loading)
            out = lltm.functional.lltm_cell(*args)
            torch.autograd.backward(out, up)
        for a in args:  # no accumulation into existing .grad (torch's own kernels)
            a.grad = None
        holder = {}
        fwd = _kernel_launches(lambda: holder.update(out=lltm.functional.lltm_cell(*args)))
        bwd = _kernel_launches(lambda: torch.autograd.backward(holder["out"], up))
        print(f"\nlaunches[{policy}] forward {len(fwd)}: {fwd}\nlaunches[{policy}] backward "
              f"{len(bwd)}: {bwd}")
        if policy == "fused":
            assert len(fwd) == 1 and "forward_fused_kernel" in fwd[0]
            assert len(bwd) == 2 and "backward_weights_kernel" in bwd[0]
            assert "backward_inputs_kernel" in bwd[1]
        else:
            bwd = [n for n in bwd if "splitKreduce" not in n]
            assert len(fwd) == 3 and len(bwd) == 4, (fwd, bwd)


def test_kernel_launch_counts_of_a_large_batch():
    """From B = 129 the cuBLAS route's pointwise backward splits the batch
    over blocks, and one more kernel adds the chunks' bias sums: the
    library's two kernels, then the three products (cuBLAS may run a product
    as more than one kernel at these sizes)."""
    with matmul_policy("cublas"):
        args = [a.requires_grad_() for a in cell_inputs(200, 32, 128, torch.float32, device="cuda")]
        up = (torch.randn(200, 128, device="cuda"), torch.randn(200, 128, device="cuda"))
        for _ in range(2):
            torch.autograd.backward(lltm.functional.lltm_cell(*args), up)
        for a in args:
            a.grad = None
        out = lltm.functional.lltm_cell(*args)
        bwd = _kernel_launches(lambda: torch.autograd.backward(out, up))
        print(f"\nlaunches backward {len(bwd)}: {bwd}")
        ours = [n for n in bwd if "anonymous namespace" in n]
        assert len(ours) == 2 and bwd[:2] == ours, bwd
        assert "backward_pointwise_kernel" in ours[0] and "bias_sum_kernel" in ours[1], bwd
        assert len(bwd) >= 5, bwd


@pytest.mark.parametrize("policy", ["fused", "cublas"])
@pytest.mark.parametrize("used", ["h", "c"])
def test_loss_on_one_output(policy, used):
    """Only new_h (or only new_cell) reaches the loss: the other upstream
    gradient is absent (None) and counts as zero."""
    with matmul_policy(policy):
        args = [a.cuda().requires_grad_() for a in cell_inputs(3, 4, 5)]
        ref_args = [a.detach().cpu().requires_grad_() for a in args]
        k = 0 if used == "h" else 1
        (lltm.functional.lltm_cell(*args)[k] ** 2).sum().backward()
        (reference.lltm_cell(*ref_args)[k] ** 2).sum().backward()
        for a, r in zip(args, ref_args):
            assert_close("grad", a.grad, r.grad, torch.float64)
