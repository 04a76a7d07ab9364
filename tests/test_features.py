"""PyTorch features over the cell and the sequence op that no other file
covers: torch.compile's modes, activation checkpointing, deterministic
algorithms, DDP and FSDP2 (fully_shard); each against eager / one process."""
import datetime
import os
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import lltm

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import multi_gpu  # noqa: E402  (the process starter)

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]
KINDS = ["cell", "sequence"]


class Net(torch.nn.Module):
    """LLTMCell stepped over time, or a two-layer LLTM, then a Linear."""

    def __init__(self, kind, device=None, dtype=None):
        super().__init__()
        self.kind = kind
        self.rnn = (lltm.LLTMCell(8, 16, device=device, dtype=dtype) if kind == "cell" else
                    lltm.LLTM(8, 16, num_layers=2, batch_first=True, device=device, dtype=dtype))
        self.head = torch.nn.Linear(16, 10, device=device, dtype=dtype)

    def forward(self, x):  # x [B, T, 8]
        if self.kind == "cell":
            state = None
            for x_t in x.unbind(1):
                state = self.rnn(x_t, state)
            return self.head(state[0])
        _out, (h_n, _c_n) = self.rnn(x)
        return self.head(h_n[-1])


def batch(device, dtype=torch.float32, B=16):
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(B, 5, 8, generator=g, dtype=dtype)
    y = torch.randint(0, 10, (B,), generator=g)
    return x.to(device), y.to(device)


def grads_of(model, x, y):
    model.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    return loss.detach(), {n.replace("_orig_mod.", ""): p.grad.clone()
                           for n, p in model.named_parameters()}


def assert_same(a, b, **tol):
    loss_a, grads_a = a
    loss_b, grads_b = b
    torch.testing.assert_close(loss_a, loss_b, **tol)
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], msg=name, **tol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_torch_compile_modes(device, kind, mode):
    """torch.compile(fullgraph=True) in both modes (reduce-overhead records CUDA
    graphs on a GPU after warm-up runs), forward and backward against eager."""
    torch._dynamo.reset()
    model = Net(kind, device, torch.float64)
    compiled = torch.compile(model, mode=mode, fullgraph=True)
    for step in range(3):
        x, y = batch(device, torch.float64, B=6 + step % 2)  # a second shape too
        assert_same(grads_of(compiled, x, y), grads_of(model, x, y))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("use_reentrant", [False, True])
def test_activation_checkpointing(device, kind, use_reentrant):
    """torch.utils.checkpoint around the recurrent layer: the forward runs again
    in backward; gradients equal the plain run's exactly."""
    from torch.utils.checkpoint import checkpoint
    model = Net(kind, device, torch.float64)
    x, y = batch(device, torch.float64)
    x.requires_grad_(use_reentrant)  # the reentrant variant needs an input that requires grad
    plain = grads_of(model, x, y)
    forward = model.forward
    calls = []

    def checkpointed(x):
        calls.append(1)
        return checkpoint(forward, x, use_reentrant=use_reentrant)

    model.forward = checkpointed
    try:
        got = grads_of(model, x, y)
    finally:
        del model.forward
    assert calls
    assert_same(got, plain, rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", KINDS)
def test_deterministic_algorithms(device, kind):
    """Under torch.use_deterministic_algorithms(True) the ops run (no
    nondeterminism alert) and two runs agree bit for bit."""
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        model = Net(kind, device)
        x, y = batch(device)
        first, second = grads_of(model, x, y), grads_of(model, x, y)
    finally:
        torch.use_deterministic_algorithms(before)
    assert_same(first, second, rtol=0, atol=0)


# --- data parallel: DDP and FSDP2, 2 processes --------------------------------------

WORLD = 2
TIMEOUT_S = 240
BACKENDS = [pytest.param("gloo", id="gloo-cpu"),
            pytest.param("nccl", id="nccl-cuda", marks=pytest.mark.skipif(
                torch.cuda.device_count() < 2, reason="NCCL needs 2 GPUs"))]
WRAPPERS = ["ddp", "fsdp2"]


def _device(backend, rank=0):
    return torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")


def _wrap(wrapper, model, device):
    if wrapper == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh(device.type, (WORLD,))
    fully_shard(model.rnn, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _full(grad):
    return grad.full_tensor() if hasattr(grad, "full_tensor") else grad


def _worker(rank, port, backend, out_dir):
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # loopback only
    os.environ["NCCL_NVLS_ENABLE"] = "0"  # no NVLink multicast on shared machines
    torch.set_num_threads(1)
    device = _device(backend, rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD, timeout=datetime.timedelta(seconds=60))
    try:
        x, y = batch(device)
        share = x.shape[0] // WORLD
        x, y = x[rank * share:(rank + 1) * share], y[rank * share:(rank + 1) * share]
        for wrapper in WRAPPERS:
            for kind in KINDS:
                torch.manual_seed(0)
                model = _wrap(wrapper, Net(kind, device), device)
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                grads = {n.replace("module.", ""): _full(p.grad).detach().cpu()
                         for n, p in model.named_parameters()}
                torch.save(grads, os.path.join(out_dir, f"{wrapper}-{kind}-rank{rank}.pt"))
                del model
        multi_gpu.settle()
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module", params=BACKENDS)
def distributed_grads(request, tmp_path_factory):
    """Runs every wrapper and kind in one pair of processes."""
    backend = request.param
    out_dir = tmp_path_factory.mktemp(backend)
    try:
        multi_gpu.start(_worker, (multi_gpu.free_port(), backend, str(out_dir)), WORLD,
                        TIMEOUT_S)
    except TimeoutError as e:
        pytest.fail(str(e))
    return backend, out_dir


@pytest.mark.parametrize("wrapper", WRAPPERS)
@pytest.mark.parametrize("kind", KINDS)
def test_data_parallel_gradients_equal_one_process(distributed_grads, wrapper, kind):
    """DDP and FSDP2 (fully_shard) over 2 processes: every rank's gradients
    equal one process's over the union batch."""
    backend, out_dir = distributed_grads
    device = _device(backend)
    torch.manual_seed(0)
    model = Net(kind, device)
    _, single = grads_of(model, *batch(device))
    for rank in range(WORLD):
        got = torch.load(out_dir / f"{wrapper}-{kind}-rank{rank}.pt", weights_only=True)
        assert got.keys() == single.keys()
        for name, g in got.items():
            torch.testing.assert_close(g, single[name].cpu(), rtol=1e-5, atol=1e-6, msg=name)
