"""lltm.LLTM's stacked layers over time chunks (lltm/_wavefront.py), forced
on any device with lltm.overrides.wavefront: the same output, final state
and every gradient as the layers run one after the other (float64, odd
sizes), and as the reference; gradcheck and gradgradcheck; dropout between
layers; variable lengths (rows ending inside and before chunks);
torch.compile(fullgraph=True) and torch.func; the cases that keep one call a
layer (bidirectional, one layer); the chunk
count's choice and its override. The CUDA streams: tests/test_cuda_wavefront.py."""
import pytest
import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence

import lltm
from lltm import _layer_grads, _schedule, _settings, _sharing, _wavefront, functional, overrides

DT = torch.float64


def model(I, H, L, **kwargs):
    torch.manual_seed(torch.randint(2**31 - 1, ()).item())
    return lltm.LLTM(I, H, num_layers=L, dtype=DT, **kwargs)


def rand(*shape, requires_grad=True):
    return torch.randn(*shape, dtype=DT).requires_grad_(requires_grad)


def results(m, x, state, chunks, grad_out=None):
    """(output, h_n, c_n, gradients of x, the state and every parameter)."""
    with overrides.wavefront(chunks):
        out, (h, c) = m(x, state)
    grad_out = grad_out or [torch.randn_like(t) for t in (out, h, c)]
    leaves = [x, *(state or ()), *m.parameters()]
    return (out, h, c, *torch.autograd.grad((out, h, c), leaves, grad_out)), grad_out


@pytest.fixture
def calls(monkeypatch):
    """The sequence operator's calls (one per layer and chunk): through
    lltm_sequence, or where the chunks leave dW to the layer
    (lltm/_layer_grads.py), its chunk_call."""
    count = []

    def counted(module, name):
        original = getattr(module, name)

        def counting(*args, **kwargs):
            count.append(args[0].shape[0])  # the steps of the call
            return original(*args, **kwargs)
        monkeypatch.setattr(module, name, counting)
    counted(functional, "lltm_sequence")
    counted(_layer_grads, "chunk_call")
    return count


def assert_all_close(got, want, **tol):
    assert len(got) == len(want)
    for k, (a, b) in enumerate(zip(got, want)):
        torch.testing.assert_close(a, b, msg=lambda m: f"result {k}: {m}", **tol)


@pytest.mark.parametrize("T,B,I,H,L,chunks", [
    (7, 3, 5, 4, 2, 2), (7, 3, 5, 4, 3, 3), (9, 1, 2, 33, 3, 9), (10, 4, 6, 3, 4, 4),
    (6, 3, 4, 5, 3, 20), (1, 2, 3, 4, 3, 4), (11, 2, 0, 3, 2, 3), (8, 5, 9, 7, 5, 2)])
def test_chunks_match_layer_by_layer_and_reference(calls, T, B, I, H, L, chunks):
    m = model(I, H, L)
    ref = model(I, H, L, impl="reference")
    ref.load_state_dict(m.state_dict())
    x, state = rand(T, B, I), (rand(L, B, H), rand(L, B, H))
    want, grad_out = results(m, x, state, 1)
    assert calls == [T] * L
    calls.clear()
    got, _ = results(m, x, state, chunks, grad_out)
    used = min(chunks, T)
    assert len(calls) == L * used and sum(calls) == L * T  # every layer in `used` chunks
    assert max(calls) - min(calls) <= 1  # near-equal chunks
    assert_all_close(got, want, rtol=1e-12, atol=1e-12)
    with overrides.wavefront(1):
        assert_all_close(results(ref, x, state, 1, grad_out)[0][:3], want[:3], rtol=1e-10,
                         atol=1e-12)


def test_layouts_and_default_state():
    m = model(3, 4, 3, batch_first=True)
    x = rand(2, 9, 3)
    for state in (None, (rand(3, 2, 4), rand(3, 2, 4))):
        want, grad_out = results(m, x, state, 1)
        assert_all_close(results(m, x, state, 3, grad_out)[0], want, rtol=1e-12, atol=1e-12)
    unbatched = rand(9, 3)
    with overrides.wavefront(1):
        out1, (h1, c1) = m(unbatched)
    with overrides.wavefront(4):
        out4, (h4, c4) = m(unbatched)
    assert out4.shape == (9, 4) and h4.shape == (3, 4)
    assert_all_close((out4, h4, c4), (out1, h1, c1), rtol=1e-12, atol=1e-12)


def test_state_carries_over_between_calls():
    """Two calls, the second from the first's final state, equal one call over
    both sequences."""
    m = model(4, 5, 3)
    x = rand(13, 2, 4, requires_grad=False)
    with overrides.wavefront(4), torch.no_grad():
        whole, (h, c) = m(x)
        first, state = m(x[:6])
        second, (h2, c2) = m(x[6:], state)
    assert_all_close((torch.cat([first, second]), h2, c2), (whole, h, c), rtol=1e-12,
                     atol=1e-12)


def test_gradcheck_and_gradgradcheck():
    m = model(3, 2, 3)
    params = list(m.parameters())

    def f(x, h0, c0, *p):
        with overrides.wavefront(3), torch.nn.utils.stateless._reparametrize_module(
                m, dict(zip([n for n, _ in m.named_parameters()], p))):
            out, (h, c) = m(x, (h0, c0))
        return out, h, c
    args = (rand(5, 2, 3), rand(3, 2, 2), rand(3, 2, 2), *[p.detach().clone().requires_grad_()
                                                           for p in params])
    assert torch.autograd.gradcheck(f, args)
    assert torch.autograd.gradgradcheck(f, args)


def test_dropout_on_each_chunk_of_every_layer_but_the_last(monkeypatch):
    """F.dropout replaced by a mask that depends on the values only: the
    chunked path drops and scales the same elements as the layer-by-layer
    one, on every layer's output but the last, in training only."""
    seen = []

    def value_dropout(x, p=0.5, training=True, inplace=False):
        seen.append(x.shape[0])
        if not training:
            return x
        return x * (torch.sin(x * 1234.5) > 0) / (1 - p)
    monkeypatch.setattr(F, "dropout", value_dropout)
    T, L = 9, 3
    m = model(4, 5, L, dropout=0.3)
    x, state = rand(T, 2, 4), (rand(L, 2, 5), rand(L, 2, 5))
    want, grad_out = results(m, x, state, 1)
    assert seen == [T] * (L - 1)
    seen.clear()
    got, _ = results(m, x, state, 3, grad_out)
    assert seen == [3] * (3 * (L - 1))
    assert_all_close(got, want, rtol=1e-12, atol=1e-12)
    seen.clear()
    m.eval()
    with overrides.wavefront(3):
        m(x, state)
    assert seen == []


def test_real_dropout_trains_and_keeps_eval_exact():
    m = model(4, 6, 3, dropout=0.5)
    x = rand(8, 3, 4)
    with overrides.wavefront(4):
        train, _ = m(x)
        m.eval()
        evaluated, _ = m(x)
    with overrides.wavefront(1):
        plain, _ = m(x)
    torch.testing.assert_close(evaluated, plain, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(train, plain)
    train.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters())


def test_torch_compile_fullgraph():
    m = model(3, 4, 3)
    x, state = rand(7, 2, 3), (rand(3, 2, 4), rand(3, 2, 4))
    want, grad_out = results(m, x, state, 1)
    torch._dynamo.reset()
    compiled = torch.compile(m, fullgraph=True)
    with overrides.wavefront(3):
        out, (h, c) = compiled(x, state)
    leaves = [x, *state, *m.parameters()]
    got = (out, h, c, *torch.autograd.grad((out, h, c), leaves, grad_out))
    assert_all_close(got, want, rtol=1e-12, atol=1e-12)
    lengths = [7, 2]  # a list of ints compiles (one graph per set of lengths)
    with overrides.wavefront(1):
        want = m(x, state, lengths=lengths)
    with overrides.wavefront(3):
        got = torch.compile(m, fullgraph=True)(x, state, lengths=lengths)
    assert_all_close((got[0], *got[1]), (want[0], *want[1]), rtol=1e-12, atol=1e-12)


def test_torch_func_grad():
    m = model(3, 4, 2)
    params = {n: p.detach() for n, p in m.named_parameters()}
    x = rand(6, 2, 3, requires_grad=False)

    def loss(p, chunks):
        with overrides.wavefront(chunks):
            out, (h, c) = torch.func.functional_call(m, p, (x,))
        return out.sin().sum() + h.sum() * c.sum()
    want = torch.func.grad(loss)(params, 1)
    got = torch.func.grad(loss)(params, 3)
    for name in params:
        torch.testing.assert_close(got[name], want[name], rtol=1e-12, atol=1e-12)


def test_cases_that_keep_one_call_a_layer(calls, monkeypatch):
    from lltm import _directions
    # a bidirectional layer counted in its per-operator form (eager calls
    # run both directions as one node, which calls the operators itself)
    monkeypatch.setattr(_directions, "fused", lambda x: False)
    L, T, B = 2, 8, 4
    bi = model(3, 4, L, bidirectional=True)
    x = rand(T, B, 3)
    with overrides.wavefront(4):
        bi(x)
        assert len(calls) == 2 * L  # the reverse direction needs the whole layer below
        calls.clear()
        bi(x, lengths=[8, 3, 5, 8])
        assert len(calls) == 2 * L
        calls.clear()
        model(3, 4, 1)(x)  # one layer
        assert calls == [T]
        calls.clear()
        model(3, 4, L, impl="reference")(x)  # a loop of cells
        assert calls == []


@pytest.mark.parametrize("chunks", [2, 4, 12])
def test_variable_lengths_in_chunks(calls, chunks):
    """Rows that end inside a chunk, at its edge, and before later chunks start
    (lengths 1 and 2 against chunks of 3 steps): the output zero past each
    row's length, each row's own final state, every gradient, as one call a
    layer; padded input with lengths= and a PackedSequence."""
    L, T, B, I, H = 3, 12, 6, 4, 5
    m = model(I, H, L)
    x, state = rand(T, B, I), (rand(L, B, H), rand(L, B, H))
    lengths = [12, 2, 5, 9, 1, 6]
    grad_out = None
    got, want = {}, {}
    for c, where in ((1, want), (chunks, got)):
        calls.clear()
        with overrides.wavefront(c):
            out, (h, c_n) = m(x, state, lengths=lengths)
        assert len(calls) == L * c
        grad_out = grad_out or [torch.randn_like(t) for t in (out, h, c_n)]
        leaves = [x, *state, *m.parameters()]
        where["padded"] = (out, h, c_n, *torch.autograd.grad((out, h, c_n), leaves, grad_out))
        packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
        with overrides.wavefront(c):
            out_p, (h_p, c_p) = m(packed, state)
        where["packed"] = (out_p.data, h_p, c_p, *torch.autograd.grad(
            (out_p.data.square().sum() + h_p.sum() + c_p.sum()), leaves))
    assert_all_close(got["padded"], want["padded"], rtol=1e-12, atol=1e-12)
    assert_all_close(got["packed"], want["packed"], rtol=1e-12, atol=1e-12)
    out = got["padded"][0]
    for b, length in enumerate(lengths):
        if length < T:
            assert out[length:, b].abs().max().item() == 0


def test_variable_lengths_gradcheck():
    m = model(2, 3, 2)
    lengths = torch.tensor([5, 1, 3])

    def f(x, h0, c0):
        with overrides.wavefront(3):
            out, (h, c) = m._run(x, h0, c0, lengths)
        return out, h, c
    assert torch.autograd.gradcheck(f, (rand(5, 3, 2), rand(2, 3, 3), rand(2, 3, 3)))


def test_chunk_count_choice(monkeypatch):
    x = torch.randn(50, 2, 3)
    assert overrides.current_wavefront_chunks() is None
    assert _schedule.wavefront_chunks(x, 4, 3) == (1, 1)  # the CPU gains nothing: one call a layer
    assert _schedule.automatic_schedule(100, 16, 128, 256, 3, torch.float32,
                                         torch.device("cpu")) == (1, 1)
    with overrides.wavefront(4):  # forced: planned for the whole device
        assert _schedule.wavefront_chunks(x, 4, 3) == (4, 1)
        assert _schedule.wavefront_chunks(x, 4, 1) == (1, 1)  # one layer: nothing to overlap
        assert _schedule.wavefront_chunks(x[:3], 4, 3) == (3, 1)  # at most T
        assert _schedule.wavefront_chunks(x[:1], 4, 3) == (1, 1)
    assert _wavefront._split(10, 3) == [4, 3, 3]
    assert _wavefront._split(6, 6) == [1] * 6


def test_calls_planned_for_a_shared_device(calls, monkeypatch):
    """run(..., sharing=2): every chunk call planned for two layers at once,
    and so is its backward (ctx.concurrent_layers, in the backward call's
    settings); the same results as the layers one after the other; the
    setting restored after."""
    seen, entered, backward = [], [], []
    sharing_device = _sharing.sharing_device
    for module, name in ((functional, "lltm_sequence"), (_layer_grads, "chunk_call")):
        def recording(*args, _counting=getattr(module, name), **kwargs):
            seen.append(_sharing.concurrent_layers())
            return _counting(*args, **kwargs)
        monkeypatch.setattr(module, name, recording)

    def entering(layers):
        entered.append(layers)
        return sharing_device(layers)
    monkeypatch.setattr(_sharing, "sharing_device", entering)
    current = _settings.current

    def settings_of_a_backward(concurrent=None):
        backward.append(concurrent)
        return current(concurrent)
    monkeypatch.setattr(_settings, "current", settings_of_a_backward)
    T, B, I, H, L = 9, 3, 4, 5, 3
    m, x = model(I, H, L), rand(T, B, I)
    want, grad_out = results(m, x, None, 1)
    del calls[:], seen[:], entered[:]
    out, (h, c) = _wavefront.run(m, x, torch.zeros(L, B, H, dtype=DT),
                                 torch.zeros(L, B, H, dtype=DT), 3, sharing=2)
    assert seen == [2] * (3 * L) and len(calls) == 3 * L and entered == [2]
    del backward[:]
    grads = torch.autograd.grad((out, h, c), [x, *m.parameters()], grad_out)
    assert backward == [2] * (3 * L)  # each call's backward too
    assert _sharing.concurrent_layers() == 1
    assert_all_close((out, h, c, *grads), want)
