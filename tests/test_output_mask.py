"""Only the gradients that are needed: the backward operators' output_mask
(ATen's convention, as in aten::convolution_backward) and the autograd
formulas that pass ctx.needs_input_grad to it. The products of a gradient
left out are not run, the gradient comes back None, and every other one is
bitwise equal to the full computation's."""
import itertools

import pytest
import torch

import lltm
from lltm import _ops
from conftest import cell_inputs

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a GPU"))]
ARG_NAMES = ("input", "weights", "bias", "state h", "state c")
# every mask of five gradients
MASKS = list(itertools.product((False, True), repeat=5))
# at the larger sizes (the CUDA cell's cuBLAS route, the grid plans): each
# gradient alone, each left out, none
SOME_MASKS = [tuple(j == k for j in range(5)) for k in range(5)] + [
    tuple(j != k for j in range(5)) for k in range(5)] + [(False,) * 5]
DTYPES = [torch.float32, torch.float64, torch.bfloat16]


def seq_inputs(T, B, I, H, dtype=torch.float64, device="cpu"):
    x, W, b, h0, c0 = cell_inputs(B, I, H, dtype, device)
    return (torch.randn(T, B, I, dtype=torch.float64).to(dtype=dtype, device=device), W, b, h0,
            c0)


def cell_backward_args(B, I, H, dtype, device="cpu"):
    x, W, b, h, c = cell_inputs(B, I, H, dtype, device)
    new_h, new_cell, gates = torch.ops.lltm.cell_forward(x, W, b, h, c)
    return (torch.randn_like(new_h), torch.randn_like(new_cell), new_cell, gates, x, h, W)


def sequence_backward_args(T, B, I, H, dtype, device="cpu"):
    x, W, b, h0, c0 = seq_inputs(T, B, I, H, dtype, device)
    out, h_n, c_n, cells, gates = torch.ops.lltm.sequence_forward(x, W, b, h0, c0)
    return (torch.randn_like(out), torch.randn_like(h_n), torch.randn_like(c_n), x, W, h0, out,
            cells, gates)


def assert_masked(got, full, mask):
    assert len(got) == len(full) == 5
    for name, g, f, wanted in zip(ARG_NAMES, got, full, mask):
        if wanted:
            assert g is not None, name
            assert g.dtype == f.dtype and g.shape == f.shape, name
            assert torch.equal(g, f), f"{name} differs from the full computation"
        else:
            assert g is None, f"{name} computed though not asked for"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("B,I,H", [(3, 7, 5), (1, 0, 2), (0, 3, 4), (16, 32, 128),
                                   (64, 256, 512)])
def test_cell_backward_output_mask(B, I, H, dtype, device):
    args = cell_backward_args(B, I, H, dtype, device)
    full = torch.ops.lltm.cell_backward(*args)
    assert all(isinstance(g, torch.Tensor) for g in full)
    assert_masked(torch.ops.lltm.cell_backward(*args, [True] * 5), full, (True,) * 5)
    for mask in MASKS if B * H < 4096 else SOME_MASKS:
        assert_masked(torch.ops.lltm.cell_backward(*args, list(mask)), full, mask)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("T,B,I,H", [(4, 3, 7, 5), (1, 1, 1, 1), (3, 2, 0, 3), (0, 2, 3, 4),
                                     (3, 0, 2, 3), (6, 16, 32, 128), (3, 40, 20, 300)])
def test_sequence_backward_output_mask(T, B, I, H, dtype, device):
    args = sequence_backward_args(T, B, I, H, dtype, device)
    full = torch.ops.lltm.sequence_backward(*args)
    for mask in MASKS if B * H < 4096 else SOME_MASKS:
        assert_masked(torch.ops.lltm.sequence_backward(*args, list(mask)), full, mask)


def test_output_mask_length_is_checked():
    cell_args = cell_backward_args(2, 3, 4, torch.float64)
    seq_args = sequence_backward_args(2, 2, 3, 4, torch.float64)
    for op, args in ((torch.ops.lltm.cell_backward, cell_args),
                     (torch.ops.lltm.sequence_backward, seq_args)):
        for mask in ([True] * 4, [True] * 6):
            with pytest.raises(RuntimeError, match=rf"output_mask has {len(mask)} entries, "
                                                   r"expected 5"):
                op(*args, mask)
            with pytest.raises(RuntimeError, match=rf"output_mask has {len(mask)} entries"):
                with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
                    op(*(mode.from_tensor(a) for a in args), mask)


@pytest.mark.parametrize("mask", [(False, True, True, True, True),
                                  (False, True, True, False, False),
                                  (True, False, False, True, True),
                                  (False,) * 5], ids=str)
def test_opcheck_with_output_mask(mask):
    torch.library.opcheck(torch.ops.lltm.cell_backward.default,
                          cell_backward_args(3, 5, 7, torch.float32) + (list(mask),))
    torch.library.opcheck(torch.ops.lltm.sequence_backward.default,
                          sequence_backward_args(3, 2, 5, 7, torch.float32) + (list(mask),))


def _grads(fn, args, needs):
    """Gradients of a random-weighted sum of fn's outputs with respect to the
    arguments marked in `needs` (the others need none)."""
    leaves = [a.detach().clone().requires_grad_(n) for a, n in zip(args, needs)]
    outs = fn(*leaves)
    g = torch.Generator().manual_seed(7)
    loss = sum((o * torch.randn(o.shape, generator=g, dtype=torch.float64).to(o)).sum()
               for o in outs)
    wanted = [a for a, n in zip(leaves, needs) if n]
    return dict(zip([i for i, n in enumerate(needs) if n], torch.autograd.grad(loss, wanted)))


def _cell(x, W, b, h, c):
    return lltm.functional.lltm_cell(x, W, b, h, c)


def _sequence(x, W, b, h0, c0):
    out, (h_n, c_n) = lltm.functional.lltm_sequence(x, W, b, h0, c0)
    return out, h_n, c_n


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fn,make", [(_cell, lambda d, v: cell_inputs(4, 6, 5, d, v)),
                                     (_sequence, lambda d, v: seq_inputs(3, 4, 6, 5, d, v))],
                         ids=["cell", "sequence"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_autograd_computes_only_what_is_needed(fn, make, dtype, device):
    """Each subset of arguments needing a gradient gets gradients bitwise equal
    to those of the full backward."""
    args = make(dtype, device)
    full = _grads(fn, args, (True,) * 5)
    for needs in MASKS[1:]:
        got = _grads(fn, args, needs)
        assert set(got) == {i for i, n in enumerate(needs) if n}
        for i, g in got.items():
            assert torch.equal(g, full[i]), f"{ARG_NAMES[i]} with {needs}"


def test_backward_asks_only_for_needed_gradients(monkeypatch):
    """The autograd formulas pass ctx.needs_input_grad as the mask (to the
    backward operators' autograd-free twins, which they call; the settings
    last, after it)."""
    seen = []

    def spy_on(op):
        def spy(*args):
            seen.append(tuple(args[-2]))
            return op(*args)
        return spy
    monkeypatch.setattr(_ops, "_cell_backward_kernel", spy_on(_ops._cell_backward_kernel))
    monkeypatch.setattr(_ops, "_sequence_backward_kernel", type("Op", (), {
        "default": spy_on(_ops._sequence_backward_kernel.default)}))
    x, W, b, h, c = cell_inputs(3, 4, 5)
    W.requires_grad_()
    b.requires_grad_()
    torch.autograd.grad(_cell(x, W, b, h, c)[0].sum(), (W, b))
    xs = seq_inputs(2, 3, 4, 5)
    torch.autograd.grad(_sequence(xs[0], W, b, xs[3], xs[4])[0].sum(), (W, b))
    assert seen == [(False, True, True, False, False)] * 2


@pytest.mark.parametrize("needs", [(False, True, True, False, False),
                                   (True, False, False, True, True),
                                   (False, False, False, True, False)], ids=str)
def test_gradcheck_with_some_arguments_constant(needs):
    for fn, args in ((_cell, cell_inputs(3, 4, 5)), (_sequence, seq_inputs(3, 2, 4, 5))):
        leaves = [a.requires_grad_(n) for a, n in zip(args, needs)]
        assert torch.autograd.gradcheck(fn, leaves)
        assert torch.autograd.gradgradcheck(fn, leaves)


def test_torch_compile_with_frozen_weights_and_constant_input():
    torch._dynamo.reset()
    cell = lltm.LLTMCell(6, 5, dtype=torch.float64)
    cell.weights.requires_grad_(False)
    rnn = lltm.LLTM(6, 5, num_layers=2, dtype=torch.float64)
    rnn.weights_l0.requires_grad_(False)

    def step(x, h, c, xs):
        new_h, new_c = cell(x, (h, c))
        out, _ = rnn(xs)
        return (new_h * new_c).sum() + out.sum()

    compiled = torch.compile(step, fullgraph=True, backend="inductor")
    x, _, _, h, c = cell_inputs(3, 6, 5)
    h.requires_grad_()
    xs = seq_inputs(4, 3, 6, 5)[0]
    wanted = [h, cell.bias, rnn.bias_l0, rnn.weights_l1]
    grads_c = torch.autograd.grad(compiled(x, h, c, xs), wanted)
    grads_e = torch.autograd.grad(step(x, h, c, xs), wanted)
    for a, b in zip(grads_c, grads_e):
        torch.testing.assert_close(a, b)


def test_vmap_of_backward_with_output_mask():
    args = cell_backward_args(3, 4, 5, torch.float64)
    batched = [torch.stack([a, a * 0.5]) for a in args[:2]]
    mask = [False, True, True, False, True]
    got = torch.vmap(lambda gh, gc: torch.ops.lltm.cell_backward(gh, gc, *args[2:], mask),
                     out_dims=tuple(0 if m else None for m in mask))(*batched)
    for k in range(2):
        want = torch.ops.lltm.cell_backward(batched[0][k], batched[1][k], *args[2:], mask)
        for g, w in zip(got, want):
            assert (g is None) == (w is None)
            if w is not None:
                torch.testing.assert_close(g[k], w)
