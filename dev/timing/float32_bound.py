"""How fast any float32-accurate LLTM could be against cuDNN's nn.LSTM on
TF32, at torch's default settings: a bound from the products alone.

At torch's defaults cuDNN's float32 LSTM runs its products on TF32 tensor
cores (``torch.backends.cudnn.allow_tf32``, on), while lltm's float32
products follow ``torch.backends.cuda.matmul.allow_tf32`` (off): they are
formed in full float32 (FFMA), since the LLTM's cell state only accumulates
and drifts 1e-2 - 5e-2 from float64 over 100 steps on TF32
(docs/performance.md, "float32 at like precision").

Whatever its recurrence costs, a forward + backward of L LLTM layers over T
steps runs these products, each at least as long as when all T x B rows go
through one matrix product (no time dependence at all):

    per layer l (input width I_l = I for the first, H above it):
      forward gates   [T B, I_l + H] x [I_l + H, 3H]
      input grads     [T B, 3H] x [3H, I_l + H]
      weight grads    [3H, T B] x [T B, I_l + H]

Those three products per layer, by CUDA-graph replay in full float32 (cuBLAS,
TF32 off), are the floor; cuDNN's graph time of the same forward + backward
over it is the highest GPU-time ratio that any LLTM with float32 products can
reach there. Also printed: the floor with the products on TF32 (1xTF32, what
cuDNN computes with), and three times it, what the 3xTF32 split (float32
accuracy from three TF32 products a product) would cost at best. lltm.LLTM's
own time (default settings) and its ratio stand beside the bound; lltm's
results are checked against its float64 run first (WRONG above the
benchmark's float32 tolerance, 1e-4).

    python3 dev/timing/float32_bound.py [--shapes 256x512,1024x1024] [--layers 1,3] [--T 100]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from lltm.bench.runner import tf32_setting  # noqa: E402
from wavefront_timing import (error_limit, graph_time, lltm_case, lstm_case, max_error,  # noqa: E402
                              parse_shapes)

DEFAULT_SHAPES = ("16x2048,64x1024,64x2048,256x256,256x512,256x1024,256x2048,"
                  "1024x256,1024x512,1024x1024")


def products(T, B, H, L, tf32: bool):  # noqa: E741
    """A step running the float32 products of L layers' forward + backward,
    every product over all T x B rows at once."""
    I = H // 2  # noqa: E741
    g = torch.Generator(device="cuda").manual_seed(0)
    mats = []
    for layer in range(L):
        k = (I if layer == 0 else H) + H
        X = torch.randn(T * B, k, device="cuda", generator=g)
        W = torch.randn(3 * H, k, device="cuda", generator=g) / k ** 0.5
        dG = torch.randn(T * B, 3 * H, device="cuda", generator=g)
        mats.append((X, W, dG, torch.empty(T * B, 3 * H, device="cuda"),
                     torch.empty(T * B, k, device="cuda"), torch.empty(3 * H, k, device="cuda")))

    def step():
        with tf32_setting("on" if tf32 else "off"):
            for X, W, dG, G, dX, dW in mats:
                torch.mm(X, W.t(), out=G)
                torch.mm(dG, W, out=dX)
                torch.mm(dG.t(), X, out=dW)
    return step


def peak_tflops(tf32: bool) -> float:
    """The rate of one large square float32 product (8192^3), TFLOP/s."""
    n = 8192
    a, b = torch.randn(n, n, device="cuda"), torch.randn(n, n, device="cuda")
    c = torch.empty(n, n, device="cuda")

    def step():
        with tf32_setting("on" if tf32 else "off"):
            torch.mm(a, b, out=c)
    return 2 * n ** 3 / graph_time(step, 5, 5) / 1e6


def replays_for(us: float) -> int:
    return max(1, min(50, int(100_000 / max(us, 1.0))))


def timed(step) -> float:
    first = graph_time(step, 1, 1)
    return graph_time(step, 5, replays_for(first))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default=DEFAULT_SHAPES, help="BxH,... (I = H/2)")
    p.add_argument("--layers", default="1,3")
    p.add_argument("--T", type=int, default=100)
    args = p.parse_args(argv)
    assert torch.cuda.is_available(), "needs a CUDA GPU"
    assert torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32, \
        "run at torch's default TF32 settings"
    T = args.T
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN "
          f"{torch.backends.cudnn.version()}, T={T}, I=H/2, float32, torch's default TF32 settings")
    print(f"# one 8192^3 product: float32 {peak_tflops(False):.1f} TFLOP/s, "
          f"TF32 {peak_tflops(True):.1f} TFLOP/s")
    print("| L | B | H | cuDNN graph us | lltm graph us | lltm ratio | float32 products us "
          "| bound ratio | TF32 products us | 3 x TF32 bound ratio | lltm error |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    wrong, limit = 0, error_limit(torch.float32, 0.0)
    for L in (int(v) for v in args.layers.split(",")):  # noqa: E741
        for B, H in parse_shapes(args.shapes):
            step, outputs, oracle = lltm_case(B, H, T, L, torch.float32)
            error = max_error(outputs(), oracle())
            wrong += error > limit
            lltm_us = timed(step)
            del step, outputs, oracle
            cudnn_us = timed(lstm_case(B, H, T, L, torch.float32))
            f32_us = timed(products(T, B, H, L, tf32=False))
            tf32_us = timed(products(T, B, H, L, tf32=True))
            mark = " WRONG" if error > limit else ""
            print(f"| {L} | {B} | {H} | {cudnn_us:,.0f} | {lltm_us:,.0f} | {cudnn_us / lltm_us:.2f} "
                  f"| {f32_us:,.0f} | **{cudnn_us / f32_us:.2f}** | {tf32_us:,.0f} "
                  f"| {cudnn_us / (3 * tf32_us):.2f} | {error:.1e}{mark} |", flush=True)
            torch.cuda.empty_cache()
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
