"""The native LLTM cell on the CPU against the tutorial's reference."""
import pytest
import torch

import lltm
from lltm import reference
from conftest import assert_matches, cell_inputs, tolerances

SHAPES = [  # (B, I, H): batch 1, odd sizes, I > H and I < H
    (1, 1, 1), (1, 5, 3), (3, 7, 5), (3, 2, 33), (16, 32, 128), (5, 300, 17), (64, 17, 65),
    (2, 0, 4), (0, 3, 4), (0, 0, 3),  # I = 0, B = 0, both
]
DTYPES = [torch.float32, torch.float64]
# float16 / bfloat16: computed in float32, stored in their own type; matrix
# products through aten::mm in that type
HALF_DTYPES = [torch.float16, torch.bfloat16]


def run_both(fn_native, fn_ref, args, grads_seed=None):
    """Outputs and gradients of every argument from both implementations,
    under the same random upstream gradients."""
    nat_args = [a.detach().clone().requires_grad_() for a in args]
    ref_args = [a.detach().clone().to(torch.float64).requires_grad_() for a in args]
    out_n = fn_native(*nat_args)
    out_r = fn_ref(*ref_args)
    upstream = [torch.randn_like(o, dtype=torch.float64) for o in out_r]
    torch.autograd.backward(out_n, [u.to(out_n[0].dtype) for u in upstream])
    torch.autograd.backward(out_r, upstream)
    return (out_n, [a.grad for a in nat_args]), (out_r, [a.grad for a in ref_args])


@pytest.mark.parametrize("dtype", DTYPES + HALF_DTYPES)
@pytest.mark.parametrize("B,I,H", SHAPES)
def test_forward_backward_match_reference(B, I, H, dtype):
    args = cell_inputs(B, I, H, dtype)
    (out_n, grad_n), (out_r, grad_r) = run_both(lltm.functional.lltm_cell,
                                                reference.lltm_cell, args)
    for name, n, r in zip(["new_h", "new_cell"], out_n, out_r):
        assert n.dtype == dtype and n.shape == r.shape, name
        assert_matches(n, r, dtype, msg=name)
    for name, n, r in zip(["input", "weights", "bias", "old_h", "old_cell"], grad_n, grad_r):
        assert n.dtype == dtype and n.shape == r.shape, name
        assert_matches(n, r, dtype, msg=f"grad of {name}")


@pytest.mark.parametrize("B,I,H", [(3, 7, 5), (16, 32, 128)])
def test_reference_function_matches_autograd(B, I, H):
    """The oracle's two forms agree with each other (float64)."""
    args = cell_inputs(B, I, H)
    (out_f, grad_f), (out_r, grad_r) = run_both(reference.lltm_cell_function,
                                                reference.lltm_cell, args)
    for n, r in zip(list(out_f) + grad_f, list(out_r) + grad_r):
        torch.testing.assert_close(n, r, **tolerances(torch.float64))


@pytest.mark.parametrize("B,I,H", [(1, 2, 3), (3, 4, 5), (2, 6, 2)])
def test_gradcheck_float64(B, I, H):
    args = [a.requires_grad_() for a in cell_inputs(B, I, H)]
    assert torch.autograd.gradcheck(lltm.functional.lltm_cell, args)


def test_gradcheck_tutorial_bias_shape():
    x, W, b, h, c = cell_inputs(2, 3, 4)
    args = [t.requires_grad_() for t in (x, W, b.reshape(1, -1).clone(), h, c)]
    assert torch.autograd.gradcheck(lltm.functional.lltm_cell, args)


@pytest.mark.parametrize("B,I,H", [(3, 5, 7), (1, 1, 1)])
@pytest.mark.parametrize("dtype", DTYPES + HALF_DTYPES)
def test_opcheck(B, I, H, dtype):
    args = [a.requires_grad_() for a in cell_inputs(B, I, H, dtype)]
    torch.library.opcheck(torch.ops.lltm.cell_forward.default, args)
    x, W, b, h, c = cell_inputs(B, I, H, dtype)
    new_h, new_cell, gates = torch.ops.lltm.cell_forward(x, W, b, h, c)
    bw_args = (torch.randn_like(new_h), torch.randn_like(new_cell), new_cell, gates, x, h, W)
    torch.library.opcheck(torch.ops.lltm.cell_backward.default, bw_args)


def test_torch_compile_fullgraph_forward_backward():
    torch._dynamo.reset()
    cell = lltm.LLTMCell(6, 5, dtype=torch.float64)

    def step(x, h, c):
        new_h, new_c = cell(x, (h, c))
        return (new_h * new_c).sum()

    compiled = torch.compile(step, fullgraph=True, backend="inductor")
    for B in (3, 4):  # a second shape exercises recompilation / dynamic shapes
        x, _, _, h, c = cell_inputs(B, 6, 5)
        loss_c = compiled(x, h, c)
        grads_c = torch.autograd.grad(loss_c, [cell.weights, cell.bias])
        loss_e = step(x, h, c)
        grads_e = torch.autograd.grad(loss_e, [cell.weights, cell.bias])
        torch.testing.assert_close(loss_c, loss_e)
        for a, b in zip(grads_c, grads_e):
            torch.testing.assert_close(a, b)


def test_non_contiguous_inputs_and_stride0_grads():
    B, I, H = 4, 6, 5
    x, W, b, h, c = cell_inputs(B, I, H)
    def strided(t):  # the same values, every other element of a wider buffer
        return torch.stack([t, torch.full_like(t, float("nan"))], dim=-1)[..., 0]

    x_nc = x.t().contiguous().t()
    W_nc, h_nc, b_nc = strided(W), strided(h), strided(b)
    c_nc = c.t().contiguous().t()
    assert not any(t.is_contiguous() for t in (x_nc, W_nc, h_nc, b_nc))
    out_nc = lltm.functional.lltm_cell(x_nc, W_nc, b_nc, h_nc, c_nc)
    out = reference.lltm_cell(x, W, b, h, c)
    for n, r in zip(out_nc, out):
        torch.testing.assert_close(n, r, **tolerances(torch.float64))
    # .sum().backward() hands the op stride-0 (expanded) gradients
    args_n = [t.clone().requires_grad_() for t in (x, W, b, h, c)]
    args_r = [t.clone().requires_grad_() for t in (x, W, b, h, c)]
    sum(o.sum() for o in lltm.functional.lltm_cell(*args_n)).backward()
    sum(o.sum() for o in reference.lltm_cell(*args_r)).backward()
    for n, r in zip(args_n, args_r):
        torch.testing.assert_close(n.grad, r.grad, **tolerances(torch.float64))
    # the op itself, called directly with expanded gradients
    new_h, new_cell, gates = torch.ops.lltm.cell_forward(x, W, b, h, c)
    g_h = torch.ones(1, 1, dtype=torch.float64).expand(B, H)
    g_c = torch.full((1, H), 0.5, dtype=torch.float64).expand(B, H)
    grads = torch.ops.lltm.cell_backward(g_h, g_c, new_cell, gates, x, h, W)
    grads_ref = torch.ops.lltm.cell_backward(g_h.contiguous(), g_c.contiguous(), new_cell, gates, x, h, W)
    for a, r in zip(grads, grads_ref):
        torch.testing.assert_close(a, r, rtol=0, atol=0)


def test_every_output_element_is_written():
    """Outputs are allocated uninitialised: run many times over memory that was
    just filled with NaN, and check no NaN leaks into any output."""
    B, I, H = 7, 9, 11
    for _ in range(20):
        junk = [torch.full((B, 3 * H + 5), float("nan")) for _ in range(8)]
        del junk
        x, W, b, h, c = cell_inputs(B, I, H, torch.float32)
        outs = torch.ops.lltm.cell_forward(x, W, b, h, c)
        grads = torch.ops.lltm.cell_backward(torch.randn(B, H), torch.randn(B, H), outs[1],
                                             outs[2], x, h, W)
        for t in list(outs) + list(grads):
            assert torch.isfinite(t).all()


def test_gates_output_holds_the_activations():
    x, W, b, h, c = cell_inputs(3, 4, 5)
    _, _, gates = torch.ops.lltm.cell_forward(x, W, b, h, c)
    g = torch.nn.functional.linear(torch.cat([h, x], 1), W, b).chunk(3, 1)
    expected = torch.cat([g[0].sigmoid(), g[1].sigmoid(), torch.nn.functional.elu(g[2])], 1)
    torch.testing.assert_close(gates, expected, **tolerances(torch.float64))
    # gates are saved state, not a differentiable output
    x, W, b, h, c = [t.requires_grad_() for t in (x, W, b, h, c)]
    _, _, gates = torch.ops.lltm.cell_forward(x, W, b, h, c)
    assert not gates.requires_grad


def test_zero_batch():
    x, W, b, h, c = [t.requires_grad_() for t in cell_inputs(0, 3, 4)]
    new_h, new_c = lltm.functional.lltm_cell(x, W, b, h, c)
    assert new_h.shape == (0, 4) and new_c.shape == (0, 4)
    (new_h.sum() + new_c.sum()).backward()
    assert torch.equal(W.grad, torch.zeros_like(W)) and torch.equal(b.grad, torch.zeros_like(b))
    assert x.grad.shape == (0, 3)


def test_respects_torch_num_threads():
    """Same result on 1 thread and on the pool. Our pointwise kernels and the
    bias-gradient reduction are bit-identical whatever the thread count (only
    the BLAS products may round differently)."""
    B, I, H = 64, 32, 1024
    x, W, b, h, c = cell_inputs(B, I, H, torch.float32)
    new_h, new_cell, gates = torch.ops.lltm.cell_forward(x, W, b, h, c)
    g_h, g_c = torch.randn(B, H), torch.randn(B, H)
    old = torch.get_num_threads()
    try:
        results = []
        for n in (1, 2):
            torch.set_num_threads(n)
            fwd = torch.ops.lltm.cell_forward(x, W, b, h, c)
            bwd = torch.ops.lltm.cell_backward(g_h, g_c, new_cell, gates, x, h, W)
            results.append((fwd, bwd))
    finally:
        torch.set_num_threads(old)
    (fwd1, bwd1), (fwd2, bwd2) = results
    for a, r in zip(fwd1 + bwd1, fwd2 + bwd2):
        torch.testing.assert_close(a, r, **tolerances(torch.float32))
    assert torch.equal(bwd1[2], bwd2[2])  # grad_bias: our reduction
    assert torch.equal(bwd1[4], bwd2[4])  # grad_old_cell: our pointwise kernel


def test_inputs_with_storage_offset():
    """Contiguous views that start inside a larger buffer: every view the
    binding makes (transposed weights, column blocks) is relative to them."""
    B, I, H = 3, 4, 5
    x, W, b, h, c = cell_inputs(B, I, H)
    def inside(t):  # the same values, at a nonzero storage offset
        buf = torch.randn(t.numel() + 7, dtype=t.dtype)
        view = buf[7:].view(t.shape)
        view.copy_(t)
        return view
    args_off = [inside(t).requires_grad_() for t in (x, W, b, h, c)]
    assert all(t.storage_offset() == 7 and t.is_contiguous() for t in args_off)
    args_ref = [t.clone().requires_grad_() for t in (x, W, b, h, c)]
    out_off = lltm.functional.lltm_cell(*args_off)
    out_ref = reference.lltm_cell(*args_ref)
    up = [torch.randn_like(o) for o in out_ref]
    torch.autograd.backward(out_off, up)
    torch.autograd.backward(out_ref, up)
    for n, r in zip(list(out_off) + [a.grad for a in args_off],
                    list(out_ref) + [a.grad for a in args_ref]):
        torch.testing.assert_close(n, r, **tolerances(torch.float64))


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_half_types_round_once_from_float32(dtype):
    """The pointwise math runs in float32: with the matrix product's result
    fixed, every output is the float32 computation rounded once to the dtype
    (nearest even), up to the float32 math's own few-ulp error."""
    B, I, H = 7, 9, 33
    x, W, b, h, c = cell_inputs(B, I, H, dtype)
    new_h, new_cell, gates = torch.ops.lltm.cell_forward(x, W, b, h, c)
    pre = torch.mm(torch.cat([h, x], 1), W.t()).float() + b.float()  # mm in the dtype, as the op
    g = pre.chunk(3, 1)
    act = torch.cat([g[0].sigmoid(), g[1].sigmoid(), torch.nn.functional.elu(g[2])], 1)
    i, o, z = act.chunk(3, 1)
    c_new = c.float() + i * z
    h_new = torch.tanh(c_new) * o
    # one rounding step of the dtype, at most (float32 ulps may tip a tie)
    eps = torch.finfo(dtype).eps
    for name, got, want in (("gates", gates, act), ("new_cell", new_cell, c_new),
                            ("new_h", new_h, h_new)):
        assert got.dtype == dtype
        err = (got.float() - want).abs()
        bound = eps * want.abs() + 1e-6 + torch.finfo(dtype).tiny
        assert (err <= bound).all(), f"{name}: {(err / bound).max().item():.3g}"
    # backward: the bias gradient is the float32 batch sum of the gate
    # gradients, rounded once (not a sum of rounded terms in the dtype)
    g_h, g_c = torch.randn(B, H).to(dtype), torch.randn(B, H).to(dtype)
    grads = torch.ops.lltm.cell_backward(g_h, g_c, new_cell, gates, x, h, W)
    i, o, z = gates.float().chunk(3, 1)
    tc = torch.tanh(new_cell.float())
    d_cell = g_c.float() + g_h.float() * o * (1 - tc * tc)
    d_gates = torch.cat([d_cell * z * i * (1 - i), g_h.float() * tc * o * (1 - o),
                         d_cell * i * torch.where(z > 0, torch.ones_like(z), z + 1)], 1)
    want_bias = d_gates.double().sum(0)
    err = (grads[2].double() - want_bias).abs()
    assert (err <= eps * want_bias.abs() + 1e-5 * B).all()
    err = (grads[4].float() - d_cell).abs()
    assert (err <= eps * d_cell.abs() + 1e-6).all()


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_half_types_gradients_match_float64_over_many_rows(dtype):
    """A batch of 300 rows: the bias gradient sums in float32, so its error
    stays at the dtype's rounding of the result and of the inputs."""
    B, I, H = 300, 8, 16
    compare_args = cell_inputs(B, I, H)
    (out_n, grad_n), (out_r, grad_r) = run_both(
        lambda *a: lltm.functional.lltm_cell(*[t.to(dtype) for t in a]),
        reference.lltm_cell, compare_args)
    for n, r in zip(list(out_n) + grad_n, list(out_r) + grad_r):
        assert_matches(n.double(), r, dtype, msg="half")


FORWARD_NAMES = ["input", "weights", "bias", "old_h", "old_cell"]
BACKWARD_NAMES = ["grad_h", "grad_cell", "new_cell", "gates", "input", "old_h", "weights"]


def backward_inputs(B=3, I=4, H=5):
    x, W, b, h, c = cell_inputs(B, I, H, torch.float32)
    new_h, new_cell, gates = torch.ops.lltm.cell_forward(x, W, b, h, c)
    return [torch.randn_like(new_h), torch.randn_like(new_cell), new_cell, gates, x, h, W]


@pytest.mark.parametrize("k", range(5))
def test_forward_none_argument_is_named(k):
    args = list(cell_inputs(3, 4, 5, torch.float32))
    args[k] = None
    with pytest.raises(RuntimeError, match=rf"lltm::cell_forward: {FORWARD_NAMES[k]} is an "
                                           r"undefined tensor \(None\); expected a tensor"):
        torch.ops.lltm.cell_forward(*args)


@pytest.mark.parametrize("k", range(7))
def test_backward_none_argument_is_named(k):
    args = backward_inputs()
    args[k] = None
    with pytest.raises(RuntimeError, match=rf"lltm::cell_backward: {BACKWARD_NAMES[k]} is an "
                                           r"undefined tensor \(None\); expected a tensor"):
        torch.ops.lltm.cell_backward(*args)


@pytest.mark.parametrize("B,I", [(3, 4), (0, 4), (3, 0)])
def test_zero_state_size_is_rejected(B, I):
    """H = 0 is the one size rejected (B = 0 and I = 0 are computed)."""
    x, W, b, h, c = (torch.randn(B, I), torch.randn(0, I), torch.randn(0), torch.randn(B, 0),
                     torch.randn(B, 0))
    with pytest.raises(RuntimeError, match=r"lltm::cell_forward: old_h has state size H = 0; "
                                           r"expected H > 0"):
        torch.ops.lltm.cell_forward(x, W, b, h, c)
    empty = torch.randn(B, 0)
    with pytest.raises(RuntimeError, match=r"lltm::cell_backward: old_h has state size H = 0; "
                                           r"expected H > 0"):
        torch.ops.lltm.cell_backward(empty, empty, empty, empty, x, h, W)


def test_eager_routes_and_their_gradients_agree():
    """With gradients needed the eager step runs CellStep (two outputs), with
    a tangent CellForward (its jvp), without gradients no Function at all; the
    gradients of the first equal those of the public operator's autograd."""
    import torch.autograd.forward_ad as fwAD
    x, W, b, h, c = cell_inputs(3, 5, 7, requires_grad=True)
    new_h, new_cell = lltm.functional.lltm_cell(x, W, b, h, c)
    assert type(new_h.grad_fn).__name__ == "CellStepBackward"
    with torch.no_grad():
        assert lltm.functional.lltm_cell(x, W, b, h, c)[0].grad_fn is None
    with fwAD.dual_level():
        dual = fwAD.make_dual(x.detach(), torch.randn_like(x))
        out = lltm.functional.lltm_cell(dual, W, b, h, c)[0]
        assert type(out.grad_fn).__name__ == "CellForwardBackward"
    gh, gc = torch.randn_like(new_h), torch.randn_like(new_cell)
    got = torch.autograd.grad((new_h, new_cell), (x, W, b, h, c), (gh, gc))
    op_h, op_c, _ = torch.ops.lltm.cell_forward(x, W, b, h, c)
    want = torch.autograd.grad((op_h, op_c), (x, W, b, h, c), (gh, gc))
    for g, w in zip(got, want):
        assert torch.equal(g, w)
