"""Second derivatives: with create_graph=True the backward of every op runs
in differentiable operations, so gradgradcheck passes and Hessian-vector
products match the reference, never silently zero."""
import pytest
import torch

import lltm
from conftest import cell_inputs

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a GPU"))]
F64 = torch.float64


def seq_inputs(T, B, I, H, device):
    x, W, b, h, c = cell_inputs(B, I, H, F64, device)
    return (torch.randn(T, B, I, dtype=F64, device=device), W, b, h, c)


def grad_of_grad(cell, x, state):
    h, c = cell(x, state)
    g = torch.autograd.grad(h.sum() + c.sum(), x, create_graph=True)[0]
    return torch.autograd.grad(g.pow(2).sum(), [x] + list(cell.parameters()))


@pytest.mark.parametrize("device", DEVICES)
def test_grad_of_grad_matches_reference_not_zeros(device):
    cell = lltm.LLTMCell(4, 5, dtype=F64, device=device)
    ref = lltm.LLTMCell(4, 5, impl="reference", dtype=F64, device=device)
    ref.load_state_dict(cell.state_dict())
    x = torch.randn(3, 4, dtype=F64, device=device, requires_grad=True)
    for state in (None, (torch.randn(3, 5, dtype=F64, device=device),
                         torch.randn(3, 5, dtype=F64, device=device))):
        got, want = grad_of_grad(cell, x, state), grad_of_grad(ref, x, state)
        assert want[0].abs().max() > 1e-3  # the check below could not pass with zeros
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_gradgradcheck_functional_cell(device):
    args = [t.requires_grad_() for t in cell_inputs(3, 4, 5, F64, device)]
    assert torch.autograd.gradgradcheck(lltm.functional.lltm_cell, args)


@pytest.mark.parametrize("device", DEVICES)
def test_gradgradcheck_cell_tutorial_bias_shape_and_direct_op(device):
    """The [1, 3H] bias, and torch.ops.lltm.cell_forward called directly (the
    torch.library.register_autograd formula: torch.compile's and export's)."""
    x, W, b, h, c = cell_inputs(2, 3, 4, F64, device)
    args = [t.requires_grad_() for t in (x, W, b.reshape(1, -1).clone(), h, c)]
    assert torch.autograd.gradgradcheck(lltm.functional.lltm_cell, args)
    assert torch.autograd.gradgradcheck(
        lambda *a: torch.ops.lltm.cell_forward(*a)[:2], args)


@pytest.mark.parametrize("device", DEVICES)
def test_gradgradcheck_module_cell(device):
    cell = lltm.LLTMCell(3, 4, dtype=F64, device=device)
    names = [n for n, _ in cell.named_parameters()]

    def f(x, h, c, *params):
        return torch.func.functional_call(cell, dict(zip(names, params)), (x, (h, c)))

    x, _, _, h, c = cell_inputs(2, 3, 4, F64, device)
    args = [t.requires_grad_() for t in (x, h, c)] + [p.detach().clone().requires_grad_()
                                                      for p in cell.parameters()]
    assert torch.autograd.gradgradcheck(f, args)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("T", [0, 1, 3])
def test_gradgradcheck_functional_sequence(device, T):
    args = [t.requires_grad_() for t in seq_inputs(T, 2, 3, 2, device)]
    assert torch.autograd.gradgradcheck(
        lambda *a: (lambda out, s: (out, *s))(*lltm.functional.lltm_sequence(*a)), args)
    assert torch.autograd.gradgradcheck(
        lambda *a: torch.ops.lltm.sequence_forward(*a)[:3], args)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_layers,batch_first,with_state,bias", [
    (1, False, False, True), (1, True, True, True), (2, False, True, True),
    (2, True, False, True), (2, False, True, False)])
def test_gradgradcheck_module_sequence(device, num_layers, batch_first, with_state, bias):
    m = lltm.LLTM(3, 2, num_layers=num_layers, batch_first=batch_first, bias=bias,
                  dtype=F64, device=device)
    names = [n for n, _ in m.named_parameters()]
    x = torch.randn(*((2, 3) if batch_first else (3, 2)), 3, dtype=F64, device=device)
    state = [torch.randn(num_layers, 2, 2, dtype=F64, device=device) for _ in range(2)]

    def f(x, *rest):
        if with_state:
            h0, c0, params = rest[0], rest[1], rest[2:]
            out, (h_n, c_n) = torch.func.functional_call(m, dict(zip(names, params)),
                                                         (x, (h0, c0)))
        else:
            out, (h_n, c_n) = torch.func.functional_call(m, dict(zip(names, rest)), (x,))
        return out, h_n, c_n

    args = [x] + (state if with_state else []) + [p.detach().clone() for p in m.parameters()]
    assert torch.autograd.gradgradcheck(f, [a.requires_grad_() for a in args])


@pytest.mark.parametrize("device", DEVICES)
def test_hessian_vector_product_of_module_matches_reference(device):
    m = lltm.LLTM(3, 4, num_layers=2, dtype=F64, device=device)
    ref = lltm.LLTM(3, 4, num_layers=2, impl="reference", dtype=F64, device=device)
    ref.load_state_dict(m.state_dict())
    x = torch.randn(5, 2, 3, dtype=F64, device=device)
    results = []
    for model in (m, ref):
        params = list(model.parameters())
        out, (h_n, c_n) = model(x)
        loss = out.pow(2).sum() + h_n.sum() + c_n.sum()
        grads = torch.autograd.grad(loss, params, create_graph=True)
        v = [torch.ones_like(p) for p in params]
        results.append(torch.autograd.grad(sum((g * u).sum() for g, u in zip(grads, v)), params))
    assert results[1][0].abs().max() > 1e-3
    for a, b in zip(*results):
        torch.testing.assert_close(a, b)


def test_backward_ops_are_not_differentiable_clear_error():
    x, W, b, h, c = cell_inputs(2, 3, 4, F64)
    new_h, new_cell, gates = torch.ops.lltm.cell_forward(x, W, b, h, c)
    grad_h = torch.randn(2, 4, dtype=F64, requires_grad=True)
    outs = torch.ops.lltm.cell_backward(grad_h, torch.randn(2, 4, dtype=F64), new_cell, gates,
                                        x, h, W)
    with pytest.raises(RuntimeError, match="lltm::cell_backward is not differentiable"):
        outs[0].sum().backward()
