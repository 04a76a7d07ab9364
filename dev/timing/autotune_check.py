"""lltm.backends.cuda.benchmark on a GPU: per shape (one layer, T = 100,
I = H), the plan the library chooses by its rules, the plan the tuner
measured fastest, and one lltm.LLTM forward + backward with each (benchmark
off, then on), eager (CUDA events around each step from an idle GPU, median)
and by CUDA-graph replay (median), and how long the first call took (the
measurement). The tuned module's outputs and gradients
are checked against the library's plan's first (within twice the error of
the library's plan against float64, or the dtype's tolerance). Beside each
row: what the tuner measured for each candidate at its capped T
(lltm/_autotune.py), and a summary (tuned / library time: below 1 faster).

    python3 dev/timing/autotune_check.py [--batches 1,16,64,256,1024] [--hidden 64,256,1024,2048]
                                         [--dtypes float32,bfloat16] [--cache-file PATH]
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))
import lltm  # noqa: E402
from lltm import _autotune, _settings, overrides  # noqa: E402

T = 100
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 4e-2}


def ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def step_fn(m, x):
    params = list(m.parameters())

    def step():
        out, (h, c) = m(x)
        return torch.autograd.grad((out.float().sum() + h.float().sum()), [x, *params])
    return step


def eager_us(step, reps: int = 20) -> float:
    for _ in range(3):
        step()  # (with benchmark on, the first one measures)
    samples = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        step()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3)
    return statistics.median(samples)


def graph_us(step, reps: int = 20) -> float:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return eager_us(graph.replay, reps)


def error(got, want) -> float:
    return max(((g.double() - w.double()).norm() / max(w.double().norm(), 1e-30)).item()
               for g, w in zip(got, want))


def plan_text(dtype, B, H, settings) -> str:
    plan = overrides.sequence_plan_in_force(dtype, T, B, H, H, settings=settings)
    if plan is None:
        return "no plan fits"
    f = plan.get("forward", {})
    return plan["family"] + (f" {f['lanes']}x{f['values']} c{f['chunk']} g{f['groups']}"
                             f"{' tf32' if f.get('tf32') else ''}" if f else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=ints, default=[1, 16, 64, 256, 1024])
    parser.add_argument("--hidden", type=ints, default=[64, 256, 1024, 2048])
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--cache-file", default=None, help="lltm.backends.cuda.cache_file")
    args = parser.parse_args()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, T={T}, I=H, one layer; "
          f"us of one forward + backward; tf32={torch.backends.cuda.matmul.allow_tf32}")
    lltm.backends.cuda.cache_file = args.cache_file
    ratios = {False: [], True: []}
    print(f"{'dtype':9} {'B':>5} {'H':>5}  {'library plan':26} {'tuned (eager)':14} "
          f"{'eager lib':>10} {'tuned':>10} {'graph lib':>10} {'tuned':>10}  check")
    for dtype in [getattr(torch, d) for d in args.dtypes.split(",")]:
        for H in args.hidden:
            for B in args.batches:
                torch.manual_seed(0)
                m = lltm.LLTM(H, H, device="cuda", dtype=dtype)
                x = torch.randn(T, B, H, device="cuda", dtype=dtype, requires_grad=True)
                step = step_fn(m, x)
                settings = _settings.current()
                library = plan_text(dtype, B, H, settings)
                lltm.backends.cuda.benchmark = False
                want = step()
                times = {"eager lib": eager_us(step), "graph lib": graph_us(step)}
                lltm.backends.cuda.benchmark = True
                try:
                    start = time.perf_counter()
                    got = step()  # measures (eager and captured at once)
                    torch.cuda.synchronize()
                    first_s = time.perf_counter() - start
                    times["eager tuned"], times["graph tuned"] = eager_us(step), graph_us(step)
                finally:
                    lltm.backends.cuda.benchmark = False
                key = (torch.cuda.current_device(), dtype, T, B, H, H, True)
                eager = _autotune.lookup(*key, False, settings) or (0, 0)
                captured = _autotune.lookup(*key, True, settings) or (0, 0)
                m64 = lltm.LLTM(H, H, device="cuda", dtype=torch.float64)
                m64.load_state_dict(m.state_dict())
                x64 = x.detach().double().requires_grad_()
                limit = max(TOLERANCE[dtype], 2 * error(want, step_fn(m64, x64)()))
                err = error(got, want)
                for mode, k in ((False, "eager"), (True, "graph")):
                    ratios[mode].append(times[f"{k} tuned"] / times[f"{k} lib"])
                print(f"{str(dtype)[6:]:9} {B:5} {H:5}  {library:26} "
                      f"{'/'.join(map(_autotune.describe, eager)):14} {times['eager lib']:10.0f} "
                      f"{times['eager tuned']:10.0f} {times['graph lib']:10.0f} "
                      f"{times['graph tuned']:10.0f}  {'ok' if err <= limit else 'WRONG'} "
                      f"{err:.1e}")
                forward = plan_text(dtype, B, H, settings | eager[0])
                print(f"    tuned plan (eager, forward): {forward}"
                      f"; captured: {'/'.join(map(_autotune.describe, captured))}; first call "
                      f"(measuring) {first_s:.2f} s")
                steps = min(1 << (T - 1).bit_length(), _autotune.MAX_STEPS)
                for mode in (False, True):
                    measured = _autotune._times.get(_autotune._key(*key, mode, settings), {})
                    for direction, us in measured.items():
                        print(f"    measured {'captured' if mode else 'eager'} {direction} "
                              f"(T={steps}): " + ", ".join(
                                  f"{_autotune.describe(f)} {t:.0f}" for f, t in us.items()))
                del m, x, step, want, got
                torch.cuda.empty_cache()
    for mode, name in ((False, "eager"), (True, "graph")):
        r = ratios[mode]
        if r:
            print(f"{name}: tuned / library geometric mean "
                  f"{math.exp(sum(map(math.log, r)) / len(r)):.3f}, min {min(r):.3f}, "
                  f"max {max(r):.3f}; {sum(v > 1.05 for v in r)} of {len(r)} shapes over 1.05")


if __name__ == "__main__":
    main()
