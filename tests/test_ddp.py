"""DistributedDataParallel with 2 processes (gloo on CPU; NCCL with one GPU
per process where 2 GPUs exist; 127.0.0.1 only): one step's gradients equal a
single process's over the union batch, and the training example runs under
DDP; gradient accumulation under no_sync() and DDP under torch.compile
(scripts/multi_gpu.py's checks, gloo on CPU), and that script under torchrun."""
import datetime
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

pytest.importorskip("sklearn")
from lltm.examples import train  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import multi_gpu  # noqa: E402  (the checks, and a process starter)

WORLD = 2
UNION_BATCH = 16
TIMEOUT_S = 240


def _free_port() -> int:
    return multi_gpu.free_port()


def _run(fn, args):
    """WORLD processes of fn(rank, *args); fail (and kill them) past TIMEOUT_S."""
    try:
        multi_gpu.start(fn, args, WORLD, TIMEOUT_S)
    except TimeoutError as e:
        pytest.fail(str(e))


BACKENDS = [
    pytest.param("gloo", id="gloo-cpu"),
    pytest.param("nccl", id="nccl-cuda", marks=pytest.mark.skipif(
        torch.cuda.device_count() < 2, reason="NCCL needs 2 GPUs")),
]


def _device(backend, rank=0):
    return torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")


def _settings(kind, device):
    return train.build_parser().parse_args(["--device", device.type, "--hidden", "16",
                                            "--models", kind])


def _union_batch():
    data = train.load_digits()
    return data, data.x_train[:UNION_BATCH], data.y_train[:UNION_BATCH]


def _gradients(model, x, y):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    return {name: p.grad.clone() for name, p in train._unwrap(model).named_parameters()}


def _gradient_worker(rank, port, kind, backend, out_dir):
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # loopback only
    os.environ["NCCL_NVLS_ENABLE"] = "0"  # no NVLink multicast on shared machines
    torch.set_num_threads(1)
    device = _device(backend, rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD, timeout=datetime.timedelta(seconds=60))
    try:
        data, x, y = _union_batch()
        model = train.build_model(kind, data, _settings(kind, device), device)
        ddp_model = torch.nn.parallel.DistributedDataParallel(model)
        share = UNION_BATCH // WORLD
        grads = _gradients(ddp_model, x[rank * share:(rank + 1) * share].to(device),
                           y[rank * share:(rank + 1) * share].to(device))
        torch.save({k: g.cpu() for k, g in grads.items()},
                   os.path.join(out_dir, f"{kind}-rank{rank}.pt"))
        del ddp_model  # its reducer holds the group's pending work
        multi_gpu.settle()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["lltm", "lstm"])
def test_ddp_gradients_equal_single_process(kind, backend, tmp_path):
    _run(_gradient_worker, (_free_port(), kind, backend, str(tmp_path)))
    data, x, y = _union_batch()
    device = _device(backend)
    model = train.build_model(kind, data, _settings(kind, device), device)
    single = {k: g.cpu() for k, g in _gradients(model, x.to(device), y.to(device)).items()}
    for rank in range(WORLD):
        ddp = torch.load(tmp_path / f"{kind}-rank{rank}.pt", weights_only=True)
        assert ddp.keys() == single.keys()
        for name, grad in single.items():
            assert grad.abs().max() > 0, name  # a gradient that can fail the comparison
            torch.testing.assert_close(ddp[name], grad, rtol=1e-5, atol=1e-6,
                                       msg=lambda m: f"rank {rank} {name}: {m}")


def _example_worker(rank, port, out_dir):
    os.environ.update({"GLOO_SOCKET_IFNAME": "lo", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port), "RANK": str(rank), "LOCAL_RANK": str(rank),
                       "WORLD_SIZE": str(WORLD)})
    torch.set_num_threads(1)
    result = train.main(["--device", "cpu", "--epochs", "3", "--hidden", "16", "--plot", "",
                         "--no-progress", "--checkpoint", os.path.join(out_dir, "ddp.pt")])
    torch.save({"world_size": result["world_size"],
                "test_acc": {k: r["test_acc"] for k, r in result["models"].items()},
                "state": result["state"]}, os.path.join(out_dir, f"result-rank{rank}.pt"))


def test_example_trains_under_ddp(tmp_path):
    _run(_example_worker, (_free_port(), str(tmp_path)))
    results = [torch.load(tmp_path / f"result-rank{r}.pt", weights_only=True)
               for r in range(WORLD)]
    assert all(r["world_size"] == WORLD for r in results)
    for kind in ("lltm", "lstm"):
        assert results[0]["test_acc"][kind] > 0.5, results[0]["test_acc"]
        for name, value in results[0]["state"][kind].items():  # replicas stayed in step
            torch.testing.assert_close(results[1]["state"][kind][name], value)
    checkpoint = torch.load(tmp_path / "ddp.pt", weights_only=True)
    assert checkpoint["epoch"] == 3


def test_no_sync_accumulation_equals_single_process():
    """Micro-batches under no_sync() (gradients stay local: checked), the last
    one synchronised: gradients and parameters after 2 SGD steps equal one
    process over the whole batch. Model: Linear -> LLTM (2 layers) -> LLTMCell
    loop -> Linear."""
    multi_gpu.spawn(["no_sync"], timeout_s=TIMEOUT_S)


def test_ddp_of_a_bidirectional_lltm_over_packed_sequences():
    """DDP of a bidirectional 2-layer LLTM fed PackedSequences of rows of
    their own lengths (unsorted): gradients of 2 SGD steps and the
    parameters after them equal one process over the whole batch."""
    multi_gpu.spawn(["packed"], timeout_s=TIMEOUT_S)


def test_ddp_under_torch_compile():
    """torch.compile of the DDP model (inductor; the DDP optimizer splits the
    graph at bucket boundaries): gradients and parameters after 2 steps equal
    one process's eager ones."""
    multi_gpu.spawn(["compile"], timeout_s=TIMEOUT_S)


def test_multi_gpu_script_under_torchrun():
    """The two-GPU script's entry point, run here as torchrun runs it (gloo, CPU)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["GLOO_SOCKET_IFNAME"] = "lo"
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc_per_node=2", str(ROOT / "scripts" / "multi_gpu.py"),
                          "--device", "cpu", "--checks", "no_sync,fsdp"],
                         env=env, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "2 processes, gloo, cpu" in run.stdout, run.stdout
    assert "all 2 checks passed" in run.stdout, run.stdout


def _failing_worker(rank, how):
    if rank == 1:
        if how == "raise":
            raise ValueError("worker 1 failed")
        os.abort()


@pytest.mark.parametrize("how", ["raise", "abort"])
def test_process_starter_reports_a_failed_worker(how, capfd):
    """The starter's clean exit after a worker returns must not hide a worker
    that raised (its traceback comes back) or died by a signal (faulthandler
    prints where)."""
    import torch.multiprocessing as mp
    expected = mp.ProcessRaisedException if how == "raise" else mp.ProcessExitedException
    with pytest.raises(expected) as info:
        multi_gpu.start(_failing_worker, (how,), WORLD, TIMEOUT_S)
    if how == "raise":
        assert "worker 1 failed" in str(info.value)
    else:
        assert "SIGABRT" in str(info.value)
        assert "_failing_worker" in capfd.readouterr().err
