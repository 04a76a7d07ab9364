"""GPU time of stacked lltm.LLTM layers against cuDNN nn.LSTM of as many
layers, by CUDA-graph replay: one forward + backward (gradients of the input
and every parameter) captured into a graph, its replays timed between CUDA
events. lltm runs with the wavefront's time chunks forced
(lltm.overrides.wavefront: 1 = the layers one after the other) and with its
own choice ("auto"), so the chunk count can be chosen from data.

    python3 dev/timing/wavefront_timing.py [--shapes 16x256,64x512] [--layers 1,3]
        [--chunks auto,1,2,3,4,6] [--dtypes float32,bfloat16] [--T 100] [--shared]
        [--json PATH]

Before timing, each lltm configuration's output and gradients are compared with
the same module's float64 run on the same data (max |error| / max |value|
over every tensor printed; "WRONG" above twice the error of the layers run one
after the other, or the benchmark's tolerance: 1e-4 float32, 5e-2 bfloat16). I = H/2. Prints one row per shape,
dtype and layer count: cuDNN's time, lltm's per chunk count, the best, and
cuDNN / lltm for the automatic choice, with the schedule that choice names
for a call under capture (lltm._schedule.automatic_schedule: chunks, and
"s2" where planned for two layers at once; the module may run the stacked
launch there instead, lltm/_stack.py). ``--shared`` adds each forced chunk
count above 1 with every call planned for two layers at once on the device
(columns C<n>s2: lltm._sharing.sharing_device(2), the plans of a bidirectional
layer's two directions), so that two layers' persistent kernels are resident
together. ``--json PATH`` writes every row to PATH.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import lltm  # noqa: E402
from lltm import _schedule, _sharing  # noqa: E402
from lltm.bench.timing import capture_graph  # noqa: E402


def parse_shapes(text):
    return [tuple(int(v) for v in s.split("x")) for s in text.split(",") if s]


def captured(step):
    """step() (forward + backward) captured in a CUDA graph, after a warm-up
    on the capture stream. step's leaves must have no autograd graph alive
    from an earlier call on another stream (their AccumulateGrad nodes would
    keep that stream)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    return capture_graph(step, stream, torch.device("cuda"))  # undone if it fails


def replay_us(graph, reps: int, replays: int) -> float:
    """Median microseconds of one replay of ``graph`` over ``reps`` timings
    of ``replays`` replays each (CUDA events), after one replay."""
    graph.replay()
    torch.cuda.synchronize()
    samples = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(reps):
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1000 / replays)
    return statistics.median(samples)


def graph_time(step, reps: int, replays: int) -> float:
    """Median microseconds of one replay of step() captured in a graph
    (:func:`captured`, :func:`replay_us`)."""
    return replay_us(captured(step), reps, replays)


def lltm_case(B, H, T, L, dtype):
    I = H // 2  # noqa: E741
    g = torch.Generator(device="cuda").manual_seed(0)
    module = lltm.LLTM(I, H, num_layers=L, device="cuda", dtype=dtype)
    x = torch.randn(T, B, I, device="cuda", dtype=dtype, generator=g).requires_grad_()
    grad_out = torch.randn(T, B, H, device="cuda", dtype=dtype, generator=g)
    leaves = [x, *module.parameters()]

    def step():
        out, _ = module(x)
        return torch.autograd.grad(out, leaves, grad_out)

    def outputs(m=module, x=x, grad_out=grad_out):
        # detached: no graph (nor its AccumulateGrad nodes) outlives the call
        out, (h, c) = m(x)
        grads = torch.autograd.grad(out, [x, *m.parameters()], grad_out)
        return tuple(t.detach() for t in (out, h, c, *grads))

    def oracle():  # the same data in float64, one call a layer
        m64 = lltm.LLTM(I, H, num_layers=L, device="cuda", dtype=torch.float64)
        m64.load_state_dict({k: v.double() for k, v in module.state_dict().items()})
        with lltm.overrides.wavefront(1):
            return outputs(m64, x.detach().double().requires_grad_(), grad_out.double())
    return step, outputs, oracle


def lstm_case(B, H, T, L, dtype):
    I = H // 2  # noqa: E741
    module = torch.nn.LSTM(I, H, num_layers=L, device="cuda", dtype=dtype)
    x = torch.randn(T, B, I, device="cuda", dtype=dtype).requires_grad_()
    grad_out = torch.randn(T, B, H, device="cuda", dtype=dtype)
    leaves = [x, *module.parameters()]

    def step():
        out, _ = module(x)
        return torch.autograd.grad(out, leaves, grad_out)
    return step


@contextlib.contextmanager
def under_capture():
    """An empty CUDA graph captured around the block: the library answers
    for the current stream as it is, so what is asked inside is asked as for
    a call under capture."""
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "the CUDA Graph is empty"
        with torch.cuda.graph(graph, stream=stream):
            yield


def captured_schedule(T, B, I, H, L, dtype):  # noqa: E741
    """The module's own schedule for a call under CUDA-graph capture (what the
    "auto" column's replays ran)."""
    with under_capture():
        return _schedule.automatic_schedule(T, B, I, H, L, dtype, torch.device("cuda"))


def error_limit(dtype, reference_error: float) -> float:
    """The largest error (max_error's) that is not WRONG: twice that of the
    layers run one after the other (``reference_error``), or the benchmark's
    tolerance for the dtype. In bfloat16 at T = 100 two routes' roundings
    part by far more than a fixed tolerance."""
    return max(1e-4 if dtype == torch.float32 else 5e-2, 2 * reference_error)


def max_error(got, want):
    worst = 0.0
    for a, b in zip(got, want):
        a, b = a.double(), b.double()
        worst = max(worst, ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item())
    return worst


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="16x256,64x512,256x1024", help="BxH,...")
    p.add_argument("--layers", default="1,3")
    p.add_argument("--chunks", default="auto,1,2,3,4,6")
    p.add_argument("--dtypes", default="float32")
    p.add_argument("--T", type=int, default=100)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--replays", type=int, default=5)
    p.add_argument("--shared", action="store_true",
                   help="also each chunk count > 1 with plans for two layers at once")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    torch.backends.cudnn.benchmark = False
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, T={args.T}, I=H/2")
    layers = [int(v) for v in args.layers.split(",")]
    chunk_choices = [c if c == "auto" else int(c) for c in args.chunks.split(",")]
    # (column, forced chunks or None, layers planned at once)
    columns = [(f"C{c}", None if c == "auto" else c, 1) for c in chunk_choices]
    if args.shared:
        columns += [(f"C{c}s2", c, 2) for c in chunk_choices if c != "auto" and c > 1]
    records = []
    header = None
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        for B, H in parse_shapes(args.shapes):
            for L in layers:
                row = {"B": B, "H": H, "T": args.T, "layers": L, "dtype": dtype_name}
                try:
                    row["cudnn"] = graph_time(lstm_case(B, H, args.T, L, dtype), args.reps,
                                              args.replays)
                except Exception as exc:  # noqa: BLE001
                    row["cudnn"] = None
                    print(f"# cuDNN B={B} H={H} L={L}: {type(exc).__name__}: {exc}")
                step, outputs, oracle = lltm_case(B, H, args.T, L, dtype)
                want = oracle()
                row["auto_chunks"], row["auto_sharing"] = captured_schedule(
                    args.T, B, H // 2, H, L, dtype)
                errors = {}
                for key, c, sharing in (columns if L > 1 else [("Cauto", None, 1)]):
                    try:
                        with lltm.overrides.wavefront(c), _sharing.sharing_device(sharing):
                            errors[key] = max_error(outputs(), want)
                            row[key] = graph_time(step, args.reps, args.replays)
                    except Exception as exc:  # noqa: BLE001
                        row[key] = None
                        print(f"# lltm B={B} H={H} L={L} {key}: {type(exc).__name__}: {exc}")
                row["max_error"] = max(errors.values()) if errors else None
                limit = error_limit(dtype, errors.get("C1", errors.get("Cauto", 0.0)))
                keys = [k for k in row if k.startswith("C") and row[k] is not None]
                best = min(keys, key=lambda k: row[k]) if keys else None
                if header is None:
                    header = (f"{'dtype':9} {'B':>5} {'H':>5} {'L':>2} {'cuDNN':>9} "
                              + " ".join(f"{key:>9}" for key, _, _ in columns)
                              + "  auto  best   cuDNN/auto  err")
                    print(header)
                cells = " ".join(f"{row.get(key) or float('nan'):9.1f}"
                                 for key, _, _ in columns)
                # the automatic choice as its column would be named
                auto = f"{row['auto_chunks']}" + ("s2" if row["auto_sharing"] == 2 else "")
                ratio = (row["cudnn"] / row["Cauto"]) if row.get("cudnn") and row.get(
                    "Cauto") else float("nan")
                verdict = "WRONG" if row["max_error"] and row["max_error"] > limit else ""
                print(f"{dtype_name:9} {B:5} {H:5} {L:2} {row['cudnn'] or float('nan'):9.1f} "
                      f"{cells}  {auto:>4}  {best or '-':6} {ratio:6.2f}x  "
                      f"{row['max_error'] or 0:.1e} {verdict}", flush=True)
                records.append(row)
                torch.cuda.empty_cache()
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
