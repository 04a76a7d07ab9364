"""Host-time floors of one forward+backward step, to tell what a custom op
registered from C (autograd in Python: the stable C ABI has no autograd API)
can reach against the reference at small sizes.

    python dev/timing/host_floor.py [--device cpu|cuda] [--sizes B,I,H ...]

Rows, each a median of interleaved passes of back-to-back steps
(torch.autograd.grad of fixed output gradients, synchronized at the end):
  function_floor  an autograd.Function whose forward and backward do almost
                  nothing (two clones; saves 5 tensors, returns 5 gradients):
                  the cost of the Python autograd machinery alone
  cpp_floor       one torch.mm through autograd: a C++ node, no Python
  native_ops      the two operators' own time: lltm::_cell_forward then
                  lltm::_cell_backward (the autograd-free twins, which
                  compiled graphs and the autograd formulas call), no autograd
  native_ops_public
                  the public lltm::cell_forward then lltm::cell_backward on
                  tensors needing no gradient: the same plus the operators'
                  Python autograd kernel, entered on every call
  native          lltm.functional.lltm_cell (what users call)
  reference       the tutorial's Python LLTM
and with --single-thread, the same steps with
torch.autograd.set_multithreading_enabled(False) ("*_1thread"): on CUDA
the engine then runs the backward on the calling thread instead of handing
it to its device thread and waiting to be handed it back, which is what the
difference measures. (Users get the default, multithreaded engine; the
benchmark times that.) Each size's line ends with the host time of the cell
above the floor, (native - function_floor) / native_ops: what lltm's autograd
glue adds over an autograd.Function that does nothing, in units of the
operators' own time; of the medians, and of the 10th percentiles (steadier
on a noisy host).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import lltm  # noqa: E402
from lltm import reference  # noqa: E402


class Floor(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, W, b, h, c):
        ctx.save_for_backward(x, W, b, h, c)
        return h.clone(), c.clone()

    @staticmethod
    def backward(ctx, gh, gc):
        x, W, b, h, c = ctx.saved_tensors
        return x, W, b, gh, gc


def cases(device, B, I, H):
    def leaf(*shape):
        return (torch.randn(*shape, device=device) * 0.5).requires_grad_()
    x, W, b, h, c = leaves = (leaf(B, I), leaf(3 * H, I + H), leaf(3 * H), leaf(B, H), leaf(B, H))
    gh, gc = torch.randn(B, H, device=device), torch.randn(B, H, device=device)
    grad = torch.autograd.grad
    plain = [t.detach() for t in leaves]

    def ops(fwd, bwd):
        def run():
            new_h, new_c, gates = fwd(*plain)
            bwd(gh, gc, new_c, gates, plain[0], plain[3], plain[1])
        return run

    hh = leaf(B, B)
    return {
        "function_floor": lambda: grad(Floor.apply(*leaves), leaves, (gh, gc)),
        "cpp_floor": lambda: grad(torch.mm(hh, hh), (hh,), (torch.ones_like(hh),)),
        "native_ops": ops(torch.ops.lltm._cell_forward.default,
                          torch.ops.lltm._cell_backward.default),
        "native_ops_public": ops(torch.ops.lltm.cell_forward.default,
                                 torch.ops.lltm.cell_backward.default),
        "native": lambda: grad(lltm.functional.lltm_cell(*leaves), leaves, (gh, gc)),
        "reference": lambda: grad(reference.lltm_cell(*leaves), leaves, (gh, gc)),
    }


def single_threaded(step):
    def run():
        with torch.autograd.set_multithreading_enabled(False):
            step()
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--sizes", nargs="*", default=["1,1,1", "16,32,128"])
    parser.add_argument("--passes", type=int, default=15)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--single-thread", action="store_true",
                        help="add each autograd step with the engine's multithreading off")
    args = parser.parse_args()
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    print(f"torch {torch.__version__}, {device}, median us per step of {args.passes} passes")
    for size in args.sizes:
        B, I, H = (int(v) for v in size.split(","))
        table = cases(device, B, I, H)
        if args.single_thread:
            table.update({f"{name}_1thread": single_threaded(step) for name, step in
                          list(table.items()) if not name.startswith("native_ops")})
        samples = {name: [] for name in table}
        for name, f in table.items():  # warm-up
            for _ in range(20):
                f()
        sync()
        for r in range(args.passes):
            names = list(table)
            names = names[r % len(names):] + names[:r % len(names)]
            for name in names:
                f = table[name]
                sync()
                start = time.perf_counter_ns()
                for _ in range(args.steps):
                    f()
                sync()
                samples[name].append((time.perf_counter_ns() - start) / 1e3 / args.steps)
        median = {name: statistics.median(v) for name, v in samples.items()}
        p10 = {name: sorted(v)[len(v) // 10] for name, v in samples.items()}

        def glue(q):
            return (q["native"] - q["function_floor"]) / q["native_ops"]
        print(f"B={B} I={I} H={H}: " + ", ".join(
            f"{name} {m:.1f}" for name, m in median.items())
              + f"; (native - function_floor) / native_ops {glue(median):.2f} "
                f"(of the 10th percentiles: {glue(p10):.2f})")


if __name__ == "__main__":
    main()
