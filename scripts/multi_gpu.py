"""Data-parallel training of models with lltm.LLTM and lltm.LLTMCell, each
check against one process over the whole batch.

    torchrun --standalone --nproc_per_node=2 scripts/multi_gpu.py                 # NCCL, GPUs
    torchrun --standalone --nproc_per_node=2 scripts/multi_gpu.py --device cpu    # gloo, CPU
    torchrun ... scripts/multi_gpu.py --checks fsdp,fsdp_bf16 --seed 7

Checks (every process runs each one; the single-process results it compares
against are computed in the same process over the union of all processes'
batches):
  ddp         DistributedDataParallel of the training example's LLTM classifier
              (lltm.examples.train): gradients of each of 3 SGD steps and the
              parameters after them
  no_sync     DDP with gradient accumulation: micro-batches under no_sync(),
              the last one synchronised; gradients equal one process over the
              whole batch, and differ between processes before the last one
  compile     torch.compile of a DDP model (the DDP optimizer splits the graph
              at bucket boundaries): gradients and parameters after 2 steps
  fsdp        FSDP2 (fully_shard on the LLTM and on the whole model): full
              gradients and parameters after 2 steps
  fsdp_bf16   FSDP2 with MixedPrecisionPolicy(param_dtype=bfloat16,
              reduce_dtype=float32): gradients equal the mean of bfloat16
              gradients of each process's batch, and are near float32's
  packed      DDP of a bidirectional LLTM (2 layers) over PackedSequences of
              rows of their own lengths (enforce_sorted=False): gradients of
              each of 2 SGD steps and the parameters after them
The model of the checks other than ddp and packed: Linear -> LLTM (2 layers) -> a loop of
LLTMCell over the LLTM's output -> Linear. Inputs are random, drawn from a
seed that process 0 picks (printed; --seed fixes it).

tests/test_ddp.py and tests/test_fsdp.py run the same checks with gloo on CPU
in processes of their own (spawn). NVLink multicast is kept off.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import faulthandler
import os
import random
import socket
import sys
import time
import warnings

os.environ.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
                  NVSHMEM_DISABLE_NVLS="1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import lltm  # noqa: E402

CHECKS = ("ddp", "no_sync", "compile", "fsdp", "fsdp_bf16", "packed")
FEATURES, STEPS, HIDDEN, CLASSES = 6, 5, 12, 5
BATCH = 16           # the global batch: split evenly between processes
MICRO_BATCHES = 2    # per process, in no_sync
FLOAT32 = dict(rtol=1e-5, atol=1e-6)


class Net(torch.nn.Module):
    """Linear -> LLTM (2 layers) -> LLTMCell over the LLTM's output -> Linear."""

    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(FEATURES, HIDDEN)
        self.rnn = lltm.LLTM(HIDDEN, HIDDEN, 2, batch_first=True)
        self.cell = lltm.LLTMCell(HIDDEN, HIDDEN)
        self.head = torch.nn.Linear(HIDDEN, CLASSES)

    def forward(self, x):  # [B, T, F] -> logits [B, classes]
        y, _ = self.rnn(torch.tanh(self.inp(x)))
        state = None
        for y_t in y.unbind(1):
            state = self.cell(y_t, state)
        return self.head(state[0])


class PackedNet(torch.nn.Module):
    """Linear -> bidirectional LLTM (2 layers) over a PackedSequence -> Linear
    on the last layer's final states of both directions."""

    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(FEATURES, HIDDEN)
        self.rnn = lltm.LLTM(HIDDEN, HIDDEN, 2, batch_first=True, bidirectional=True)
        self.head = torch.nn.Linear(2 * HIDDEN, CLASSES)

    def forward(self, x, lengths):  # [B, T, F], lengths [B] (CPU) -> logits [B, classes]
        from torch.nn.utils.rnn import pack_padded_sequence
        packed = pack_padded_sequence(torch.tanh(self.inp(x)), lengths, batch_first=True,
                                      enforce_sorted=False)
        _, (h_n, _) = self.rnn(packed)
        return self.head(torch.cat([h_n[-2], h_n[-1]], 1))


class Context:
    """The process group's view: rank, world size, device, seed."""

    def __init__(self, device: torch.device, seed: int):
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.device, self.seed = device, seed

    def shard(self, t: torch.Tensor, rank: int | None = None) -> torch.Tensor:
        """This process's (or rank's) rows of a global batch."""
        share = t.shape[0] // self.world
        r = self.rank if rank is None else rank
        return t[r * share:(r + 1) * share]

    def batch(self, step: int = 0):
        """The global batch of a step: the same on every process."""
        g = torch.Generator().manual_seed(self.seed * 1000 + step)
        x = torch.randn(BATCH, STEPS, FEATURES, generator=g)
        y = torch.randint(0, CLASSES, (BATCH,), generator=g)
        return x.to(self.device), y.to(self.device)

    def net(self, cls=Net) -> torch.nn.Module:
        torch.manual_seed(self.seed)
        return cls().to(self.device)


def _full(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor of a (possibly sharded DTensor) parameter or gradient."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _grads(model) -> dict:
    return {n: _full(p.grad).detach().float().clone() for n, p in model.named_parameters()}


def _params(model) -> dict:
    return {n: _full(p).detach().float().clone() for n, p in model.named_parameters()}


def assert_equal(got: dict, want: dict, what: str, ctx: Context, tol=FLOAT32):
    """Every entry of ``got`` close to ``want``'s, relative tolerance per element
    plus an absolute one scaled by max|want|; gradients must not all be zero."""
    if got.keys() != want.keys():
        raise AssertionError(f"{what}: names {sorted(got)} != {sorted(want)}")
    for name, w in want.items():
        scale = max(1.0, w.abs().max().item())
        assert w.abs().max() > 0, f"{what} {name}: all zero, the comparison could not fail"
        torch.testing.assert_close(got[name].cpu(), w.cpu(), rtol=tol["rtol"],
                                   atol=tol["atol"] * scale,
                                   msg=lambda m: f"rank {ctx.rank} {what} {name}: {m}")


def _step(model, optimizer, x, y, owner=None, lengths=None) -> dict:
    """One optimizer step; the gradients of ``owner`` (default: the model).
    ``lengths``: the rows' lengths, for a model over packed sequences."""
    optimizer.zero_grad()
    F.cross_entropy(model(x) if lengths is None else model(x, lengths), y).backward()
    grads = _grads(owner or model)
    optimizer.step()
    return grads


# ----------------------------------------------------------------------------
# The checks: check(ctx) raises AssertionError when a result differs.

def check_ddp(ctx: Context) -> None:
    from lltm.examples import train
    data = train.load_digits()
    args = train.build_parser().parse_args(["--device", ctx.device.type, "--hidden", "16",
                                            "--models", "lltm", "--seed", str(ctx.seed % 1000)])
    single = train.build_model("lltm", data, args, ctx.device)
    model = DDP(train.build_model("lltm", data, args, ctx.device))
    # SGD: Adam's division by sqrt(v) would turn rounding-level differences
    # of near-zero gradients into whole steps.
    opt_single = torch.optim.SGD(single.parameters(), lr=0.5, momentum=0.9)
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    x_all, y_all = data.x_train.to(ctx.device), data.y_train.to(ctx.device)
    for step in range(3):
        rows = slice(step * BATCH, (step + 1) * BATCH)
        x, y = x_all[rows], y_all[rows]
        want = _step(single, opt_single, x, y)
        got = _step(model, opt, ctx.shard(x), ctx.shard(y), model.module)
        assert_equal(got, want, f"step {step} gradient", ctx)
    assert_equal(_params(model.module), _params(single), "parameters after 3 steps", ctx)


def check_no_sync(ctx: Context) -> None:
    single, model = ctx.net(), DDP(ctx.net())
    opt_single = torch.optim.SGD(single.parameters(), lr=0.5, momentum=0.9)
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    for step in range(2):
        x, y = ctx.batch(step)
        want = _step(single, opt_single, x, y)
        opt.zero_grad()
        micro_x, micro_y = ctx.shard(x).chunk(MICRO_BATCHES), ctx.shard(y).chunk(MICRO_BATCHES)
        with model.no_sync():
            for mx, my in zip(micro_x[:-1], micro_y[:-1]):
                (F.cross_entropy(model(mx), my) / MICRO_BATCHES).backward()
        local = model.module.head.weight.grad.clone()
        others = [torch.empty_like(local) for _ in range(ctx.world)]
        dist.all_gather(others, local)
        assert not torch.equal(others[0], others[1]), \
            "gradients equal between processes inside no_sync(): they were synchronised"
        (F.cross_entropy(model(micro_x[-1]), micro_y[-1]) / MICRO_BATCHES).backward()
        assert_equal(_grads(model.module), want,
                     f"step {step} accumulated gradient", ctx)
        opt.step()
    assert_equal(_params(model.module), _params(single), "parameters after 2 steps", ctx)


def check_compile(ctx: Context, backend: str = "inductor") -> None:
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    single, ddp = ctx.net(), DDP(ctx.net())
    model = torch.compile(ddp, backend=backend)
    opt_single = torch.optim.SGD(single.parameters(), lr=0.5)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.5)
    for step in range(2):
        x, y = ctx.batch(step)
        want = _step(single, opt_single, x, y)
        got = _step(model, opt, ctx.shard(x), ctx.shard(y), ddp.module)
        assert_equal(got, want, f"step {step} gradient", ctx, tol=dict(rtol=1e-4, atol=1e-5))
    assert counters["stats"]["unique_graphs"] >= 1, "torch.compile captured no graph"
    assert_equal(_params(ddp.module), _params(single), "parameters after 2 steps", ctx,
                 tol=dict(rtol=1e-4, atol=1e-5))


def _fully_shard(ctx: Context, mp_policy=None) -> Net:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.device_mesh import init_device_mesh
    # lltm.LLTM(batch_first=True) returns its output as a transposed view;
    # FSDP2 warns that an in-place op on it would skip its hooks (none here).
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module \(FSDPLLTM\) returned a view")
    mesh = init_device_mesh(ctx.device.type, (ctx.world,))
    model = ctx.net()
    kwargs = dict(mesh=mesh, mp_policy=mp_policy or MixedPrecisionPolicy())
    fully_shard(model.rnn, **kwargs)
    fully_shard(model, **kwargs)
    return model


def check_fsdp(ctx: Context) -> None:
    single, model = ctx.net(), _fully_shard(ctx)
    assert type(model.rnn.weights_l0).__name__ == "DTensor", "parameters were not sharded"
    opt_single = torch.optim.SGD(single.parameters(), lr=0.5, momentum=0.9)
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    for step in range(2):
        x, y = ctx.batch(step)
        want = _step(single, opt_single, x, y)
        got = _step(model, opt, ctx.shard(x), ctx.shard(y))
        assert_equal(got, want, f"step {step} gradient", ctx)
    assert_equal(_params(model), _params(single), "parameters after 2 steps", ctx)


def check_fsdp_bf16(ctx: Context) -> None:
    from torch.distributed.fsdp import MixedPrecisionPolicy
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    single, model = ctx.net(), _fully_shard(ctx, policy)
    opt_single = torch.optim.SGD(single.parameters(), lr=0.5)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for step in range(2):
        x, y = ctx.batch(step)
        # What FSDP computes: each process's gradient in bfloat16 (parameters and
        # inputs cast), averaged in float32.
        want = None
        for r in range(ctx.world):
            replica = copy.deepcopy(single).to(torch.bfloat16)
            F.cross_entropy(replica(ctx.shard(x, r).bfloat16()), ctx.shard(y, r)).backward()
            g = _grads(replica)
            want = g if want is None else {k: want[k] + g[k] for k in g}
        want = {k: v / ctx.world for k, v in want.items()}
        opt_single.zero_grad()
        F.cross_entropy(single(x), y).backward()
        float32 = _grads(single)
        for name, p in single.named_parameters():  # step with the bfloat16 gradient
            p.grad.copy_(want[name])
        opt_single.step()
        got = _step(model, opt, ctx.shard(x), ctx.shard(y))
        assert all(p.dtype == torch.float32 for p in model.parameters())
        gap = max((want[k] - float32[k]).abs().max().item() for k in want)
        assert gap > 10 * FLOAT32["atol"], \
            f"bfloat16 and float32 gradients differ by only {gap}: the comparison cannot tell them apart"
        assert_equal(got, want, f"step {step} gradient (bfloat16 mean)", ctx)
        assert_equal(got, float32, f"step {step} gradient (near float32)", ctx,
                     tol=dict(rtol=0.1, atol=0.03))
    assert_equal(_params(model), _params(single), "parameters after 2 steps", ctx,
                 tol=dict(rtol=1e-4, atol=1e-5))


def check_packed(ctx: Context) -> None:
    single, model = ctx.net(PackedNet), DDP(ctx.net(PackedNet))
    opt_single = torch.optim.SGD(single.parameters(), lr=0.5, momentum=0.9)
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    for step in range(2):
        x, y = ctx.batch(step)
        g = torch.Generator().manual_seed(ctx.seed * 1000 + step + 500)
        lengths = torch.randint(1, STEPS + 1, (BATCH,), generator=g)
        lengths[0] = STEPS  # some row runs every step
        want = _step(single, opt_single, x, y, lengths=lengths)
        got = _step(model, opt, ctx.shard(x), ctx.shard(y), model.module,
                    lengths=ctx.shard(lengths))
        assert_equal(got, want, f"step {step} gradient", ctx)
    assert_equal(_params(model.module), _params(single), "parameters after 2 steps", ctx)


def run_checks(ctx: Context, checks, compile_backend: str = "inductor", log=print) -> None:
    table = {"ddp": check_ddp, "no_sync": check_no_sync, "fsdp": check_fsdp,
             "fsdp_bf16": check_fsdp_bf16, "packed": check_packed,
             "compile": lambda c: check_compile(c, compile_backend)}
    for name in checks:
        t0 = time.perf_counter()
        table[name](ctx)
        dist.barrier()
        if ctx.rank == 0:
            log(f"{name}: ok ({time.perf_counter() - t0:.1f} s)")


def _agree_on_seed(seed: int | None, device: torch.device) -> int:
    t = torch.tensor([seed if seed is not None else random.SystemRandom().randrange(2**20)],
                     device=device)
    dist.broadcast(t, 0)
    return int(t.item())


# ----------------------------------------------------------------------------
# Entry points: torchrun (main) and torch.multiprocessing (run_spawned).

def run_spawned(rank: int, world: int, port: int, checks, seed: int | None = None,
                compile_backend: str = "inductor") -> None:
    """One of ``world`` processes started by torch.multiprocessing.spawn: gloo
    on CPU over 127.0.0.1:port."""
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    try:
        device = torch.device("cpu")
        run_checks(Context(device, _agree_on_seed(seed, device)), checks, compile_backend)
    finally:
        dist.destroy_process_group()


def settle() -> None:
    """Wait for every rank before the group is torn down, so that no rank
    closes its sockets while a peer still finishes the last collective."""
    dist.barrier()
    if dist.get_backend() == "nccl":
        torch.cuda.synchronize()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker_entry(rank: int, fn, args) -> None:
    """fn(rank, *args) in a started process. A Python traceback of every
    thread goes to stderr if the process is killed by a signal (a gloo abort
    then says where it happened). After fn returns, the process leaves at once
    with status 0: fn has destroyed its process group and written its results,
    and interpreter finalization with torch.distributed's threads still being
    wound down was seen to abort a gloo process now and then on a loaded
    machine ("terminate called without an active exception", SIGABRT), the
    same worker passing in every rerun. An exception in fn still fails the
    process, with its traceback, as torch.multiprocessing reports it."""
    faulthandler.enable(all_threads=True)
    fn(rank, *args)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def start(fn, args, world: int = 2, timeout_s: float = 240) -> None:
    """fn(rank, *args) in ``world`` fresh processes; a process's exception is
    raised here (torch.multiprocessing.ProcessRaisedException, with its
    traceback); processes still running after ``timeout_s`` are killed and
    TimeoutError raised. The processes are started with the "spawn" method
    (each imports torch afresh: a process forked from one that has imported
    torch's compiler was seen to hang) and end as _worker_entry says."""
    import torch.multiprocessing as mp
    context = mp.start_processes(_worker_entry, args=(fn, args), nprocs=world, join=False,
                                 start_method="spawn")
    deadline = time.monotonic() + timeout_s
    while not context.join(timeout=0.5):
        if time.monotonic() > deadline:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
            raise TimeoutError(f"{fn.__name__}{args} still running after {timeout_s} s")


def spawn(checks, world: int = 2, timeout_s: float = 240, seed: int | None = None,
          compile_backend: str = "inductor") -> None:
    """Run the checks in ``world`` fresh processes (gloo, CPU); see start."""
    start(run_spawned, (world, free_port(), list(checks), seed, compile_backend), world,
          timeout_s)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cuda: process k on cuda:LOCAL_RANK (default)")
    parser.add_argument("--backend", choices=("nccl", "gloo"),
                        help="default: nccl on cuda, gloo on cpu")
    parser.add_argument("--checks", default=",".join(CHECKS),
                        help=f"comma-separated, of {', '.join(CHECKS)} (default: all)")
    parser.add_argument("--compile-backend", default="inductor")
    parser.add_argument("--seed", type=int)
    args = parser.parse_args(argv)
    checks = [c for c in args.checks.split(",") if c]
    unknown = sorted(set(checks) - set(CHECKS))
    if unknown:
        parser.error(f"--checks: unknown {unknown}; expected some of {list(CHECKS)}")
    if "WORLD_SIZE" not in os.environ:
        parser.error("run under torchrun: torchrun --standalone --nproc_per_node=2 "
                     "scripts/multi_gpu.py ...")
    backend = args.backend or ("nccl" if args.device == "cuda" else "gloo")
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["WORLD_SIZE"])))
    dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    try:
        ctx = Context(device, _agree_on_seed(args.seed, device))
        if ctx.rank == 0:
            print(f"{ctx.world} processes, {backend}, {device.type}, torch {torch.__version__}, "
                  f"seed {ctx.seed}", flush=True)
        run_checks(ctx, checks, args.compile_backend, log=lambda s: print(s, flush=True))
        if ctx.rank == 0:
            print(f"all {len(checks)} checks passed", flush=True)
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
