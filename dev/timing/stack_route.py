"""lltm.LLTM's stacked layers through lltm::stack_forward against a call of
the sequence operator a layer: one forward + backward (T = 100, I = H/2)
eager (wall time) and by CUDA-graph replay, each route forced
(``lltm.overrides.stacked_layers``: off, on) and the module's own choice
(auto), at every shape where the stacked launch runs, and cuDNN's nn.LSTM of
the same sizes by graph replay. Per row, the plan a
layer above the first runs alone (what the route's rule reads,
lltm/_stack.py). Each route's
outputs and gradients are checked first against the same module's float64
run: WRONG above twice the layer calls' own error, or the tolerance.

    python3 dev/timing/stack_route.py [--batches 1,4,16,...] [--hidden 64,128,...]
                                      [--layers 3,2] [--dtypes float32,bfloat16]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))
import lltm  # noqa: E402
from lltm import overrides  # noqa: E402
from wavefront_timing import error_limit, graph_time, lltm_case, lstm_case, max_error  # noqa: E402

T = 100


def eager_us(step, n: int = 5, passes: int = 5) -> float:
    """Median microseconds of one step, over passes of n back-to-back steps."""
    for _ in range(2):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(passes):
        start = time.perf_counter()
        for _ in range(n):
            step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / n * 1e6)
    return statistics.median(times)


def plan_name(plan: dict | None) -> str:
    if plan is None:  # no plan fits (a forced family), or no CUDA library
        return "none"
    if plan["family"] == "steps":
        return "steps"
    f = plan["forward"]
    return f"{plan['family']} {f['lanes']}x{f['values']}g{f['groups']}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", default="1,4,16,32,64,256")
    p.add_argument("--hidden", default="64,128,192,256")
    p.add_argument("--layers", default="3,2")
    p.add_argument("--dtypes", default="float32,bfloat16")
    args = p.parse_args(argv)
    assert torch.cuda.is_available(), "needs a CUDA GPU"
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, lltm {lltm.__file__}")
    print("| dtype | L | B | H | layer plan | off eager | on eager | auto eager "
          "| off graph | on graph | auto graph | eager on/off | graph on/off | cuDNN graph "
          "| cuDNN / on | cuDNN / auto |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    failed = 0
    for dtype in (getattr(torch, d) for d in args.dtypes.split(",")):
        for L in (int(v) for v in args.layers.split(",")):
            for B in (int(v) for v in args.batches.split(",")):
                for H in (int(v) for v in args.hidden.split(",")):
                    if overrides.stack_plan_in_force(dtype, L, T, B, H // 2, H) is None:
                        continue
                    above = overrides.sequence_plan_in_force(dtype, T, B, H, H)
                    times, errors = {}, {}
                    for mode in ("off", "on", "auto"):
                        torch.manual_seed(0)  # the same module parameters each time
                        with overrides.stacked_layers(mode):
                            step, outputs, oracle = lltm_case(B, H, T, L, dtype)
                            if mode == "off":
                                want = oracle()
                            errors[mode] = max_error(outputs(), want)
                            times[mode] = (eager_us(step), graph_time(step, 3, 5))
                    limit = error_limit(dtype, errors["off"])  # the layer calls set the bar
                    for mode in ("on", "auto"):
                        if errors[mode] > limit:
                            print(f"WRONG {mode} {dtype} L{L} B{B} H{H}: {errors[mode]:.2e} "
                                  f"(the layer calls: {errors['off']:.2e})")
                            failed += 1
                    off, on, auto = times["off"], times["on"], times["auto"]
                    cudnn = graph_time(lstm_case(B, H, T, L, dtype), 3, 5)
                    print(f"| {str(dtype)[6:]} | {L} | {B} | {H} | {plan_name(above)} | "
                          f"{off[0]:.0f} | {on[0]:.0f} | {auto[0]:.0f} | "
                          f"{off[1]:.0f} | {on[1]:.0f} | {auto[1]:.0f} | {on[0] / off[0]:.2f} | "
                          f"{on[1] / off[1]:.2f} | {cudnn:.0f} | {cudnn / on[1]:.2f} | "
                          f"{cudnn / auto[1]:.2f} |", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
