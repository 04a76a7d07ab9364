"""lltm.LLTM(bidirectional=True) with nn.LSTM's conventions, against a loop
of reference cells run per direction (tests/lstm_reference.py)."""
import contextlib

import pytest
import torch

import lltm
from lstm_reference import reference_lltm

F64 = torch.float64
TOL = dict(rtol=1e-10, atol=1e-12)


def make(I, H, device="cpu", **kw):
    return lltm.LLTM(I, H, bidirectional=True, dtype=F64, device=device, **kw)


def state(L, B, H, device="cpu", requires_grad=False):
    return tuple(torch.randn(2 * L, B, H, dtype=F64, device=device,
                             requires_grad=requires_grad) for _ in range(2))


def test_parameters_named_like_lstm():
    m = lltm.LLTM(3, 5, num_layers=2, bidirectional=True)
    lstm = torch.nn.LSTM(3, 5, num_layers=2, bidirectional=True)
    want = [n for n, _ in lstm.named_parameters() if n.startswith("weight_ih")]
    got = [n for n, _ in m.named_parameters() if n.startswith("weights")]
    assert got == [n.replace("weight_ih", "weights") for n in want]
    assert [n for n, _ in m.named_parameters()] == [
        "weights_l0", "bias_l0", "weights_l0_reverse", "bias_l0_reverse",
        "weights_l1", "bias_l1", "weights_l1_reverse", "bias_l1_reverse"]
    assert m.weights_l0.shape == m.weights_l0_reverse.shape == (15, 3 + 5)
    assert m.weights_l1.shape == m.weights_l1_reverse.shape == (15, 2 * 5 + 5)
    assert "bias_l0_reverse" not in dict(
        lltm.LLTM(3, 5, bias=False, bidirectional=True).named_parameters())
    with pytest.raises(IndexError, match="not bidirectional"):
        lltm.LLTM(3, 5).layer_parameters(0, reverse=True)


@pytest.mark.parametrize("impl", ["native", "reference"])
@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_matches_reference_per_direction(impl, num_layers, with_state, bias):
    T, B, I, H = 7, 3, 5, 9
    m = make(I, H, num_layers=num_layers, bias=bias, impl=impl)
    x = torch.randn(T, B, I, dtype=F64)
    hx = state(num_layers, B, H) if with_state else None
    out, (h_n, c_n) = m(x, hx)
    assert out.shape == (T, B, 2 * H) and h_n.shape == c_n.shape == (2 * num_layers, B, H)
    want = reference_lltm(m, x, *(hx or (None, None)))
    for g, w in zip((out, h_n, c_n), want):
        torch.testing.assert_close(g, w, **TOL)


def test_reverse_half_is_the_reverse_direction_alone():
    """output[..., H:] is the reverse layer run on the flipped input, flipped
    back; h_n[1] its state after input step 0, as in nn.LSTM."""
    T, B, I, H = 6, 2, 3, 4
    m = make(I, H)
    x = torch.randn(T, B, I, dtype=F64)
    out, (h_n, c_n) = m(x)
    w, b = m.layer_parameters(0, reverse=True)
    zeros = torch.zeros(B, H, dtype=F64)
    rev, (h, c) = lltm.functional.lltm_sequence(x.flip(0), w, b, zeros, zeros)
    torch.testing.assert_close(out[..., H:], rev.flip(0), rtol=0, atol=0)
    torch.testing.assert_close(h_n[1], h, rtol=0, atol=0)
    torch.testing.assert_close(out[0, :, H:], h_n[1], rtol=0, atol=0)
    torch.testing.assert_close(out[-1, :, :H], h_n[0], rtol=0, atol=0)


@pytest.mark.parametrize("num_layers", [1, 2])
def test_batch_first_and_unbatched(num_layers):
    T, B, I, H = 5, 3, 4, 7
    m = make(I, H, num_layers=num_layers)
    m_bf = make(I, H, num_layers=num_layers, batch_first=True)
    m_bf.load_state_dict(m.state_dict())
    x = torch.randn(T, B, I, dtype=F64)
    hx = state(num_layers, B, H)
    out, (h_n, c_n) = m(x, hx)
    out_bf, (h_bf, c_bf) = m_bf(x.transpose(0, 1), hx)
    torch.testing.assert_close(out_bf, out.transpose(0, 1), rtol=0, atol=0)
    torch.testing.assert_close(h_bf, h_n, rtol=0, atol=0)
    for row in range(B):
        o, (h, c) = m(x[:, row], (hx[0][:, row], hx[1][:, row]))
        assert o.shape == (T, 2 * H) and h.shape == (2 * num_layers, H)
        want = reference_lltm(m, x[:, row:row + 1], hx[0][:, row:row + 1], hx[1][:, row:row + 1])
        torch.testing.assert_close(o, want[0][:, 0], **TOL)
        torch.testing.assert_close(c, want[2][:, 0], **TOL)
    o, (h, c) = m(x[:, 0])  # unbatched, zero state
    torch.testing.assert_close(o, reference_lltm(m, x[:, :1])[0][:, 0], **TOL)


@pytest.mark.parametrize("batch_first", [False, True])
def test_shapes_like_lstm(batch_first):
    T, B, I, H, L = 4, 3, 2, 5, 2
    kw = dict(num_layers=L, bidirectional=True, batch_first=batch_first)
    m, lstm = lltm.LLTM(I, H, **kw), torch.nn.LSTM(I, H, **kw)
    for x in (torch.randn(B, T, I) if batch_first else torch.randn(T, B, I), torch.randn(T, I)):
        got, want = m(x), lstm(x)
        assert (got[0].shape, got[1][0].shape, got[1][1].shape) == (
            want[0].shape, want[1][0].shape, want[1][1].shape)
    with pytest.raises(ValueError, match=r"h0 must have shape \[4, 3, 5\], got \[2, 3, 5\]"):
        m(torch.randn(T, B, I).transpose(0, 1) if batch_first else torch.randn(T, B, I),
          (torch.zeros(L, B, H), torch.zeros(L, B, H)))


def test_gradcheck_float64():
    T, B, I, H, L = 4, 2, 3, 3, 2
    m = make(I, H, num_layers=L)
    x = torch.randn(T, B, I, dtype=F64, requires_grad=True)
    h0, c0 = state(L, B, H, requires_grad=True)
    params = list(m.parameters())

    def f(x, h0, c0, *p):
        out, (h_n, c_n) = torch.func.functional_call(
            m, dict(zip([n for n, _ in m.named_parameters()], p)), (x, (h0, c0)))
        return out, h_n, c_n
    assert torch.autograd.gradcheck(f, (x, h0, c0, *params))


def test_gradients_match_reference():
    T, B, I, H, L = 5, 3, 2, 4, 2
    m = make(I, H, num_layers=L)
    x = torch.randn(T, B, I, dtype=F64, requires_grad=True)
    hx = state(L, B, H, requires_grad=True)
    got, want = m(x, hx), reference_lltm(m, x, *hx)
    weights = [torch.randn_like(t) for t in want]
    inputs = (x, *hx, *m.parameters())
    g_got = torch.autograd.grad([(g * w).sum() for g, w in zip((got[0], *got[1]), weights)],
                                inputs)
    g_want = torch.autograd.grad([(g * w).sum() for g, w in zip(want, weights)], inputs)
    for a, b in zip(g_got, g_want):
        torch.testing.assert_close(a, b, **TOL)


def test_dropout_between_layers_like_lstm():
    """dropout=1 in training: layer 1 (both directions) reads zeros; the
    last layer's output is not dropped."""
    T, B, I, H = 5, 2, 3, 4
    m = make(I, H, num_layers=2, dropout=1.0)
    m.train()
    x = torch.randn(T, B, I, dtype=F64)
    out, (h_n, c_n) = m(x)
    want = reference_lltm(m, x, layer_inputs={1: torch.zeros(T, B, 2 * H, dtype=F64)})
    torch.testing.assert_close(out, want[0], **TOL)
    torch.testing.assert_close(c_n, want[2], **TOL)
    assert out.abs().min() > 0
    m.eval()
    torch.testing.assert_close(m(x)[0], reference_lltm(m, x)[0], **TOL)


@pytest.mark.parametrize("num_layers", [1, 2])
def test_compile_fullgraph(num_layers):
    torch._dynamo.reset()
    T, B, I, H = 5, 3, 4, 6
    m = lltm.LLTM(I, H, num_layers=num_layers, bidirectional=True, batch_first=True)
    x = torch.randn(B, T, I, requires_grad=True)
    hx = tuple(torch.randn(2 * num_layers, B, H) for _ in range(2))
    compiled = torch.compile(m, fullgraph=True)
    got, want = compiled(x, hx), m(x, hx)
    for a, b in zip((got[0], *got[1]), (want[0], *want[1])):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    g_got = torch.autograd.grad(got[0].sum() + got[1][1].sum(), (x, *m.parameters()))
    g_want = torch.autograd.grad(want[0].sum() + want[1][1].sum(), (x, *m.parameters()))
    for a, b in zip(g_got, g_want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_state_dict_round_trip_and_repr():
    m = lltm.LLTM(3, 4, num_layers=2, batch_first=True, bidirectional=True)
    m2 = lltm.LLTM(3, 4, num_layers=2, batch_first=True, bidirectional=True)
    m2.load_state_dict(m.state_dict())
    x = torch.randn(2, 5, 3)
    torch.testing.assert_close(m(x), m2(x), rtol=0, atol=0)
    assert repr(m) == "LLTM(3, 4, num_layers=2, batch_first=True, bidirectional=True)"
    with pytest.raises(RuntimeError, match="weights_l0_reverse"):
        lltm.LLTM(3, 4, num_layers=2, batch_first=True).load_state_dict(m.state_dict())


# --- both directions as one autograd node (eager) ----------------------------------

@contextlib.contextmanager
def per_operator():
    """The per-operator path (one node per operator, as torch.compile and
    torch.func trace it) instead of one BothDirections node a layer."""
    from lltm import _directions
    saved = _directions.fused
    _directions.fused = lambda x: False
    try:
        yield
    finally:
        _directions.fused = saved


@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("lengths", [None, [4, 6, 1]])
def test_one_node_per_layer_matches_per_operator_path(num_layers, bias, lengths):
    T, B, I, H = 6, 3, 4, 5
    m = make(I, H, num_layers=num_layers, bias=bias)
    x = torch.randn(T, B, I, dtype=F64, requires_grad=True)
    hx = state(num_layers, B, H, requires_grad=True)
    w = torch.randn(T, B, 2 * H, dtype=F64)

    def run():
        o, (h, c) = m(x, hx, lengths=lengths)
        loss = (o * w).sum() + (h * h).sum() + c.sum()
        return [o, h, c, *torch.autograd.grad(loss, (x, *hx, *m.parameters()))], o.grad_fn
    got, node = run()
    assert type(node).__name__ == "BothDirectionsBackward"
    with per_operator():
        want, node = run()
    assert type(node).__name__ != "BothDirectionsBackward"
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e, **TOL)


def test_one_node_partial_gradients_and_unused_outputs():
    """Only some inputs need a gradient; only some outputs are used."""
    T, B, I, H = 5, 2, 3, 4
    m = make(I, H)
    x = torch.randn(T, B, I, dtype=F64)  # no gradient
    hx = state(1, B, H)

    def grads_of_h_n():
        return torch.autograd.grad(m(x, hx)[1][0][0].sum(), list(m.parameters()),
                                   allow_unused=True)

    def grads_of_output():
        x.requires_grad_()
        try:
            return torch.autograd.grad(m(x)[0][..., 0].sum(), x)
        finally:
            x.requires_grad_(False)
    got = grads_of_h_n() + grads_of_output()
    with per_operator():
        want = grads_of_h_n() + grads_of_output()
    for a, b in zip(got, want):
        if b is None:  # the reverse direction's parameters do not reach h_n[0]
            assert a is None or not a.any()
        else:
            torch.testing.assert_close(a, b, **TOL)


@pytest.mark.parametrize("lengths", [None, [3, 5]])
def test_one_node_gradcheck_and_gradgradcheck(lengths):
    """float64 first and second derivatives through the one-node path (its
    backward under create_graph runs the differentiable formulas)."""
    T, B, I, H = 5, 2, 2, 3
    m = make(I, H, num_layers=2)
    names = [n for n, _ in m.named_parameters()]

    def f(x, h0, c0, *p):
        out, (h_n, c_n) = torch.func.functional_call(m, dict(zip(names, p)), (x, (h0, c0)),
                                                     {"lengths": lengths})
        assert type(out.grad_fn).__name__ == "BothDirectionsBackward"
        return out, h_n, c_n
    x = torch.randn(T, B, I, dtype=F64, requires_grad=True)
    args = (x, *state(2, B, H, requires_grad=True), *m.parameters())
    assert torch.autograd.gradcheck(f, args)
    assert torch.autograd.gradgradcheck(f, args[:3] + tuple(
        p.detach().requires_grad_(False) for p in args[3:]))


def test_torch_func_and_forward_ad_take_the_per_operator_path():
    T, B, I, H = 4, 2, 3, 4
    m = make(I, H)
    x = torch.randn(T, B, I, dtype=F64)
    params = dict(m.named_parameters())

    def loss(p, x):
        out, (h_n, c_n) = torch.func.functional_call(m, p, (x,))
        return (out * out).sum() + h_n.sum()
    got = torch.func.grad(loss)(params, x)
    want = torch.autograd.grad(loss(params, x), list(params.values()))
    for g, w in zip(got.values(), want):
        torch.testing.assert_close(g, w, **TOL)
    tangent = torch.randn_like(x)
    _, jvp = torch.func.jvp(lambda x: m(x)[0], (x,), (tangent,))
    eps = 1e-6
    fd = (m(x + eps * tangent)[0] - m(x - eps * tangent)[0]) / (2 * eps)
    torch.testing.assert_close(jvp, fd, rtol=1e-6, atol=1e-7)
