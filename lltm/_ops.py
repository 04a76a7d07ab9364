"""What torch needs besides the C kernels, registered in Python (the stable C
ABI has no autograd API): fake kernels for tracing, and the autograd formulas.

Every operator exists twice (csrc/binding/register.c): the public one
(``lltm::cell_forward``), whose autograd kernel is registered here, and its
autograd-free twin (``lltm::_cell_forward``), which the formulas call: graphs
torch.compile builds from them then reach the kernels without entering Python."""
from __future__ import annotations

import re
import types

import torch
import torch.autograd.forward_ad as _forward_ad
from torch._C._functorch import TransformType
from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters

from . import _autocast, _autotune, _differentiable, _native, _settings, _sharing
from .backends import cuda as _backend

# --- fake kernels: the binding's checks, from its tables -----------------------------
# For tracing (torch.compile, export, FakeTensor): each operator's arguments
# checked against its table (csrc/binding/ops.c, lltm/_native.operators) as
# lltm_open checks them (csrc/binding/tensor_args.c), with its messages; the
# results' shapes from the same table. Sizes may be symbolic.

_DTYPES = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16",
           torch.bfloat16: "bfloat16"}
_LETTERS = "TBIHL"


def _forms(shape: str) -> list[list[str]]:
    """"[3H] (or [1, 3H])" -> [["3H"], ["1", "3H"]]"""
    return [[s.strip() for s in form.split(",")] for form in re.findall(r"\[([^]]*)\]", shape)]


def _value(symbol: str, sizes: dict):
    """A symbol's size ("3H", "I+H", "L-1", "1") from the letters' sizes."""
    total = 0
    for sign, coefficient, letter in re.findall(r"([+-]?)(\d*)([A-Z]?)", symbol):
        if coefficient or letter:
            term = (int(coefficient) if coefficient else 1) * (sizes[letter] if letter else 1)
            total = total - term if sign == "-" else total + term
    return total


def _device_text(device: torch.device) -> str:
    return f"{device.type if device.type in ('cpu', 'cuda') else 'another device'}:" \
           f"{-1 if device.index is None else device.index}"


def _fake_kernel(op: _native.Operator, with_lengths: bool):
    names = [name for name, _ in op.args]
    shapes = [_forms(shape) for _, shape in op.args]
    results = [_forms(shape)[0] for _, shape in op.results]
    what = _native.size_symbols()
    state = names[op.state]

    def fail(message):
        raise RuntimeError(f"{op.name}: {message}")

    def form(k, t):  # the symbols of t's shape: the form of argument k of t's rank
        for symbols in shapes[k]:
            if len(symbols) == t.dim():
                return symbols
        fail(f"{names[k]} must be {len(shapes[k][0])}-dimensional {op.args[k][1]}, "
             f"got shape {list(t.shape)}")

    def fake(*args, **kwargs):
        tensors = args[:len(names)]
        rest = list(args[len(names) + with_lengths:])
        mask = rest[0] if rest and op.backward else kwargs.get("output_mask", [True] * len(results))
        if op.backward and len(mask) != len(results):
            fail(f"output_mask has {len(mask)} entries, expected {len(results)} (one per gradient)")
        first = tensors[0]
        if first.dtype not in _DTYPES:
            fail(f"{names[0]} has dtype a non-floating or unsupported dtype; expected float32, "
                 "float64, float16 or bfloat16")
        for name, t in zip(names, tensors):
            if t.device != first.device:
                fail(f"all tensors must be on one device: {names[0]} is on "
                     f"{_device_text(first.device)}, {name} on {_device_text(t.device)}")
            if t.dtype != first.dtype:
                fail(f"all tensors must have one dtype: {names[0]} is {_DTYPES[first.dtype]}, "
                     f"{name} is {_DTYPES.get(t.dtype, 'a non-floating or unsupported dtype')}")
        sizes, bound = {"T": 1, "L": 1}, set()
        for k in (op.input, op.state):
            for size, symbol in zip(tensors[k].shape, form(k, tensors[k])):
                if symbol in _LETTERS and symbol not in bound:
                    sizes[symbol] = size
                    bound.add(symbol)
        if sizes["L"] < 1:
            fail(f"{state} holds L = 0 layers; expected at least one")
        if sizes["H"] == 0:
            fail(f"{state} has state size H = 0; expected H > 0")
        for k in (op.state, *range(len(names))):  # the state's batch size first
            t = tensors[k]
            for j, symbol in enumerate(form(k, t)):
                if t.shape[j] != _value(symbol, sizes):
                    fail(f"{names[k]} has size {t.shape[j]} in dimension {j}, expected "
                         f"{_value(symbol, sizes)} ({what[symbol].replace('%s', state)}); "
                         f"shape {list(t.shape)}")
        if with_lengths:
            lengths, B = args[len(names)], sizes["B"]
            int64 = lengths.dtype == torch.int64
            if not int64 or lengths.dim() != 1 or lengths.shape[0] != B:
                fail(f"lengths must be an int64 tensor of shape [{B}] (one length per batch row "
                     f"B of input), got {'int64' if int64 else 'another dtype'} of "
                     f"{lengths.dim()} dimensions, first size "
                     f"{lengths.shape[0] if lengths.dim() else 0}")
            if lengths.device != first.device:
                fail(f"lengths must be on the device of {names[0]}")
        settings = (rest[op.backward] if len(rest) > op.backward
                    else kwargs.get("settings", _settings.NOT_GIVEN))
        if first.device.type == "cpu" and settings != _settings.NOT_GIVEN and (
                settings & _settings.INFERENCE):  # (the CPU library's inference forward)
            mask = [wanted and not op.kept >> k & 1 for k, wanted in enumerate(mask)]
        return tuple(first.new_empty([_value(s, sizes) for s in shape]) if wanted else None
                     for shape, wanted in zip(results, mask))
    return fake


for _op in _native.operators():
    for _overload in ("", ".lengths")[:1 + _op.lengths]:
        for _prefix in ("lltm::", "lltm::_"):  # the operator and its autograd-free twin
            torch.library.register_fake(_prefix + _op.name[6:] + _overload)(
                _fake_kernel(_op, bool(_overload)))


# --- the autograd formulas -----------------------------------------------------------

def _save(ctx, inputs, saved, non_differentiable) -> None:
    """Every forward's setup_context: ``saved`` kept for the backward, the
    inputs for the jvp where dual tensors are live, ``non_differentiable``
    marked. Gradients are not materialized (zero-filling the never-used
    gates' gradients cost ~50 us of host time a CUDA sequence); the backward
    fills what it needs (incoming_grads)."""
    ctx.save_for_backward(*saved)
    if _forward_ad._current_level >= 0:
        ctx.save_for_forward(*inputs)
    ctx.mark_non_differentiable(*non_differentiable)
    ctx.set_materialize_grads(False)


def incoming_grads(grads: tuple, likes: tuple) -> tuple:
    """A forward's incoming gradients, zeros like ``likes`` for those absent."""
    return tuple(torch.zeros_like(like) if g is None else g for g, like in zip(grads, likes))


def lengths_tail(lengths) -> tuple:
    """An optional trailing argument as the arguments it adds: () for None."""
    return () if lengths is None else (lengths,)


def overload(packet, tail: tuple):
    """Operator ``packet``'s overload for a call with lengths (``tail``) or without."""
    return packet.lengths if tail else packet.default


def _cell_setup_context(ctx, inputs, output):
    # Only the gate activations are new memory; the rest is alive anyway.
    # bias and old_cell serve the differentiable backward (create_graph).
    _new_h, new_cell, gates = output
    _save(ctx, inputs, (*inputs, new_cell, gates), (gates,))


# the autograd-free twins the backward formulas call
_cell_backward_kernel = torch.ops.lltm._cell_backward.default
_sequence_backward_kernel = torch.ops.lltm._sequence_backward
_stack_backward_kernel = torch.ops.lltm._stack_backward


def _cell_backward(ctx, grad_h, grad_cell, _grad_gates):
    input, weights, bias, old_h, old_cell, new_cell, gates = ctx.saved_tensors
    grad_h, grad_cell = incoming_grads((grad_h, grad_cell), (new_cell, new_cell))
    if torch.is_grad_enabled():
        # This backward's graph is recorded (create_graph=True, torch.func):
        # the kernel's result would be a constant, its second derivatives
        # silently zero. Differentiable operations instead.
        d_input, d_weights, d_bias, d_old_h, d_old_cell = _differentiable.cell_backward(
            grad_h, grad_cell, input, weights, bias, old_h, old_cell)
    else:
        # Only the gradients autograd asks for. The twin has no autograd
        # kernel: no guard below autograd needed (~3.5 us of host time each).
        d_input, d_weights, d_bias, d_old_h, d_old_cell = _cell_backward_kernel(
            grad_h, grad_cell, new_cell, gates, input, old_h, weights,
            ctx.needs_input_grad[:5], _settings.current())
    if d_bias is not None and d_bias.shape != bias.shape:  # the tutorial's [1, 3H] bias
        d_bias = d_bias.view(bias.shape)
    return d_input, d_weights, d_bias, d_old_h, d_old_cell


def _sequence_setup_context(ctx, inputs, output):
    # inputs: sequence_forward's, then the lengths overload's [B]. New memory
    # kept: cells and gates (h_{t-1} is read from out).
    out, _h_n, _c_n, cells, gates = output
    _save(ctx, inputs, (*inputs[:5], out, cells, gates, *inputs[5:]), (cells, gates))
    # a layer run beside another plans its backward for the shared device too
    ctx.concurrent_layers = _sharing.concurrent_layers()


def layer_grads(ctx, grad_output, grad_h_n, grad_c_n, kernel, mask):
    """One layer's backward from what _sequence_setup_context saved:
    ((d_input, d_weights, d_bias, d_h0, d_c0), saved tensors). As in
    _cell_backward: differentiable operations where create_graph, else
    ``kernel`` (sequence_backward, or sequence_backward_gates, whose second
    result is dG) with output_mask ``mask``."""
    saved = ctx.saved_tensors
    input, weights, bias, h0, c0, out, cells, gates, *lengths = saved
    grads = incoming_grads((grad_output, grad_h_n, grad_c_n), (out, h0, h0))
    if torch.is_grad_enabled():
        d_input, d_weights, d_bias, d_h0, d_c0 = _differentiable.sequence_backward(
            *grads, input, weights, bias, h0, c0, *lengths)
    else:
        settings = _autotune.backward_settings(
            ctx, _settings.current(getattr(ctx, "concurrent_layers", 1)))
        d_input, d_weights, d_bias, d_h0, d_c0 = overload(kernel, lengths)(
            *grads, input, weights, h0, out, cells, gates, *lengths, mask, settings)
    if d_bias is not None:
        d_bias = d_bias.view(bias.shape)
    return (d_input, d_weights, d_bias, d_h0, d_c0), saved


def _sequence_backward(ctx, grad_output, grad_h_n, grad_c_n, _grad_cells, _grad_gates):
    grads, saved = layer_grads(ctx, grad_output, grad_h_n, grad_c_n, _sequence_backward_kernel,
                               ctx.needs_input_grad[:5])
    # lengths (an integer tensor, saved last where given) has no gradient
    return grads + (None,) * (len(saved) - 8)


def _stack_setup_context(ctx, inputs, output):
    # inputs: stack_forward's, and the lengths [B] of its lengths overload
    out, _h_n, _c_n, outputs, cells, gates = output
    _save(ctx, inputs, (*inputs[:6], out, outputs, cells, gates, *inputs[6:]),
          (outputs, cells, gates))


def _stack_backward(ctx, grad_output, grad_h_n, grad_c_n, *_unused):
    input, weights0, weights, biases, h0, c0, out, outputs, cells, gates, *lengths = (
        ctx.saved_tensors)
    grads = incoming_grads((grad_output, grad_h_n, grad_c_n), (out, h0, h0))
    if torch.is_grad_enabled():  # the backward's graph is recorded: see _cell_backward
        d = _differentiable.stack_backward(*grads, input, weights0, weights, biases, h0, c0,
                                           *lengths)
    else:  # only the gradients autograd asks for, as in _cell_backward
        d = overload(_stack_backward_kernel, lengths)(
            *grads, input, weights0, weights, h0, out, outputs, cells, gates, *lengths,
            ctx.needs_input_grad[:6], _settings.current())
    return tuple(d) + (None,) * len(lengths)

# --- the Functions -------------------------------------------------------------------
# One autograd.Function per forward operator, its forward the operator's
# twin: eager_call enters it directly (entering the operator's Python autograd
# kernel through the dispatcher costs more host time than a small step), and
# the autograd kernel registered below enters the same Function. In the
# setup_context style, so torch.func works: vmap through the batching rules
# (lltm/_vmap.py), grad and vjp through the backward's differentiable branch,
# forward-mode AD through jvp (under functorch's jvp transforms the step runs
# in plain operations instead: functorch would not differentiate the jvp again).

def _op_function(name: str, op, setup_context, backward, tangents, tuned=False):
    """The autograd.Function of a forward operator: forward runs ``op`` (a
    twin) on the operator's arguments, the settings last, which
    ``setup_context`` and ``backward`` do not see; ``tangents(*inputs,
    *input_tangents, *lengths)`` gives the first outputs' tangents; ``tuned``:
    a sequence forward, whose plans lltm.backends.cuda.benchmark measures."""
    n_outputs = len(op._schema.returns)
    with_lengths = op._overloadname == "lengths"

    def forward(*args):  # (gradient mode is off here: op goes straight to its kernel)
        return op(*args)

    def setup(ctx, inputs, output):
        setup_context(ctx, inputs[:-1], output)
        if tuned and _backend.benchmark:  # the backward's measured plan
            ctx.tuned_plan = _autotune.backward_plan(inputs[-1], inputs[0], inputs[3].shape[-1])

    def differentiate(ctx, *grads):
        return (*backward(ctx, *grads), None)  # (the settings have none)

    def jvp(ctx, *input_tangents):
        inputs = ctx.saved_tensors  # those of save_for_forward: the lengths last
        n = len(inputs) - with_lengths
        out = tangents(*inputs[:n], *input_tangents[:n], *inputs[n:])
        return (*out, *(None,) * (n_outputs - len(out)))

    def body(namespace):
        namespace.update(generate_vmap_rule=True, forward=staticmethod(forward),
                         setup_context=staticmethod(setup),
                         backward=staticmethod(differentiate), jvp=staticmethod(jvp),
                         __module__=__name__, __doc__=f"torch.ops.lltm.{op.__name__[1:]} "
                                                      "with autograd.")
    function = types.new_class(name, (torch.autograd.Function,), exec_body=body)
    # Function.apply's Python wrapper serves functorch transforms; outside
    # them the C apply it ends in saves ~2 us of host time a call.
    function.c_apply = super(torch.autograd.Function, function).apply
    function.kernel = op
    return function


_twin = torch.ops.lltm
CellForward = _op_function("CellForward", _twin._cell_forward.default, _cell_setup_context,
                           _cell_backward, lambda *a: _differentiable.cell_jvp(*a)[2:])
SequenceForward = _op_function("SequenceForward", _twin._sequence_forward.default,
                               _sequence_setup_context, _sequence_backward,
                               _differentiable.sequence_jvp, tuned=True)
SequenceLengthsForward = _op_function("SequenceLengthsForward", _twin._sequence_forward.lengths,
                                      _sequence_setup_context, _sequence_backward,
                                      _differentiable.sequence_jvp, tuned=True)
StackForward = _op_function("StackForward", _twin._stack_forward.default, _stack_setup_context,
                            _stack_backward, _differentiable.stack_jvp)
StackLengthsForward = _op_function("StackLengthsForward", _twin._stack_forward.lengths,
                                   _stack_setup_context, _stack_backward,
                                   _differentiable.stack_jvp)

# Bound once: an eager step reads each of these on every call.
_is_compiling = torch.compiler.is_compiling
_transforms_active = torch._C._are_functorch_transforms_active
_autocast_enabled = torch._C._is_any_autocast_enabled
_grad_enabled = torch.is_grad_enabled
_any_requires_grad = torch._C._any_requires_grad  # what torch.library's autograd asks too
_is_wrapped = torch._C._functorch.is_functorch_wrapped_tensor
_current_settings = _settings.current


def eager_call(function, op, *args):
    """``op(*args, settings)`` with autograd and the settings in force, through
    ``function`` (whose forward is op's twin) when eager and some input needs
    a gradient or a tangent; under torch.autocast in the autocast dtype."""
    if _is_compiling():  # (dynamo reads no attributes of a Function: op is passed)
        return op(*args, _settings.traced())
    if _transforms_active():
        if _under_functorch_jvp():
            # (functorch tracks no second derivative through the Function's jvp)
            return _FORWARD_MATH[function](*args)
        if _backend.benchmark and function in _TUNED:
            return function.apply(*_tuned((*args, _current_settings())))
        return function.apply(*args, _current_settings())
    args = (*args, _current_settings())
    if _autocast_enabled():
        return _autocast.eager_call(lambda a: _eager(function, a), args)
    return _eager(function, args)


class CellStep(torch.autograd.Function):
    """The cell's plainest, most frequent eager step (gradients needed; no
    transform, tangent, autocast or compiling): CellForward with two outputs,
    ~5 us less host time a step on a 2-core CPU host."""

    @staticmethod
    def forward(ctx, input, weights, bias, old_h, old_cell, settings):
        new_h, new_cell, gates = _cell_forward_kernel(input, weights, bias, old_h, old_cell,
                                                      settings)
        ctx.save_for_backward(input, weights, bias, old_h, old_cell, new_cell, gates)
        ctx.set_materialize_grads(False)  # as CellForward's
        return new_h, new_cell

    @staticmethod
    def backward(ctx, grad_h, grad_cell):
        return (*_cell_backward(ctx, grad_h, grad_cell, None), None)


_cell_forward_kernel = torch.ops.lltm._cell_forward.default
_cell_step = super(torch.autograd.Function, CellStep).apply  # the C apply, as c_apply


def cell(input, weights, bias, old_h, old_cell):
    """(new_h, new_cell) of lltm::cell_forward with autograd: lltm.functional.lltm_cell."""
    if not (_is_compiling() or _transforms_active() or _autocast_enabled()
            or _forward_ad._current_level >= 0) and _grad_enabled() and _any_requires_grad(
                input, weights, bias, old_h, old_cell) and not (
                _is_wrapped(input) or _is_wrapped(weights) or _is_wrapped(bias)
                or _is_wrapped(old_h) or _is_wrapped(old_cell)):
        return _cell_step(input, weights, bias, old_h, old_cell, _current_settings())
    new_h, new_cell, _gates = eager_call(CellForward, _cell_forward, input, weights, bias,
                                         old_h, old_cell)
    return new_h, new_cell


_cell_forward = torch.ops.lltm.cell_forward.default


def _under_functorch_jvp() -> bool:
    return any(i.key() == TransformType.Jvp for i in retrieve_all_functorch_interpreters())


_TUNED = (SequenceForward, SequenceLengthsForward)  # lltm.backends.cuda.benchmark's calls


def _tuned(args: tuple) -> tuple:
    """A sequence forward's ``args`` (the settings last) with its measured plan."""
    training = _grad_enabled() and _any_requires_grad(*args)
    return (*args[:-1], _autotune.settings(args[-1], args[0], args[3].shape[-1], training))


_FORWARD_MATH = {CellForward: _differentiable.cell_forward,
                 SequenceForward: _differentiable.sequence_forward,
                 SequenceLengthsForward: _differentiable.sequence_forward,
                 StackForward: _differentiable.stack_forward,
                 StackLengthsForward: _differentiable.stack_forward}


_KEEPING = (SequenceForward, SequenceLengthsForward, StackForward, StackLengthsForward)


def _eager(function, args):
    """eager_call outside transforms and autocast (``args``: the settings last)."""
    if _backend.benchmark and function in _TUNED:
        args = _tuned(args)
    if (_grad_enabled() and _any_requires_grad(*args)) or _forward_ad._current_level >= 0:
        if any(map(_is_wrapped, args[:-1])):  # left over from a finished transform: apply unwraps
            return function.apply(*args)
        return function.c_apply(*args)
    if function in _KEEPING and args[0].is_cpu and args[-1] != _settings.NOT_GIVEN:
        args = (*args[:-1], args[-1] | _settings.INFERENCE)  # cells, gates: None
    return function.kernel(*args)  # no gradient to track: the autograd-free twin


# --- the operators' autograd kernels --------------------------------------------------
# Direct torch.ops.lltm calls, torch.compile, export and opcheck: the same
# Functions as eager_call. torch.func's derivative transforms reach this
# kernel one level at a time, where a Function cannot be told apart from its
# transforms: they get a clear error (vmap is handled before autograd).

def _has_tangent(args) -> bool:
    return _forward_ad._current_level >= 0 and any(
        _forward_ad.unpack_dual(a).tangent is not None for a in args)


def _transform_error(name: str) -> RuntimeError:
    instead = {"cell_forward": "lltm.functional.lltm_cell (or lltm.LLTMCell)",
               "sequence_forward": "lltm.functional.lltm_sequence (or lltm.LLTM)",
               "stack_forward": "lltm.LLTM"}[name]
    return RuntimeError(
        f"torch.ops.lltm.{name}: torch.func's grad, vjp, jacrev, jvp, jacfwd and hessian "
        f"are not supported on the operator called directly; call {instead} instead, "
        "which supports them. torch.vmap alone works on the operator.")


_after_autograd = torch._C._after_autograd_keyset
_is_exporting = _settings.exporting


def _in_force(args: tuple, defaults: tuple) -> tuple:
    """A call's ``args`` completed by the schema's ``defaults``, with the
    settings in force where it gave none (an exported program keeps NOT_GIVEN)."""
    args = args + defaults[len(args):]
    if args[-1] == _settings.NOT_GIVEN and not _is_exporting():
        return (*args[:-1], _current_settings())
    return args


def _register_autograd(name: str, overload: str, function=None) -> None:
    """The autograd kernel of lltm::name (``overload``): a forward operator's
    ``function`` where a gradient or a tangent is to be tracked; for a
    backward operator (no ``function``), a Function whose backward raises a
    clear error instead of autograd's silent zeros; else the twin below
    autograd."""
    kernel = getattr(getattr(torch.ops.lltm, "_" + name), overload)
    defaults = tuple(a.default_value if a.has_default_value() else None
                     for a in kernel._schema.arguments)
    tuned = function in _TUNED
    qualname = name if overload == "default" else f"{name}.{overload}"
    if function is None:
        forward = name.replace("backward_gates", "forward").replace("backward", "forward")
        message = (f"lltm::{qualname} is not differentiable. For second derivatives "
                   f"differentiate lltm::{forward} (lltm.functional) with create_graph=True: "
                   "its backward then runs in differentiable operations.")

        class Refusing(torch.autograd.Function):
            @staticmethod
            def forward(ctx, *args):
                return kernel(*args)

            @staticmethod
            def backward(ctx, *grads):
                raise RuntimeError(message)

    def autograd_kernel(keyset, *args):
        args = _in_force(args, defaults)
        if tuned and _backend.benchmark:  # (torch.compile's calls: at trace time)
            args = _tuned(args)
        if function is None:
            if _grad_enabled() and _any_requires_grad(*args):
                return Refusing.apply(*args)
        elif (_grad_enabled() and _any_requires_grad(*args)) or _has_tangent(args):
            if _transforms_active():
                raise _transform_error(name)
            if args[-1] != _settings.NOT_GIVEN:  # a backward reads what inference drops
                args = (*args[:-1], args[-1] & ~_settings.INFERENCE)
            return function.c_apply(*args)
        with torch._C._AutoDispatchBelowAutograd():
            return kernel.redispatch(keyset & _after_autograd, *args)

    _autograd_library.impl(qualname, autograd_kernel, "Autograd", with_keyset=True)


_autograd_library = torch.library.Library("lltm", "IMPL")  # alive as long as the module
for _name, _overload, _function in (
        ("cell_forward", "default", CellForward), ("cell_backward", "default", None),
        ("sequence_forward", "default", SequenceForward),
        ("sequence_forward", "lengths", SequenceLengthsForward),
        ("stack_forward", "default", StackForward),
        ("stack_forward", "lengths", StackLengthsForward),
        *((name, overload, None) for name in ("sequence_backward", "sequence_backward_gates",
                                              "stack_backward")
          for overload in ("default", "lengths"))):
    _register_autograd(_name, _overload, _function)
