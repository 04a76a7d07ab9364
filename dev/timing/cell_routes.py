"""GPU time of one LLTM cell step on CUDA (forward, then torch.autograd.grad
of input, weights, bias and state) by CUDA-graph replay: the native cell on
the library's route ("auto", named in the table) and on each route forced
(lltm.overrides.matmul: "fused" kernels, "cublas" products), against the
tutorial's Python reference and nn.LSTMCell; I = H/2, float32 and bfloat16.

    python3 dev/timing/cell_routes.py [BxH ...] [--passes N] [--kernels]

Default shapes: B 1, 16, 64, 256, 1024 x H 128, 512, 1024. Microseconds a
step, the least of --passes passes (each the median of 5 x 3 replays of a
graph of 10 steps), implementations interleaved within a pass. --kernels: after the
table, torch.profiler's GPU time per kernel of one step, for the native cell
on each route and nn.LSTMCell.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import lltm  # noqa: E402
from lltm import reference  # noqa: E402
from directions import graph_us  # noqa: E402  (dev/timing/directions.py)

IMPLS = [("native", "auto"), ("native", "fused"), ("native", "cublas"), ("reference", "auto"),
         ("LSTMCell", "auto")]


def make_step(impl, policy, dtype, B, I, H):  # noqa: E741
    """One forward + backward of `impl` on fixed random inputs."""
    g = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, device="cuda", dtype=dtype, generator=g)
    if impl == "LSTMCell":
        cell = torch.nn.LSTMCell(I, H, device="cuda", dtype=dtype)
        x, h, c = (rand(B, I).requires_grad_(), rand(B, H).requires_grad_(),
                   rand(B, H).requires_grad_())
        leaves = [x, h, c, *cell.parameters()]

        def forward():
            return cell(x, (h, c))
    else:
        leaves = [t.requires_grad_() for t in (rand(B, I), rand(3 * H, I + H) / (I + H) ** 0.5,
                                               rand(3 * H), rand(B, H), rand(B, H))]
        fn = lltm.functional.lltm_cell if impl == "native" else reference.lltm_cell

        def forward():
            return fn(*leaves)
    grads = (rand(B, H), rand(B, H))

    def step():
        with lltm.overrides.matmul(policy):
            return torch.autograd.grad(forward(), leaves, grads)
    return step


def step_graph_us(step, unroll=10):
    """GPU microseconds of one step(): directions.graph_us (median of CUDA-graph
    replays) of a graph of `unroll` steps, divided by `unroll`."""
    def steps():
        for _ in range(unroll):
            step()
    return graph_us(steps, replays=3, passes=5) / unroll


def kernels(step, n=5):
    """(us a step, launches a step, name) per kernel, largest first."""
    from torch.profiler import ProfilerActivity, profile
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            step()
        torch.cuda.synchronize()
    rows = [(e.device_time_total / n, e.count // n, e.key[:100]) for e in prof.key_averages()
            if e.device_type.name == "CUDA" and e.count]
    return sorted(rows, reverse=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shapes", nargs="*", help="BxH (default: the cell sweep's 15)")
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--kernels", action="store_true")
    args = parser.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes] or \
        [(b, h) for b in (1, 16, 64, 256, 1024) for h in (128, 512, 1024)]
    times = {}
    for dtype in (torch.float32, torch.bfloat16):
        for B, H in shapes:
            for _ in range(args.passes):
                for impl, policy in IMPLS:
                    us = step_graph_us(make_step(impl, policy, dtype, B, H // 2, H))
                    key = (dtype, B, H, impl, policy)
                    times[key] = min(times.get(key, us), us)
    if args.kernels:
        for dtype in (torch.float32, torch.bfloat16):
            for B, H in shapes:
                for impl, policy in (("native", "fused"), ("native", "cublas"),
                                     ("LSTMCell", "auto")):
                    print(f"## {str(dtype)[6:]} B{B} I{H // 2} H{H} {impl}[{policy}]")
                    for us, count, name in kernels(make_step(impl, policy, dtype, B, H // 2, H)):
                        print(f"  {us:8.2f} us x{count}  {name}")
    print(f"\n# {torch.cuda.get_device_name()}, torch {torch.__version__}; microseconds a step "
          "(CUDA-graph replay), I = H/2")
    print("| dtype | B | H | route | native | fused | cublas | reference | nn.LSTMCell | "
          "faster peer / native |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for dtype in (torch.float32, torch.bfloat16):
        for B, H in shapes:
            row = [times[(dtype, B, H, impl, policy)] for impl, policy in IMPLS]
            route = lltm.overrides.cell_route_in_force(dtype, B, H // 2, H)
            print(f"| {str(dtype)[6:]} | {B} | {H} | {route} | "
                  + " | ".join(f"{v:.1f}" for v in row) + f" | {min(row[3:]) / row[0]:.2f} |")


if __name__ == "__main__":
    main()
