"""One LLTM layer over a whole sequence on CUDA (lltm::sequence_forward /
sequence_backward, lltm.LLTM), against the float64 reference loop of cells
on the CPU.

Every plan family of the CUDA sequence is tested, forced with
lltm.overrides.sequence_plan (docs/cuda-plans.md): "cluster" (persistent
kernel, clusters of 16 thread blocks, H <= 128, B <= 64: route "cluster16"
here; and "cluster16-split8" and "cluster16-nosplit", with its batch split
in 8-row chunks instead of 4, and without it: a cluster a 16-row chunk
also for B <= 16; past H = 128 16 units a block, H <= 256, a cluster a
chunk of 4 or 8 rows, not float64), "grid" (persistent kernel, cooperative
grid), "block" (persistent kernel, one block a batch chunk, H <= 64),
"steps" (per-step products + pointwise kernel) and "auto". The core reads
no environment.

Tolerances against float64: elementwise |got - ref| <= tol * (|ref| + max|ref|)
(products sum many terms), and for the half types, over >= 64 elements, also
||got - ref|| / ||ref|| <= tol/2: float64 1e-10, float32 1e-4 (TF32 off,
torch's default), float16 1e-2, bfloat16 4e-2. Skipped without a GPU.
"""

import ctypes
import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import lltm
from lltm import _native, reference
from conftest import assert_close

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or not _native.has_cuda_kernels(),
    reason="needs a CUDA GPU and the CUDA kernels (liblltm_cuda.so)")

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
ROUTES = ["auto", "cluster16", "cluster16-split8", "cluster16-nosplit", "grid", "block",
          "steps"]
CHUNKS = {"-split8": 8, "-nosplit": 16}  # route suffixes: the 16-block kernels' batch chunk
CLUSTERS = ["cluster16"]
SHAPES = [  # (T, B, I, H): T = 1, batch 1 and 3, B over one 16-row chunk, odd H, I = 0,
    # B over one 8-row chunk (clusters of 4 or 8 rows of the 16-block kernels)
    (1, 1, 1, 1), (5, 3, 7, 5), (4, 3, 2, 33), (3, 17, 9, 128), (6, 2, 0, 4), (4, 13, 5, 128),
    (3, 5, 40, 129), (2, 64, 256, 512), (2, 4, 8, 1000), (2, 3, 4, 1100),
]


def clusters_available():
    """Whether this build's code runs cluster plans on this GPU: code built for
    sm_90+ on a Hopper GPU does; compute_80 PTX JIT-compiled on it does not
    (the chooser then plans grids, and a forced cluster plan is refused)."""
    if not hasattr(clusters_available, "answer"):
        args, _ = seq_inputs(1, 1, 1, 8, torch.float32)
        try:
            with lltm.overrides.sequence_plan(family="cluster"):
                torch.ops.lltm.sequence_forward(*args)
            clusters_available.answer = True
        except RuntimeError as exc:
            assert "no plan of the forced kernel family" in str(exc), exc
            clusters_available.answer = False
    return clusters_available.answer


@pytest.fixture
def route(request):
    """Forces the plan of the route's name (lltm.overrides) for the test."""
    if request.param.startswith("cluster") and not clusters_available():
        pytest.skip("this build's code has no cluster kernels for this GPU (built for an "
                    "architecture before sm_90)")
    name, constraints = request.param, {}
    suffix = next((f for f in CHUNKS if name.endswith(f)), None)
    if suffix:
        constraints["cluster_chunk"] = CHUNKS[suffix]
        name = name[:-len(suffix)]
    if name.startswith("cluster") and name != "cluster":  # the cluster plan's shape
        constraints["cluster_blocks"] = int(name[len("cluster"):])
        name = "cluster"
    with lltm.overrides.sequence_plan(family=name, **constraints):
        yield request.param


def route_fits(route, H, dtype):
    if route.startswith("cluster"):  # 16 units a block past 128: 4- or 8-row clusters
        wide = route in ("cluster16", "cluster16-split8") and dtype != torch.float64
        return H <= (256 if wide else 128)
    if route == "grid":  # float64: 16x8 and 32x16
        return H <= (512 if dtype == torch.float64 else 1024)
    if route == "block":
        return H <= 64
    return True


def seq_inputs(T, B, I, H, dtype, device="cuda", weight_scale=2.0):
    g = torch.Generator().manual_seed(torch.randint(2**31 - 1, ()).item())
    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)
    args = [rand(T, B, I), rand(3 * H, I + H, scale=weight_scale / (I + H) ** 0.5), rand(3 * H),
            rand(B, H), rand(B, H)]
    return [a.to(device) for a in args], [a.double() for a in args]  # reference: rounded inputs


def reference_sequence(x, W, b, h0, c0):
    h, c, outs = h0, c0, []
    for t in range(x.shape[0]):
        h, c = reference.lltm_cell(x[t], W, b, h, c)
        outs.append(h)
    return (torch.stack(outs) if outs else h0.new_empty(0, *h0.shape)), h, c


def native_sequence(x, W, b, h0, c0):
    out, (h_n, c_n) = lltm.functional.lltm_sequence(x, W, b, h0, c0)
    return out, h_n, c_n


def compare(T, B, I, H, dtype, through=(0, 1, 2), device="cuda"):
    args, ref_args = seq_inputs(T, B, I, H, dtype, device=device)
    nat = [a.clone().requires_grad_() for a in args]
    ref = [a.clone().requires_grad_() for a in ref_args]
    out_n, out_r = native_sequence(*nat), reference_sequence(*ref)
    for name, n, r in zip(["output", "h_n", "c_n"], out_n, out_r):
        assert n.dtype == dtype and n.device == args[0].device and n.shape == r.shape, name
        assert_close(name, n, r, dtype)
    ups = [torch.randn_like(out_r[k]) for k in through]
    torch.autograd.backward([out_n[k] for k in through], [u.to(dtype).to(device) for u in ups])
    torch.autograd.backward([out_r[k] for k in through], ups)
    for name, n, r in zip(["input", "weights", "bias", "h0", "c0"], nat, ref):
        assert n.grad is not None and n.grad.dtype == dtype, name
        assert_close(f"grad of {name}", n.grad, r.grad, dtype)


@pytest.mark.parametrize("route", ROUTES, indirect=True)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("T,B,I,H", SHAPES)
def test_matches_reference(route, dtype, T, B, I, H):
    if not route_fits(route, H, dtype):
        with pytest.raises(RuntimeError, match="no plan of the forced kernel family"):
            compare(T, B, I, H, dtype)
        return
    compare(T, B, I, H, dtype)


def refused(shape, dtype):
    """Whether a grid shape has no kernels for dtype: the 32-value ones in
    float64, the 64-value ones (tensor cores only) but in the half types."""
    return ((dtype == torch.float64 and shape.endswith("x32"))
            or (shape.endswith("x64") and dtype not in (torch.float16, torch.bfloat16)))


@pytest.mark.parametrize("route", ["grid"], indirect=True)
@pytest.mark.parametrize("groups", [1, 3, None])
@pytest.mark.parametrize("shape", lltm.overrides.GRID_SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_grid_shapes_and_batch_groups(route, shape, groups, dtype):
    """Every grid shape with B = 50 (4 chunks of 16, the last partial) shared
    out over 1, 3 (capped) or as many batch groups as fit; H past one block's
    units in each."""
    with lltm.overrides.sequence_plan(grid_shape=shape, grid_groups=groups):
        if refused(shape, dtype):
            with pytest.raises(RuntimeError, match="no plan of the forced kernel family"):
                compare(3, 50, 5, 70, dtype)
            return
        compare(3, 50, 5, 70, dtype)


@pytest.mark.parametrize("route", ["grid"], indirect=True)
@pytest.mark.parametrize("groups", [1, 3, None])
@pytest.mark.parametrize("shape", lltm.overrides.GRID_SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
def test_grid_small_chunks(route, shape, groups, dtype):
    """Every grid shape in 4-row chunks: B = 13 (4 chunks, the last one of a
    row) over 1 group walking all four, 3 (capped: one walks two) or one
    group a chunk; B = 3 (one chunk, a padding row); H past one block's
    units. float64 has no 32-value shapes, and only the half types 64-value
    ones: refused."""
    with lltm.overrides.sequence_plan(grid_shape=shape, grid_groups=groups, grid_chunk=4):
        if refused(shape, dtype):
            with pytest.raises(RuntimeError, match="no plan of the forced kernel family"):
                compare(3, 13, 5, 70, dtype)
            return
        compare(3, 13, 5, 70, dtype)
        compare(4, 3, 6, 37, dtype)


@pytest.mark.parametrize("groups", [1, 3, None])
@pytest.mark.parametrize("chunk", [1, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
def test_block_chunks_and_groups(chunk, groups, dtype):
    """The block family in both of its chunks: one block walking every chunk,
    3 blocks, or as many as run at once (at most one a chunk); H = 64 (every
    unit of the block) and 37; B = 300 (as many blocks as run at once: more
    chunks than blocks; a block holds all its rows' state in shared memory,
    so one block or three cannot take 300 rows) and bitwise the same twice."""
    with lltm.overrides.sequence_plan(family="block", block_chunk=chunk, grid_groups=groups):
        compare(5, 13, 6, 64, dtype)
        if groups is None:
            compare(3, 300, 4, 37, dtype)
        args, _ = seq_inputs(4, 21, 5, 50, dtype)
        runs = []
        for _ in range(2):
            nat = [a.clone().requires_grad_() for a in args]
            out, h_n, c_n = native_sequence(*nat)
            (out.double().sum() + (h_n.double() * c_n.double()).sum()).backward()
            runs.append([out, h_n, c_n] + [a.grad for a in nat])
        for a, b in zip(*runs):
            assert torch.equal(a, b)


@pytest.mark.parametrize("route", CLUSTERS + ["grid", "block", "steps"], indirect=True)
@pytest.mark.parametrize("through", [(0,), (1,), (2,)])
def test_gradients_through_each_output(route, through):
    compare(5, 3, 4, 20, torch.float64, through=through)


@pytest.mark.parametrize("route", CLUSTERS + ["grid", "block", "steps"], indirect=True)
def test_gradcheck_float64(route):
    args, _ = seq_inputs(3, 2, 3, 5, torch.float64)
    args = [a.requires_grad_() for a in args]
    assert torch.autograd.gradcheck(native_sequence, args)


@pytest.mark.parametrize("route", CLUSTERS + ["grid", "steps"], indirect=True)
@pytest.mark.parametrize("T,tol", [(100, 1e-4), (1000, 1e-3)])
def test_long_sequence_matches_cpu_op(route, T, tol):
    """float32 on the GPU against the (reference-tested) CPU op in float64,
    B=16, H=128. Weights of a contracting recurrence: with the scale of the
    other tests c grows into the thousands over 1000 steps and float32 itself
    drifts ~1e-3 from float64 (on the CPU too)."""
    B, I, H = 16, 32, 128
    args, ref_args = seq_inputs(T, B, I, H, torch.float32, weight_scale=0.5)
    nat = [a.clone().requires_grad_() for a in args]
    ref = [a.clone().requires_grad_() for a in ref_args]
    out_n, out_r = native_sequence(*nat), native_sequence(*ref)
    ups = [torch.randn_like(o) for o in out_r]
    torch.autograd.backward(out_n, [u.float().cuda() for u in ups])
    torch.autograd.backward(out_r, ups)
    got = list(out_n) + [a.grad for a in nat]
    want = list(out_r) + [a.grad for a in ref]
    names = ["output", "h_n", "c_n", "grad input", "grad weights", "grad bias", "grad h0",
             "grad c0"]
    errors = {n: ((g.detach().double().cpu() - w.detach()).abs().max()
                  / w.detach().abs().max().clamp_min(1e-30)).item()
              for n, g, w in zip(names, got, want)}
    assert max(errors.values()) <= tol, errors


@pytest.mark.parametrize("route", CLUSTERS + ["grid", "block", "steps"], indirect=True)
def test_every_output_element_is_written(route):
    """The caching allocator hands back blocks just filled with NaN."""
    T, B, I, H = 7, 5, 6, 37
    for _ in range(3):
        junk = [torch.full((T * B * 3 * H + 1000,), float("nan"), device="cuda")
                for _ in range(8)]
        del junk
        args, _ = seq_inputs(T, B, I, H, torch.float32)
        outs = torch.ops.lltm.sequence_forward(*args)
        out, h_n, c_n, cells, gates = outs
        grads = torch.ops.lltm.sequence_backward(
            torch.randn_like(out), torch.randn_like(h_n), torch.randn_like(c_n), args[0],
            args[1], args[3], out, cells, gates)
        for t in list(outs) + list(grads):
            assert torch.isfinite(t).all()


@pytest.mark.parametrize("route", CLUSTERS, indirect=True)
@pytest.mark.parametrize("dtype,B", [(torch.float32, 40), (torch.float32, 64),
                                     (torch.float64, 32), (torch.bfloat16, 50)])
def test_cluster_plan_rows(route, dtype, B):
    """The cluster plan keeps every row's state in shared memory: several
    16-row chunks, up to the most it takes."""
    compare(4, B, 5, 100, dtype)


@pytest.mark.parametrize("route", ["cluster16", "cluster16-split8"], indirect=True)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16],
                         ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("B,H", [(1, 256), (13, 200), (40, 160), (56, 256)])
def test_wide_cluster_plan(route, dtype, B, H):
    """Past H = 128 the 16-block clusters take 16 units a block: a cluster a
    chunk of 4 rows (8 past 28 rows, or forced), up to 56 rows (7 clusters
    of 8); the last block part padded at H = 200 and 160."""
    compare(4, B, 7, H, dtype)


@pytest.mark.parametrize("route", ["cluster16"], indirect=True)
@pytest.mark.parametrize("dtype,B,H", [(torch.float32, 57, 256), (torch.float64, 4, 200),
                                       (torch.float32, 4, 257)])
def test_wide_cluster_plan_refused(route, dtype, B, H):
    """No wide cluster plan past 56 rows (8 clusters of 8 rows do not fit an
    H100 at once), in float64, or past H = 256."""
    with pytest.raises(RuntimeError, match="no plan of the forced kernel family"):
        compare(2, B, 3, H, dtype)


@pytest.mark.parametrize("route", CLUSTERS, indirect=True)
@pytest.mark.parametrize("dtype,B", [(torch.float32, 65), (torch.float64, 33)])
def test_cluster_plan_too_many_rows(route, dtype, B):
    with pytest.raises(RuntimeError, match="no plan of the forced kernel family"):
        compare(2, B, 3, 20, dtype)


@pytest.mark.parametrize("route", ["auto", "steps"] + CLUSTERS, indirect=True)
def test_deterministic(route):
    args, _ = seq_inputs(6, 5, 7, 70, torch.float32)
    runs = []
    for _ in range(2):
        nat = [a.clone().requires_grad_() for a in args]
        out, h_n, c_n = native_sequence(*nat)
        (out.sum() + (h_n * c_n).sum()).backward()
        runs.append([out, h_n, c_n] + [a.grad for a in nat])
    for a, b in zip(*runs):
        assert torch.equal(a, b)


@pytest.mark.parametrize("route", ["steps"], indirect=True)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64],
                         ids=lambda d: str(d).split(".")[-1])
def test_steps_many_blocks_of_rows(route, dtype):
    """The per-step kernels over many blocks of rows and units (B = 301: the
    backward's bias sums in 38 lines, the last block of rows short; H = 161:
    6 blocks of units, the last partial) against the reference, and bitwise
    the same twice."""
    compare(4, 301, 33, 161, dtype)
    args, _ = seq_inputs(3, 301, 33, 161, dtype)
    runs = []
    for _ in range(2):
        nat = [a.clone().requires_grad_() for a in args]
        out, h_n, c_n = native_sequence(*nat)
        (out.float().sum() + (h_n.float() * c_n.float()).sum()).backward()
        runs.append([out, h_n, c_n] + [a.grad for a in nat])
    for a, b in zip(*runs):
        assert torch.equal(a, b)


@pytest.mark.parametrize("route", CLUSTERS + ["grid", "block"], indirect=True)
def test_side_stream_and_cuda_graph(route):
    T, B, I, H = 4, 3, 5, 40
    args, _ = seq_inputs(T, B, I, H, torch.float32)
    want = torch.ops.lltm.sequence_forward(*args)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = torch.ops.lltm.sequence_forward(*args)
    torch.cuda.current_stream().wait_stream(side)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    static = [a.clone() for a in args]
    graph = torch.cuda.CUDAGraph()
    torch.ops.lltm.sequence_forward(*static)  # warm up (plan, attributes) outside capture
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        captured = torch.ops.lltm.sequence_forward(*static)
    fresh, _ = seq_inputs(T, B, I, H, torch.float32)
    for s, f in zip(static, fresh):
        s.copy_(f)
    graph.replay()
    first = [t.clone() for t in captured]
    graph.replay()
    expect = torch.ops.lltm.sequence_forward(*fresh)
    for a, b, c in zip(captured, expect, first):
        assert torch.equal(a, c)  # replays repeat exactly
        # captured, the input projection is cuBLAS's product, eager the
        # library's small one: equal up to rounding
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_captured_products_run_on_the_gemm_eager_small_ones_on_the_library_kernel():
    """A product small enough for the library's one-launch kernel runs there
    in eager mode (less host time than a library call) and through the gemm
    (cuBLAS: less GPU time) when the call is captured into a CUDA graph."""
    from torch.profiler import ProfilerActivity, profile
    T, B, I, H = 10, 4, 24, 32
    args, _ = seq_inputs(T, B, I, H, torch.float32)
    x, W = args[0].requires_grad_(), args[1].requires_grad_()

    def step():
        out, (h, c) = lltm.functional.lltm_sequence(x, W, *args[2:])
        return torch.autograd.grad(out.sum() + h.sum() + c.sum(), [x, W])

    def kernels(run):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            run()
            torch.cuda.synchronize()
        return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]

    eager = kernels(step)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        grads = step()
    replayed = kernels(graph.replay)
    assert any("small_mm" in k for k in eager), eager
    assert replayed and not any("small_mm" in k for k in replayed), replayed
    for got, want in zip(grads, step()):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_opcheck(dtype):
    args, _ = seq_inputs(3, 2, 5, 7, dtype)
    torch.library.opcheck(torch.ops.lltm.sequence_forward.default,
                          [a.requires_grad_() for a in args])
    args, _ = seq_inputs(3, 2, 5, 7, dtype)
    out, h_n, c_n, cells, gates = torch.ops.lltm.sequence_forward(*args)
    torch.library.opcheck(torch.ops.lltm.sequence_backward.default,
                          (torch.randn_like(out), torch.randn_like(h_n), torch.randn_like(c_n),
                           args[0], args[1], args[3], out, cells, gates))


def test_module_on_cuda_matches_cpu_and_compiles():
    torch._dynamo.reset()
    m = lltm.LLTM(6, 20, num_layers=2, batch_first=True, dtype=torch.float64)
    m_cuda = lltm.LLTM(6, 20, num_layers=2, batch_first=True, dtype=torch.float64,
                       device="cuda")
    m_cuda.load_state_dict(m.state_dict())
    x = torch.randn(3, 7, 6, dtype=torch.float64)

    def loss(mod, x):
        out, (h_n, c_n) = mod(x)
        return (out * out).sum() + (h_n * c_n).sum()

    l_cpu = loss(m, x)
    g_cpu = torch.autograd.grad(l_cpu, list(m.parameters()))
    compiled = torch.compile(lambda x: loss(m_cuda, x), fullgraph=True)
    l_cuda = compiled(x.cuda())
    g_cuda = torch.autograd.grad(l_cuda, list(m_cuda.parameters()))
    torch.testing.assert_close(l_cuda.cpu(), l_cpu)
    for a, b in zip(g_cuda, g_cpu):
        torch.testing.assert_close(a.cpu(), b)


def test_mixed_devices_rejected():
    args, _ = seq_inputs(3, 2, 4, 5, torch.float32)
    args[3] = args[3].cpu()
    with pytest.raises(RuntimeError, match="one device"):
        torch.ops.lltm.sequence_forward(*args)


def test_bad_route_is_a_clear_error():
    with pytest.raises(ValueError, match="family must be one of"):
        with lltm.overrides.sequence_plan(family="fast"):
            pass


def test_plan_that_cannot_run_is_a_clear_error():
    """A forced family that cannot run the sizes is an error, not a fallback."""
    args, _ = seq_inputs(3, 2, 4, 2000, torch.float32)
    with lltm.overrides.sequence_plan(family="cluster"):
        with pytest.raises(RuntimeError, match="no plan of the forced kernel family"):
            torch.ops.lltm.sequence_forward(*args)


def test_no_plan_is_forced_by_default():
    assert lltm.overrides._plan == lltm.overrides.SequencePlan()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("route", CLUSTERS + ["grid", "block", "steps"], indirect=True)
def test_second_device(route):
    """Tensors on cuda:1 while cuda:0 is current: the kernels must run on the
    tensors' device (a device guard) and on its current stream."""
    assert torch.cuda.current_device() == 0
    compare(5, 3, 7, 33, torch.float32, device="cuda:1")
    torch.cuda.synchronize(1)


CAPTURE_AFTER_SMALL_PRODUCTS = textwrap.dedent("""
    import torch, lltm
    x = torch.randn(10, 4, 24, device="cuda", requires_grad=True)
    m = lltm.LLTM(24, 32, num_layers=2, device="cuda")
    def step():
        out, _ = m(x)
        return torch.autograd.grad(out.sum(), [x, *m.parameters()])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        grads = step()
    graph.replay()
    for got, want in zip(grads, step()):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    print("captured and replayed")
""")


def test_a_capture_after_eager_calls_of_small_products_only():
    """A fresh process whose eager calls ran every product on the library's
    small kernel, then captures them (where they run through cuBLAS): torch
    makes a thread's cuBLAS handle at its first product, which a capture may
    not do; the library has the gemm ready from the eager calls (forward on
    this thread, backward on autograd's)."""
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-c", CAPTURE_AFTER_SMALL_PRODUCTS], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "captured and replayed" in done.stdout


def gemm_counts():
    """Products run so far in this process: (straight through cuBLAS, through aten::mm)."""
    lib = _native._loaded["cuda"]
    direct, through_torch = ctypes.c_int64(), ctypes.c_int64()
    lib.lltm_cuda_gemm_counts(ctypes.byref(direct), ctypes.byref(through_torch))
    return direct.value, through_torch.value


@pytest.mark.parametrize("route", ["steps"], indirect=True)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
def test_eager_products_straight_through_cublas(route, dtype):
    """Eager calls run the products on torch's cuBLAS with the library's own
    handle (none of them small: H = 600 > the small kernel's K), both operand
    layouts (forward h W_h^T, backward dG W_h, dW, dx), against the reference;
    a captured call runs them through aten::mm, and agrees up to rounding."""
    assert _native._loaded["cuda"].lltm_cuda_gemm_direct_available() == 1
    compare(2, 3, 8, 600, dtype)  # the thread's first product goes through torch
    before = gemm_counts()
    compare(3, 5, 520, 600, dtype)
    after = gemm_counts()
    assert after[0] - before[0] >= 2 * 3, (before, after)  # a product a step, each way
    assert after[1] == before[1], (before, after)

    args, _ = seq_inputs(3, 5, 520, 600, dtype)
    eager = torch.ops.lltm.sequence_forward(*args)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    before = gemm_counts()
    with torch.cuda.graph(graph):
        captured = torch.ops.lltm.sequence_forward(*args)
    graph.replay()
    after = gemm_counts()
    assert after[0] == before[0] and after[1] - before[1] == 1 + 3, (before, after)
    for a, b in zip(captured, eager):
        assert_close("captured against eager", a, b, dtype)


@pytest.fixture
def torch_determinism_restored():
    """torch's deterministic-algorithms setting as it was before the test."""
    before = (torch.are_deterministic_algorithms_enabled(),
              torch.is_deterministic_algorithms_warn_only_enabled())
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def lltm_training_step(model, x):
    out, (h_n, c_n) = model(x)
    (out.sum() + (h_n * c_n).sum()).backward()


def test_deterministic_algorithms_take_aten_mm(torch_determinism_restored):
    """With torch's deterministic algorithms on (warn-only here: a torch that
    wants CUBLAS_WORKSPACE_CONFIG, read once a process, would raise without
    it) an lltm.LLTM step on CUDA runs no product straight on cuBLAS, all
    through aten::mm, eagerly and in a direct call of the operators (which
    reads the setting as the module does); off again, the direct route is
    taken again."""
    model = lltm.LLTM(520, 600, device="cuda")
    x = torch.randn(3, 5, 520, device="cuda", requires_grad=True)
    lltm_training_step(model, x)  # each thread's first product goes through torch
    before = gemm_counts()
    lltm_training_step(model, x)
    after = gemm_counts()
    assert after[0] > before[0], (before, after)  # the direct route is in use

    weights, bias = (p.detach() for p in model.layer_parameters(0))
    h0 = x.new_zeros(5, 600)

    def direct_call():
        torch.ops.lltm.sequence_forward(x.detach(), weights, bias, h0, h0)

    torch.use_deterministic_algorithms(True, warn_only=True)
    for step in (lltm_training_step, direct_call):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # such a torch's, for the products
            before = gemm_counts()
            step() if step is direct_call else step(model, x)
            after = gemm_counts()
        assert after[0] == before[0] and after[1] > before[1], (step, before, after)

    torch.use_deterministic_algorithms(False)
    for step in (lltm_training_step, direct_call):
        before = gemm_counts()
        step() if step is direct_call else step(model, x)
        after = gemm_counts()
        assert after[0] > before[0], (step, before, after)


DETERMINISM_WITHOUT_WORKSPACE_CONFIG = textwrap.dedent("""
    import json, warnings
    import torch, lltm
    model = lltm.LLTM(520, 600, device="cuda")
    x = torch.randn(3, 5, 520, device="cuda", requires_grad=True)
    a = torch.randn(64, 64, device="cuda")

    def lltm_step():
        out, (h_n, c_n) = model(x)
        (out.sum() + (h_n * c_n).sum()).backward()

    def outcome(call):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                call()
            except RuntimeError as exc:
                return ["raised", str(exc)]
        messages = [str(w.message) for w in caught if "eterministic" in str(w.message)]
        return ["warned", messages[0]] if messages else ["ran", ""]

    lltm_step()  # each thread's first product goes through torch
    seen = {}
    for mode, warn_only in [("on", False), ("warn_only", True)]:
        torch.use_deterministic_algorithms(True, warn_only=warn_only)
        seen[mode] = {"torch.mm": outcome(lambda: torch.mm(a, a)), "lltm": outcome(lltm_step)}
    torch.use_deterministic_algorithms(False)
    seen["off"] = {"torch.mm": outcome(lambda: torch.mm(a, a)), "lltm": outcome(lltm_step)}
    torch.cuda.synchronize()
    print(json.dumps(seen))
""")


def test_deterministic_algorithms_without_workspace_config_as_torch_mm():
    """A fresh process without CUBLAS_WORKSPACE_CONFIG (torch reads it once a
    process): with deterministic algorithms on, warn-only, and off, an
    lltm.LLTM step on CUDA does what torch.mm does: raises its RuntimeError,
    warns its warning, or runs. (torch 2.11 runs: it gives each stream of its
    cuBLAS handle a workspace of its own and asks for no setting; a torch
    that asked raised or warned for torch.mm, and must for lltm.)"""
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    env.pop("CUBLAS_WORKSPACE_CONFIG", None)
    done = subprocess.run([sys.executable, "-c", DETERMINISM_WITHOUT_WORKSPACE_CONFIG], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    for mode in seen:
        (torch_kind, torch_message), (lltm_kind, lltm_message) = (
            seen[mode]["torch.mm"], seen[mode]["lltm"])
        assert lltm_kind == torch_kind, (mode, seen)
        # torch's message, as far as lltm's error (512 characters) holds it
        assert torch_message[:120] in lltm_message, (mode, seen)
