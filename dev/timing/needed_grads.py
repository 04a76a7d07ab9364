"""What skipping unneeded gradients buys the cell on the CPU: one step
(forward, then torch.autograd.grad with respect to weights and bias) where
the input and the state need no gradient, interleaved:
  reference            the tutorial's Python LLTM
  lltm                 lltm.functional.lltm_cell: the backward's output_mask
                       leaves out grad_input and grad_old_h (no dX products)
  lltm_full_backward   the same step with input and state requiring grad
                       (every product runs, as without the mask)
Minimum, 10th percentile and median of many short samples: on a shared
machine the low percentiles are the least disturbed.

    python dev/timing/needed_grads.py [THREADS]
"""
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import lltm  # noqa: E402
from lltm import reference  # noqa: E402

threads = int(sys.argv[1]) if len(sys.argv) > 1 else torch.get_num_threads()
torch.set_num_threads(threads)
for B, I, H in ((16, 32, 128), (64, 256, 512)):
    steps = 20 if B == 16 else 2
    def leaves(grad_data):
        g = torch.Generator().manual_seed(0)
        r = lambda *s: torch.randn(*s, generator=g) * 0.5
        x, h, c = (r(B, I).requires_grad_(grad_data), r(B, H).requires_grad_(grad_data),
                   r(B, H).requires_grad_(grad_data))
        W, b = r(3 * H, I + H).requires_grad_(), r(3 * H).requires_grad_()
        return x, W, b, h, c
    gh, gc = torch.randn(B, H), torch.randn(B, H)
    def case(fn, grad_data):
        x, W, b, h, c = leaves(grad_data)
        return lambda: torch.autograd.grad(fn(x, W, b, h, c), (W, b), (gh, gc))
    table = {"reference": case(reference.lltm_cell, False),
             "lltm": case(lltm.functional.lltm_cell, False),
             "lltm_full_backward": case(lltm.functional.lltm_cell, True)}
    for f in table.values():
        for _ in range(20): f()
    samples = {n: [] for n in table}
    for r in range(150 if B == 16 else 60):
        for n in (list(table)[r % 3:] + list(table)[:r % 3]):
            t0 = time.perf_counter_ns()
            for _ in range(steps): table[n]()
            samples[n].append((time.perf_counter_ns() - t0) / 1e3 / steps)
    q = {n: (min(v), sorted(v)[len(v) // 10], statistics.median(v)) for n, v in samples.items()}
    print(f"B={B} I={I} H={H}, {threads} thread(s): " + "; ".join(
        f"{n} min {a:.0f} p10 {b:.0f} median {c:.0f}" for n, (a, b, c) in q.items()))
    for k in ("lltm", "lltm_full_backward"):
        print(f"  reference / {k}: min {q['reference'][0] / q[k][0]:.2f}x, "
              f"p10 {q['reference'][1] / q[k][1]:.2f}x, median {q['reference'][2] / q[k][2]:.2f}x")
