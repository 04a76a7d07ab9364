"""Stacked lltm.LLTM layers pipelined over time chunks on CUDA
(lltm/_wavefront.py: one stream per layer, events between them): the same
results as the layers run one after the other, in eager mode, on a
non-default stream and under CUDA-graph capture (forward and backward
replayed), and the automatic chunk count's bounds. Skipped without a GPU."""
import warnings

import pytest
import torch

import lltm
from lltm import _native, _schedule
from lltm.bench.timing import capture_graph
from conftest import assert_close

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or not _native.has_cuda_kernels(),
    reason="needs a CUDA GPU and the CUDA kernels (liblltm_cuda.so)")

# (T, B, I, H, L): a cluster plan (H <= 128), grid plans (H 256, 512), odd sizes,
# the per-step family (H 1100)
SHAPES = [(20, 3, 7, 33, 3), (31, 16, 128, 256, 3), (17, 5, 9, 128, 2), (24, 64, 256, 512, 3),
          (9, 2, 5, 1100, 2), (40, 1, 64, 64, 4)]
TOL = {torch.float64: 1e-10, torch.float32: 1e-4, torch.bfloat16: 4e-2}


def model(I, H, L, dtype, **kwargs):
    torch.manual_seed(torch.randint(2**31 - 1, ()).item())
    return lltm.LLTM(I, H, num_layers=L, device="cuda", dtype=dtype, **kwargs)


def inputs(T, B, I, H, L, dtype):
    def rand(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.float64).to(dtype).requires_grad_()
    return rand(T, B, I), rand(L, B, H), rand(L, B, H)


def captured(body, stream):
    """(graph, body's result) captured on ``stream``; a failed capture is
    undone (lltm.bench.timing.capture_graph), so it spoils no later test."""
    result = []
    graph = capture_graph(lambda: result.append(body()), stream, torch.device("cuda"))
    return graph, result[0]


def run(m, x, h0, c0, chunks, grad_out=None):
    """(output, h_n, c_n, every gradient) with ``chunks`` time chunks."""
    with lltm.overrides.wavefront(chunks):
        out, (h, c) = m(x, (h0, c0))
    grad_out = grad_out if grad_out is not None else [torch.randn_like(t) for t in (out, h, c)]
    leaves = [x, h0, c0, *m.parameters()]
    return (out, h, c, *torch.autograd.grad((out, h, c), leaves, grad_out)), grad_out


def check_same(got, want, dtype, what):
    names = ["output", "h_n", "c_n", "d_input", "d_h0", "d_c0"]
    for k, (a, b) in enumerate(zip(got, want)):
        name = names[k] if k < len(names) else f"d_param{k - len(names)}"
        assert_close(f"{what} {name}", a, b.double(), dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
def test_streams_match_layer_by_layer(shape, dtype):
    T, B, I, H, L = shape
    m = model(I, H, L, dtype)
    x, h0, c0 = inputs(T, B, I, H, L, dtype)
    want, grad_out = run(m, x, h0, c0, 1)
    for chunks in (2, L + 1, 7):
        got, _ = run(m, x, h0, c0, chunks, grad_out)
        check_same(got, want, dtype, f"chunks={chunks}")
    got, _ = run(m, x, h0, c0, None, grad_out)  # the automatic choice
    check_same(got, want, dtype, "automatic")


def test_on_a_user_stream_and_without_grad():
    T, B, I, H, L = 33, 16, 64, 256, 3
    m = model(I, H, L, torch.float32)
    x, h0, c0 = inputs(T, B, I, H, L, torch.float32)
    want, grad_out = run(m, x, h0, c0, 1)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        got, _ = run(m, x, h0, c0, 4, grad_out)
        with torch.no_grad(), lltm.overrides.wavefront(5):
            out, (h, c) = m(x, (h0, c0))
    torch.cuda.current_stream().wait_stream(stream)
    check_same(got, want, torch.float32, "user stream")
    check_same((out, h, c), want[:3], torch.float32, "no_grad")


@pytest.mark.parametrize("chunks", [1, 4, None])
def test_graph_capture_forward_and_backward(chunks):
    """The whole step captured (fork and join of the layers' streams inside
    the capture), replayed on new data: the eager results."""
    T, B, I, H, L = 30, 16, 64, 256, 3
    m = model(I, H, L, torch.float32)
    static = [t.detach().clone().requires_grad_() for t in inputs(T, B, I, H, L,
                                                                  torch.float32)]
    grad_out = torch.randn(T, B, H, device="cuda")
    leaves = [*static, *m.parameters()]

    def step():
        with lltm.overrides.wavefront(chunks):
            out, _ = m(static[0], (static[1], static[2]))
        return (out, *torch.autograd.grad(out, leaves, grad_out))

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up on the capture stream
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph, results = captured(step, stream)
    for _ in range(2):
        new = inputs(T, B, I, H, L, torch.float32)
        with torch.no_grad():
            for s, n in zip(static, new):
                s.copy_(n)
        graph.replay()
        torch.cuda.synchronize()
        want = step()
        for k, (a, b) in enumerate(zip(results, want)):
            assert_close(f"replay result {k}", a, b.double(), torch.float32)


def test_dropout_between_layers_under_capture():
    T, B, I, H, L = 24, 8, 32, 128, 3
    m = model(I, H, L, torch.float32, dropout=0.5)
    x = torch.randn(T, B, I, device="cuda", requires_grad=True)
    m.eval()
    with torch.no_grad():  # no graph whose AccumulateGrad nodes outlive this on the legacy stream
        with lltm.overrides.wavefront(1):
            want, _ = m(x)
        with lltm.overrides.wavefront(4):
            got, _ = m(x)
    assert_close("eval output", got, want.double(), torch.float32)
    m.train()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())

    def step():
        with lltm.overrides.wavefront(4):
            out, _ = m(x)
        return out, torch.autograd.grad(out.square().sum(), [x, *m.parameters()])
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph, (out, grads) = captured(step, stream)
    graph.replay()
    first = out.clone()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads)
    assert not torch.equal(first, out)  # a new dropout mask each replay
    assert not torch.allclose(out, want)  # dropout applied in training


def test_automatic_choice_bounds():
    dev = torch.device("cuda")
    for T, B, H, L in [(100, 16, 256, 3), (100, 1, 64, 2), (100, 1024, 2048, 3),
                       (12, 16, 256, 3), (1000, 64, 512, 4)]:
        c, sharing = _schedule.automatic_schedule(T, B, H // 2, H, L, torch.float32, dev)
        assert 1 <= c and (c == 1 or T // c >= 8), (T, B, H, L, c)  # no chunk under 8 steps
        assert sharing in (1, 2) and (c > 1 or sharing == 1), (T, B, H, L, c, sharing)
    assert _schedule.automatic_schedule(100, 16, 128, 256, 1, torch.float32, dev) == (1, 1)


def test_wavefront_in_force_follows_the_capture():
    """The rule as a call sees it: one call a layer eagerly; under capture,
    the per-step family's layers in 4 chunks, none shorter than 8 steps."""
    with lltm.overrides.sequence_plan(family="steps"):
        assert lltm.overrides.wavefront_in_force(torch.float32, 100, 16, 256) == (1, 1)
        graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        with torch.cuda.graph(graph, stream=stream):
            got = [lltm.overrides.wavefront_in_force(torch.float32, T, 16, 256)
                   for T in (100, 20, 12)]
    assert got == [(4, 1), (2, 1), (1, 1)]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_variable_lengths_in_chunks(dtype):
    """Rows ending inside chunks and before later chunks start, padded and
    packed, eager and captured: as one call a layer."""
    T, B, I, H, L = 40, 16, 32, 256, 3
    m = model(I, H, L, dtype)
    x, h0, c0 = inputs(T, B, I, H, L, dtype)
    lengths = [40, 1, 9, 10, 11, 25, 39, 2, 40, 17, 5, 30, 33, 20, 8, 3]

    packed_x = torch.nn.utils.rnn.pack_padded_sequence(x.detach(), lengths, enforce_sorted=False)

    def step(chunks):  # the packing (host to device copies) outside: capturable
        with lltm.overrides.wavefront(chunks):
            out, (h, c) = m(x, (h0, c0), lengths=lengths)
            packed, (hp, cp) = m(packed_x, (h0, c0))
        loss = (out * grad_out).sum() + h.sum() + c.square().sum() + packed.data.sum()
        results = (out, h, c, packed.data, hp, cp,
                   *torch.autograd.grad(loss, [x, h0, c0, *m.parameters()]))
        # detached: no graph (and its AccumulateGrad nodes) outlives an eager call
        return tuple(t.detach() for t in results)
    grad_out = torch.randn(T, B, H, device="cuda", dtype=dtype)
    want = step(1)
    for chunks in (4, 7):
        got = step(chunks)
        for k, (a, b) in enumerate(zip(got, want)):
            assert_close(f"chunks={chunks} result {k}", a, b.double(), dtype)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step(4)
    torch.cuda.current_stream().wait_stream(stream)
    graph, results = captured(lambda: step(4), stream)
    graph.replay()
    torch.cuda.synchronize()
    for k, (a, b) in enumerate(zip(results, want)):
        assert_close(f"replayed result {k}", a, b.double(), dtype)


def test_schedule_for_the_stream_as_it_is():
    """The automatic schedule is the one for a call on the current stream as
    it is, eager or captured, and each is kept apart: asking eagerly first
    (eager plans, host time counted, no shared plans) must not answer a
    captured call later (three bfloat16 layers at B64/H256: the library's
    eager plan of a layer there is a grid kernel, its captured one may share
    the device)."""
    dev = torch.device("cuda")
    args = (100, 64, 128, 256, 3, torch.bfloat16, dev)

    def under_capture():
        graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the graph is empty
            with torch.cuda.graph(graph, stream=stream):
                return _schedule.automatic_schedule(*args)

    _schedule._chunks.cache_clear()
    eager = _schedule.automatic_schedule(*args)
    captured = under_capture()
    _schedule._chunks.cache_clear()
    assert captured == under_capture() and eager == _schedule.automatic_schedule(*args)
    assert eager[1] == 1, eager  # plans shared by two layers only in CUDA graphs
