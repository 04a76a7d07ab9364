"""A small model trained one step at a time, eager against torch.compile: it
steps a cell T times over its input and puts a linear head on the last
state; a training step is zero_grad, forward, cross-entropy, backward and an
SGD step. The cell is lltm.LLTMCell (native kernels), the tutorial's
Python LLTM (lltm.reference.LLTM), or "null": a cell of LLTMCell's
parameters and signature doing next to no work (two pointwise operations a
step), whose rows are what torch's machinery alone costs a model of this
structure (its graphs, their inputs, autograd, the optimizer). Rows:
  eager                   the whole step eager
  default, reduce-overhead
                          the model torch.compile'd (mode default, and
                          mode="reduce-overhead": CUDA graphs); loss,
                          backward() and the optimizer step eager
  step default, step reduce-overhead
                          the loss computed inside the compiled model (mode
                          default, and "reduce-overhead") and the optimizer
                          step compiled too (PyTorch's recipe for compiling
                          optimizers; mode default); backward() through the
                          autograd engine as always

    python dev/timing/compiled_model.py [--device cpu|cuda] [--size B,I,H] [--steps T]
                                        [--passes N] [--iters N] [--impl lltm,reference]

First, for each cell: the graphs and graph breaks torch._dynamo.explain finds
in the model's forward (with the loss), and one training step of every
compiled row against the eager one (loss and every parameter afterwards; a
row that fails it, or fails to run, is left out with its error printed, and
the tool exits with status 1 after the table). Then the timing: each row is
compiled, warmed up, and timed in passes of back-to-back training steps,
synchronized at the end of each pass; the rows' passes are interleaved, and each row reports the
median and the 10th percentile of its passes, in ms a step. What the
compilation logged about CUDA graphs ("skipping cudagraphs due to ...",
"disabling cudagraphs ...": the graph then runs without them) is collected
per row and printed, with inductor's count of skips. The table comes last.
"""
from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from pathlib import Path

import torch
import torch._dynamo
from torch._dynamo.utils import counters

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import lltm  # noqa: E402
from lltm import reference  # noqa: E402

# row: (torch.compile mode of the model, or None: eager; whole step compiled)
ROWS = {"eager": (None, False), "default": ("default", False),
        "reduce-overhead": ("reduce-overhead", False), "step default": ("default", True),
        "step reduce-overhead": ("reduce-overhead", True)}


class Model(torch.nn.Module):
    """T steps of ``cell`` over xs [T, B, I] from (h, c), then a linear head on h."""

    def __init__(self, cell: torch.nn.Module, hidden: int, steps: int, classes: int = 10):
        super().__init__()
        self.cell = cell
        self.head = torch.nn.Linear(hidden, classes)
        self.steps = steps

    def forward(self, xs, h, c, target=None):
        """Logits [B, classes]; with ``target``, their cross-entropy loss."""
        for t in range(self.steps):
            h, c = self.cell(xs[t], (h, c))
        logits = self.head(h)
        if target is None:
            return logits
        return torch.nn.functional.cross_entropy(logits, target)


class NullCell(torch.nn.Module):
    """LLTMCell's parameters and call, two pointwise operations a step: the
    floor under any cell's model."""

    def __init__(self, input_features: int, state_size: int):
        super().__init__()
        self.state_size = state_size
        self.weights = torch.nn.Parameter(
            0.1 * torch.randn(3 * state_size, input_features + state_size))
        self.bias = torch.nn.Parameter(torch.zeros(3 * state_size))

    def forward(self, input, state):
        h, c = state
        new_c = c + self.bias[:self.state_size]
        return new_c + self.weights[0, :self.state_size] * h, new_c


CELLS = {"lltm": lltm.LLTMCell, "reference": reference.LLTM, "null": NullCell}


def make_model(impl: str, I: int, H: int, steps: int, device) -> Model:
    torch.manual_seed(0)  # every model of one cell starts from the same parameters
    cell = CELLS[impl](I, H)
    return Model(cell, H, steps).to(device)


class SkipReasons(logging.Handler):
    """Keeps what torch logs about CUDA graphs being skipped or disabled."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record):
        msg = record.getMessage()
        if "cudagraph" in msg and ("skipping" in msg or "disabling" in msg):
            first = msg.strip().splitlines()[0]
            if first not in self.messages:
                self.messages.append(first)


def training_step(model, optimizer, xs, h0, c0, target, new_graph_step=False):
    """One training step: the loss computed outside ``model``, the optimizer
    eager. ``new_graph_step``: tell CUDA-graph trees that a new step begins
    (torch.compiler.cudagraph_mark_step_begin), as reduce-overhead wants."""
    def step():
        if new_graph_step:
            torch.compiler.cudagraph_mark_step_begin()
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(xs, h0, c0), target)
        loss.backward()
        optimizer.step()
        return loss
    return step


def whole_training_step(model, optimizer, xs, h0, c0, target, new_graph_step=False):
    """One training step: the loss computed inside ``model`` (compiled), the
    optimizer step compiled too (mode default: a CUDA-graphed optimizer step
    reading the model's CUDA-graph outputs fails in torch 2.11's CUDA-graph
    trees, "accessing tensor output of CUDAGraphs that has been overwritten")."""
    @torch.compile
    def optimizer_step():
        optimizer.step()

    def step():
        if new_graph_step:
            torch.compiler.cudagraph_mark_step_begin()
        optimizer.zero_grad(set_to_none=True)
        loss = model(xs, h0, c0, target)
        loss.backward()
        optimizer_step()
        return loss
    return step


def explain(impl, args, inputs) -> str:
    torch._dynamo.reset()
    model = make_model(impl, args.I, args.H, args.steps, args.device)
    result = torch._dynamo.explain(model)(*inputs)  # (with the target: the loss too)
    reasons = "; ".join(str(r.reason).splitlines()[0][:160] for r in result.break_reasons)
    torch._dynamo.reset()
    return (f"{impl}: {result.graph_count} graph(s), {result.graph_break_count} graph break(s)"
            + (f": {reasons}" if reasons else ""))


def check_one_step(impl, mode, step, model, eager_loss, eager_params) -> None:
    """One training step of ``model`` (through ``step``) against the eager one's."""
    loss = step()
    tol = {"rtol": 1e-4, "atol": 1e-5}
    torch.testing.assert_close(loss, eager_loss, **tol,
                               msg=lambda m: f"{impl} {mode}: loss differs from eager: {m}")
    for (name, p), want in zip(model.named_parameters(), eager_params):
        torch.testing.assert_close(p, want, **tol, msg=lambda m, name=name:
                                   f"{impl} {mode}: {name} after one step differs: {m}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--size", default="16,32,128", help="B,I,H")
    parser.add_argument("--steps", type=int, default=10, help="cell steps in the model")
    parser.add_argument("--passes", type=int, default=15)
    parser.add_argument("--iters", type=int, default=0,
                        help="training steps a pass (default: 50 on cuda, 10 on cpu)")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--impl", default="lltm,reference",
                        help="of: " + ", ".join(CELLS))
    parser.add_argument("--rows", default=",".join(ROWS),
                        help="of: " + ", ".join(ROWS) + " (eager is always run)")
    args = parser.parse_args()
    args.device = torch.device(args.device)
    args.B, args.I, args.H = (int(v) for v in args.size.split(","))
    iters = args.iters or (50 if args.device.type == "cuda" else 10)
    impls = args.impl.split(",")
    for impl in impls:
        if impl not in CELLS:
            parser.error(f"unknown cell {impl!r}; cells: {', '.join(CELLS)}")
    labels = ["eager"] + [r for r in args.rows.split(",") if r != "eager"]
    for label in labels:
        if label not in ROWS:
            parser.error(f"unknown row {label!r}; rows: {', '.join(ROWS)}")
    cuda = args.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    where = (f" ({torch.cuda.get_device_name()})" if cuda
             else f", {torch.get_num_threads()} threads")
    print(f"torch {torch.__version__}, {args.device}{where}"
          + f"; B={args.B} I={args.I} H={args.H}, {args.steps} cell steps, linear head, SGD")

    g = torch.Generator().manual_seed(1)
    inputs = tuple(torch.randn(*s, generator=g).to(args.device) for s in
                   ((args.steps, args.B, args.I), (args.B, args.H), (args.B, args.H)))
    target = torch.randint(0, 10, (args.B,), generator=g).to(args.device)

    for impl in impls:
        print(explain(impl, args, inputs + (target,)))

    skip_log = SkipReasons()
    torch._logging.set_logs(cudagraphs=True, perf_hints=True)
    # torch's loggers that stop propagation (torch, torch._inductor, ...) each
    # get the collector; their own handlers, which would print every record of
    # these logs, only errors
    for name in list(logging.root.manager.loggerDict):
        logger = logging.getLogger(name)
        if name.split(".")[0] == "torch" and not logger.propagate:
            for handler in logger.handlers:
                handler.setLevel(logging.ERROR)
            logger.addHandler(skip_log)

    torch._dynamo.reset()
    # every row compiles Model.forward anew (guarded on its model): room for all
    for limit in ("recompile_limit", "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, limit):
            setattr(torch._dynamo.config, limit, max(64, getattr(torch._dynamo.config, limit)))
    rows, skips, skip_counts, failed = {}, {}, {}, {}
    for impl in impls:
        model = make_model(impl, args.I, args.H, args.steps, args.device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        eager_loss = training_step(model, optimizer, *inputs, target)().detach().clone()
        eager_params = [p.detach().clone() for p in model.parameters()]
        for label in labels:
            mode, whole_step = ROWS[label]
            skip_log.messages = []
            before = counters["inductor"]["cudagraph_skips"]
            model = make_model(impl, args.I, args.H, args.steps, args.device)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
            run = model if mode is None else torch.compile(
                model, mode=None if mode == "default" else mode)
            step = (whole_training_step if whole_step else training_step)(
                run, optimizer, *inputs, target, new_graph_step=mode == "reduce-overhead")
            try:
                check_one_step(impl, label, step, model, eager_loss, eager_params)
                for _ in range(args.warmup):
                    step()
                sync()
            except Exception as exc:  # the row is left out; the others are timed
                failed[impl, label] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                print(f"{impl} {label}: FAILED, left out: {failed[impl, label]}")
                continue
            finally:
                skips[impl, label] = skip_log.messages
                skip_counts[impl, label] = counters["inductor"]["cudagraph_skips"] - before
            rows[impl, label] = (step, [])
    print("checked: one training step of every compiled row timed equals the eager one's "
          "(loss and parameters, rtol 1e-4)")

    names = list(rows)
    for r in range(args.passes):
        for key in names[r % len(names):] + names[:r % len(names)]:
            step, samples = rows[key]
            sync()
            start = time.perf_counter_ns()
            for _ in range(iters):
                step()
            sync()
            samples.append((time.perf_counter_ns() - start) / 1e6 / iters)

    for key in skips:
        if skips[key] or skip_counts[key]:
            print(f"{key[0]} {key[1]}: {skip_counts[key]} cudagraph skip(s): "
                  + (" | ".join(skips[key]) or "no reason logged (inductor logs none on "
                                                "the CPU)"))
    print(f"\nms a training step, median [p10] of {args.passes} passes of {iters} steps")
    compiled = labels[1:]
    print("| cell | " + " | ".join(labels) + " | " + " | ".join(
        f"{m} / eager" for m in compiled) + " |")
    print("|---" * (1 + 2 * len(labels) - 1) + "|")
    for impl in impls:
        med = {m: statistics.median(rows[impl, m][1]) for m in labels if (impl, m) in rows}
        p10 = {m: sorted(rows[impl, m][1])[len(rows[impl, m][1]) // 10] for m in med}
        cells = [f"{med[m]:.3f} [{p10[m]:.3f}]" if m in med else "failed" for m in labels]
        ratios = [f"{med[m] / med['eager']:.2f}" if m in med and "eager" in med else "-"
                  for m in compiled]
        print(f"| {impl} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
