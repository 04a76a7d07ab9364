"""What is benchmarked: workloads (a configuration, its random data, its
float64 oracle), the implementations, and the check that comes before timing."""
from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from typing import Callable, Sequence

import torch
import torch.utils.checkpoint
from torch.utils._python_dispatch import TorchDispatchMode

import lltm
from lltm import _settings, functional, reference

DTYPES = {"float32": torch.float32, "float64": torch.float64,
          "bfloat16": torch.bfloat16, "float16": torch.float16}

# Largest accepted max|got - want| / max|want| against the float64 oracle.
TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4, torch.float16: 1e-2,
             torch.bfloat16: 5e-2}
# float32 products that run on TF32 tensor cores (cuDNN RNNs by default) keep
# 10 mantissa bits, as float16 does. With torch's matmul TF32 setting on,
# lltm's float32 products run on TF32 too (through aten::mm), and so do the
# reference's: the LLTM's accumulating cell state then takes the reference
# loop itself ~2e-2 off float64 at T=100 (H100, B >= 16), so the reference
# sets the bar there too (REFERENCE_SETS_BAR), with this as its floor.
TF32_TOLERANCE = 1e-2
# Below float64 the error grows with the sizes and with T (the LLTM's cell
# state only accumulates, and a long recurrence amplifies rounding: the
# float32 reference loop itself is ~1e-3 off float64 at T=1000), so the bar
# there is the larger of TOLERANCE and twice the error of the family's
# reference computed in that same dtype, when the reference runs: an
# implementation must be about as accurate as plain PyTorch, or better.
REFERENCE_SETS_BAR = (torch.float32, torch.float16, torch.bfloat16)

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
    layers: int = 1            # sequences: stacked layers (layer k > 0 reads H features)
    oracle_device: torch.device = torch.device("cpu")  # where the float64 oracle runs
    input_grad: bool = True    # False: the input and the initial state need no gradient

    def __post_init__(self):
        self._data: dict[str, torch.Tensor] = {}
        self._oracles: dict[str, tuple] = {}

    @property
    def name(self) -> str:
        dtype = str(self.dtype).replace("torch.", "")
        size = f"B={self.B} I={self.I} H={self.H}"
        if self.kind == "sequence":
            size += f" T={self.T}" + (f" L={self.layers}" if self.layers > 1 else "")
        if not self.input_grad:
            size += " (input and state need no grad)"
        return f"{self.device} {dtype} {self.kind} {size}"

    def share_data(self, other: "Workload") -> None:
        """Use ``other``'s data and oracles (same sizes, another dtype): they
        are made once."""
        same = ("kind", "B", "I", "H", "T", "layers", "oracle_device")
        if any(getattr(self, a) != getattr(other, a) for a in same):
            raise ValueError(f"share_data: {self.name} and {other.name} differ in size")
        self._data, self._oracles = other._data, other._oracles

    def data(self, name: str) -> torch.Tensor:
        """A float64 CPU tensor of this workload, random, the same on every
        device and dtype (seeded by the sizes)."""
        if not self._data:
            self._make_data()
        return self._data[name]

    def _make_data(self) -> None:
        B, I, H, T, L = self.B, self.I, self.H, self.T, self.layers
        g = torch.Generator().manual_seed(1000003 * B + 1009 * I + 17 * H + T + 7919 * (L - 1))

        def randn(*shape, scale=1.0):
            return torch.randn(*shape, generator=g, dtype=torch.float64) * scale

        def uniform(*shape, bound):
            return (torch.rand(*shape, generator=g, dtype=torch.float64) * 2 - 1) * bound

        bound = 1.0 / math.sqrt(H)  # the modules' own initialisation
        x_shape = (B, I) if self.kind == "cell" else (T, B, I)
        state = (B, H) if L == 1 else (L, B, H)
        self._data.update({
            "x": randn(*x_shape), "h": randn(*state, scale=0.5), "c": randn(*state, scale=0.5),
            "W": uniform(3 * H, I + H, bound=bound), "b": uniform(3 * H, bound=bound),
            "w_ih": uniform(4 * H, I, bound=bound), "w_hh": uniform(4 * H, H, bound=bound),
            "b_ih": uniform(4 * H, bound=bound), "b_hh": uniform(4 * H, bound=bound),
            "grad_h": randn(*state), "grad_c": randn(*state),
            "grad_out": randn(T, B, H) if self.kind == "sequence" else randn(B, H),
        })
        for k in range(1, L):  # the layers above the first read H features
            self._data.update({
                layer_name("W", k): uniform(3 * H, 2 * H, bound=bound),
                layer_name("b", k): uniform(3 * H, bound=bound),
                layer_name("w_ih", k): uniform(4 * H, H, bound=bound),
                layer_name("w_hh", k): uniform(4 * H, H, bound=bound),
                layer_name("b_ih", k): uniform(4 * H, bound=bound),
                layer_name("b_hh", k): uniform(4 * H, bound=bound)})

    def leaf(self, name: str, shape=None) -> torch.Tensor:
        """The data in this workload's device and dtype, requiring grad (the
        input and the initial state only when ``input_grad``)."""
        t = self.data(name)
        if shape is not None:
            t = t.reshape(shape)
        needs_grad = self.input_grad or name not in DATA_NAMES
        # (detached: the float64 oracle makes the data itself a leaf of its graph)
        t = t.detach().to(device=self.device, dtype=self.dtype, copy=True)
        return t.requires_grad_(needs_grad)

    @property
    def state_shape(self) -> tuple[int, int, int]:
        """The sequence modules' state layout [layers, B, H]."""
        return (self.layers, self.B, self.H)

    def grads_out(self, *names: str, state_shape=None, oracle=False) -> tuple[torch.Tensor, ...]:
        """Output gradients; those of the final state ("grad_h", "grad_c")
        reshaped to ``state_shape`` when given (nn.LSTM's [layers, B, H]);
        ``oracle``: in float64 on the oracle's device."""
        device, dtype = (self.oracle_device, torch.float64) if oracle else (self.device, self.dtype)

        def get(name):
            t = self.data(name)
            if state_shape is not None and name in ("grad_h", "grad_c"):
                t = t.reshape(state_shape)
            return t.to(device=device, dtype=dtype)
        return tuple(get(n) for n in names)

    def oracle(self, key: str, compute: Callable[["Workload"], tuple]) -> tuple:
        """(outputs, gradients) in float64 on the oracle's device, computed
        once per key."""
        if key not in self._oracles:
            self._oracles[key] = compute(self)
        return self._oracles[key]


# The data of a step (input, initial state), as opposed to its parameters.
DATA_NAMES = ("x", "h", "c")


def layer_name(name: str, k: int) -> str:
    """The data name of layer k's parameter ``name`` (layer 0: the name itself)."""
    return name if k == 0 else f"{name}_l{k}"


LLTM_PARAMS = ("W", "b")
LSTM_PARAMS = ("w_ih", "w_hh", "b_ih", "b_hh")


def layer_names(names: Sequence[str], layers: int) -> list[str]:
    """Every layer's parameters, layer by layer."""
    return [layer_name(n, k) for k in range(layers) for n in names]


def _outputs_and_grads(forward, leaves, grad_outputs):
    outputs = forward()
    grads = torch.autograd.grad(outputs, leaves, grad_outputs)
    return [o.detach() for o in outputs], list(grads)


def _oracle_leaves(w: Workload, *names):
    return [w.data(n).to(w.oracle_device).requires_grad_() for n in names]


def _reference_step(x, h, c, W, b):
    return reference.lltm_cell(x, W, b, h, c)


def stack_loop(step, x, layer_params, h0, c0, checkpoint=False):
    """Stacked layers of ``step(x_t, h, c, *params) -> (h, c)`` over the T steps
    of ``x`` [T,B,I]; ``layer_params``: one parameter tuple per layer; h0, c0:
    [layers,B,H]. Returns (output [T,B,H], h_n, c_n [layers,B,H]).
    ``checkpoint``: every step is recomputed in the backward, so that only the
    states are kept (the float64 oracle of a long, wide sequence fits)."""
    def run(*args):
        if checkpoint:
            return torch.utils.checkpoint.checkpoint(step, *args, use_reentrant=False)
        return step(*args)
    inp, h_n, c_n = x, [], []
    for k, params in enumerate(layer_params):
        h, c, outputs = h0[k], c0[k], []
        for t in range(inp.shape[0]):
            h, c = run(inp[t], h, c, *params)
            outputs.append(h)
        inp = torch.stack(outputs)
        h_n.append(h)
        c_n.append(c)
    return inp, torch.stack(h_n), torch.stack(c_n)


def _per_layer(params: Sequence, n: int) -> list:
    return [tuple(params[i:i + n]) for i in range(0, len(params), n)]


def lltm_cell_oracle(w: Workload):
    x, W, b, h, c = leaves = _oracle_leaves(w, "x", "W", "b", "h", "c")
    return _outputs_and_grads(lambda: reference.lltm_cell(x, W, b, h, c), leaves,
                              w.grads_out("grad_h", "grad_c", oracle=True))


def lltm_sequence_oracle(w: Workload):
    names = ["x", *layer_names(LLTM_PARAMS, w.layers), "h", "c"]
    x, *params, h, c = leaves = _oracle_leaves(w, *names)
    shape = w.state_shape
    return _outputs_and_grads(
        lambda: stack_loop(_reference_step, x, _per_layer(params, 2), h.reshape(shape),
                           c.reshape(shape), checkpoint=True),
        leaves, w.grads_out("grad_out", "grad_h", "grad_c", state_shape=shape, oracle=True))


def _lstm_step(x, h, c, w_ih, w_hh, b_ih, b_hh):
    """torch.nn.LSTMCell's documented formula."""
    gates = x @ w_ih.t() + b_ih + h @ w_hh.t() + b_hh
    i, f, g, o = gates.chunk(4, dim=1)
    new_c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.tanh(new_c) * torch.sigmoid(o), new_c


def lstm_cell_oracle(w: Workload):
    x, h, c, *params = leaves = _oracle_leaves(w, "x", "h", "c", *LSTM_PARAMS)
    return _outputs_and_grads(lambda: _lstm_step(x, h, c, *params), leaves,
                              w.grads_out("grad_h", "grad_c", oracle=True))


def lstm_sequence_oracle(w: Workload):
    x, h, c, *params = leaves = _oracle_leaves(w, "x", "h", "c",
                                               *layer_names(LSTM_PARAMS, w.layers))
    shape = w.state_shape
    return _outputs_and_grads(
        lambda: stack_loop(_lstm_step, x, _per_layer(params, 4), h.reshape(shape),
                           c.reshape(shape), checkpoint=True),
        leaves, w.grads_out("grad_out", "grad_h", "grad_c", state_shape=shape, oracle=True))


# ----------------------------------------------------------------------------
# Implementations: each builds a Case (what to run) for a workload.

@dataclasses.dataclass
class Case:
    forward: Callable[[], Sequence[torch.Tensor]]
    leaves: list[torch.Tensor]           # gradients are taken with respect to these
    grad_outputs: tuple[torch.Tensor, ...]
    expected: tuple                      # (outputs, gradients): float64, same order
    family: str = "lltm"                 # "lltm" | "lstm": which reference sets the bar
    uses_cudnn: bool = False             # float32 may then run on TF32
    setup_s: float | None = None         # e.g. compilation time
    note: str = ""
    # entered around every call of forward and of the backward (a measurement
    # override of the CUDA library's choices, lltm.overrides); not around
    # CUDA-graph replays: a graph keeps the kernels of its capture
    scope: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext

    def __post_init__(self):
        # Gradients are taken of the leaves that need one (see
        # Workload.input_grad); the expected gradients follow.
        keep = [leaf.requires_grad for leaf in self.leaves]
        if not all(keep):
            outputs, grads = self.expected
            self.leaves = [leaf for leaf, k in zip(self.leaves, keep) if k]
            self.expected = (outputs, [g for g, k in zip(grads, keep) if k])


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


def lltm_loop_impl(key: str, label: str, cell_fn, note: str = "",
                   checkpoint: bool = False) -> Impl:
    """A Python loop over the T steps (and the layers) of ``cell_fn``;
    ``checkpoint``: see :func:`stack_loop`."""
    def step(x, h, c, W, b):
        return cell_fn(x, W, b, h, c)

    def build(w: Workload) -> Case:
        x, *params, h, c = leaves = [w.leaf(n) for n in
                                     ("x", *layer_names(LLTM_PARAMS, w.layers), "h", "c")]
        shape = w.state_shape
        return Case(lambda: stack_loop(step, x, _per_layer(params, 2), h.reshape(shape),
                                       c.reshape(shape), checkpoint),
                    leaves, w.grads_out("grad_out", "grad_h", "grad_c", state_shape=shape),
                    w.oracle("lltm", lltm_sequence_oracle))
    return Impl(key, label, "sequence", build, note=note, graph_unroll=1)


def lstm_loop_impl(key: str = "lstm_loop", checkpoint: bool = True) -> Impl:
    """A Python loop of nn.LSTMCell's formula: the LSTM family's reference in
    the benchmarked dtype (it sets the LSTM peers' bar below float64)."""
    def build(w: Workload) -> Case:
        x, h, c, *params = leaves = [w.leaf(n) for n in
                                     ("x", "h", "c", *layer_names(LSTM_PARAMS, w.layers))]
        shape = w.state_shape
        return Case(lambda: stack_loop(_lstm_step, x, _per_layer(params, 4), h.reshape(shape),
                                       c.reshape(shape), checkpoint),
                    leaves, w.grads_out("grad_out", "grad_h", "grad_c", state_shape=shape),
                    w.oracle("lstm", lstm_sequence_oracle), family="lstm")
    return Impl(key, "loop of LSTM-formula steps", "sequence", build, graph_unroll=1)


def bar_references() -> list[Impl]:
    """The family references that set the check's bar below float64 when the
    run does not time them; checkpointed (only the states are kept), so that
    they fit wherever the implementations do."""
    return [lltm_loop_impl("reference_loop", "loop of reference cells", reference.lltm_cell,
                           checkpoint=True), lstm_loop_impl()]


def _build_compiled(w: Workload) -> Case:
    # A fresh compilation per configuration, static shapes: what a user who
    # compiles for one fixed size gets (and no recompilation limit is hit).
    torch.compiler.reset()
    compiled_cell = torch.compile(reference.lltm_cell, dynamic=False)

    def compiled(*args):
        # every call, not only the first: a later call that recompiles (the
        # graph timers' capture runs new guards) must compile the same way
        with _no_donated_buffers():
            return compiled_cell(*args)

    case = lltm_cell_impl("compile", "", compiled).build(w)
    start = time.perf_counter()
    _outputs_and_grads(case.forward, case.leaves, case.grad_outputs)  # compiles fwd and bwd
    synchronize(w.device)
    case.setup_s = time.perf_counter() - start
    case.note = f"first call (compilation) {case.setup_s:.1f} s; donated buffers off"
    return case


def _no_donated_buffers():
    """AOTAutograd's donated buffers off while compiling: a backward compiled
    with them refuses retain_graph=True, which the CUDA-graph timer of the
    backward alone needs (it replays the backward of one kept forward)."""
    try:
        from torch._functorch import config
    except ImportError:
        return contextlib.nullcontext()
    if not hasattr(config, "donated_buffer"):
        return contextlib.nullcontext()
    return config.patch(donated_buffer=False)


def _build_lstm_cell(w: Workload) -> Case:
    module = torch.nn.LSTMCell(w.I, w.H, device=w.device, dtype=w.dtype)
    _copy_parameters(module, w, {"weight_ih": "w_ih", "weight_hh": "w_hh",
                                 "bias_ih": "b_ih", "bias_hh": "b_hh"})
    x, h, c = (w.leaf(n) for n in ("x", "h", "c"))
    leaves = [x, h, c, module.weight_ih, module.weight_hh, module.bias_ih, module.bias_hh]
    return Case(lambda: module(x, (h, c)), leaves, w.grads_out("grad_h", "grad_c"),
                w.oracle("lstm_cell", lstm_cell_oracle), family="lstm")


def _build_lstm(w: Workload) -> Case:
    module = torch.nn.LSTM(w.I, w.H, num_layers=w.layers, device=w.device, dtype=w.dtype)
    _copy_parameters(module, w, {f"{p}_l{k}": layer_name(d, k) for k in range(w.layers)
                                 for p, d in zip(("weight_ih", "weight_hh", "bias_ih", "bias_hh"),
                                                 LSTM_PARAMS)})
    x = w.leaf("x")
    h, c = (w.leaf(n, shape=w.state_shape) for n in ("h", "c"))
    leaves = [x, h, c, *(getattr(module, f"{p}_l{k}") for k in range(w.layers)
                         for p in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"))]

    def forward():
        output, (h_n, c_n) = module(x, (h, c))
        return output, h_n, c_n
    return Case(forward, leaves,
                w.grads_out("grad_out", "grad_h", "grad_c", state_shape=w.state_shape),
                w.oracle("lstm", lstm_sequence_oracle), family="lstm",
                uses_cudnn=w.device.type == "cuda")


def _build_lltm_sequence(w: Workload) -> Case:
    module = lltm.LLTM(w.I, w.H, num_layers=w.layers, device=w.device, dtype=w.dtype)
    _copy_parameters(module, w, {f"{p}_l{k}": layer_name(d, k) for k in range(w.layers)
                                 for p, d in zip(("weights", "bias"), LLTM_PARAMS)})
    x = w.leaf("x")
    h, c = (w.leaf(n, shape=w.state_shape) for n in ("h", "c"))
    leaves = [x, *(getattr(module, f"{p}_l{k}") for k in range(w.layers)
                   for p in ("weights", "bias")), h, c]

    def forward():
        output, (h_n, c_n) = module(x, (h, c))
        return output, h_n, c_n
    return Case(forward, leaves,
                w.grads_out("grad_out", "grad_h", "grad_c", state_shape=w.state_shape),
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
        lltm_cell_impl("native", "native (lltm.LLTMCell)", functional.lltm_cell),
        Impl("compile", "torch.compile(reference)", "cell", _build_compiled),
        Impl("lstm_cell", "nn.LSTMCell (peer)", "cell", _build_lstm_cell, note=lstm_note),
        lltm_loop_impl("reference_loop", "loop of reference cells", reference.lltm_cell),
        lltm_loop_impl("native_loop", "loop of native cells", functional.lltm_cell),
        Impl("lltm", "lltm.LLTM (one call)", "sequence", _build_lltm_sequence,
             available=_needs_lltm_sequence, graph_unroll=1),
        Impl("lstm", "nn.LSTM (peer)", "sequence", _build_lstm, note=lstm_note,
             graph_unroll=1),
    ]


# ----------------------------------------------------------------------------
# Checking.

def tolerance(w: Workload, case: Case, reference_error: float | None = None) -> float:
    """The largest error accepted; ``reference_error``: that of the family's
    reference in the same dtype (used below float64 only)."""
    floor = TF32_TOLERANCE if uses_tf32(w.dtype, w.device, case) else TOLERANCE[w.dtype]
    if w.dtype in REFERENCE_SETS_BAR and reference_error is not None:
        return max(floor, 2 * reference_error)
    return floor


def uses_tf32(dtype: torch.dtype, device: torch.device, case: Case) -> bool:
    """Whether the case's float32 products may run on TF32: torch's matmul
    setting (aten::mm: the reference, lltm), or cuDNN's for cuDNN RNNs."""
    return dtype == torch.float32 and device.type == "cuda" and (
        _settings.float32_tf32() or (case.uses_cudnn and torch.backends.cudnn.allow_tf32))


def round_to_tf32(t: torch.Tensor) -> torch.Tensor:
    """float32 values rounded to TF32's 10 mantissa bits (to nearest, ties
    away from zero), the precision TF32 tensor cores take their operands in."""
    bits = t.view(torch.int32)  # same element size: any layout, kept
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


class TF32Products(TorchDispatchMode):
    """float32 matrix products with their operands rounded to TF32 (sums
    still in float32), as TF32 tensor cores compute them. With torch's matmul
    TF32 setting on, cuBLAS still picks kernels without TF32 for some shapes
    (matrix-vector products at B=1), so the reference loop's own error, which
    sets the bar, would depend on cuBLAS's choice of kernel: ~1e-5 at B=1,
    5e-4 at B16/H256, against ~2e-2 where every product runs on TF32 (H100,
    T=100). Under this mode every product of the reference is a TF32
    product, whatever kernel runs it."""

    OPERANDS = {torch.ops.aten.mm.default: (0, 1), torch.ops.aten.addmm.default: (1, 2),
                torch.ops.aten.bmm.default: (0, 1), torch.ops.aten.baddbmm.default: (1, 2),
                torch.ops.aten.mv.default: (0, 1), torch.ops.aten.addmv.default: (1, 2)}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        operands = self.OPERANDS.get(func, ())
        if operands:
            args = tuple(round_to_tf32(a) if i in operands and isinstance(a, torch.Tensor)
                         and a.dtype == torch.float32 else a for i, a in enumerate(args))
        return func(*args, **(kwargs or {}))


def check(case: Case, tf32_products: bool = False) -> tuple[float, str]:
    """Largest normalized error over every output and gradient, and where;
    ``tf32_products``: the case's float32 matrix products computed as TF32
    tensor cores do (TF32Products), for a reference whose error sets the bar
    under torch's TF32 setting."""
    with case.scope(), (TF32Products() if tf32_products else contextlib.nullcontext()):
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
        got = got.detach().to(want.device, torch.float64).reshape(want.shape)
        scale = want.abs().max().item() if want.numel() else 0.0
        err = (got - want).abs().max().item() / max(scale, 1e-30) if want.numel() else 0.0
        if not math.isfinite(err):
            return math.inf, f"{name}: not finite"
        if err > worst:
            worst, where = err, name
    return worst, where


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
