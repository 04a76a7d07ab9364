"""The LLTM benchmark: ``python -m lltm.bench`` (``--help`` lists the options).

The PyTorch C++ extension tutorial's comparison, done so that its numbers mean
something: every implementation is checked before it is timed, the GPU is
synchronized, implementations are interleaved, and medians with their spread
are reported.

Implementations, on every device asked for (CPU, and CUDA where present):

  cell, one step of B rows (ratios against ``reference``)
    reference           the tutorial's Python LLTM, gradients by autograd
    reference_function  the tutorial's autograd.Function with its hand-written backward
    native              lltm.functional.lltm_cell: our C / CUDA kernels
    compile             torch.compile(reference), default mode, static shapes
    lstm_cell           torch.nn.LSTMCell: NOT an LLTM (4 gates, 33% more math),
                        the peer a user would pick instead
  sequence, T steps (ratios against ``reference_loop`` and ``lstm``)
    lltm                lltm.LLTM: the whole sequence in one call
    lstm                torch.nn.LSTM (cuDNN on CUDA): NOT an LLTM, the peer
    native_loop         a Python loop of native cells
    reference_loop      a Python loop of reference cells

What is timed, in microseconds, median and [p10-p90] of the samples:

  forward   one forward call (autograd recording), synchronized before and after
  backward  torch.autograd.grad of the outputs with fixed random output
            gradients; the forward before it is not timed
  step      forward + backward, N times back to back with no synchronization
            inside the loop, synchronized at the end, divided by N; N covers
            at least 20 ms (estimated from the pass's synchronized forward
            and backward), so the final synchronization is amortized
  graph     CUDA only: forward, backward and step captured in one CUDA graph
            (several iterations unrolled) and replayed between CUDA events:
            the GPU's time without the host's launch cost. "n/a" says why
            where capture fails.

Within a configuration the implementations take turns pass by pass (each
pass starts with a different one), so drift of the machine hits all alike.

Checks: before timing, outputs and gradients (of the input, the state and
every parameter) are compared with a float64 CPU oracle: the reference LLTM for
the LLTM implementations, and their own float64 counterpart for the LSTM
peers (the LSTM formula). The error of a tensor is max|got - want| / max|want|;
the largest over all tensors must be within the tolerance of the dtype
(``TOLERANCE``: 1e-9 float64, 1e-4 float32, 1e-2 float32 on TF32). In float16
and bfloat16 the bar is the larger of ``TOLERANCE`` and twice the error of the
reference (or the loop of reference cells) run in that dtype: as accurate as
plain PyTorch, or better. A wrong implementation is reported WRONG and not
timed; one that raises (an unsupported dtype, a compiler missing) is reported
ERROR with the reason.

The table is printed last; ``--json`` saves every number with a description of
the machine, ``--plot`` a PNG (bars per implementation, log scale). ``--layers``
stacks the sequences (lltm.LLTM and nn.LSTM with num_layers, loops of cells).
``--tf32 off`` / ``--tf32 on`` set both of torch's TF32 flags for the run
(aten::mm's, which lltm's float32 products follow, and cuDNN's, on by default),
so that float32 compares like precision with like; the tables' first line and
the machine record say which held.

The performance map, ``--sweep`` (``lltm/bench/sweep.py``): lltm.LLTM against
nn.LSTM (cuDNN on CUDA; its float32 on TF32, torch's default) over B in
1,16,64,256,1024 x H in 64..2048, I = H/2, T = 100, 1 and 3 layers, and the
native cell against the reference and nn.LSTMCell (H in 128,512,1024); float32
and bfloat16 on CUDA, float32 on CPU. Every shape is checked as above (the
oracle then runs on the benchmarked device, checkpointed step by step, so that
it fits where the implementations do); a WRONG or ERROR implementation is
shown so, not timed. Per shape: the GPU time of forward + backward from CUDA-
graph replay (the headline on CUDA) and the eager pipelined step (the only
figure on CPU); ratio = the peer's time / lltm's (>1: lltm faster). Sampling is
sized by a time budget per shape (``--sweep-budget-ms``); shapes run cheapest
first and are skipped, with a note, above ``--sweep-max-gib`` or where they
would end past ``--sweep-time-limit`` (540 s). Restrict the grid with
``--sweep-batches``, ``--sweep-hidden``, ``--dtype``, ``--layers``,
``--sweep-kind``; ``--sweep-quick`` (or ``--quick``) runs B 1,16,64 x H
64,128,256 (cells 128,512) at T = 20. Out: tables (ratios per B x H, a block per
kind, dtype and depth), ``--json`` (every number, the machine), and with
``--sweep-out DIR`` heatmaps of the headline ratio (against nn.LSTM; for cells
against the faster of reference and nn.LSTMCell), a diverging colour map centred
at 1 with each ratio printed, titled with the GPU (or CPU), date, commit and
float32's TF32 flags, and DIR/sweep.json.

Every route of the CUDA library, ``--sweep --sweep-variants``
(``lltm/bench/variants.py``): per shape (B in 1..1024, nine values; H in
64..2048, cells 128, 512, 1024; T = 100, and 20 and 1000 at a few shapes; one
layer), each sequence plan family and grid layout forced through
``lltm.overrides`` beside the library's own choice, cuDNN and the loop of
reference cells, and the cell's two matrix-product routes beside its choice,
the reference and nn.LSTMCell; each checked, then its GPU time by CUDA-graph
replay, with the plan it ran. The data behind the library's rules
(``csrc/core/lltm_cuda_rules.c``); DIR/variants.json with ``--sweep-out DIR``.
"""
from __future__ import annotations

from .cases import (DTYPES, TOLERANCE, Case, Impl, Workload, check, default_impls,
                    lltm_cell_impl, lltm_loop_impl)
from .runner import build_parser, main
from .timing import GRAPH_METRICS, METRICS

__all__ = ["DTYPES", "GRAPH_METRICS", "METRICS", "TOLERANCE", "Case", "Impl", "Workload",
           "build_parser", "check", "default_impls", "lltm_cell_impl", "lltm_loop_impl", "main"]
