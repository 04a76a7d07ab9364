"""One forward and backward of one LLTM layer on the GPU, for profilers:

    ncu -k regex:sequence_ --launch-count 2 python3 dev/timing/sequence_profile.py 64 256 512 100
    python3 dev/timing/sequence_profile.py 64 256 512 100 --table
    python3 dev/timing/sequence_profile.py 16 32 128 100 --timeline

Arguments B I H T (default 16 32 128 100).
--table: torch.profiler's GPU time per kernel over 5 forward+backward calls,
for lltm.LLTM and cuDNN nn.LSTM of the same sizes (where the time goes).
--timeline: one forward+backward call of each, as in dev/timing/sequence_timing.py
(given gradients of output, h_n, c_n): when each host op began and ended and
when each kernel ran, in microseconds from the call's start (is the GPU
waiting for the host?).
--graph: the GPU time of one forward+backward by CUDA-graph replay, lltm and
cuDNN (median of 5 replays of 5 calls each).
--family forces lltm's plan family (lltm.overrides.sequence_plan), --dtype
runs float32 (default), bfloat16 or float16, --tf32 lets float32 matrix
products run on TF32 (torch.backends.cuda.matmul.allow_tf32; cuDNN follows
torch.backends.cudnn.allow_tf32, True by default).
"""
import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import lltm  # noqa: E402


def step(m, x, grads=None):
    out, (h, c) = m(x)
    if grads is None:
        (out.sum() + h.sum() + c.sum()).backward()
    else:
        torch.autograd.backward([out, h, c], grads)


def graph_us(m, x, calls=5, replays=5):
    """Median GPU time of one forward+backward, from replays of a CUDA graph of
    `calls` of them (gradients accumulate; their values do not matter here)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step(m, x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            step(m, x)
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / calls)
    return sorted(times)[len(times) // 2]


def timeline(m, x):
    out, (h, c) = m(x)
    grads = [torch.randn_like(t) for t in (out, h, c)]
    for _ in range(5):
        step(m, x, grads)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            torch.cuda.synchronize()
            with torch.profiler.record_function("## step"):
                step(m, x, grads)
            torch.cuda.synchronize()
    events = [e for e in prof.events() if e.time_range.end > e.time_range.start]
    steps = sorted(e.time_range.start for e in events if e.name == "## step")
    t0, t1 = steps[-1], float("inf")
    rows = []
    for e in events:
        start, end = e.time_range.start, e.time_range.end
        if start < t0 or start >= t1 or e.name == "## step":
            continue
        gpu = e.device_type == torch.autograd.DeviceType.CUDA
        if not gpu and end - start < 4:  # host ops under 4 us: noise here
            continue
        rows.append((start - t0, end - t0, "GPU " if gpu else "host", e.name[:90]))
    for start, end, where, name in sorted(rows)[:150]:
        print(f"{start:9.1f} {end:9.1f} {end - start:8.1f}  {where} {name}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sizes", nargs="*", type=int, metavar="B I H T",
                        help="batch, input, hidden, steps (default 16 32 128 100)")
    parser.add_argument("--table", action="store_true",
                        help="GPU time per kernel, lltm.LLTM and cuDNN nn.LSTM")
    parser.add_argument("--timeline", action="store_true",
                        help="host ops and kernels of one forward+backward call")
    parser.add_argument("--graph", action="store_true",
                        help="GPU time of one forward+backward by CUDA-graph replay")
    parser.add_argument("--family", choices=tuple(lltm.overrides.FAMILIES),
                        default="auto", help="force lltm's plan family")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                        default="float32")
    parser.add_argument("--tf32", action="store_true",
                        help="float32 matrix products on TF32 (torch's matmul flag)")
    args = parser.parse_args(argv)
    if len(args.sizes) not in (0, 4):
        parser.error("give all four of B I H T, or none")
    B, I, H, T = args.sizes or (16, 32, 128, 100)
    assert torch.cuda.is_available(), "needs a GPU"
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    dtype = getattr(torch, args.dtype)
    x = torch.randn(T, B, I, device="cuda", dtype=dtype, requires_grad=True)
    modules = {"lltm.LLTM": lltm.LLTM(I, H).cuda().to(dtype)}
    if args.table or args.timeline or args.graph:
        modules["cuDNN nn.LSTM"] = torch.nn.LSTM(I, H).cuda().to(dtype)
    plan = lltm.overrides.sequence_plan(family=args.family)
    plan.__enter__()
    print(f"B I H T = {B} {I} {H} {T}, {args.dtype}, matmul.allow_tf32={args.tf32}, "
          f"lltm plan {lltm.overrides.sequence_plan_in_force(dtype, T, B, I, H)}")
    for name, m in modules.items():
        step(m, x)
        torch.cuda.synchronize()
        if args.graph:
            print(f"=== {name}: {graph_us(m, x):,.1f} us a forward+backward (CUDA-graph replay)")
        if args.timeline:
            print(f"=== {name}, B I H T = {B} {I} {H} {T}: one forward+backward, us from its start")
            print("    start       end      dur  where")
            timeline(m, x)
        if not args.table:
            continue
        for _ in range(2):
            step(m, x)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                step(m, x)
            torch.cuda.synchronize()
        print(f"=== {name}, B I H T = {B} {I} {H} {T}: GPU time of 5 forward+backward calls")
        print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=14,
                                        max_name_column_width=70))
    plan.__exit__(None, None, None)
    print("profiled B I H T =", B, I, H, T)
    return 0


if __name__ == "__main__":
    sys.exit(main())
