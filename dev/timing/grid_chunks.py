"""GPU time (CUDA-graph replay) of one forward+backward step of one LLTM layer
in the grid family's two chunk sizes, against the library's own choice and
cuDNN's nn.LSTM of the same sizes (float32 on TF32, torch's default), T=100,
I = H/2, every input and parameter's gradient.

    python3 dev/timing/grid_chunks.py [--shapes B,H ...] [--dtypes float32,bfloat16]

Rows: "auto" (the library's plan, named in the last column), "grid/16" and
"grid/4" (the grid family in 16- and 4-row chunks, its cheapest layout of
each), cuDNN. Each forced plan's outputs and gradients are compared with the
library's choice first (float32: 1e-4 of the largest value, bfloat16: 3e-2).
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import lltm  # noqa: E402
from directions import graph_us, make_step  # noqa: E402

PLANS = {"auto": {}, "grid/16": dict(family="grid", grid_chunk=16),
         "grid/4": dict(family="grid", grid_chunk=4)}
SHAPES = ["1,256", "16,256", "32,256", "64,256", "1,512", "16,512", "1,1024", "4,1024"]


def describe(plan):
    if plan is None:
        return "-"
    if plan["family"] != "grid" and plan["family"] != "cluster":
        return plan["family"]
    f = plan["forward"]
    return (f"{plan['family']} {f['lanes']}x{f['values']} chunk {f['chunk']} "
            f"groups {f['groups']}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="*", default=SHAPES, metavar="B,H")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--seq-len", type=int, default=100)
    args = parser.parse_args()
    T = args.seq_len
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, T={T}, I=H/2, "
          "us of GPU time a forward+backward (graph replay, median)")
    rows = []
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        tol = 1e-4 if dtype == torch.float32 else 3e-2
        for shape in args.shapes:
            B, H = map(int, shape.split(","))
            I = H // 2
            torch.manual_seed(0)
            module = lltm.LLTM(I, H, device="cuda", dtype=dtype)
            lstm = torch.nn.LSTM(I, H, device="cuda", dtype=dtype)
            x = (torch.randn(T, B, I) * 0.5).cuda().to(dtype)
            times, results = {}, {}
            for name, plan in PLANS.items():
                with lltm.overrides.sequence_plan(**plan):
                    chosen = describe(lltm.overrides.sequence_plan_in_force(dtype, T, B, I, H))
                    if chosen == "-":
                        times[name] = (None, "does not fit")
                        continue
                    step, _ = make_step(module, x, 1, H)
                    results[name] = [g.float() for g in step()]
                    times[name] = (graph_us(step), chosen)
            base = results["auto"]
            for name, got in results.items():
                scale = max(float(g.abs().max()) for g in base)
                err = max(float((a - b).abs().max()) for a, b in zip(got, base)) / scale
                if err > tol:
                    raise SystemExit(f"{dtype_name} B={B} H={H}: {name} differs from the "
                                     f"library's choice by {err:.2e} of the largest value")
            step, _ = make_step(lstm, x, 1, H)
            cudnn = graph_us(step)
            for name, (us, chosen) in times.items():
                rows.append((dtype_name, B, H, name, us, cudnn, chosen))
    print(f"{'dtype':9} {'B':>5} {'H':>5} {'plan':8} {'lltm us':>9} {'cuDNN us':>9} "
          f"{'vs cuDNN':>8}  plan run")
    for dtype_name, B, H, name, us, cudnn, chosen in rows:
        ratio = f"{cudnn / us:.2f}x" if us else "-"
        lltm_us = f"{us:,.0f}" if us else "-"
        print(f"{dtype_name:9} {B:5} {H:5} {name:8} {lltm_us:>9} {cudnn:9,.0f} {ratio:>8}  "
              f"{chosen}")


if __name__ == "__main__":
    main()
