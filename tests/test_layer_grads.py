"""Stacked layers in time chunks forming each layer's weight and bias
gradients once (lltm/_layer_grads.py), through lltm::sequence_backward_gates
(the backward handing out dG in place of dW): the operator against
sequence_backward (dW = dG^T [h_prev | x], the rest bitwise), its opcheck
and output_mask; the chunked module against one call a layer with some
parameters frozen, without bias, under autocast, with a gradient of the
input alone first (retain_graph), gradients accumulated over two backward
calls, double backward; the route left where it
does not apply. On the CPU (forced chunks), some on CUDA too; the CUDA streams
under capture: tests/test_cuda_wavefront.py."""
import pytest
import torch

import lltm
from lltm import _layer_grads, _native, overrides
from test_wavefront import model  # float64, freshly seeded

DT = torch.float64


CUDA = pytest.mark.skipif(not torch.cuda.is_available() or not _native.has_cuda_kernels(),
                          reason="needs a CUDA GPU and the CUDA kernels (liblltm_cuda.so)")
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]


def _layer(T, B, I, H, dtype=DT, device="cpu"):
    def rand(*shape):
        return torch.randn(*shape, dtype=dtype, device=device)
    return rand(T, B, I), rand(3 * H, I + H) / (I + H) ** 0.5, rand(3 * H), rand(B, H), rand(B, H)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("T,B,I,H", [(5, 3, 4, 6), (1, 2, 3, 5), (4, 1, 0, 3), (7, 5, 9, 2),
                                     (6, 17, 8, 40)])
@pytest.mark.parametrize("with_lengths", [False, True], ids=["all_T", "lengths"])
def test_gates_operator_matches_sequence_backward(T, B, I, H, with_lengths, device):
    x, W, b, h0, c0 = _layer(T, B, I, H, device=device)
    lengths = torch.randint(1, T + 1, (B,), device=device) if with_lengths else None
    extra = () if lengths is None else (lengths,)
    fwd = torch.ops.lltm.sequence_forward.lengths if extra else torch.ops.lltm.sequence_forward
    out, _, _, cells, gates = fwd(x, W, b, h0, c0, *extra)
    grads = (torch.randn_like(out), torch.randn_like(h0), torch.randn_like(h0))
    args = (*grads, x, W, h0, out, cells, gates, *extra)
    if extra:
        full = torch.ops.lltm.sequence_backward.lengths(*args)
        gated = torch.ops.lltm.sequence_backward_gates.lengths(*args)
        op = torch.ops.lltm.sequence_backward_gates.lengths
    else:
        full = torch.ops.lltm.sequence_backward(*args)
        gated = torch.ops.lltm.sequence_backward_gates(*args)
        op = torch.ops.lltm.sequence_backward_gates.default
    for k in (0, 2, 3, 4):
        assert torch.equal(gated[k], full[k])
    dG = gated[1]
    assert dG.shape == (T, B, 3 * H)
    h_prev = torch.cat([h0.unsqueeze(0), out[:-1]])
    dW = dG.reshape(T * B, -1).t() @ torch.cat([h_prev, x], 2).reshape(T * B, -1)
    torch.testing.assert_close(dW, full[1], rtol=1e-12, atol=1e-12)
    assert dG.abs().sum() > 0
    # output_mask: only what is asked for, the rest bitwise the same
    mask = [False, True, False, True, False]
    some = op(*args, mask)
    assert [t is None for t in some] == [not m for m in mask]
    assert torch.equal(some[1], dG) and torch.equal(some[3], full[3])
    torch.library.opcheck(op, args)


def test_gates_operator_checks_and_refuses_to_differentiate():
    x, W, b, h0, c0 = _layer(3, 2, 4, 5)
    out, _, _, cells, gates = torch.ops.lltm.sequence_forward(x, W, b, h0, c0)
    g = torch.randn_like(out)
    with pytest.raises(RuntimeError, match=r"lltm::sequence_backward_gates: .*gates"):
        torch.ops.lltm.sequence_backward_gates(g, h0, c0, x, W, h0, out, cells, gates[:, :, 1:])
    with pytest.raises(RuntimeError, match="is not differentiable"):
        gr = g.clone().requires_grad_()
        torch.ops.lltm.sequence_backward_gates(gr, h0, c0, x, W, h0, out, cells,
                                               gates)[1].sum().backward()


def _grads(m, x, chunks, grad_out, lengths=None):
    """Gradients of x and of the parameters that want one."""
    with overrides.wavefront(chunks):
        out, (h, c) = m(x, lengths=lengths)
    leaves = [x, *(p for p in m.parameters() if p.requires_grad)]
    return torch.autograd.grad((out, h, c), leaves, grad_out)


def _grad_out(T, B, H, L):
    return [torch.randn(T, B, H, dtype=DT), torch.randn(L, B, H, dtype=DT),
            torch.randn(L, B, H, dtype=DT)]


@pytest.mark.parametrize("frozen", ["none", "weights", "biases", "layer1", "no_bias"])
@pytest.mark.parametrize("with_lengths", [False, True], ids=["all_T", "lengths"])
@pytest.mark.parametrize("joined", [False, True], ids=["views", "joined"])
def test_chunked_gradients_equal_one_call_a_layer(frozen, with_lengths, joined, monkeypatch):
    """Either way of forming dW: the chunks' rows joined (the GPU's, while
    they fit in its L2 cache) or products on their views."""
    monkeypatch.setattr(_layer_grads, "join_limit", lambda device: 1 << 62 if joined else 0)
    T, B, I, H, L = 11, 4, 5, 6, 3
    m = model(I, H, L, bias=frozen != "no_bias")
    for name, p in m.named_parameters():
        if (frozen == "weights" and name.startswith("weights")) or \
                (frozen == "biases" and name.startswith("bias")) or \
                (frozen == "layer1" and name.endswith("_l1")):
            p.requires_grad_(False)
    x = torch.randn(T, B, I, dtype=DT, requires_grad=True)
    lengths = torch.tensor([T, 3, 1, 8]) if with_lengths else None
    grad_out = _grad_out(T, B, H, L)
    want = _grads(m, x, 1, grad_out, lengths=lengths)
    got = _grads(m, x, 4, grad_out, lengths=lengths)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_join_limit():
    assert _layer_grads.join_limit(torch.device("cpu")) == 0
    if torch.cuda.is_available():
        assert _layer_grads.join_limit(torch.device("cuda")) == \
            torch.cuda.get_device_properties(0).L2_cache_size


def test_route_taken_only_where_it_applies(monkeypatch):
    """The chunk calls go through _layer_grads where gradients are recorded
    and parameters want them; not in no_grad, nor for frozen layers, nor for
    one call a layer."""
    taken = []
    original = _layer_grads.chunk_call

    def counting(*args, **kwargs):
        taken.append(args[0].shape[0])
        return original(*args, **kwargs)
    monkeypatch.setattr(_layer_grads, "chunk_call", counting)
    T, B, I, H, L = 8, 2, 3, 4, 2
    m, x = model(I, H, L), torch.randn(T, B, I, dtype=DT)
    with overrides.wavefront(4):
        m(x)
        assert len(taken) == 4 * L
        taken.clear()
        with torch.no_grad():
            m(x)
        assert taken == []
        for p in m.parameters():
            p.requires_grad_(False)
        m(x.requires_grad_())
        assert taken == []
    with overrides.wavefront(1):
        for p in m.parameters():
            p.requires_grad_(True)
        m(x)
        assert taken == []


@pytest.mark.parametrize("device", DEVICES)
def test_input_gradient_first_then_all(device):
    """A backward that asks for the input's gradient alone leaves nothing
    behind that a later backward through the same graph would add."""
    T, B, I, H, L = 9, 3, 4, 5, 3
    m = model(I, H, L).to(device)
    x = torch.randn(T, B, I, dtype=DT, device=device, requires_grad=True)
    grad_out = torch.randn(T, B, H, dtype=DT, device=device)
    with overrides.wavefront(3):
        out, _ = m(x)
    torch.autograd.grad(out, [x], torch.randn_like(grad_out), retain_graph=True)
    got = torch.autograd.grad(out, [x, *m.parameters()], grad_out, retain_graph=True)
    again = torch.autograd.grad(out, [x, *m.parameters()], grad_out)
    with overrides.wavefront(1):
        want = torch.autograd.grad(m(x)[0], [x, *m.parameters()], grad_out)
    for a, b, c in zip(got, again, want):
        torch.testing.assert_close(a, c, rtol=1e-12, atol=1e-12)
        assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_gradients_accumulate_over_backward_calls(device):
    T, B, I, H, L = 7, 2, 3, 4, 2
    m = model(I, H, L).to(device)
    x = torch.randn(T, B, I, dtype=DT, device=device)
    grad_out = torch.randn(T, B, H, dtype=DT, device=device)
    for chunks in (1, 3):
        m.zero_grad(set_to_none=True)
        with overrides.wavefront(chunks):
            for _ in range(2):
                m(x)[0].backward(grad_out)
        if chunks == 1:
            want = [p.grad.clone() for p in m.parameters()]
    for p, w in zip(m.parameters(), want):
        torch.testing.assert_close(p.grad, w, rtol=1e-12, atol=1e-12)


def test_double_backward_and_gradgradcheck():
    T, B, I, H, L = 6, 2, 3, 3, 2
    m = model(I, H, L)
    x = torch.randn(T, B, I, dtype=DT, requires_grad=True)
    weights = list(m.parameters())

    def f(x, *params):
        with torch.nn.utils.stateless._reparametrize_module(
                m, dict(zip((n for n, _ in m.named_parameters()), params))):
            with overrides.wavefront(3):
                return m(x)[0]
    assert torch.autograd.gradcheck(f, (x, *weights))
    assert torch.autograd.gradgradcheck(f, (x, *weights))


def test_under_autocast_as_one_call_a_layer():
    T, B, I, H, L = 8, 3, 4, 6, 2
    m = lltm.LLTM(I, H, num_layers=L)
    x = torch.randn(T, B, I, requires_grad=True)
    grad_out = torch.randn(T, B, H, dtype=torch.bfloat16)
    results = []
    for chunks in (1, 4):
        with torch.autocast("cpu", dtype=torch.bfloat16), overrides.wavefront(chunks):
            out, _ = m(x)
        assert out.dtype == torch.bfloat16
        grads = torch.autograd.grad(out, [x, *m.parameters()], grad_out)
        assert all(g.dtype == torch.float32 for g in grads)
        results.append(grads)
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=0.05, atol=0.05)
