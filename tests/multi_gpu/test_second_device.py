"""Every op and module of lltm on cuda:1 while cuda:0 is the current device:
results on cuda:1 equal to the CPU's in float64 (within the dtype's
tolerance), nothing allocated on cuda:0, the current device left at 0; the
ops run on cuda:1's current stream (side streams), under CUDA graph capture
and replay on cuda:1, and under torch.compile; tensors on two GPUs in one call
are an error. (tests/test_cuda_cell.py and tests/test_cuda_sequence.py check
the ops alone on cuda:1 in float32.) Skipped with fewer than 2 GPUs."""
import contextlib

import pytest
import torch

import lltm
from lltm import _native
from conftest import cell_inputs

pytestmark = pytest.mark.skipif(
    torch.cuda.device_count() < 2 or not _native.has_cuda_kernels(),
    reason="needs 2 CUDA GPUs and the CUDA kernels (liblltm_cuda.so)")

DEV = torch.device("cuda", 1)
TOL = {torch.float64: 1e-10, torch.float32: 1e-4, torch.bfloat16: 4e-2}


def assert_near(name, got, want64, dtype):
    """got (on cuda:1, in dtype) against the CPU float64 result: relative
    tolerance per element plus an absolute one scaled by max|want|."""
    assert got.device == DEV and got.dtype == dtype, (name, got.device, got.dtype)
    tol = TOL[dtype]
    scale = max(1.0, want64.abs().max().item())
    torch.testing.assert_close(got.cpu().double(), want64, rtol=tol, atol=tol * scale,
                               msg=lambda m: f"{name} ({dtype}): {m}")


@contextlib.contextmanager
def on_cuda0_only_cuda1_used():
    """Current device 0 throughout; no memory taken from cuda:0's allocator."""
    with torch.cuda.device(0):
        torch.cuda.synchronize(0)
        before = torch.cuda.memory_allocated(0)
        yield
        assert torch.cuda.current_device() == 0
        torch.cuda.synchronize(1)
        assert torch.cuda.memory_allocated(0) == before, "memory allocated on cuda:0"


def _modules(dtype, impl):
    cpu = torch.nn.ModuleDict({
        "cell": lltm.LLTMCell(7, 33, impl=impl),
        "seq": lltm.LLTM(7, 33, 2, batch_first=True, impl=impl)}).double()
    gpu = torch.nn.ModuleDict({
        "cell": lltm.LLTMCell(7, 33, impl=cpu["cell"].impl, device=DEV, dtype=dtype),
        "seq": lltm.LLTM(7, 33, 2, batch_first=True, impl=impl, device=DEV, dtype=dtype)})
    with torch.no_grad():  # the CPU copy holds exactly the (rounded) weights of the GPU one
        for p, q in zip(gpu.parameters(), cpu.parameters()):
            q.copy_(p.double().cpu())
    return cpu, gpu


def _loss(modules, x, state):
    h, c = modules["cell"](x[:, 0], state)
    out, (h_n, c_n) = modules["seq"](x)
    return (h * c).sum() + (out * out).sum() + (h_n * c_n).sum()


@pytest.mark.parametrize("impl", ["native"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_modules_on_second_device(dtype, impl):
    cpu, gpu = _modules(dtype, impl)
    x64 = torch.randn(5, 4, 7, dtype=torch.float64)
    state64 = (torch.randn(5, 33, dtype=torch.float64), torch.randn(5, 33, dtype=torch.float64))
    with on_cuda0_only_cuda1_used():
        x = x64.to(DEV, dtype).requires_grad_()
        state = tuple(s.to(DEV, dtype).requires_grad_() for s in state64)
        loss = _loss(gpu, x, state)
        loss.backward()
    x_ref = x.detach().cpu().double().requires_grad_()
    state_ref = tuple(s.detach().cpu().double().requires_grad_() for s in state)
    loss_ref = _loss(cpu, x_ref, state_ref)
    loss_ref.backward()
    assert_near("loss", loss.detach(), loss_ref.detach(), dtype)
    for (name, p), q in zip(gpu.named_parameters(), cpu.parameters()):
        assert_near(f"grad {name}", p.grad, q.grad, dtype)
    for name, a, r in (("input", x, x_ref), ("h0", state[0], state_ref[0]),
                       ("c0", state[1], state_ref[1])):
        assert_near(f"grad {name}", a.grad, r.grad, dtype)


def _step_ops(args):
    """Forward and backward of the cell and sequence ops, upstream gradients 1."""
    x_seq, W, b, h, c = args
    new_h, new_cell, gates = torch.ops.lltm.cell_forward(x_seq[0], W, b, h, c)
    cell_grads = torch.ops.lltm.cell_backward(torch.ones_like(new_h), torch.ones_like(new_cell),
                                              new_cell, gates, x_seq[0], h, W)
    out, h_n, c_n, cells, seq_gates = torch.ops.lltm.sequence_forward(x_seq, W, b, h, c)
    seq_grads = torch.ops.lltm.sequence_backward(torch.ones_like(out), torch.ones_like(h_n),
                                                 torch.ones_like(c_n), x_seq, W, h, out, cells,
                                                 seq_gates)
    return [new_h, new_cell, *cell_grads, out, h_n, c_n, *seq_grads]


def _op_inputs(device):
    x, W, b, h, c = cell_inputs(6, 24, 40, torch.float32, device=device)
    x_seq = torch.randn(5, 6, 24, device=device)
    x_seq[0] = x
    return [x_seq, W, b, h, c]


def test_side_stream_on_second_device():
    """cuda:1's current stream is a side stream whose inputs arrive behind a
    long sleep, while cuda:0 is the current device: the ops must wait for
    them on that stream (results equal a plain run's)."""
    fresh = _op_inputs(DEV)
    want = _step_ops(fresh)
    side = torch.cuda.Stream(device=DEV)
    staged = [torch.full_like(a, float("nan")) for a in fresh]
    side.wait_stream(torch.cuda.current_stream(DEV))
    with torch.cuda.stream(side):  # current device 1, its current stream `side`
        torch.cuda._sleep(50_000_000)  # ~25 ms of GPU time before the copies
        for s, a in zip(staged, fresh):
            s.copy_(a)
        with torch.cuda.device(0):  # current device 0; cuda:1's current stream still `side`
            got = _step_ops(staged)
            assert torch.cuda.current_stream(DEV) == side
    side.synchronize()
    assert torch.cuda.current_device() == 0
    for g, w in zip(got, want):
        assert g.device == DEV
        torch.testing.assert_close(g, w)


def test_cuda_graph_on_second_device():
    """Capture the ops and a module's forward and backward on cuda:1; replay
    with fresh inputs (current device 0): results equal eager runs."""
    static = _op_inputs(DEV)
    seq = lltm.LLTM(24, 40, 2, device=DEV)
    side = torch.cuda.Stream(device=DEV)
    side.wait_stream(torch.cuda.current_stream(DEV))
    with torch.cuda.stream(side):  # warm up outside the capture
        for _ in range(2):
            _step_ops(static)
            seq.zero_grad(set_to_none=True)
            seq(static[0])[0].square().sum().backward()
    torch.cuda.current_stream(DEV).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    seq.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph, stream=torch.cuda.Stream(device=DEV)):  # capture on cuda:1
        captured = _step_ops(static)
        seq(static[0])[0].square().sum().backward()
    grads = [p.grad for p in seq.parameters()]
    for _ in range(2):
        fresh = _op_inputs(DEV)
        for s, f in zip(static, fresh):
            s.copy_(f)
        with torch.cuda.device(0):
            graph.replay()
        torch.cuda.synchronize(DEV)
        for g, w in zip(captured, _step_ops(fresh)):
            torch.testing.assert_close(g, w)
        want = torch.autograd.grad(seq(fresh[0])[0].square().sum(), list(seq.parameters()))
        for g, w in zip(grads, want):
            torch.testing.assert_close(g, w)


def test_torch_compile_on_second_device():
    torch._dynamo.reset()
    cpu, gpu = _modules(torch.float32, "native")
    x64 = torch.randn(3, 6, 7, dtype=torch.float64)
    with on_cuda0_only_cuda1_used():
        x = x64.to(DEV, torch.float32)
        loss = torch.compile(lambda x: _loss(gpu, x, None), fullgraph=True)(x)
        grads = torch.autograd.grad(loss, list(gpu.parameters()))
    loss_ref = _loss(cpu, x.cpu().double(), None)
    grads_ref = torch.autograd.grad(loss_ref, list(cpu.parameters()))
    assert_near("loss", loss.detach(), loss_ref.detach(), torch.float32)
    for g, r in zip(grads, grads_ref):
        assert_near("grad", g, r, torch.float32)


@pytest.mark.parametrize("which", range(5))
def test_tensors_on_two_gpus_rejected(which):
    args = _op_inputs(DEV)
    args[which] = args[which].to("cuda:0")
    with pytest.raises(RuntimeError, match="device"):
        torch.ops.lltm.sequence_forward(*args)
    cell_args = [args[0][0], *args[1:]]
    with pytest.raises(RuntimeError, match="device"):
        torch.ops.lltm.cell_forward(*cell_args)
