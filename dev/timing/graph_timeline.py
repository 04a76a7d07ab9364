"""The kernels of one CUDA-graph replay of stacked lltm.LLTM layers (one
forward + backward: the input's and every parameter's gradient), each with its
stream, start and GPU time (torch.profiler's CUDA activities, which list the
kernels inside a replayed graph): which kernels of the layers overlap, and
what sits between them on the wavefront's critical path.

    python3 dev/timing/graph_timeline.py [B:H:L:CHUNKS:DTYPE ...] [--timeline] [--out PATH]

Each configuration: batch B, hidden H (I = H/2), L layers, CHUNKS time chunks
forced (lltm.overrides.wavefront; 0: the library's own choice), DTYPE float32
or bfloat16 (default 16:256:3:4:float32). T = 100. Prints per configuration the
graph's GPU time a step (CUDA events over 10 replays), the replay's span and
the sum of its kernels' times (above the span: kernels overlapped), then the GPU
time per kernel name (calls, total, mean), then the tail: the kernels after the
last recurrence kernel ends (what the step waits for after the bottom layer's
recurrence) and how long they take; --timeline adds every kernel (start
from the first one, duration, stream, name), --out writes those timelines to a
file. Times only (the wavefront's results are checked by wavefront_timing.py and
the tests).
"""
from __future__ import annotations

import argparse
import collections
import json
import re
import sys
import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import lltm  # noqa: E402
from wavefront_timing import captured, lltm_case, replay_us  # noqa: E402  (dev/timing/)

KINDS = ("kernel", "gpu_memcpy", "gpu_memset")


def parse(spec: str):
    B, H, L, chunks, dtype = spec.split(":")
    return int(B), int(H), int(L), int(chunks), getattr(torch, dtype)


def timeline(B: int, H: int, L: int, chunks: int, dtype: torch.dtype, T: int = 100):
    """(GPU us a replay, the replay's kernels as (start us, duration us,
    stream, name) sorted by start)."""
    step, _, _ = lltm_case(B, H, T, L, dtype)
    with lltm.overrides.wavefront(chunks or None):
        graph = captured(step)
    per_replay = replay_us(graph, reps=1, replays=10)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text())["traceEvents"]
    kernels = sorted((e for e in events if e.get("cat") in KINDS), key=lambda e: e["ts"])
    t0 = kernels[0]["ts"] if kernels else 0.0
    return per_replay, [(e["ts"] - t0, e["dur"], e.get("tid"), e["name"]) for e in kernels]


def kernel_name(name: str) -> str:
    """A kernel's name without template arguments."""
    return name.split("<")[0].strip() or name


def summary(kernels) -> list[tuple[str, int, float]]:
    """(kernel name without template arguments, calls, total us), largest first."""
    calls, total = collections.Counter(), collections.Counter()
    for _, duration, _, name in kernels:
        key = kernel_name(name)
        calls[key] += 1
        total[key] += duration
    return sorted(((k, calls[k], total[k]) for k in calls), key=lambda r: -r[2])


# the recurrences' kernels: persistent (each family), stacked, per step
RECURRENCE = re.compile(r"(sequence|stack)_(forward|backward)\w*_kernel|(forward|backward)_step_kernel")


def tail(kernels) -> tuple[float, list]:
    """(us from the end of the last recurrence kernel to the end of the
    replay, the kernels that start there): what the step waits for after
    the bottom layer's recurrence."""
    ends = [start + duration for start, duration, _, name in kernels if RECURRENCE.search(name)]
    if not ends:
        return 0.0, []
    last = max(ends)
    after = [k for k in kernels if k[0] >= last]
    return max(start + duration for start, duration, _, _ in kernels) - last, after


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("configs", nargs="*", default=["16:256:3:4:float32"],
                   help="B:H:L:CHUNKS:DTYPE (CHUNKS 0: the library's choice)")
    p.add_argument("--timeline", action="store_true", help="print every kernel too")
    p.add_argument("--out", default=None, help="write the timelines here")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, T=100, I=H/2")
    written = []
    for spec in args.configs:
        B, H, L, chunks, dtype = parse(spec)
        per_replay, kernels = timeline(B, H, L, chunks, dtype)
        span = kernels[-1][0] + kernels[-1][1] if kernels else 0.0
        head = (f"## B{B} H{H} L{L} {str(dtype).split('.')[-1]} chunks={chunks or 'auto'}: "
                f"graph {per_replay:.0f} us a step, {len(kernels)} kernels, span {span:.0f} us, "
                f"kernels' sum {sum(k[1] for k in kernels):.0f} us")
        lines = [f"{start:9.1f} {duration:8.1f} s{stream} {name[:100]}"
                 for start, duration, stream, name in kernels]
        print(head)
        for name, calls, total in summary(kernels)[:10]:
            print(f"  {calls:5d} calls {total:9.1f} us {total / calls:8.2f} us each  {name[:70]}")
        after_us, after = tail(kernels)
        print(f"  tail {after_us:.1f} us after the last recurrence kernel, {len(after)} kernels: "
              + ", ".join(f"{kernel_name(name)[:60]} {duration:.1f}"
                          for _, duration, _, name in after))
        if args.timeline:
            print("\n".join(lines))
        written += [head, *lines]
    if args.out:
        Path(args.out).write_text("\n".join(written) + "\n")


if __name__ == "__main__":
    main()
