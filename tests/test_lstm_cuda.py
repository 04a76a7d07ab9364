"""lltm.LLTM's nn.LSTM conventions on CUDA (bidirectional, with the reverse
direction on a side stream; variable lengths), against the same module on
the CPU and the reference loop. Skipped without a GPU."""
import pytest
import torch

import lltm
from lltm import _native
from lstm_reference import reference_lltm

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or not _native.has_cuda_kernels(),
    reason="needs a CUDA GPU and the CUDA kernels (liblltm_cuda.so)")

F64 = torch.float64
TOL = dict(rtol=1e-10, atol=1e-12)


def pair(I, H, **kw):
    cpu = lltm.LLTM(I, H, dtype=F64, **kw)
    cuda = lltm.LLTM(I, H, dtype=F64, device="cuda", **kw)
    cuda.load_state_dict(cpu.state_dict())
    return cpu, cuda


def run_and_grads(m, x, hx, lengths=None):
    x = x.detach().requires_grad_()
    hx = tuple(t.detach().requires_grad_() for t in hx)
    out, (h_n, c_n) = m(x, hx, lengths=lengths)
    loss = (out * torch.linspace(-1, 1, out.shape[-1], dtype=F64, device=out.device)).sum() \
        + h_n.pow(2).sum() + c_n.sum()
    grads = torch.autograd.grad(loss, (x, *hx, *m.parameters()))
    return [out, h_n, c_n, *grads]


def assert_same(got, want):
    for g, w in zip(got, want):
        torch.testing.assert_close(g.cpu(), w, **TOL)


@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.parametrize("lengths", [None, [5, 7, 1, 3]])
def test_bidirectional_matches_cpu(num_layers, lengths):
    T, B, I, H = 7, 4, 5, 33
    cpu, cuda = pair(I, H, num_layers=num_layers, bidirectional=True)
    x = torch.randn(T, B, I, dtype=F64)
    hx = tuple(torch.randn(2 * num_layers, B, H, dtype=F64) for _ in range(2))
    want = run_and_grads(cpu, x, hx, lengths)
    got = run_and_grads(cuda, x.cuda(), tuple(t.cuda() for t in hx), lengths)
    assert_same(got, want)
    ref = reference_lltm(cpu, x, *hx, lengths=lengths)
    for g, w in zip(got[:3], ref):
        torch.testing.assert_close(g.cpu(), w, **TOL)


def test_concurrent_directions_after_work_on_a_user_stream():
    """Input produced on a non-default stream just before the call, results
    read there at once: the side stream must wait for it and be waited for."""
    T, B, I, H = 50, 8, 16, 64
    cpu, cuda = pair(I, H, num_layers=2, bidirectional=True)
    x = torch.randn(T, B, I, dtype=F64)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        xc = x.cuda(non_blocking=False) * 2.0
        torch.cuda._sleep(1_000_000)  # a late producer
        xc = xc + 0.0
        out, (h_n, c_n) = cuda(xc)
        out = out.clone()
    torch.cuda.current_stream().wait_stream(stream)
    want = cpu(x * 2.0)
    torch.testing.assert_close(out.cpu(), want[0], **TOL)
    torch.testing.assert_close(c_n.cpu(), want[1][1], **TOL)


@pytest.mark.parametrize("lengths", [None, [2, 6, 5]])
def test_cuda_graph_capture_of_both_directions(lengths):
    """Forward and backward captured into one CUDA graph (the reverse
    direction forks onto the side stream and joins back inside the capture,
    and autograd runs its backward there too); replays on new data give the
    eager results."""
    T, B, I, H = 6, 3, 4, 32
    m = lltm.LLTM(I, H, num_layers=2, bidirectional=True, device="cuda", dtype=F64)
    static_x = torch.randn(T, B, I, device="cuda", dtype=F64, requires_grad=True)
    h0 = torch.randn(4, B, H, device="cuda", dtype=F64, requires_grad=True)
    c0 = torch.randn(4, B, H, device="cuda", dtype=F64, requires_grad=True)
    g_out = torch.randn(T, B, 2 * H, device="cuda", dtype=F64)
    leaves = [static_x, h0, c0, *m.parameters()]

    def step():
        out, (h_n, c_n) = m(static_x, (h0, c0), lengths=lengths)
        grads = torch.autograd.grad((out, h_n, c_n), leaves,
                                    (g_out, torch.ones_like(h_n), torch.ones_like(c_n)))
        return (out, h_n, c_n, *grads)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up on a side stream, as torch.cuda.graphs asks
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    with torch.no_grad():
        static_x.copy_(torch.randn_like(static_x))
    graph.replay()
    want = step()
    for got, w in zip(captured, want):
        torch.testing.assert_close(got, w, **TOL)


@pytest.mark.parametrize("lengths", [None, [3, 6, 6]])
def test_compile_fullgraph_cuda(lengths):
    torch._dynamo.reset()
    T, B, I, H = 6, 3, 4, 32
    m = lltm.LLTM(I, H, num_layers=2, bidirectional=True, device="cuda")
    x = torch.randn(T, B, I, device="cuda")
    compiled = torch.compile(m, fullgraph=True)
    got, want = compiled(x, lengths=lengths), m(x, lengths=lengths)
    for a, b in zip((got[0], *got[1]), (want[0], *want[1])):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_packed_unsorted_matches_cpu():
    from torch.nn.utils.rnn import pack_padded_sequence
    T, B, I, H = 6, 4, 3, 17
    cpu, cuda = pair(I, H, num_layers=2, bidirectional=True)
    x = torch.randn(T, B, I, dtype=F64)
    lengths = [2, 6, 4, 6]
    hx = tuple(torch.randn(4, B, H, dtype=F64) for _ in range(2))
    p_cpu = pack_padded_sequence(x, lengths, enforce_sorted=False)
    p_cuda = pack_padded_sequence(x.cuda(), lengths, enforce_sorted=False)
    want = cpu(p_cpu, hx)
    got = cuda(p_cuda, tuple(t.cuda() for t in hx))
    torch.testing.assert_close(got[0].data.cpu(), want[0].data, **TOL)
    torch.testing.assert_close(got[1][0].cpu(), want[1][0], **TOL)
    torch.testing.assert_close(got[1][1].cpu(), want[1][1], **TOL)


def test_directions_plan_for_a_shared_device():
    """Inside sharing_device(2) (where lltm.LLTM runs both directions) the
    sequence plan leaves room for a second launch beside it: never more
    clusters or batch groups than alone; outside, the whole device again."""
    from lltm import _sharing
    f32 = torch.float32
    alone = lltm.overrides.sequence_plan_in_force(f32, 100, 16, 32, 128)
    with _sharing.sharing_device(2):
        shared = lltm.overrides.sequence_plan_in_force(f32, 100, 16, 32, 128)
        assert _sharing.concurrent_layers() == 2
    assert lltm.overrides.sequence_plan_in_force(f32, 100, 16, 32, 128) == alone
    if alone["family"] != "steps" and shared["family"] == alone["family"]:
        for d in ("forward", "backward"):
            assert shared[d]["groups"] <= alone[d]["groups"]


def test_both_directions_keep_the_plan_of_one_on_hopper():
    """On an H100-class GPU (compute capability 9.x, 132 SMs or more) the
    plan for two directions at float32 B16/H128 is the plan for one: the
    4-row reduce-scatter backward runs blocks of 128 threads, two to an SM,
    so both directions' eight clusters of 16 blocks fit at once (with
    256-thread blocks seven did, and the backward fell back to 8-row chunks:
    1.32x one direction's time instead of 1.28x)."""
    from lltm import _sharing
    props = torch.cuda.get_device_properties(0)
    if props.major != 9 or props.multi_processor_count < 132:
        pytest.skip(f"not an H100-class GPU ({props.name})")
    f32 = torch.float32
    alone = lltm.overrides.sequence_plan_in_force(f32, 100, 16, 32, 128)
    if alone["family"] != "cluster":
        pytest.skip("the library's code for this GPU has no cluster kernels")
    with _sharing.sharing_device(2):
        shared = lltm.overrides.sequence_plan_in_force(f32, 100, 16, 32, 128)
    assert alone["backward"]["chunk"] == 4 and alone["backward"]["groups"] == 4
    assert shared == alone


@pytest.mark.parametrize("lengths", [None, [5, 7, 2, 3]])
def test_per_operator_concurrent_path_matches_one_node(lengths):
    """The per-operator form (each direction's operator on its own stream,
    as it runs when the one-node form does not apply) gives the one-node
    results, forward and backward."""
    from lltm import _directions
    T, B, I, H = 7, 4, 5, 33
    _, m = pair(I, H, num_layers=2, bidirectional=True)
    x = torch.randn(T, B, I, dtype=F64, device="cuda")
    hx = tuple(torch.randn(4, B, H, dtype=F64, device="cuda") for _ in range(2))
    got = run_and_grads(m, x, hx, lengths)
    saved = _directions.fused
    _directions.fused = lambda x: False
    try:
        want = run_and_grads(m, x, hx, lengths)
    finally:
        _directions.fused = saved
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **TOL)
