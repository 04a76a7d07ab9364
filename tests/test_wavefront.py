"""lltm.LLTM's stacked layers over time chunks (lltm/_wavefront.py), forced
on any device with lltm.overrides.wavefront: the same output, final state
and every gradient as the layers run one after the other (float64, odd
sizes), and as the reference; gradcheck and gradgradcheck; dropout between
layers; variable lengths (rows ending inside and before chunks);
torch.compile(fullgraph=True) and torch.func; the cases that keep one call a
layer (bidirectional, one layer); the chunk
count's choice and its override. The CUDA streams: tests/test_cuda_wavefront.py."""
import itertools
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


def test_predicted_time_and_best_chunks():
    """The automatic choice's arithmetic (docs/design.md, "Stacked layers")."""
    # one call a layer: L (call + T steps)
    assert _schedule.predicted_time(1, 3, 100, 40, 10, 3) == 3 * (40 + 1000)
    # C chunks, all layers at once: C + L - 1 chunk times
    assert _schedule.predicted_time(4, 3, 100, 40, 10, 3) == 6 * (40 + 250)
    # room for one layer at a time: every chunk call one after the other
    assert _schedule.predicted_time(4, 3, 100, 40, 10, 1) == 12 * (40 + 250)
    # the host issuing the calls
    assert _schedule.predicted_time(4, 3, 100, 1, 1, 3, host_us=100) == 1200
    # whole launches hold whole slots: three layers in two, three chunks
    # take 6 chunk times (the fluid count: max(5, 4.5)), two chunks 4
    assert _schedule.predicted_time(3, 3, 120, 40, 10, 2) == 5 * (40 + 400)
    assert _schedule.predicted_time(3, 3, 120, 40, 10, 2, whole_launches=True) == 6 * (40 + 400)
    assert _schedule.predicted_time(2, 3, 120, 40, 10, 2, whole_launches=True) == 4 * (40 + 600)
    assert _schedule.predicted_time(4, 3, 120, 40, 10, 3, whole_launches=True) == 6 * (40 + 300)
    # parts that start as they fit, a layer and three quarters at once: fluid
    assert _schedule.predicted_time(3, 3, 120, 40, 10, 1.75) == pytest.approx(
        9 / 1.75 * (40 + 400))
    c = _schedule.best_chunks(3, 100, 40, 10, 3)
    assert 2 <= c <= 100 // _schedule.MIN_CHUNK_STEPS
    # where the fluid count favours 3 chunks, whole slots favour 2
    assert _schedule.best_chunks(3, 100, 110, 5, 2) == 3
    assert _schedule.best_chunks(3, 100, 110, 5, 2, whole_launches=True) == 2
    assert _schedule.best_chunks(3, 100, 40, 10, 1) == 1  # no room: the layers in turn
    assert _schedule.best_chunks(3, 100, 40, 10, 3, host_us=2000) == 1  # the host bound
    assert _schedule.best_chunks(3, 100, 1000, 1, 3) == 1  # calls dearer than steps
    assert _schedule.best_chunks(3, 12, 1, 10, 3) == 1  # too few steps for two chunks
    assert _schedule.best_chunks(8, 10000, 1, 10, 8) == _schedule.MAX_CHUNKS


def test_makespan_of_the_chunk_calls():
    """Chunk times of the L x C chunk calls in whole slots: the wavefront's
    C + L - 1 where every layer has a slot, every call in turn with one, and
    in between the list schedule's count, checked against every order of
    the calls (a brute-force search over the ready calls each time)."""
    from functools import lru_cache

    def brute(L, C, slots):
        @lru_cache(maxsize=None)
        def rest(done):
            if done[-1] == C:
                return 0
            ready = [l for l in range(L) if done[l] < C and (l == 0 or done[l - 1] > done[l])]
            best = None
            for n in range(1, min(slots, len(ready)) + 1):
                for pick in itertools.combinations(ready, n):
                    after = tuple(d + (l in pick) for l, d in enumerate(done))
                    t = 1 + rest(after)
                    best = t if best is None else min(best, t)
            return best
        return rest((0,) * L)
    for L in (2, 3, 4, 5):
        for C in range(1, 7):
            assert _schedule.makespan(L, C, L) == C + L - 1
            assert _schedule.makespan(L, C, 1) == L * C
            for slots in range(2, L):
                assert _schedule.makespan(L, C, slots) == brute(L, C, slots), (L, C, slots)
    assert [_schedule.makespan(3, C, 2) for C in (2, 3, 4, 6)] == [4, 6, 7, 10]


def h100_properties(index):
    return type("Props", (), {"multi_processor_count": 132, "L2_cache_size": 50 * 2**20})()


def test_layers_at_once_of_the_per_step_family():
    """The per-step family: on FFMA one layer at a time, but float32's in CUDA
    graphs a little more, less the larger B H^2, and not bound by the L2
    cache; on tensor cores (the half types, float32 on TF32) fewer the
    larger B x H, and no more than the L2 cache holds the weights of (3H x
    2H each)."""
    steps, l2 = {"family": "steps"}, 50 * 2**20
    at_once = _schedule.layers_at_once
    assert at_once(steps, 3, 16, 1024, torch.float32, None, l2) == 1  # eager
    assert at_once(steps, 3, 16, 1024, torch.float64, None, l2, tf32=True) == 1
    assert at_once(steps, 3, 16, 1024, torch.float64, None, l2, captured=True) == 1
    most = 1 + _schedule.FFMA_OVERLAP
    for B, H in [(256, 256), (1024, 128), (16, 2048), (1, 2048), (64, 256)]:  # B H^2 <= 2^26
        assert at_once(steps, 3, B, H, torch.float32, None, l2, captured=True) == most, (B, H)
    larger = [at_once(steps, 3, B, H, torch.float32, None, l2, captured=True)
              for B, H in [(64, 2048), (256, 1024), (256, 2048), (1024, 2048)]]
    assert most > larger[0] == larger[1] > larger[2] > larger[3] > 1
    assert at_once(steps, 2, 1, 64, torch.float32, None, l2, captured=True) == most  # <= L
    assert at_once(steps, 3, 256, 256, torch.float32, None, l2, tf32=True) == \
        at_once(steps, 3, 256, 256, torch.bfloat16, None, l2) == pytest.approx(3 * 0.5 ** 0.3)
    assert at_once(steps, 3, 16, 1024, torch.float32, None, l2, tf32=True) == \
        pytest.approx(l2 / (6 * 1024**2 * 4))  # 25 MB of float32 W_h a layer
    assert at_once(steps, 3, 16, 256, torch.bfloat16, None, l2) == 3
    assert 1.5 < at_once(steps, 3, 128, 2048, torch.bfloat16, None, 0) < 2  # 262144: 1.6
    assert at_once(steps, 3, 16, 1024, torch.bfloat16, None, l2) == 3  # 12.6 MB a layer
    assert at_once(steps, 3, 1, 2048, torch.bfloat16, None, l2) < 1.1  # 50 MB a layer
    assert at_once(steps, 3, 1, 1536, torch.bfloat16, None, l2) == pytest.approx(l2 / (6 * 1536**2 * 2))
    grid = {"family": "grid"}
    assert at_once(grid, 3, 16, 256, torch.float32, 2, l2) == 2  # the library's count
    assert at_once(grid, 3, 64, 128, torch.float32, 1.75, l2) == 1.75
    assert at_once(grid, 3, 16, 256, torch.float32, 5, l2) == 3  # at most L
    assert at_once(grid, 3, 16, 256, torch.float32, 0, l2) == 1  # at least 1


def test_resident_layers():
    """Layers held at once from the library's residency (per direction:
    parts resident at once, parts a call): the direction that holds fewer;
    a fraction of a layer where parts start as they fit; None for the
    per-step family (no parts) or without an answer."""
    assert _schedule.resident_layers(((7, 4), (14, 4))) == 1.75
    assert _schedule.resident_layers(((4, 1), (4, 1))) == 4  # whole grids
    assert _schedule.resident_layers(((264, 256), (264, 256))) == pytest.approx(1.03125)
    assert _schedule.resident_layers(((0, 0), (0, 0))) is None
    assert _schedule.resident_layers(None) is None


def test_eager_host_time_of_the_per_step_family():
    """In eager mode the per-step family's host time a step counts, chunked or
    not: where the host is the bound, more chunks only add calls."""
    T, L = 100, 3
    # the GPU's time below the host's: one call a layer
    assert _schedule.best_chunks(L, T, 110, 20, 3, host_us=200, host_step_us=40) == 1
    # without the host's time a step, chunks look like a gain
    assert _schedule.best_chunks(L, T, 110, 20, 3, host_us=200) > 1
    # the host's share: L (C calls + T steps)
    assert _schedule.predicted_time(4, L, T, 0, 0, 3, 200, 40) == L * (4 * 200 + T * 40)
    assert _schedule.predicted_time(1, L, T, 0, 0, 3, 200, 40) == L * (200 + T * 40)


def test_choice_from_the_cost_model(monkeypatch):
    """_choose's glue on a fake device: the time per step from the cost model
    at T and T/2, the layers at once from the library's count of the plan's
    launches resident together (B16/H256 float32 on an H100: a grid of 32
    blocks, 4 of which fit, 971 us of steps: C4 captured, C3 eager with the
    host's time per call; a grid of which one fits at a time: 1; the
    per-step family in float32: 1, on TF32 as in the half types). Clusters
    and blocks start as they fit: 7 clusters of a layer's 4 hold a layer and
    three quarters (B64/H128 on an H100, 346 us of steps a layer: 3 chunks
    measured 0.89x - 0.91x of a call a layer), in CUDA graphs (eager calls:
    whole layers); 264 blocks of a layer's 256 little more than one. The
    per-step family in float32 a little more than one layer in CUDA graphs,
    one in eager calls. The same plan whether planned for the whole device
    or shared: no sharing."""
    grid = {"family": "grid", "forward": {"blocks": 32, "groups": 1},
            "backward": {"blocks": 32, "groups": 1}}
    family = {"plan": grid, "step_us": 9.71}
    resident = {"parts": ((4, 1), (4, 1))}

    def cost(dtype, T, B, I, H, device=None):  # noqa: E741
        return family["plan"], 69 + family["step_us"] * T

    def residency(dtype, T, B, I, H, device=None):  # noqa: E741
        return resident["parts"]
    monkeypatch.setattr(overrides, "sequence_cost_in_force", cost)
    monkeypatch.setattr(overrides, "sequence_residency_in_force", residency)
    monkeypatch.setattr(torch.cuda, "get_device_properties", h100_properties)
    assert _schedule._choose(100, 16, 256, 3, torch.float32, 0, True) == (4, 1)
    assert _schedule._choose(100, 16, 256, 3, torch.float32, 0, False) == (3, 1)
    resident["parts"] = ((1, 1), (1, 1))
    assert _schedule._choose(100, 16, 256, 3, torch.float32, 0, True) == (1, 1)
    family["plan"], family["step_us"] = {"family": "cluster"}, 3.46
    resident["parts"] = ((7, 4), (7, 4))
    assert _schedule._choose(100, 64, 128, 3, torch.bfloat16, 0, True) == (3, 1)
    # eager: whole layers only (the host issues every chunk call)
    assert _schedule._choose(100, 64, 128, 3, torch.bfloat16, 0, False) == (1, 1)
    resident["parts"] = ((14, 4), (7, 4))  # the direction that holds fewer
    assert _schedule._choose(100, 64, 128, 3, torch.bfloat16, 0, True) == (3, 1)
    family["plan"] = {"family": "block"}
    resident["parts"] = ((264, 256), (264, 256))
    assert _schedule._choose(100, 256, 64, 3, torch.float32, 0, True) == (1, 1)
    family["step_us"] = 9.71
    resident["parts"] = ((4, 1), (4, 1))
    family["plan"] = {"family": "steps"}
    # 1.25 layers at once: C2 takes 2 x 3/1.25 chunk times of 110 + 971/2 us,
    # 88% of 3 x (110 + 971)
    assert _schedule._choose(100, 16, 256, 3, torch.float32, 0, True) == (2, 1)
    assert _schedule._choose(100, 16, 256, 3, torch.float32, 0, False) == (1, 1)
    assert _schedule._choose(100, 16, 256, 3, torch.float64, 0, True) == (1, 1)
    chunks, sharing = _schedule._choose(100, 64, 512, 3, torch.bfloat16, 0, True)
    assert chunks > 1 and sharing == 1
    # float32's per-step products on TF32 tensor cores overlap as the half
    # types' do, in CUDA graphs; eager calls keep them a layer at a time
    assert _schedule._choose(100, 64, 512, 3, torch.float32, 0, True, tf32=True) == \
        (chunks, sharing)
    assert _schedule._choose(100, 64, 512, 3, torch.float32, 0, False, tf32=True) == \
        _schedule._choose(100, 64, 512, 3, torch.float32, 0, False) == (1, 1)
    monkeypatch.setattr(overrides, "sequence_cost_in_force", lambda *a, **k: None)
    assert _schedule._choose(100, 16, 256, 3, torch.float32, 0, True) == (1, 1)  # no library


def test_choice_of_plans_for_a_shared_device(monkeypatch):
    """Where a layer's plan fills the device (one layer at once) and, planned
    for two layers at once (_sharing.sharing_device(2)), it becomes the
    per-step family, the chunks are planned so if that is predicted to gain
    at least a tenth over the layers one after the other, under CUDA-graph
    capture; not in eager mode, not where those plans are too slow, nor where
    the shared plan is a persistent one, unless it is the grid with its
    products on tensor cores (float32: its TF32 build)."""
    whole = {"family": "grid", "forward": {"blocks": 128, "groups": 1},
             "backward": {"blocks": 128, "groups": 1}}
    shared = {"plan": {"family": "steps"}}
    step_us = {1: 10.0, 2: 11.0}  # a step of the shared plan: slower

    def cost(dtype, T, B, I, H, device=None):  # noqa: E741
        layers = _sharing.concurrent_layers()
        return (whole if layers == 1 else shared["plan"]), 69 + step_us[layers] * T

    def residency(dtype, T, B, I, H, device=None):  # noqa: E741
        return ((1, 1),) * 2 if _sharing.concurrent_layers() == 1 else ((2, 1),) * 2
    monkeypatch.setattr(overrides, "sequence_cost_in_force", cost)
    monkeypatch.setattr(overrides, "sequence_residency_in_force", residency)
    monkeypatch.setattr(torch.cuda, "get_device_properties", h100_properties)
    B, H = 64, 256
    chunks, sharing = _schedule._choose(100, B, H, 3, torch.bfloat16, 0, True)
    assert chunks > 1 and sharing == 2
    # what it predicts: at most 90% of the three layers in turn
    at_once = _schedule.layers_at_once(shared["plan"], 3, B, H, torch.bfloat16, 3)
    plain = _schedule.predicted_time(1, 3, 100, _schedule.CALL_US["grid"], 10.0, 1)
    assert _schedule.predicted_time(chunks, 3, 100, _schedule.CALL_US["steps"], 11.0, at_once) \
        <= _schedule.GAIN * plain
    assert _sharing.concurrent_layers() == 1  # restored
    # what it weighs, as model_inputs gives it: both sharings under capture
    weighed = _schedule.model_inputs(100, B, H, 3, torch.bfloat16, 0, True)
    assert {s: family for s, (family, _) in weighed.items()} == {1: "grid", 2: "steps"}
    assert weighed[2][1]["concurrent"] == at_once and weighed[1][1]["whole_launches"]
    assert _schedule.predicted_time(chunks, 3, 100, **weighed[2][1]) <= _schedule.GAIN * \
        _schedule.predicted_time(1, 3, 100, **weighed[1][1])
    assert set(_schedule.model_inputs(100, B, H, 3, torch.bfloat16, 0, False)) == {1}  # eager
    assert set(_schedule.model_inputs(100, B, H, 3, torch.float32, 0, True)) == {1}  # FFMA
    # eager: the per-step family's launches cost host time a step
    assert _schedule._choose(100, B, H, 3, torch.bfloat16, 0, False)[1] == 1
    # the shared plan's products on FFMA (float32's per-step family): not
    # taken, even where its steps are predicted faster than the whole device's
    assert _schedule._choose(100, B, H, 3, torch.float32, 0, True) == (1, 1)
    step_us[2] = 8.0
    assert _schedule._choose(100, B, H, 3, torch.float32, 0, True) == (1, 1)
    step_us[2] = 11.0
    assert _schedule._choose(100, B, H, 3, torch.float32, 0, True, tf32=True) == \
        (chunks, sharing)  # on TF32: as the half types
    step_us[2] = 25.0  # the shared plan at 2.5x the step: no gain
    assert _schedule._choose(100, B, H, 3, torch.bfloat16, 0, True) == (1, 1)
    step_us[2] = 11.0  # a persistent plan halved: not taken, its products on FFMA
    tensor_cores = []
    monkeypatch.setattr(overrides, "grid_tensor_cores",
                        lambda dtype, device=None: dtype in tensor_cores)
    shared["plan"] = {"family": "grid", "forward": {"blocks": 64, "groups": 1},
                      "backward": {"blocks": 64, "groups": 1}}
    assert _schedule._choose(100, B, H, 3, torch.bfloat16, 0, True) == (1, 1)
    # the grid's products on tensor cores: taken where it gains, as the per-step family
    tensor_cores.append(torch.bfloat16)
    chunks, sharing = _schedule._choose(100, B, H, 3, torch.bfloat16, 0, True)
    assert chunks > 1 and sharing == 2
    step_us[2] = 25.0
    assert _schedule._choose(100, B, H, 3, torch.bfloat16, 0, True) == (1, 1)
    # float32 where TF32 is allowed: the shared grid's TF32 build, not its FFMA one
    step_us[2] = 11.0
    tensor_cores.append(torch.float32)
    shared["plan"] = {"family": "grid", "forward": {"blocks": 64, "groups": 1, "tf32": True},
                      "backward": {"blocks": 64, "groups": 1, "tf32": True}}
    chunks, sharing = _schedule._choose(100, B, H, 3, torch.float32, 0, True, tf32=True)
    assert chunks > 1 and sharing == 2
    shared["plan"] = {"family": "grid", "forward": {"blocks": 64, "groups": 1, "tf32": False},
                      "backward": {"blocks": 64, "groups": 1, "tf32": False}}
    assert _schedule._choose(100, B, H, 3, torch.float32, 0, True, tf32=True) == (1, 1)
    shared["plan"] = {"family": "cluster", "forward": {"blocks": 16, "groups": 2},
                      "backward": {"blocks": 16, "groups": 2}}
    step_us[2] = 11.0  # other persistent families: not taken
    assert _schedule._choose(100, B, H, 3, torch.bfloat16, 0, True) == (1, 1)


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
