"""lltm::stack_forward / stack_backward (stacked layers in one call) against
the same layers run as one sequence_forward call each, on random inputs at
odd sizes; its autograd (gradcheck, gradgradcheck, forward mode), opcheck,
vmap, torch.compile, and lltm.LLTM's route through it (CPU and CUDA; the
CUDA tests skip without a GPU)."""
import pytest
import torch
import torch.autograd.forward_ad as fwAD

import lltm
from lltm import _native, _schedule, overrides
from conftest import assert_close

HAS_CUDA = torch.cuda.is_available() and _native.has_cuda_kernels()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU and the CUDA kernels")


def stack_inputs(T, B, I, H, L, dtype=torch.float64, device="cpu", requires_grad=False):
    """(input, weights0, weights, biases, h0, c0), random, never zeros."""
    g = torch.Generator().manual_seed(torch.randint(2**31 - 1, ()).item())

    def rand(*shape, scale=1.0):
        t = torch.randn(*shape, generator=g, dtype=torch.float64) * scale
        return t.to(dtype=dtype, device=device).requires_grad_(requires_grad)

    return (rand(T, B, I), rand(3 * H, H + I, scale=2 / (H + I) ** 0.5),
            rand(L - 1, 3 * H, 2 * H, scale=2 / (2 * H) ** 0.5), rand(L, 3 * H),
            rand(L, B, H, scale=0.5), rand(L, B, H, scale=0.5))


def by_layers(input, weights0, weights, biases, h0, c0, lengths=None):
    """The stack as one lltm::sequence_forward call a layer (with autograd)."""
    x, hs, cs = input, [], []
    for l in range(h0.shape[0]):
        w = weights0 if l == 0 else weights[l - 1]
        extra = () if lengths is None else (lengths,)
        op = torch.ops.lltm.sequence_forward
        x, h, c, *_ = (op.lengths if extra else op.default)(x, w, biases[l], h0[l], c0[l],
                                                            *extra)
        hs.append(h)
        cs.append(c)
    return x, torch.stack(hs), torch.stack(cs)


def forward_and_grads(fn, args, seeds):
    """fn's three outputs and the gradients of sum(outputs * seeds) to args."""
    args = [a.detach().clone().requires_grad_() for a in args]
    outs = fn(*args)[:3]
    loss = sum((o * s).sum() for o, s in zip(outs, seeds))
    # (one layer: by_layers leaves the empty weights [0, 3H, 2H] unused)
    grads = torch.autograd.grad(loss, args, allow_unused=True, materialize_grads=True)
    return [o.detach() for o in outs], grads


SHAPES = [  # (T, B, I, H, L): T = 1, B = 1, I = 0, odd sizes
    (1, 1, 3, 4, 2), (5, 3, 7, 5, 3), (4, 2, 0, 6, 2), (3, 4, 5, 3, 1), (6, 5, 2, 7, 3)]


@pytest.mark.parametrize("lengths", [False, True])
@pytest.mark.parametrize("T,B,I,H,L", SHAPES)
def test_stack_matches_layer_calls_cpu(T, B, I, H, L, lengths):
    args = stack_inputs(T, B, I, H, L)
    lens = torch.randint(1, T + 1, (B,)) if lengths else None
    extra = () if lens is None else (lens,)
    op = torch.ops.lltm.stack_forward.lengths if lengths else torch.ops.lltm.stack_forward.default
    seeds = [torch.randn(T, B, H, dtype=torch.float64), torch.randn(L, B, H, dtype=torch.float64),
             torch.randn(L, B, H, dtype=torch.float64)]
    got, got_grads = forward_and_grads(lambda *a: op(*a, *extra), args, seeds)
    want, want_grads = forward_and_grads(lambda *a: by_layers(*a, lens), args, seeds)
    for name, g, w in zip(("output", "h_n", "c_n"), got, want):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12, msg=name)
    names = ("input", "weights0", "weights", "biases", "h0", "c0")
    for name, g, w in zip(names, got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12, msg=f"d {name}")
    if L > 1:  # the layers below the top come back too, as their own calls make them
        below = op(*args, *extra)[3]
        lower = (*args[:3], args[3][:L - 1], args[4][:L - 1], args[5][:L - 1])
        torch.testing.assert_close(below[-1], by_layers(*lower, lens)[0], rtol=1e-12,
                                   atol=1e-12)


@pytest.mark.parametrize("T,B", [(0, 3), (4, 0)])
def test_no_steps_or_no_rows(T, B):
    """T = 0: the state passes through (h_n = h0); B = 0: empty results; the
    gradients as the layer calls give them."""
    args = stack_inputs(T, B, 3, 4, 3)
    seeds = [torch.randn(T, B, 4, dtype=torch.float64), torch.randn(3, B, 4, dtype=torch.float64),
             torch.randn(3, B, 4, dtype=torch.float64)]
    got, got_grads = forward_and_grads(torch.ops.lltm.stack_forward, args, seeds)
    want, want_grads = forward_and_grads(by_layers, args, seeds)
    for g, w in zip(list(got) + list(got_grads), list(want) + list(want_grads)):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("L", [1, 2, 3])
def test_gradcheck_and_gradgradcheck(L):
    args = stack_inputs(3, 2, 3, 4, L, requires_grad=True)
    lens = torch.tensor([3, 1])
    for fn in (lambda *a: torch.ops.lltm.stack_forward(*a)[:3],
               lambda *a: torch.ops.lltm.stack_forward.lengths(*a, lens)[:3]):
        assert torch.autograd.gradcheck(fn, args)
        assert torch.autograd.gradgradcheck(fn, args)


def test_forward_mode_matches_finite_differences():
    args = stack_inputs(4, 3, 2, 5, 3)
    tangents = [torch.randn_like(a) for a in args]
    with fwAD.dual_level():
        outs = torch.ops.lltm.stack_forward(*(fwAD.make_dual(a, t) for a, t in
                                              zip(args, tangents)))
        got = [fwAD.unpack_dual(o).tangent for o in outs[:3]]
    eps = 1e-6
    plus = torch.ops.lltm.stack_forward(*(a + eps * t for a, t in zip(args, tangents)))
    minus = torch.ops.lltm.stack_forward(*(a - eps * t for a, t in zip(args, tangents)))
    for g, p, m in zip(got, plus, minus):
        torch.testing.assert_close(g, (p - m) / (2 * eps), rtol=1e-6, atol=1e-7)


def backward_args(args, lengths=None):
    T, B, _ = args[0].shape
    L, H = args[4].shape[0], args[4].shape[2]
    fwd = (torch.ops.lltm.stack_forward.lengths(*args, lengths) if lengths is not None
           else torch.ops.lltm.stack_forward(*args))
    like = args[0]
    grads = [torch.randn(T, B, H, dtype=like.dtype, device=like.device),
             torch.randn(L, B, H, dtype=like.dtype, device=like.device),
             torch.randn(L, B, H, dtype=like.dtype, device=like.device)]
    return grads + [args[0], args[1], args[2], args[4], fwd[0], fwd[3], fwd[4], fwd[5]]


def check_opcheck(device):
    args = list(stack_inputs(4, 3, 5, 6, 3, dtype=torch.float32, device=device))
    lens = torch.tensor([4, 2, 1], device=device)
    torch.library.opcheck(torch.ops.lltm.stack_forward.default, args)
    torch.library.opcheck(torch.ops.lltm.stack_forward.lengths, args + [lens])
    bargs = backward_args(args)
    torch.library.opcheck(torch.ops.lltm.stack_backward.default, bargs)
    torch.library.opcheck(torch.ops.lltm.stack_backward.default,
                          bargs + [[True, False, True, False, True, False]])
    torch.library.opcheck(torch.ops.lltm.stack_backward.lengths,
                          backward_args(args, lens) + [lens])


def test_opcheck_cpu():
    check_opcheck("cpu")


def test_output_mask_leaves_out_gradients_and_keeps_the_rest():
    args = stack_inputs(4, 3, 5, 6, 3)
    bargs = backward_args(args)
    full = torch.ops.lltm.stack_backward(*bargs)
    mask = [False, True, False, True, False, True]
    part = torch.ops.lltm.stack_backward(*bargs, mask)
    for m, f, p in zip(mask, full, part):
        if m:
            torch.testing.assert_close(p, f, rtol=0, atol=0)
        else:
            assert p is None


def test_errors_name_the_argument():
    args = list(stack_inputs(4, 3, 5, 6, 3))
    bad = list(args)
    bad[2] = args[2][:1]
    with pytest.raises(RuntimeError, match="weights.*L-1"):
        torch.ops.lltm.stack_forward(*bad)
    bad = list(args)
    bad[3] = args[3][:, :5]
    with pytest.raises(RuntimeError, match="biases"):
        torch.ops.lltm.stack_forward(*bad)
    bad = list(args)
    bad[5] = args[5][:2]
    with pytest.raises(RuntimeError, match="c0"):
        torch.ops.lltm.stack_forward(*bad)
    with pytest.raises(RuntimeError, match="lengths"):
        torch.ops.lltm.stack_forward.lengths(*args, torch.tensor([5, 1, 1]))
    with pytest.raises(RuntimeError, match="dtype"):
        torch.ops.lltm.stack_forward(*args[:5], args[5].float())


def test_vmap_runs_each_instance():
    args = stack_inputs(3, 2, 4, 5, 2)
    xs = torch.randn(3, *args[0].shape, dtype=torch.float64)
    got = torch.vmap(lambda x: torch.ops.lltm.stack_forward(x, *args[1:])[0])(xs)
    for k in range(3):
        torch.testing.assert_close(got[k], torch.ops.lltm.stack_forward(xs[k], *args[1:])[0])


def test_compiles_fullgraph():
    args = stack_inputs(5, 3, 4, 6, 3, dtype=torch.float32, requires_grad=True)
    fn = torch.compile(lambda *a: torch.ops.lltm.stack_forward(*a)[0].sum(), fullgraph=True)
    loss = fn(*args)
    grads = torch.autograd.grad(loss, args)
    want_loss = torch.ops.lltm.stack_forward(*args)[0].sum()
    want = torch.autograd.grad(want_loss, args)
    torch.testing.assert_close(loss, want_loss)
    for g, w in zip(grads, want):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("L,sizes", [(1, [1]), (2, [2]), (3, [3]), (4, [2, 2]), (5, [3, 2]),
                                     (7, [3, 2, 2])])
def test_groups(L, sizes):
    assert _schedule.groups(L) == sizes


def run_module(module, x, mode, **kw):
    module.zero_grad()
    x = x.detach().clone().requires_grad_()
    with overrides.stacked_layers(mode):
        out, (h, c) = module(x, **kw)
    (out.pow(2).sum() + h.sum() + c.pow(2).sum()).backward()
    return [out, h, c, x.grad] + [p.grad for p in module.parameters()]


@pytest.mark.parametrize("L,bias", [(2, True), (3, False), (5, True)])
def test_module_through_the_stack_matches_layer_calls_cpu(L, bias):
    m = lltm.LLTM(5, 7, num_layers=L, bias=bias).double()
    x = torch.randn(6, 3, 5, dtype=torch.float64)
    for kw in ({}, {"lengths": [6, 2, 4]}):
        for got, want in zip(run_module(m, x, "on", **kw), run_module(m, x, "off", **kw)):
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_module_route():
    m = lltm.LLTM(4, 8, num_layers=3)
    x = torch.randn(5, 2, 4)
    with overrides.stacked_layers("on"):
        assert _schedule.stack_groups(m, x) == [3]
        m.dropout = 0.5
        assert _schedule.stack_groups(m, x) is None  # dropout between the layers, in training
        m.eval()
        assert _schedule.stack_groups(m, x) == [3]
    with overrides.stacked_layers("off"):
        assert _schedule.stack_groups(m, x) is None
    assert _schedule.stack_groups(m, x) is None  # the CPU: a call a layer


# --- CUDA ---------------------------------------------------------------------------------

CUDA_SHAPES = [  # (T, B, I, H, L): the stacked launch's layouts (H <= 128: 32x4, else
    # 32x8), one and several batch groups, odd sizes
    (5, 1, 3, 20, 2), (7, 5, 9, 130, 3), (4, 16, 16, 256, 3), (6, 37, 4, 64, 2),
    (3, 3, 0, 33, 3)]


# the half types on tensor cores (compute capability 8.0+): 16 units a block,
# 16-row chunks, one and two a block, and 4-row ones
CUDA_HALF_SHAPES = [(5, 64, 8, 256, 3), (4, 300, 5, 200, 3), (3, 40, 3, 100, 2),
                    (4, 200, 6, 100, 3)]


def _half_shapes():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 8:
        return []
    return CUDA_HALF_SHAPES


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("lengths", [False, True])
@pytest.mark.parametrize("T,B,I,H,L", CUDA_SHAPES)
def test_stacked_launch_matches_reference(T, B, I, H, L, lengths, dtype):
    _stacked_launch_matches_reference(T, B, I, H, L, lengths, dtype)


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("lengths", [False, True])
@pytest.mark.parametrize("T,B,I,H,L", _half_shapes())
def test_stacked_launch_on_tensor_cores_matches_reference(T, B, I, H, L, lengths, dtype):
    plan = overrides.stack_plan_in_force(dtype, L, T, B, I, H)
    assert plan is not None and plan["forward"]["lanes"] == 16, plan
    _stacked_launch_matches_reference(T, B, I, H, L, lengths, dtype)


def _stacked_launch_matches_reference(T, B, I, H, L, lengths, dtype):
    assert overrides.stack_plan_in_force(dtype, L, T, B, I, H) is not None
    args = stack_inputs(T, B, I, H, L)
    lens = torch.randint(1, T + 1, (B,)) if lengths else None
    seeds = [torch.randn(T, B, H, dtype=torch.float64), torch.randn(L, B, H, dtype=torch.float64),
             torch.randn(L, B, H, dtype=torch.float64)]
    want, want_grads = forward_and_grads(lambda *a: by_layers(*a, lens), args, seeds)

    def on_cuda(*a):
        extra = () if lens is None else (lens.cuda(),)
        op = torch.ops.lltm.stack_forward
        return (op.lengths if extra else op.default)(*a, *extra)

    got, got_grads = forward_and_grads(on_cuda, [a.to("cuda", dtype) for a in args],
                                       [s.to("cuda", dtype) for s in seeds])
    for name, g, w in zip(("output", "h_n", "c_n"), got, want):
        assert_close(name, g, w, dtype)
    names = ("input", "weights0", "weights", "biases", "h0", "c0")
    for name, g, w in zip(names, got_grads, want_grads):
        assert_close(f"d {name}", g, w, dtype)


@needs_cuda
def test_forced_plan_runs_layer_by_layer_on_cuda():
    args = [a.cuda().float() for a in stack_inputs(5, 3, 4, 40, 3)]
    with overrides.sequence_plan(family="grid"):
        assert overrides.stack_plan_in_force(torch.float32, 3, 5, 3, 4, 40) is None
        forced = torch.ops.lltm.stack_forward(*args)
    stacked = torch.ops.lltm.stack_forward(*args)
    for name, f, s in zip(("output", "h_n", "c_n"), forced[:3], stacked[:3]):
        assert_close(name, s, f.double(), torch.float32)


@needs_cuda
def test_float64_and_large_sizes_run_layer_by_layer_on_cuda():
    for dtype, H in ((torch.float64, 16), (torch.float32, 300)):
        assert overrides.stack_plan_in_force(dtype, 2, 4, 3, 5, H) is None
        args = stack_inputs(4, 3, 5, H, 2)
        got = torch.ops.lltm.stack_forward(*(a.to("cuda", dtype) for a in args))
        want = by_layers(*args)
        for name, g, w in zip(("output", "h_n", "c_n"), got[:3], want):
            assert_close(name, g, w, dtype)


@needs_cuda
def test_gradcheck_cuda_float64():
    args = stack_inputs(3, 2, 3, 4, 2, device="cuda", requires_grad=True)
    assert torch.autograd.gradcheck(lambda *a: torch.ops.lltm.stack_forward(*a)[:3], args)


@needs_cuda
def test_opcheck_cuda():
    check_opcheck("cuda")


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("L", [2, 3, 5])
def test_module_routes_the_stack_on_cuda(L, dtype):
    m = lltm.LLTM(24, 64, num_layers=L).cuda().to(dtype)
    x = torch.randn(9, 5, 24, device="cuda", dtype=dtype)
    assert _schedule.stack_groups(m, x) == _schedule.groups(L)
    for kw in ({}, {"lengths": [9, 3, 5, 1, 8]}):
        got = run_module(m, x, "auto", **kw)
        want = run_module(m, x, "off", **kw)
        for k, (g, w) in enumerate(zip(got, want)):
            assert_close(f"result {k}", g, w.double(), dtype)


@needs_cuda
def test_module_through_the_stack_in_a_cuda_graph():
    m = lltm.LLTM(16, 48, num_layers=3).cuda()
    x = torch.randn(8, 4, 16, device="cuda")
    static_x = x.clone().requires_grad_()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # warm-up on a side stream, as torch.cuda.graphs asks
            m.zero_grad(set_to_none=False)
            out, _ = m(static_x)
            out.sum().backward()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    m.zero_grad(set_to_none=False)
    with torch.cuda.graph(graph), overrides.stacked_layers("on"):
        assert _schedule.stack_groups(m, static_x) == [3]
        out, _ = m(static_x)
        out.sum().backward()
    new_x = torch.randn_like(x)
    with torch.no_grad():
        static_x.copy_(new_x)
    m.zero_grad(set_to_none=False)
    graph.replay()
    got = [out.detach().clone()] + [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    with overrides.stacked_layers("off"):  # the same step eagerly, a call a layer
        want_out, _ = m(new_x)
        want_out.sum().backward()
    want = [want_out.detach()] + [p.grad for p in m.parameters()]
    for k, (g, w) in enumerate(zip(got, want)):
        assert_close(f"result {k}", g, w.double(), torch.float32)
