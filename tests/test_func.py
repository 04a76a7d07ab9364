"""torch.func transforms over the functional forms, the raw operators and the
modules: grad, vjp/jacrev, vmap (own batching rules, no slow fallback), jvp /
jacfwd / forward-mode AD, hessian, functional_call; each against the
reference in float64."""
import warnings

import pytest
import torch
import torch.autograd.forward_ad as fwAD

import lltm
from lltm import reference
from conftest import cell_inputs

F64 = torch.float64
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a GPU"))]


def native_cell(*a):
    return lltm.functional.lltm_cell(*a)


def op_cell(*a):
    return tuple(torch.ops.lltm.cell_forward(*a)[:2])


def native_seq(*a):
    out, (h, c) = lltm.functional.lltm_sequence(*a)
    return out, h, c


def op_seq(*a):
    return tuple(torch.ops.lltm.sequence_forward(*a)[:3])


def ref_seq(x, W, b, h, c):
    outs = []
    for x_t in x.unbind(0):
        h, c = reference.lltm_cell(x_t, W, b, h, c)
        outs.append(h)
    return (torch.stack(outs) if outs else x.new_empty(0, *h.shape)), h, c


def seq_inputs(T, B, I, H, device="cpu"):
    x, W, b, h, c = cell_inputs(B, I, H, F64, device)
    return (torch.randn(T, B, I, dtype=F64, device=device), W, b, h, c)


CELLS = [native_cell]
SEQS = [native_seq]


def close(got, want):
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


@pytest.fixture
def no_vmap_fallback():
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*batching rule")
        yield


def total(f):
    return lambda *a: sum(o.pow(2).sum() for o in f(*a))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("f", CELLS + SEQS)
def test_grad(f, device):
    seq = f in SEQS
    args = seq_inputs(4, 3, 4, 5, device) if seq else cell_inputs(3, 4, 5, F64, device)
    argnums = tuple(range(5))
    got = torch.func.grad(total(f), argnums=argnums)(*args)
    want = torch.func.grad(total(ref_seq if seq else reference.lltm_cell), argnums=argnums)(*args)
    close(got, want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("f", CELLS + SEQS)
def test_jacrev_and_hessian(f, device):
    seq = f in SEQS
    x, W, b, h, c = seq_inputs(3, 2, 3, 4, device) if seq else cell_inputs(2, 3, 4, F64, device)
    ref = ref_seq if seq else reference.lltm_cell
    close(torch.func.jacrev(lambda W: f(x, W, b, h, c))(W),
          torch.func.jacrev(lambda W: ref(x, W, b, h, c))(W))
    for second in (torch.func.hessian,  # jacfwd(jacrev)
                   lambda g: torch.func.jacrev(torch.func.jacrev(g)),
                   lambda g: torch.func.jacfwd(torch.func.jacfwd(g)),
                   lambda g: torch.func.jacrev(torch.func.jacfwd(g))):
        hess = second(lambda x: total(f)(x, W, b, h, c))(x)
        assert hess.abs().max() > 1e-3
        torch.testing.assert_close(hess, second(lambda x: total(ref)(x, W, b, h, c))(x))


@pytest.mark.parametrize("f,name", [(op_cell, "cell_forward"), (op_seq, "sequence_forward")])
@pytest.mark.parametrize("device", DEVICES)
def test_transforms_on_direct_ops_refuse_clearly(f, name, device, no_vmap_fallback):
    """Called directly, the operators support vmap (above) and forward-mode
    dual tensors; torch.func's derivative transforms refuse with a pointer to
    lltm.functional, never a wrong result."""
    args = seq_inputs(3, 2, 3, 4, device) if f is op_seq else cell_inputs(2, 3, 4, F64, device)
    x, W, b, h, c = args
    for transform in (lambda: torch.func.grad(lambda x: total(f)(x, W, b, h, c))(x),
                      lambda: torch.func.jacrev(lambda x: f(x, W, b, h, c)[0])(x),
                      lambda: torch.func.jvp(lambda x: f(x, W, b, h, c), (x,), (x,)),
                      lambda: torch.func.hessian(lambda x: total(f)(x, W, b, h, c))(x)):
        with pytest.raises(RuntimeError, match=f"torch.ops.lltm.{name}: torch.func.*lltm.functional"):
            transform()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("f", CELLS + SEQS)
def test_jvp_and_jacfwd(f, device):
    seq = f in SEQS
    args = seq_inputs(3, 2, 3, 4, device) if seq else cell_inputs(2, 3, 4, F64, device)
    ref = ref_seq if seq else reference.lltm_cell
    tangents = tuple(torch.randn_like(a) for a in args)
    out, t_out = torch.func.jvp(f, args, tangents)
    out_r, t_out_r = torch.func.jvp(ref, args, tangents)
    close(out, out_r)
    close(t_out, t_out_r)
    x, W, b, h, c = args
    close(torch.func.jacfwd(lambda h: f(x, W, b, h, c))(h),
          torch.func.jacfwd(lambda h: ref(x, W, b, h, c))(h))


@pytest.mark.parametrize("f", CELLS + SEQS + [op_cell, op_seq])
def test_forward_ad_dual_tensors(f):
    """torch.autograd.forward_ad without torch.func: some tangents missing."""
    seq = f in (native_seq, op_seq)
    args = seq_inputs(3, 2, 3, 4) if seq else cell_inputs(2, 3, 4)
    ref = ref_seq if seq else reference.lltm_cell
    tangents = [torch.randn_like(a) if k in (0, 1) else None for k, a in enumerate(args)]
    results = []
    for g in (f, ref):
        with fwAD.dual_level():
            duals = [a if t is None else fwAD.make_dual(a, t) for a, t in zip(args, tangents)]
            results.append([fwAD.unpack_dual(o).tangent for o in g(*duals)])
    assert results[1][0].abs().max() > 1e-3
    close(*results)


@pytest.mark.parametrize("f", CELLS + [op_cell])
@pytest.mark.parametrize("in_dims", [(0, None, None, 0, 0), (1, None, None, None, 0),
                                     (None, None, None, 0, None), (0, 0, None, 0, 0),
                                     (0, None, 0, None, None)])
@pytest.mark.parametrize("device", DEVICES)
def test_vmap_cell(f, in_dims, device, no_vmap_fallback):
    N = 3
    args = list(cell_inputs(2, 3, 4, F64, device))
    for k, d in enumerate(in_dims):
        if d is not None:
            args[k] = torch.stack([torch.randn_like(args[k]) for _ in range(N)], dim=d)
    got = torch.func.vmap(f, in_dims=in_dims)(*args)
    want = torch.func.vmap(reference.lltm_cell, in_dims=in_dims)(*args)
    close(got, want)


@pytest.mark.parametrize("f", SEQS + [op_seq])
@pytest.mark.parametrize("in_dims", [(0, None, None, 0, 0), (2, None, None, None, None),
                                     (None, None, None, 0, 0), (0, 0, 0, None, None)])
@pytest.mark.parametrize("device", DEVICES)
def test_vmap_sequence(f, in_dims, device, no_vmap_fallback):
    N = 2
    args = list(seq_inputs(3, 2, 3, 4, device))
    for k, d in enumerate(in_dims):
        if d is not None:
            args[k] = torch.stack([torch.randn_like(args[k]) for _ in range(N)], dim=d)
    close(torch.func.vmap(f, in_dims=in_dims)(*args),
          torch.func.vmap(ref_seq, in_dims=in_dims)(*args))


def test_vmap_of_grad_per_sample_gradients(no_vmap_fallback):
    """Per-sample weight gradients: vmap(grad) over a batch of sequences."""
    x, W, b, h, c = seq_inputs(3, 5, 3, 4)

    def loss(f, W, x, h, c):
        out, h_n, c_n = f(x.unsqueeze(1), W, b, h.unsqueeze(0), c.unsqueeze(0))
        return out.pow(2).sum() + c_n.sum()

    dims = (None, 1, 0, 0)
    got = torch.func.vmap(torch.func.grad(lambda *a: loss(native_seq, *a)), in_dims=dims)(W, x, h, c)
    want = torch.func.vmap(torch.func.grad(lambda *a: loss(ref_seq, *a)), in_dims=dims)(W, x, h, c)
    assert got.shape == (5, *W.shape)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("seq", [False, True])
def test_batched_grads_through_native_backward(seq, no_vmap_fallback):
    """torch.autograd.grad(is_grads_batched=True) vmaps the native backward op."""
    args = [a.requires_grad_() for a in (seq_inputs(3, 2, 3, 4) if seq else cell_inputs(2, 3, 4))]
    f, ref = (native_seq, ref_seq) if seq else (native_cell, reference.lltm_cell)
    results = []
    for g in (f, ref):
        out = g(*args)[0]
        v = torch.randn(4, *out.shape, dtype=F64, generator=torch.Generator().manual_seed(1))
        results.append(torch.autograd.grad(out, args, v, is_grads_batched=True))
    close(*results)


@pytest.mark.parametrize("num_layers", [1, 2])
def test_functional_call_grad_of_module(num_layers):
    m = lltm.LLTM(3, 4, num_layers=num_layers, batch_first=True, dtype=F64)
    ref = lltm.LLTM(3, 4, num_layers=num_layers, batch_first=True, impl="reference", dtype=F64)
    params = {k: v.detach() for k, v in m.named_parameters()}
    x = torch.randn(2, 5, 3, dtype=F64)

    def loss(model, params, x):
        out, (h_n, c_n) = torch.func.functional_call(model, params, (x,))
        return out.pow(2).sum() + h_n.sum() + c_n.sum()

    got = torch.func.grad(lambda p: loss(m, p, x))(params)
    want = torch.func.grad(lambda p: loss(ref, p, x))(params)
    for k in params:
        torch.testing.assert_close(got[k], want[k], msg=k)

    cell = lltm.LLTMCell(3, 4, dtype=F64)
    cp = {k: v.detach() for k, v in cell.named_parameters()}
    xc = torch.randn(2, 3, dtype=F64)
    got = torch.func.grad(lambda p: torch.func.functional_call(cell, p, (xc,))[0].sum())(cp)
    want = torch.func.grad(lambda p: reference.lltm_cell(xc, p["weights"], p["bias"],
                                                         *(torch.zeros(2, 4, dtype=F64),) * 2)
                           [0].sum())(cp)
    close([got["weights"], got["bias"]], [want["weights"], want["bias"]])
