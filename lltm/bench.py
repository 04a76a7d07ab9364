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
            inside the loop, synchronized at the end, divided by N
  graph     CUDA only: forward, backward and step captured in one CUDA graph
            (several iterations unrolled) and replayed between CUDA events:
            the GPU's time without the host's launch cost. "n/a" says why
            where capture fails.

Within a configuration the implementations take turns round by round (each
round starts with a different one), so drift of the machine hits all alike.

Checks: before timing, outputs and gradients (of the input, the state and
every parameter) are compared with a float64 CPU oracle: the reference LLTM for
the LLTM implementations, and their own float64 counterpart for the LSTM
peers. The error of a tensor is max|got - want| / max|want|; the largest over
all tensors must be within the tolerance of the dtype (``TOLERANCE``). A wrong
implementation is reported WRONG and not timed; one that raises (an
unsupported dtype, a compiler missing) is reported ERROR with the reason.

The table is printed last; ``--json`` saves every number with a description of
the machine, ``--plot`` a PNG (bars per implementation, log scale).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Callable, Sequence

import torch

import lltm
from lltm import functional, reference

DTYPES = {"float32": torch.float32, "float64": torch.float64,
          "bfloat16": torch.bfloat16, "float16": torch.float16}

# Largest accepted max|got - want| / max|want| against the float64 oracle.
TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4, torch.float16: 1e-2,
             torch.bfloat16: 5e-2}
# float32 products that run on TF32 tensor cores (cuDNN RNNs by default) keep
# 10 mantissa bits, as float16 does.
TF32_TOLERANCE = 1e-2

DEFAULT_SIZES = "16,32,128;64,256,512"
METRICS = ("forward", "backward", "step")
GRAPH_METRICS = ("graph_forward", "graph_backward", "graph_step")
CELL_BASELINES = ("reference",)
SEQUENCE_BASELINES = ("reference_loop", "lstm")


# ----------------------------------------------------------------------------
# Workloads: one configuration, its random data and its float64 oracle.

@dataclasses.dataclass
class Workload:
    """One configuration: device, dtype, cell or sequence, sizes."""
    device: torch.device
    dtype: torch.dtype
    kind: str                  # "cell" | "sequence"
    B: int
    I: int
    H: int
    T: int = 1

    def __post_init__(self):
        self._data: dict[str, torch.Tensor] = {}
        self._oracles: dict[str, tuple] = {}

    @property
    def name(self) -> str:
        dtype = str(self.dtype).replace("torch.", "")
        size = f"B={self.B} I={self.I} H={self.H}" + (f" T={self.T}" if self.kind == "sequence" else "")
        return f"{self.device} {dtype} {self.kind} {size}"

    def data(self, name: str) -> torch.Tensor:
        """A float64 CPU tensor of this workload, random, the same on every
        device and dtype (seeded by the sizes)."""
        if not self._data:
            self._make_data()
        return self._data[name]

    def _make_data(self) -> None:
        B, I, H, T = self.B, self.I, self.H, self.T
        g = torch.Generator().manual_seed(1000003 * B + 1009 * I + 17 * H + T)

        def randn(*shape, scale=1.0):
            return torch.randn(*shape, generator=g, dtype=torch.float64) * scale

        def uniform(*shape, bound):
            return (torch.rand(*shape, generator=g, dtype=torch.float64) * 2 - 1) * bound

        bound = 1.0 / math.sqrt(H)  # the modules' own initialisation
        x_shape = (B, I) if self.kind == "cell" else (T, B, I)
        self._data = {
            "x": randn(*x_shape), "h": randn(B, H, scale=0.5), "c": randn(B, H, scale=0.5),
            "W": uniform(3 * H, I + H, bound=bound), "b": uniform(3 * H, bound=bound),
            "w_ih": uniform(4 * H, I, bound=bound), "w_hh": uniform(4 * H, H, bound=bound),
            "b_ih": uniform(4 * H, bound=bound), "b_hh": uniform(4 * H, bound=bound),
            "grad_h": randn(B, H), "grad_c": randn(B, H),
            "grad_out": randn(T, B, H) if self.kind == "sequence" else randn(B, H),
        }

    def leaf(self, name: str, shape=None) -> torch.Tensor:
        """The data in this workload's device and dtype, requiring grad."""
        t = self.data(name)
        if shape is not None:
            t = t.reshape(shape)
        return t.to(device=self.device, dtype=self.dtype).requires_grad_()

    def grads_out(self, *names: str, state_shape=None) -> tuple[torch.Tensor, ...]:
        """Output gradients; those of the final state ("grad_h", "grad_c")
        reshaped to ``state_shape`` when given (nn.LSTM's [layers, B, H])."""
        def get(name):
            t = self.data(name)
            if state_shape is not None and name in ("grad_h", "grad_c"):
                t = t.reshape(state_shape)
            return t.to(device=self.device, dtype=self.dtype)
        return tuple(get(n) for n in names)

    def oracle(self, key: str, compute: Callable[["Workload"], tuple]) -> tuple:
        """(outputs, gradients) in float64 on the CPU, computed once per key."""
        if key not in self._oracles:
            self._oracles[key] = compute(self)
        return self._oracles[key]


def _outputs_and_grads(forward, leaves, grad_outputs):
    outputs = forward()
    grads = torch.autograd.grad(outputs, leaves, grad_outputs)
    return [o.detach() for o in outputs], list(grads)


def _cpu64(w: Workload, *names):
    return [w.data(n).clone().requires_grad_() for n in names]


def _lltm_sequence_loop(cell, x, W, b, h, c):
    outputs = []
    for t in range(x.shape[0]):
        h, c = cell(x[t], W, b, h, c)
        outputs.append(h)
    return torch.stack(outputs), h, c


def lltm_cell_oracle(w: Workload):
    x, W, b, h, c = leaves = _cpu64(w, "x", "W", "b", "h", "c")
    return _outputs_and_grads(lambda: reference.lltm_cell(x, W, b, h, c), leaves,
                              (w.data("grad_h"), w.data("grad_c")))


def lltm_sequence_oracle(w: Workload):
    x, W, b, h, c = leaves = _cpu64(w, "x", "W", "b", "h", "c")
    return _outputs_and_grads(lambda: _lltm_sequence_loop(reference.lltm_cell, x, W, b, h, c),
                              leaves, (w.data("grad_out"), w.data("grad_h"), w.data("grad_c")))


def _lstm_step(x, h, c, w_ih, w_hh, b_ih, b_hh):
    """torch.nn.LSTMCell's documented formula."""
    gates = x @ w_ih.t() + b_ih + h @ w_hh.t() + b_hh
    i, f, g, o = gates.chunk(4, dim=1)
    new_c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.tanh(new_c) * torch.sigmoid(o), new_c


_LSTM_DATA = ("x", "h", "c", "w_ih", "w_hh", "b_ih", "b_hh")


def lstm_cell_oracle(w: Workload):
    x, h, c, *params = leaves = _cpu64(w, *_LSTM_DATA)
    return _outputs_and_grads(lambda: _lstm_step(x, h, c, *params), leaves,
                              (w.data("grad_h"), w.data("grad_c")))


def lstm_sequence_oracle(w: Workload):
    x, h0, c0, *params = leaves = _cpu64(w, *_LSTM_DATA)

    def forward():
        h, c, outputs = h0, c0, []
        for t in range(x.shape[0]):
            h, c = _lstm_step(x[t], h, c, *params)
            outputs.append(h)
        return torch.stack(outputs), h, c
    return _outputs_and_grads(forward, leaves,
                              (w.data("grad_out"), w.data("grad_h"), w.data("grad_c")))


# ----------------------------------------------------------------------------
# Implementations: each builds a Case (what to run) for a workload.

@dataclasses.dataclass
class Case:
    forward: Callable[[], Sequence[torch.Tensor]]
    leaves: list[torch.Tensor]           # gradients are taken with respect to these
    grad_outputs: tuple[torch.Tensor, ...]
    expected: tuple                      # (outputs, gradients): float64 CPU, same order
    uses_cudnn: bool = False             # float32 may then run on TF32
    setup_s: float | None = None         # e.g. compilation time
    note: str = ""


@dataclasses.dataclass
class Impl:
    key: str
    label: str
    kind: str                                   # "cell" | "sequence"
    build: Callable[[Workload], Case]
    available: Callable[[Workload], str | None] = lambda w: None  # reason to skip, or None
    note: str = ""
    graph_unroll: int = 10                      # iterations per CUDA graph replay


def lltm_cell_impl(key: str, label: str, cell_fn, note: str = "") -> Impl:
    """An LLTM cell implementation ``cell_fn(input, weights, bias, old_h, old_cell)
    -> (new_h, new_cell)``, checked against the float64 reference."""
    def build(w: Workload) -> Case:
        x, W, b, h, c = leaves = [w.leaf(n) for n in ("x", "W", "b", "h", "c")]
        return Case(lambda: cell_fn(x, W, b, h, c), leaves, w.grads_out("grad_h", "grad_c"),
                    w.oracle("lltm", lltm_cell_oracle))
    return Impl(key, label, "cell", build, note=note)


def lltm_loop_impl(key: str, label: str, cell_fn, note: str = "") -> Impl:
    """A Python loop over the T steps of ``cell_fn``."""
    def build(w: Workload) -> Case:
        x, W, b, h, c = leaves = [w.leaf(n) for n in ("x", "W", "b", "h", "c")]
        return Case(lambda: _lltm_sequence_loop(cell_fn, x, W, b, h, c), leaves,
                    w.grads_out("grad_out", "grad_h", "grad_c"),
                    w.oracle("lltm", lltm_sequence_oracle))
    return Impl(key, label, "sequence", build, note=note, graph_unroll=1)


def _build_compiled(w: Workload) -> Case:
    # A fresh compilation per configuration, static shapes: what a user who
    # compiles for one fixed size gets (and no recompilation limit is hit).
    torch.compiler.reset()
    compiled = torch.compile(reference.lltm_cell, dynamic=False)
    case = lltm_cell_impl("compile", "", compiled).build(w)
    start = time.perf_counter()
    _outputs_and_grads(case.forward, case.leaves, case.grad_outputs)  # compiles fwd and bwd
    _synchronize(w.device)
    case.setup_s = time.perf_counter() - start
    case.note = f"first call (compilation) {case.setup_s:.1f} s"
    return case


def _build_lstm_cell(w: Workload) -> Case:
    module = torch.nn.LSTMCell(w.I, w.H, device=w.device, dtype=w.dtype)
    _copy_parameters(module, w, {"weight_ih": "w_ih", "weight_hh": "w_hh",
                                 "bias_ih": "b_ih", "bias_hh": "b_hh"})
    x, h, c = (w.leaf(n) for n in ("x", "h", "c"))
    leaves = [x, h, c, module.weight_ih, module.weight_hh, module.bias_ih, module.bias_hh]
    return Case(lambda: module(x, (h, c)), leaves, w.grads_out("grad_h", "grad_c"),
                w.oracle("lstm_cell", lstm_cell_oracle))


def _build_lstm(w: Workload) -> Case:
    module = torch.nn.LSTM(w.I, w.H, device=w.device, dtype=w.dtype)
    _copy_parameters(module, w, {"weight_ih_l0": "w_ih", "weight_hh_l0": "w_hh",
                                 "bias_ih_l0": "b_ih", "bias_hh_l0": "b_hh"})
    x = w.leaf("x")
    h, c = (w.leaf(n, shape=(1, w.B, w.H)) for n in ("h", "c"))
    leaves = [x, h, c, module.weight_ih_l0, module.weight_hh_l0, module.bias_ih_l0,
              module.bias_hh_l0]

    def forward():
        output, (h_n, c_n) = module(x, (h, c))
        return output, h_n, c_n
    return Case(forward, leaves,
                w.grads_out("grad_out", "grad_h", "grad_c", state_shape=(1, w.B, w.H)),
                w.oracle("lstm", lstm_sequence_oracle), uses_cudnn=w.device.type == "cuda")


def _build_lltm_sequence(w: Workload) -> Case:
    module = lltm.LLTM(w.I, w.H, device=w.device, dtype=w.dtype)
    _copy_parameters(module, w, {"weights_l0": "W", "bias_l0": "b"})
    x = w.leaf("x")
    h, c = (w.leaf(n, shape=(1, w.B, w.H)) for n in ("h", "c"))
    leaves = [x, module.weights_l0, module.bias_l0, h, c]

    def forward():
        output, (h_n, c_n) = module(x, (h, c))
        return output, h_n, c_n
    return Case(forward, leaves,
                w.grads_out("grad_out", "grad_h", "grad_c", state_shape=(1, w.B, w.H)),
                w.oracle("lltm", lltm_sequence_oracle))


def _copy_parameters(module: torch.nn.Module, w: Workload, names: dict[str, str]) -> None:
    with torch.no_grad():
        for param_name, data_name in names.items():
            param = getattr(module, param_name, None)
            if param is None:
                raise RuntimeError(f"{type(module).__name__} has no parameter {param_name!r}")
            param.copy_(w.data(data_name).reshape(param.shape))


def _needs_lltm_sequence(w: Workload) -> str | None:
    return None if hasattr(lltm, "LLTM") else "lltm.LLTM is not in this version of lltm"


def default_impls() -> list[Impl]:
    lstm_note = "not an LLTM (4 gates); checked against the LSTM formula in float64"
    return [
        lltm_cell_impl("reference", "reference (Python, autograd)", reference.lltm_cell),
        lltm_cell_impl("reference_function", "reference Function (manual bwd)",
                       reference.lltm_cell_function),
        lltm_cell_impl("native", "native (lltm C/CUDA)", functional.lltm_cell),
        Impl("compile", "torch.compile(reference)", "cell", _build_compiled),
        Impl("lstm_cell", "nn.LSTMCell (peer)", "cell", _build_lstm_cell, note=lstm_note),
        lltm_loop_impl("reference_loop", "loop of reference cells", reference.lltm_cell),
        lltm_loop_impl("native_loop", "loop of native cells", functional.lltm_cell),
        Impl("lltm", "lltm.LLTM (one call)", "sequence", _build_lltm_sequence,
             available=_needs_lltm_sequence, graph_unroll=1),
        Impl("lstm", "nn.LSTM (peer, cuDNN on CUDA)", "sequence", _build_lstm, note=lstm_note,
             graph_unroll=1),
    ]


# ----------------------------------------------------------------------------
# Checking.

def tolerance(w: Workload, case: Case) -> float:
    if w.dtype == torch.float32 and w.device.type == "cuda" and (
            torch.backends.cuda.matmul.allow_tf32
            or (case.uses_cudnn and torch.backends.cudnn.allow_tf32)):
        return TF32_TOLERANCE
    return TOLERANCE[w.dtype]


def check(case: Case) -> tuple[float, str]:
    """Largest normalized error over every output and gradient, and where."""
    outputs, grads = _outputs_and_grads(case.forward, case.leaves, case.grad_outputs)
    want_outputs, want_grads = case.expected
    worst, where = 0.0, ""
    pairs = [(f"output {i}", g, e) for i, (g, e) in enumerate(zip(outputs, want_outputs))]
    pairs += [(f"gradient {i}", g, e) for i, (g, e) in enumerate(zip(grads, want_grads))]
    if len(outputs) != len(want_outputs) or len(grads) != len(want_grads):
        return math.inf, "wrong number of outputs"
    for name, got, want in pairs:
        if got is None or got.numel() != want.numel():
            return math.inf, f"{name}: shape {None if got is None else list(got.shape)}, " \
                             f"expected {list(want.shape)}"
        got = got.detach().to("cpu", torch.float64).reshape(want.shape)
        scale = want.abs().max().item() if want.numel() else 0.0
        err = (got - want).abs().max().item() / max(scale, 1e-30) if want.numel() else 0.0
        if not math.isfinite(err):
            return math.inf, f"{name}: not finite"
        if err > worst:
            worst, where = err, name
    return worst, where


# ----------------------------------------------------------------------------
# Timing.

def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Timer:
    """Eager timings of one case; samples in microseconds."""

    def __init__(self, case: Case, device: torch.device):
        self.case = case
        self.device = device
        self.samples: dict[str, list[float]] = {m: [] for m in METRICS}

    def _grad(self, outputs, retain_graph=False):
        return torch.autograd.grad(outputs, self.case.leaves, self.case.grad_outputs,
                                   retain_graph=retain_graph)

    def warm_up(self, n: int) -> None:
        for _ in range(n):
            self._grad(self.case.forward())
        _synchronize(self.device)

    def round(self, n: int) -> None:
        """n synced forwards, n synced backwards, one pipelined chunk of n steps."""
        forward, clock = self.case.forward, time.perf_counter_ns

        def sync():
            _synchronize(self.device)
        for _ in range(n):
            sync()
            start = clock()
            outputs = forward()
            sync()
            self.samples["forward"].append((clock() - start) / 1e3)
            del outputs
        for _ in range(n):
            outputs = forward()
            sync()
            start = clock()
            self._grad(outputs)
            sync()
            self.samples["backward"].append((clock() - start) / 1e3)
            del outputs
        sync()
        start = clock()
        for _ in range(n):
            self._grad(forward())
        sync()
        self.samples["step"].append((clock() - start) / 1e3 / n)


class GraphTimer:
    """GPU time of one case from CUDA-graph replay: ``unroll`` iterations of the
    forward, the backward (of one retained forward) and the step, each captured
    into one graph; a replay is timed between CUDA events."""

    def __init__(self, case: Case, device: torch.device, unroll: int):
        self.case, self.device, self.unroll = case, device, unroll
        self.graphs: dict[str, torch.cuda.CUDAGraph] = {}
        self.reasons: dict[str, str] = {}
        self.samples: dict[str, list[float]] = {m: [] for m in GRAPH_METRICS}
        self._keep = []  # tensors the graphs read (the retained forward)

    def capture(self) -> None:
        case, unroll = self.case, self.unroll

        def grad(outputs, retain_graph=False):
            return torch.autograd.grad(outputs, case.leaves, case.grad_outputs,
                                       retain_graph=retain_graph)

        def forwards():
            for _ in range(unroll):
                case.forward()

        def steps():
            for _ in range(unroll):
                grad(case.forward())

        stream = torch.cuda.Stream(self.device)
        with torch.cuda.device(self.device):
            for metric, body in (("graph_forward", forwards), ("graph_step", steps)):
                self._capture(metric, body, stream)
            # The backward alone: its forward runs (on the capture stream, where
            # autograd will run the backward) before the capture and is kept.
            try:
                stream.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(stream):
                    outputs = case.forward()
                self._keep.append(outputs)
            except Exception as error:  # noqa: BLE001
                self.reasons["graph_backward"] = _reason(error)
                return

            def backwards():
                for _ in range(unroll):
                    grad(outputs, retain_graph=True)
            self._capture("graph_backward", backwards, stream)

    def _capture(self, metric: str, body: Callable[[], None], stream) -> None:
        try:
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):  # warm-up on the side stream, as the docs ask
                body()
            torch.cuda.current_stream(self.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                body()
            graph.replay()
            torch.cuda.synchronize(self.device)
            self.graphs[metric] = graph
        except Exception as error:  # noqa: BLE001
            self.reasons[metric] = _reason(error)
            try:
                torch.cuda.synchronize(self.device)
            except Exception:  # noqa: BLE001
                pass

    def round(self, replays: int) -> None:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        for metric, graph in self.graphs.items():
            start.record()
            for _ in range(replays):
                graph.replay()
            end.record()
            end.synchronize()
            self.samples[metric].append(start.elapsed_time(end) * 1e3 / (replays * self.unroll))

    def release(self) -> None:
        self.graphs.clear()
        self._keep.clear()


def _reason(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:200]


def summarize(samples: list[float]) -> dict | None:
    if not samples:
        return None
    q = statistics.quantiles(samples, n=10, method="inclusive") if len(samples) > 1 else \
        [samples[0]] * 9
    return {"median_us": statistics.median(samples), "p10_us": q[0], "p90_us": q[-1],
            "n": len(samples)}


# ----------------------------------------------------------------------------
# Progress.

class Progress:
    """tqdm when installed, else a plain bar on stderr."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.done, self.enabled = total, 0, enabled
        self._bar = None
        if enabled:
            try:
                from tqdm import tqdm
                self._bar = tqdm(total=total, file=sys.stderr, unit="run", dynamic_ncols=True)
            except ImportError:
                pass

    def update(self, n: int, what: str) -> None:
        self.done += n
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.set_description_str(what[:60], refresh=False)
            self._bar.update(n)
            return
        width = 30
        filled = int(width * self.done / max(self.total, 1))
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] "
                         f"{100 * self.done / max(self.total, 1):3.0f}% {what[:60]:<60}")
        sys.stderr.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.close()
        else:
            sys.stderr.write("\n")


# ----------------------------------------------------------------------------
# Running.

@dataclasses.dataclass
class Options:
    reps: int            # timed iterations per metric (cells)
    seq_reps: int        # timed iterations per metric (sequences)
    rounds: int
    warmup: int
    graphs: bool
    compile_on_cpu: bool


def run_workload(w: Workload, impls: list[Impl], opts: Options, progress: Progress) -> list[dict]:
    """Check, then time, every implementation of one workload; one record each."""
    records, timers, graph_timers = [], {}, {}
    for impl in impls:
        rec = {"device": str(w.device), "dtype": str(w.dtype).replace("torch.", ""),
               "kind": w.kind, "B": w.B, "I": w.I, "H": w.H, "T": w.T, "impl": impl.key,
               "label": impl.label, "status": "ok", "error": None, "tolerance": None,
               "where": None, "note": impl.note, "setup_s": None,
               **{m: None for m in METRICS + GRAPH_METRICS}}
        records.append(rec)
        skip = impl.available(w)
        if skip is None and impl.key == "compile" and w.device.type == "cpu" \
                and not opts.compile_on_cpu:
            skip = "skipped on CPU by --quick (inductor compiles C++: seconds per size)"
        if skip:
            rec.update(status="skipped", note=skip)
            progress.update(1, f"{w.name}: {impl.key}")
            continue
        try:
            case = impl.build(w)
            rec["setup_s"] = case.setup_s
            if case.note:
                rec["note"] = "; ".join(filter(None, [rec["note"], case.note]))
            err, where = check(case)
            tol = tolerance(w, case)
            rec.update(error=err, tolerance=tol, where=where)
            if not err <= tol:
                rec["status"] = "WRONG"
            else:
                timers[impl.key] = Timer(case, w.device)
        except Exception as error:  # noqa: BLE001
            rec.update(status="ERROR", note=_reason(error))
        progress.update(1, f"{w.name}: check {impl.key}")

    reps = opts.reps if w.kind == "cell" else opts.seq_reps
    per_round = max(1, math.ceil(reps / opts.rounds))
    order = list(timers.values())
    for timer in order:
        timer.warm_up(opts.warmup)
    for r in range(opts.rounds):
        for timer in order[r % max(len(order), 1):] + order[:r % max(len(order), 1)]:
            timer.round(per_round)
        progress.update(len(impls), f"{w.name}: round {r + 1}/{opts.rounds}")

    if w.device.type == "cuda" and opts.graphs:
        unroll = {impl.key: impl.graph_unroll for impl in impls}
        for key, timer in timers.items():
            graph_timers[key] = gt = GraphTimer(timer.case, w.device, unroll[key])
            gt.capture()
        active = list(graph_timers.values())
        for r in range(opts.rounds):
            for gt in active[r % max(len(active), 1):] + active[:r % max(len(active), 1)]:
                gt.round(per_round)
        progress.update(len(impls), f"{w.name}: CUDA graphs")

    for rec in records:
        timer = timers.get(rec["impl"])
        if timer is None:
            continue
        for metric in METRICS:
            rec[metric] = summarize(timer.samples[metric])
        gt = graph_timers.get(rec["impl"])
        if gt is not None:
            for metric in GRAPH_METRICS:
                rec[metric] = summarize(gt.samples[metric]) or {"n/a": gt.reasons.get(metric, "")}
            gt.release()
    if w.device.type == "cuda":
        torch.cuda.empty_cache()
    _add_ratios(records, CELL_BASELINES if w.kind == "cell" else SEQUENCE_BASELINES)
    return records


def _median(rec: dict, metric: str) -> float | None:
    value = rec.get(metric)
    return value.get("median_us") if isinstance(value, dict) else None


def _add_ratios(records: list[dict], baselines: Sequence[str]) -> None:
    """speedup[baseline][metric] = baseline's median / this median (> 1: faster)."""
    by_key = {r["impl"]: r for r in records}
    for rec in records:
        rec["speedup"] = {}
        for base in baselines:
            if base not in by_key:
                continue
            ratios = {}
            for metric in METRICS + GRAPH_METRICS:
                mine, theirs = _median(rec, metric), _median(by_key[base], metric)
                if mine and theirs:
                    ratios[metric] = theirs / mine
            if ratios:
                rec["speedup"][base] = ratios


# ----------------------------------------------------------------------------
# Reporting.

def describe_machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu": cpu, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(), "platform": platform.platform(),
        "torch": torch.__version__, "torch_cuda": torch.version.cuda,
        "lltm": getattr(lltm, "__version__", None), "lltm_git": _git_revision(),
        "gpus": [], "tf32": None,
    }
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        info["cudnn"] = torch.backends.cudnn.version()
        info["tf32"] = {"matmul": torch.backends.cuda.matmul.allow_tf32,
                        "cudnn": torch.backends.cudnn.allow_tf32}
    return info


def _git_revision() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=5,
                             cwd=os.path.dirname(os.path.abspath(lltm.__file__)))
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def _fmt_us(value: float) -> str:
    if value >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}" if value >= 1 else f"{value:.2g}"


def _fmt_cell(stat) -> str:
    if stat is None:
        return "-"
    if "n/a" in stat:
        return "n/a"
    return f"{_fmt_us(stat['median_us'])} [{_fmt_us(stat['p10_us'])}-{_fmt_us(stat['p90_us'])}]"


def _fmt_speedup(ratio: float | None) -> str:
    if ratio is None:
        return "-"
    if ratio >= 1:
        return f"x{ratio:.2f} faster"
    return f"x{1 / ratio:.2f} slower"


def _fmt_status(rec: dict) -> str:
    if rec["status"] == "ok":
        return f"ok {rec['error']:.0e}"
    if rec["status"] == "WRONG":
        return f"WRONG {rec['error']:.1e}"
    return rec["status"]


def format_table(records: list[dict], machine: dict) -> str:
    lines = [f"lltm benchmark, {machine['date']}: torch {machine['torch']}, "
             f"CPU {machine['cpu']} ({machine['torch_threads']} torch threads)"
             + (f", GPU {', '.join(machine['gpus'])}" if machine["gpus"] else ""),
             "times in microseconds per call: median [p10-p90]; check = largest "
             "max|err|/max|ref| of outputs and gradients against float64;",
             "x faster/slower = the baseline's median / this median, for the pipelined step.",
             ""]
    groups: dict[tuple, list[dict]] = {}
    for rec in records:
        groups.setdefault((rec["device"], rec["dtype"], rec["kind"], rec["B"], rec["I"],
                           rec["H"], rec["T"]), []).append(rec)
    for (device, dtype, kind, B, I, H, T), recs in groups.items():
        graphs = any(isinstance(r.get("graph_step"), dict) for r in recs)
        metrics = METRICS + (GRAPH_METRICS if graphs else ())
        baselines = CELL_BASELINES if kind == "cell" else SEQUENCE_BASELINES
        size = f"B={B} I={I} H={H}" + (f" T={T}" if kind == "sequence" else "")
        lines.append(f"== {device} | {dtype} | {kind} {size}")
        header = ["implementation", "check"] + [m.replace("graph_", "graph ") for m in metrics] \
            + [f"step vs {b}" for b in baselines]
        rows = [header]
        for rec in recs:
            rows.append([rec["label"], _fmt_status(rec)] + [_fmt_cell(rec[m]) for m in metrics]
                        + ["baseline" if rec["impl"] == b else
                           _fmt_speedup(rec.get("speedup", {}).get(b, {}).get("step"))
                           for b in baselines])
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        for i, row in enumerate(rows):
            lines.append("  " + "  ".join(cell.ljust(widths[j]) if j < 2 else cell.rjust(widths[j])
                                          for j, cell in enumerate(row)).rstrip())
        for rec in recs:
            notes = [rec["note"]] if rec["note"] else []
            for metric in GRAPH_METRICS:
                stat = rec.get(metric)
                if isinstance(stat, dict) and stat.get("n/a"):
                    notes.append(f"{metric}: n/a ({stat['n/a']})")
            if rec["status"] == "WRONG":
                notes.append(f"not timed: error {rec['error']:.2e} in {rec['where']} "
                             f"> tolerance {rec['tolerance']:.0e}")
            if notes:
                lines.append(f"  - {rec['impl']}: " + "; ".join(notes))
        ours = [r for r in recs if r["impl"] in ("native", "lltm") and _median(r, "step")]
        for mine in ours:
            parts = [f"{_fmt_speedup(_median(p, 'step') / _median(mine, 'step'))} than {p['impl']}"
                     for p in recs if p is not mine and _median(p, "step")]
            if parts:
                lines.append(f"  {mine['impl']} step: " + ", ".join(parts))
        lines.append("")
    return "\n".join(lines)


def save_plot(records: list[dict], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    groups: dict[tuple, list[dict]] = {}
    for rec in records:
        groups.setdefault((rec["device"], rec["dtype"], rec["kind"], rec["B"], rec["I"],
                           rec["H"], rec["T"]), []).append(rec)
    ncols = 2 if len(groups) > 1 else 1
    nrows = math.ceil(len(groups) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(8 * ncols, 4.5 * nrows), squeeze=False)
    colors = {"forward": "#4c72b0", "backward": "#dd8452", "step": "#55a868",
              "graph_forward": "#8fa9d6", "graph_backward": "#f0b48a", "graph_step": "#a3d4ad"}
    for ax, ((device, dtype, kind, B, I, H, T), recs) in zip(axes.flat, groups.items()):
        metrics = [m for m in METRICS + GRAPH_METRICS
                   if any(_median(r, m) for r in recs)]
        width = 0.8 / max(len(metrics), 1)
        for j, metric in enumerate(metrics):
            xs, ys, lo, hi = [], [], [], []
            for i, rec in enumerate(recs):
                med = _median(rec, metric)
                if med:
                    xs.append(i + (j - (len(metrics) - 1) / 2) * width)
                    ys.append(med)
                    lo.append(med - rec[metric]["p10_us"])
                    hi.append(rec[metric]["p90_us"] - med)
            ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, label=metric.replace("_", " "),
                   color=colors[metric])
        labels = [r["label"] + ("" if r["status"] == "ok" else f"\n({r['status']})") for r in recs]
        ax.set_xticks(range(len(recs)))
        ax.set_xticklabels(labels, rotation=25, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
        ax.set_ylabel("microseconds (median, p10-p90)")
        size = f"B={B} I={I} H={H}" + (f" T={T}" if kind == "sequence" else "")
        ax.set_title(f"{device} {dtype} {kind} {size}", fontsize=10)
        ax.grid(axis="y", which="both", alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(groups):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------
# Command line.

def _parse_sizes(text: str) -> list[tuple[int, int, int]]:
    sizes = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        fields = [f.strip() for f in part.split(",")]
        if len(fields) != 3 or not all(f.isdigit() and int(f) > 0 for f in fields):
            raise argparse.ArgumentTypeError(
                f"a size is B,I,H with three positive integers, got {part!r}")
        sizes.append(tuple(int(f) for f in fields))
    if not sizes:
        raise argparse.ArgumentTypeError("no sizes given")
    return sizes


def _parse_devices(text: str) -> list[torch.device]:
    devices = []
    for name in text.split(","):
        name = name.strip()
        if name == "all":
            devices.append(torch.device("cpu"))
            if torch.cuda.is_available():
                devices.append(torch.device("cuda"))
            continue
        device = torch.device(name)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise argparse.ArgumentTypeError("--device cuda: CUDA is not available here")
        if device.type not in ("cpu", "cuda"):
            raise argparse.ArgumentTypeError(f"--device: cpu, cuda or all, got {name!r}")
        devices.append(device)
    return devices


def _parse_dtypes(text: str) -> list[torch.dtype]:
    try:
        return [DTYPES[name.strip()] for name in text.split(",")]
    except KeyError as error:
        raise argparse.ArgumentTypeError(
            f"--dtype: one or more of {', '.join(DTYPES)}, got {error.args[0]!r}") from None


def _parse_keys(text: str) -> list[str]:
    return [k.strip() for k in text.split(",") if k.strip()]


def _finite(value):
    """JSON has no inf / nan: write them as strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m lltm.bench", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Implementations: " + ", ".join(i.key for i in default_impls()) + ".")
    parser.add_argument("--device", type=_parse_devices, default="all",
                        help="cpu, cuda (or cuda:N), all, or a comma list (default: all available)")
    parser.add_argument("--sizes", type=_parse_sizes, default=DEFAULT_SIZES,
                        help=f"B,I,H[;B,I,H...] (default: {DEFAULT_SIZES})")
    parser.add_argument("--seq-len", type=int, default=None,
                        help="T of the sequence benchmarks (default 100, 10 with --quick; "
                             "0 skips them)")
    parser.add_argument("--dtype", type=_parse_dtypes, default="float32",
                        help="float32 (default), float64, bfloat16, float16, or a comma list")
    parser.add_argument("--reps", type=int, default=None,
                        help="timed iterations per metric and cell implementation "
                             "(default 200, 20 with --quick); sequences get a tenth")
    parser.add_argument("--rounds", type=int, default=None,
                        help="interleaved rounds the reps are split into (default 10, 2 with --quick)")
    parser.add_argument("--only", type=_parse_keys, default=None,
                        help="comma list of implementations to run (default: all)")
    parser.add_argument("--skip", type=_parse_keys, default=[],
                        help="comma list of implementations to leave out")
    parser.add_argument("--no-graphs", action="store_true", help="no CUDA-graph timings")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch.set_num_threads for the CPU runs (default: torch's choice)")
    parser.add_argument("--json", metavar="PATH", help="save every number and the machine here")
    parser.add_argument("--plot", metavar="PATH", help="save a PNG bar chart here (matplotlib)")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: few reps, T=10, no torch.compile on CPU")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def main(argv: Sequence[str] | None = None, extra_impls: Sequence[Impl] = ()) -> list[dict]:
    """Run the benchmark; returns the records (also printed, and saved with
    --json). ``extra_impls`` adds implementations (tests use it)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            parser.error("--plot needs matplotlib (pip install matplotlib)")
    if args.threads:
        torch.set_num_threads(args.threads)
    seq_len = args.seq_len if args.seq_len is not None else (10 if args.quick else 100)
    reps = args.reps or (20 if args.quick else 200)
    opts = Options(reps=reps, seq_reps=max(2, reps // 10),
                   rounds=args.rounds or (2 if args.quick else 10),
                   warmup=2 if args.quick else 5, graphs=not args.no_graphs,
                   compile_on_cpu=not args.quick)
    opts.rounds = max(1, min(opts.rounds, opts.seq_reps))

    impls = default_impls() + list(extra_impls)
    known = {i.key for i in impls}
    unknown = [k for k in (args.only or []) + args.skip if k not in known]
    if unknown:
        parser.error(f"unknown implementation(s) {unknown}; known: {sorted(known)}")
    impls = [i for i in impls if (args.only is None or i.key in args.only)
             and i.key not in args.skip]

    workloads = []
    for device in args.device:
        for dtype in args.dtype:
            for B, I, H in args.sizes:
                workloads.append(Workload(device, dtype, "cell", B, I, H))
            if seq_len > 0:
                for B, I, H in args.sizes:
                    workloads.append(Workload(device, dtype, "sequence", B, I, H, seq_len))
    plan = [(w, [i for i in impls if i.kind == w.kind]) for w in workloads]
    plan = [(w, ws) for w, ws in plan if ws]
    total = sum(len(ws) * (1 + opts.rounds + (w.device.type == "cuda" and opts.graphs))
                for w, ws in plan)

    machine = describe_machine()
    progress = Progress(total, enabled=not args.no_progress)
    records = []
    try:
        for w, ws in plan:
            records += run_workload(w, ws, opts, progress)
    finally:
        progress.close()

    print(format_table(records, machine))
    if args.json:
        config = {"argv": list(argv) if argv is not None else sys.argv[1:],
                  "sizes": args.sizes, "seq_len": seq_len, "dtypes": [str(d) for d in args.dtype],
                  "devices": [str(d) for d in args.device], **dataclasses.asdict(opts)}
        with open(args.json, "w") as f:
            json.dump(_finite({"machine": machine, "config": config, "results": records}), f,
                      indent=1, default=str)
        print(f"saved {args.json}")
    if args.plot:
        save_plot(records, args.plot)
        print(f"saved {args.plot}")
    return records


if __name__ == "__main__":
    main()
