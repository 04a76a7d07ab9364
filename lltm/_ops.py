"""What torch needs besides the C kernels: fake (meta) implementations for
tracing and torch.compile, and autograd formulas tying forward to backward.
Both are registered in Python because the stable C ABI has no autograd API.

Every operator exists twice (csrc/binding/ops.h): the public one
(``lltm::cell_forward``), whose autograd kernel is registered here, and the
same C kernels under the name with a leading underscore
(``lltm::_cell_forward``), with no autograd kernel. The autograd formulas
call the underscored ones: the graphs torch.compile builds from them hold
those, and running such a graph reaches the kernels without entering Python
(the public operators' autograd kernel is a Python function, entered on
every call whether gradients are needed or not)."""
from __future__ import annotations

import types

import torch
import torch.autograd.forward_ad as _forward_ad
from torch._C._functorch import TransformType
from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters

from . import _autocast, _autotune, _differentiable, _settings, _sharing
from .backends import cuda as _backend


def _same_dtype_device(op: str, **tensors: torch.Tensor) -> None:
    names = list(tensors)
    first = tensors[names[0]]
    if first.dtype not in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        raise RuntimeError(f"{op}: {names[0]} has dtype {first.dtype}; expected a floating dtype")
    for name in names[1:]:
        t = tensors[name]
        if t.device != first.device:
            raise RuntimeError(f"{op}: all tensors must be on one device: "
                               f"{names[0]} is on {first.device}, {name} on {t.device}")
        if t.dtype != first.dtype:
            raise RuntimeError(f"{op}: all tensors must have one dtype: "
                               f"{names[0]} is {first.dtype}, {name} is {t.dtype}")


def _register_fake(name: str):
    """Registers the decorated function as the fake kernel of lltm::name and
    of its autograd-free twin lltm::_name."""
    def register(fake):
        torch.library.register_fake(f"lltm::{name}")(fake)
        torch.library.register_fake(f"lltm::_{name}")(fake)
        return fake
    return register


def _expect(op: str, name: str, t: torch.Tensor, shape: tuple) -> None:
    if tuple(t.shape) != tuple(shape):
        raise RuntimeError(f"{op}: {name} has shape {list(t.shape)}, expected {list(shape)}")


def _cell_dims(op: str, input: torch.Tensor, old_h: torch.Tensor) -> tuple[int, int, int]:
    # One rule for zero sizes in every op: B = 0 and I = 0 are allowed
    # (empty results), H = 0 is not.
    if input.dim() != 2:
        raise RuntimeError(f"{op}: input must be 2-dimensional [B, I], got shape "
                           f"{list(input.shape)}")
    if old_h.dim() != 2:
        raise RuntimeError(f"{op}: old_h must be 2-dimensional [B, H], got shape "
                           f"{list(old_h.shape)}")
    B, I = input.shape
    H = old_h.shape[1]
    if H == 0:
        raise RuntimeError(f"{op}: old_h has state size H = 0; expected H > 0")
    return B, I, H


@_register_fake("cell_forward")
def _cell_forward_fake(input, weights, bias, old_h, old_cell, settings=-1):
    op = "lltm::cell_forward"
    _same_dtype_device(op, input=input, weights=weights, bias=bias, old_h=old_h,
                       old_cell=old_cell)
    B, I, H = _cell_dims(op, input, old_h)
    _expect(op, "old_h", old_h, (B, H))
    _expect(op, "old_cell", old_cell, (B, H))
    _expect(op, "weights", weights, (3 * H, I + H))
    if tuple(bias.shape) not in ((3 * H,), (1, 3 * H)):
        raise RuntimeError(f"{op}: bias has shape {list(bias.shape)}, expected [{3 * H}]")
    return old_h.new_empty(B, H), old_h.new_empty(B, H), old_h.new_empty(B, 3 * H)


def _masked(op: str, results: tuple, output_mask) -> tuple:
    """``results`` with None where ``output_mask`` (the backward operators'
    last argument: which gradients to compute) is False, as the kernels
    return them."""
    if len(output_mask) != len(results):
        raise RuntimeError(f"{op}: output_mask has {len(output_mask)} entries, expected "
                           f"{len(results)} (one per gradient)")
    return tuple(r if m else None for r, m in zip(results, output_mask))


_ALL = (True,) * 5  # every gradient: the backward operators' default output_mask


@_register_fake("cell_backward")
def _cell_backward_fake(grad_h, grad_cell, new_cell, gates, input, old_h, weights,
                        output_mask=_ALL, settings=-1):
    op = "lltm::cell_backward"
    _same_dtype_device(op, grad_h=grad_h, grad_cell=grad_cell, new_cell=new_cell,
                       gates=gates, input=input, old_h=old_h, weights=weights)
    B, I, H = _cell_dims(op, input, old_h)
    for name, t in (("grad_h", grad_h), ("grad_cell", grad_cell), ("new_cell", new_cell),
                    ("old_h", old_h)):
        _expect(op, name, t, (B, H))
    _expect(op, "gates", gates, (B, 3 * H))
    _expect(op, "weights", weights, (3 * H, I + H))
    return _masked(op, (input.new_empty(B, I), weights.new_empty(3 * H, I + H),
                        weights.new_empty(3 * H), old_h.new_empty(B, H), old_h.new_empty(B, H)),
                   output_mask)


def _cell_setup_context(ctx, inputs, output):
    input, weights, bias, old_h, old_cell = inputs
    _new_h, new_cell, gates = output
    # Only the gate activations are new memory; the rest is alive anyway.
    # bias and old_cell serve the differentiable backward (create_graph).
    ctx.save_for_backward(input, weights, bias, old_h, old_cell, new_cell, gates)
    if _forward_ad._current_level >= 0:  # dual tensors: CellForward.jvp reads them
        ctx.save_for_forward(*inputs)
    ctx.mark_non_differentiable(gates)
    # No zero-filled gradient for gates (never used) each backward: that was a
    # kernel launch per step on CUDA. _cell_backward fills what it needs.
    ctx.set_materialize_grads(False)


# the autograd-free twins the backward formulas call
_cell_backward_kernel = torch.ops.lltm._cell_backward.default
_sequence_backward_kernel = torch.ops.lltm._sequence_backward


def _cell_backward(ctx, grad_h, grad_cell, _grad_gates):
    input, weights, bias, old_h, old_cell, new_cell, gates = ctx.saved_tensors
    if grad_h is None:
        grad_h = torch.zeros_like(new_cell)
    if grad_cell is None:
        grad_cell = torch.zeros_like(new_cell)
    if torch.is_grad_enabled():
        # The graph of this backward is recorded (create_graph=True, torch.func):
        # the native kernel's result would be a constant, its second
        # derivatives silently zero. Differentiable operations instead.
        d_input, d_weights, d_bias, d_old_h, d_old_cell = _differentiable.cell_backward(
            grad_h, grad_cell, input, weights, bias, old_h, old_cell)
    else:
        # Only the gradients autograd asks for (the products of the others
        # are not run; they come back None). Gradient mode is off and the
        # twin has no autograd kernel: no guard below autograd needed (each
        # _AutoDispatchBelowAutograd costs ~3.5 us of host time on a 2-core
        # CPU host).
        d_input, d_weights, d_bias, d_old_h, d_old_cell = _cell_backward_kernel(
            grad_h, grad_cell, new_cell, gates, input, old_h, weights,
            ctx.needs_input_grad[:5], _settings.current())
    if d_bias is not None and d_bias.shape != bias.shape:  # the tutorial's [1, 3H] bias
        d_bias = d_bias.view(bias.shape)
    return d_input, d_weights, d_bias, d_old_h, d_old_cell


# --- one layer over a whole sequence -------------------------------------------------

def _sequence_dims(op: str, input: torch.Tensor, state: torch.Tensor) -> tuple[int, int, int, int]:
    if input.dim() != 3:
        raise RuntimeError(f"{op}: input must be 3-dimensional [T, B, I], got shape "
                           f"{list(input.shape)}")
    if state.dim() != 2:
        raise RuntimeError(f"{op}: h0 must be 2-dimensional [B, H], got shape {list(state.shape)}")
    T, B, I = input.shape
    H = state.shape[1]
    if H == 0:
        raise RuntimeError(f"{op}: h0 has state size H = 0; expected H > 0")
    return T, B, I, H


@_register_fake("sequence_forward")
def _sequence_forward_fake(input, weights, bias, h0, c0, settings=-1):
    op = "lltm::sequence_forward"
    _same_dtype_device(op, input=input, weights=weights, bias=bias, h0=h0, c0=c0)
    T, B, I, H = _sequence_dims(op, input, h0)
    _expect(op, "h0", h0, (B, H))
    _expect(op, "c0", c0, (B, H))
    _expect(op, "weights", weights, (3 * H, I + H))
    if tuple(bias.shape) not in ((3 * H,), (1, 3 * H)):
        raise RuntimeError(f"{op}: bias has shape {list(bias.shape)}, expected [{3 * H}]")
    return (h0.new_empty(T, B, H), h0.new_empty(B, H), h0.new_empty(B, H),
            h0.new_empty(T, B, H), h0.new_empty(T, B, 3 * H))


@_register_fake("sequence_backward")
def _sequence_backward_fake(grad_output, grad_h_n, grad_c_n, input, weights, h0, output,
                            cells, gates, output_mask=_ALL, settings=-1):
    op = "lltm::sequence_backward"
    _same_dtype_device(op, grad_output=grad_output, grad_h_n=grad_h_n, grad_c_n=grad_c_n,
                       input=input, weights=weights, h0=h0, output=output, cells=cells,
                       gates=gates)
    T, B, I, H = _sequence_dims(op, input, h0)
    for name, t in (("grad_h_n", grad_h_n), ("grad_c_n", grad_c_n), ("h0", h0)):
        _expect(op, name, t, (B, H))
    for name, t in (("grad_output", grad_output), ("output", output), ("cells", cells)):
        _expect(op, name, t, (T, B, H))
    _expect(op, "gates", gates, (T, B, 3 * H))
    _expect(op, "weights", weights, (3 * H, I + H))
    return _masked(op, (input.new_empty(T, B, I), weights.new_empty(3 * H, I + H),
                        weights.new_empty(3 * H), h0.new_empty(B, H), h0.new_empty(B, H)),
                   output_mask)


@_register_fake("sequence_backward_gates")
def _sequence_backward_gates_fake(grad_output, grad_h_n, grad_c_n, input, weights, h0, output,
                                  cells, gates, output_mask=_ALL, settings=-1):
    grads = _sequence_backward_fake(grad_output, grad_h_n, grad_c_n, input, weights, h0, output,
                                    cells, gates)
    return _masked("lltm::sequence_backward_gates",
                   (grads[0], gates.new_empty(gates.shape), *grads[2:]), output_mask)


def _check_lengths(op: str, lengths: torch.Tensor, input: torch.Tensor, B: int) -> None:
    if lengths.dtype != torch.int64 or tuple(lengths.shape) != (B,):
        raise RuntimeError(f"{op}: lengths must be an int64 tensor of shape [{B}] (one length "
                           f"per batch row), got {lengths.dtype} of shape {list(lengths.shape)}")
    if lengths.device != input.device:
        raise RuntimeError(f"{op}: lengths must be on the input's device {input.device}, got "
                           f"{lengths.device}")


@_register_fake("sequence_forward.lengths")
def _sequence_forward_lengths_fake(input, weights, bias, h0, c0, lengths, settings=-1):
    outputs = _sequence_forward_fake(input, weights, bias, h0, c0)
    _check_lengths("lltm::sequence_forward", lengths, input, input.shape[1])
    return outputs


@_register_fake("sequence_backward.lengths")
def _sequence_backward_lengths_fake(grad_output, grad_h_n, grad_c_n, input, weights, h0, output,
                                    cells, gates, lengths, output_mask=_ALL, settings=-1):
    grads = _sequence_backward_fake(grad_output, grad_h_n, grad_c_n, input, weights, h0, output,
                                    cells, gates, output_mask)
    _check_lengths("lltm::sequence_backward", lengths, input, input.shape[1])
    return grads


@_register_fake("sequence_backward_gates.lengths")
def _sequence_backward_gates_lengths_fake(grad_output, grad_h_n, grad_c_n, input, weights, h0,
                                          output, cells, gates, lengths, output_mask=_ALL,
                                          settings=-1):
    grads = _sequence_backward_gates_fake(grad_output, grad_h_n, grad_c_n, input, weights, h0,
                                          output, cells, gates, output_mask)
    _check_lengths("lltm::sequence_backward_gates", lengths, input, input.shape[1])
    return grads


def _sequence_setup_context(ctx, inputs, output):
    # inputs: sequence_forward's, and the lengths [B] of its lengths overload
    input, weights, bias, h0, c0, *lengths = inputs
    out, _h_n, _c_n, cells, gates = output
    # New memory kept per step: cells and gates (4*B*H); out is the layer's
    # result (h_{t-1} is read from it), the inputs are alive anyway (bias and
    # c0 serve the differentiable backward).
    ctx.save_for_backward(input, weights, bias, h0, c0, out, cells, gates, *lengths)
    if _forward_ad._current_level >= 0:  # dual tensors: SequenceForward.jvp reads them
        ctx.save_for_forward(*inputs)
    ctx.mark_non_differentiable(cells, gates)
    # A layer run beside another (lltm.sequence's two directions) plans its
    # backward for the shared device too.
    ctx.concurrent_layers = _sharing.concurrent_layers()
    # Gradients of cells and gates are never used: without this, autograd
    # allocates and zero-fills [T,B,4H] for them every backward (two kernel
    # launches and ~50 us of host time on a CUDA host).
    ctx.set_materialize_grads(False)


def incoming_grads(out, h0, grad_output, grad_h_n, grad_c_n):
    """The gradients arriving through a layer's (or stack's) output, h_n
    and c_n, which may come in any combination: zeros (like ``out`` and
    ``h0``) for those that did not."""
    zeros = torch.zeros_like
    return (zeros(out) if grad_output is None else grad_output,
            zeros(h0) if grad_h_n is None else grad_h_n,
            zeros(h0) if grad_c_n is None else grad_c_n)


def layer_grads(ctx, grad_output, grad_h_n, grad_c_n, kernel, mask):
    """One layer's backward from what _sequence_setup_context saves in
    ``ctx``: ((d_input, d_weights, d_bias, d_h0, d_c0), saved tensors).
    Where the backward's graph is recorded (create_graph), in differentiable
    operations (see _cell_backward); else through ``kernel``
    (sequence_backward, or sequence_backward_gates, whose second result is
    then dG), its lengths overload where the forward had lengths, with
    output_mask ``mask`` (only the gradients asked for, as in
    _cell_backward), with the settings in force, planned for the layers that
    ran beside this one."""
    saved = ctx.saved_tensors
    input, weights, bias, h0, c0, out, cells, gates, *lengths = saved
    grad_output, grad_h_n, grad_c_n = incoming_grads(out, h0, grad_output, grad_h_n, grad_c_n)
    if torch.is_grad_enabled():
        d_input, d_weights, d_bias, d_h0, d_c0 = _differentiable.sequence_backward(
            grad_output, grad_h_n, grad_c_n, input, weights, bias, h0, c0, *lengths)
    else:
        op = kernel.lengths if lengths else kernel.default
        settings = _settings.current(getattr(ctx, "concurrent_layers", 1))
        tuned = getattr(ctx, "tuned_plan", None)  # the forward's measured plan
        if tuned is not None:
            settings = _autotune.with_plan(settings, tuned)
        d_input, d_weights, d_bias, d_h0, d_c0 = op(
            grad_output, grad_h_n, grad_c_n, input, weights, h0, out, cells, gates, *lengths,
            mask, settings)
    if d_bias is not None:
        d_bias = d_bias.view(bias.shape)
    return (d_input, d_weights, d_bias, d_h0, d_c0), saved


def _sequence_backward(ctx, grad_output, grad_h_n, grad_c_n, _grad_cells, _grad_gates):
    grads, saved = layer_grads(ctx, grad_output, grad_h_n, grad_c_n, _sequence_backward_kernel,
                               ctx.needs_input_grad[:5])
    # lengths (an integer tensor, saved last where given) has no gradient
    return grads + (None,) * (len(saved) - 8)


# --- stacked layers over a whole sequence ----------------------------------------------

def _stack_dims(op: str, input, weights0, weights, biases, h0) -> tuple[int, int, int, int, int]:
    if input.dim() != 3:
        raise RuntimeError(f"{op}: input must be 3-dimensional [T, B, I], got shape "
                           f"{list(input.shape)}")
    if h0.dim() != 3:
        raise RuntimeError(f"{op}: h0 must be 3-dimensional [L, B, H], got shape "
                           f"{list(h0.shape)}")
    T, B, I = input.shape
    L, H = h0.shape[0], h0.shape[2]
    if L == 0:
        raise RuntimeError(f"{op}: h0 holds L = 0 layers; expected at least one")
    if H == 0:
        raise RuntimeError(f"{op}: h0 has state size H = 0; expected H > 0")
    _expect(op, "h0", h0, (L, B, H))
    _expect(op, "weights0", weights0, (3 * H, H + I))
    _expect(op, "weights", weights, (L - 1, 3 * H, 2 * H))
    if biases is not None:
        _expect(op, "biases", biases, (L, 3 * H))
    return T, B, I, H, L


@_register_fake("stack_forward")
def _stack_forward_fake(input, weights0, weights, biases, h0, c0, settings=-1):
    op = "lltm::stack_forward"
    _same_dtype_device(op, input=input, weights0=weights0, weights=weights, biases=biases,
                       h0=h0, c0=c0)
    T, B, I, H, L = _stack_dims(op, input, weights0, weights, biases, h0)
    _expect(op, "c0", c0, (L, B, H))
    return (h0.new_empty(T, B, H), h0.new_empty(L, B, H), h0.new_empty(L, B, H),
            h0.new_empty(L - 1, T, B, H), h0.new_empty(L, T, B, H),
            h0.new_empty(L, T, B, 3 * H))


_ALL6 = (True,) * 6  # the stack's backward: every gradient


@_register_fake("stack_backward")
def _stack_backward_fake(grad_output, grad_h_n, grad_c_n, input, weights0, weights, h0, output,
                         outputs, cells, gates, output_mask=_ALL6, settings=-1):
    op = "lltm::stack_backward"
    _same_dtype_device(op, grad_output=grad_output, grad_h_n=grad_h_n, grad_c_n=grad_c_n,
                       input=input, weights0=weights0, weights=weights, h0=h0, output=output,
                       outputs=outputs, cells=cells, gates=gates)
    T, B, I, H, L = _stack_dims(op, input, weights0, weights, None, h0)
    for name, t in (("grad_h_n", grad_h_n), ("grad_c_n", grad_c_n)):
        _expect(op, name, t, (L, B, H))
    for name, t in (("grad_output", grad_output), ("output", output)):
        _expect(op, name, t, (T, B, H))
    _expect(op, "outputs", outputs, (L - 1, T, B, H))
    _expect(op, "cells", cells, (L, T, B, H))
    _expect(op, "gates", gates, (L, T, B, 3 * H))
    return _masked(op, (input.new_empty(T, B, I), weights0.new_empty(3 * H, H + I),
                        weights.new_empty(L - 1, 3 * H, 2 * H), h0.new_empty(L, 3 * H),
                        h0.new_empty(L, B, H), h0.new_empty(L, B, H)), output_mask)


@_register_fake("stack_forward.lengths")
def _stack_forward_lengths_fake(input, weights0, weights, biases, h0, c0, lengths, settings=-1):
    outputs = _stack_forward_fake(input, weights0, weights, biases, h0, c0)
    _check_lengths("lltm::stack_forward", lengths, input, input.shape[1])
    return outputs


@_register_fake("stack_backward.lengths")
def _stack_backward_lengths_fake(grad_output, grad_h_n, grad_c_n, input, weights0, weights, h0,
                                 output, outputs, cells, gates, lengths, output_mask=_ALL6,
                                 settings=-1):
    grads = _stack_backward_fake(grad_output, grad_h_n, grad_c_n, input, weights0, weights, h0,
                                 output, outputs, cells, gates, output_mask)
    _check_lengths("lltm::stack_backward", lengths, input, input.shape[1])
    return grads


def _stack_setup_context(ctx, inputs, output):
    # inputs: stack_forward's, and the lengths [B] of its lengths overload
    out, _h_n, _c_n, outputs, cells, gates = output
    ctx.save_for_backward(*inputs[:6], out, outputs, cells, gates, *inputs[6:])
    if _forward_ad._current_level >= 0:  # dual tensors: StackForward.jvp reads them
        ctx.save_for_forward(*inputs)
    ctx.mark_non_differentiable(outputs, cells, gates)
    ctx.set_materialize_grads(False)  # as the sequence's: no zero-filled [L,T,B,5H]


_stack_backward_kernel = torch.ops.lltm._stack_backward


def _stack_backward(ctx, grad_output, grad_h_n, grad_c_n, *_unused):
    input, weights0, weights, biases, h0, c0, out, outputs, cells, gates, *lengths = (
        ctx.saved_tensors)
    grad_output, grad_h_n, grad_c_n = incoming_grads(out, h0, grad_output, grad_h_n, grad_c_n)
    if torch.is_grad_enabled():  # the backward's graph is recorded: see _cell_backward
        grads = _differentiable.stack_backward(grad_output, grad_h_n, grad_c_n, input,
                                               weights0, weights, biases, h0, c0, *lengths)
    else:  # only the gradients autograd asks for, as in _cell_backward
        op = _stack_backward_kernel.lengths if lengths else _stack_backward_kernel.default
        grads = op(grad_output, grad_h_n, grad_c_n, input, weights0, weights, h0, out, outputs,
                   cells, gates, *lengths, ctx.needs_input_grad[:6], _settings.current())
    return tuple(grads) + (None,) * len(lengths)


# --- the Functions -------------------------------------------------------------------
# One autograd.Function per forward operator, whose forward runs the
# operator's autograd-free twin: eager_call enters it directly (the
# operator's Python autograd kernel, entered through the dispatcher, costs
# more host time than a whole small step), and the autograd kernel
# registered below for direct torch.ops calls, torch.compile, export and
# opcheck enters the same Function (the cell's plainest eager call takes
# CellStep, below). The Functions are in the setup_context style, so
# torch.func transforms work: vmap runs forward through the ops' batching
# rules (lltm/_vmap.py), grad and vjp through the backward above (its
# differentiable branch: torch.func records the backward's graph),
# forward-mode AD (dual tensors) through jvp.
# Under torch.func's forward-mode transforms (jvp, jacfwd, hessian) the step
# runs in plain PyTorch operations instead: functorch would not differentiate
# the Function's jvp again.

def _op_function(name: str, op, setup_context, backward, tangents, n_outputs: int):
    """The autograd.Function of a forward operator: forward runs ``op`` (an
    autograd-free twin) on the operator's arguments, the settings last;
    ``setup_context`` and ``backward`` see the others only, and
    ``tangents(*inputs, *input_tangents)`` gives the tangents of the
    differentiable outputs (the rest get None)."""
    def forward(*args):
        # A Function's forward runs with gradient mode off, and op has no
        # autograd kernel: it goes straight to its device kernel.
        return op(*args)

    def setup(ctx, inputs, output):
        setup_context(ctx, inputs[:-1], output)
        if _backend.benchmark and inputs[-1] != _settings.NOT_GIVEN:
            ctx.tuned_plan = inputs[-1] & _autotune.PLAN_FIELDS  # the backward's too

    def differentiate(ctx, *grads):
        return (*backward(ctx, *grads), None)  # (the settings have none)

    def jvp(ctx, *input_tangents):
        out = tangents(*ctx.saved_tensors, *input_tangents[:-1])
        return (*out, *(None,) * (n_outputs - len(out)))

    def body(namespace):
        namespace.update(generate_vmap_rule=True, forward=staticmethod(forward),
                         setup_context=staticmethod(setup),
                         backward=staticmethod(differentiate), jvp=staticmethod(jvp),
                         __module__=__name__, __doc__=f"torch.ops.lltm.{op.__name__[1:]} "
                                                      "with autograd.")
    function = types.new_class(name, (torch.autograd.Function,), exec_body=body)
    # Function.apply's Python wrapper exists for functorch transforms (and
    # default arguments, which forward has none of); outside transforms
    # eager_call goes straight to the C apply it ends in: ~2 us less host
    # time per call, a tenth of a small CUDA step's forward.
    function.c_apply = super(torch.autograd.Function, function).apply
    function.kernel = op
    return function


CellForward = _op_function("CellForward", torch.ops.lltm._cell_forward.default,
                           _cell_setup_context, _cell_backward,
                           lambda *a: _differentiable.cell_jvp(*a)[2:], 3)
SequenceForward = _op_function("SequenceForward", torch.ops.lltm._sequence_forward.default,
                               _sequence_setup_context, _sequence_backward,
                               _differentiable.sequence_jvp, 5)


# The lengths overload: saved tensors are (*inputs, lengths), tangents six.
SequenceLengthsForward = _op_function(
    "SequenceLengthsForward", torch.ops.lltm._sequence_forward.lengths,
    _sequence_setup_context, _sequence_backward,
    lambda *a: _differentiable.sequence_jvp(*a[:-7], *a[-6:-1], a[-7]), 5)

StackForward = _op_function("StackForward", torch.ops.lltm._stack_forward.default,
                            _stack_setup_context, _stack_backward,
                            _differentiable.stack_jvp, 6)
# saved (*inputs, lengths), then seven tangents (lengths' last)
StackLengthsForward = _op_function(
    "StackLengthsForward", torch.ops.lltm._stack_forward.lengths,
    _stack_setup_context, _stack_backward,
    lambda *a: _differentiable.stack_jvp(*a[:-8], *a[-7:-1], a[-8]), 6)

# Bound once: an eager step reads each of these on every call.
_is_compiling = torch.compiler.is_compiling
_transforms_active = torch._C._are_functorch_transforms_active
_autocast_enabled = torch._C._is_any_autocast_enabled
_grad_enabled = torch.is_grad_enabled
_any_requires_grad = torch._C._any_requires_grad  # what torch.library's autograd asks too
_is_wrapped = torch._C._functorch.is_functorch_wrapped_tensor
_current_settings = _settings.current


def eager_call(function, op, *args):
    """``op(*args, settings)`` with autograd, the settings those in force
    (lltm/_settings.py), through ``function`` (CellForward or
    SequenceForward, whose forward is op's autograd-free twin) when eager and
    some input needs a gradient or a tangent; under torch.autocast in the
    autocast dtype."""
    if _is_compiling():  # (dynamo reads no attributes of a Function: op is passed)
        return op(*args, _settings.traced())
    if _transforms_active():
        if _under_functorch_jvp():
            # The Function's jvp is exact once, but functorch does not track a
            # second derivative through it (jvp of jvp, jacfwd of jacrev):
            # under forward-mode transforms the step runs in plain operations.
            return _FORWARD_MATH[function](*args)
        if _backend.benchmark and function in _TUNED:
            return function.apply(*_tuned((*args, _current_settings())))
        return function.apply(*args, _current_settings())
    args = (*args, _current_settings())
    if _autocast_enabled():
        return _autocast.eager_call(lambda a: _eager(function, a), args)
    return _eager(function, args)


class CellStep(torch.autograd.Function):
    """The cell's eager step where it is plainest and most frequent (gradients
    needed, no transform, no tangent, no autocast, not compiling): CellForward
    with two outputs, the gate activations saved as an intermediate. Fewer
    outputs to wrap and mark: ~5 us less host time a step than CellForward
    on the 2-core CPU host."""

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
    """A sequence forward's ``args`` (the settings last) with the plan
    measured for it (lltm/_autotune.py)."""
    training = _grad_enabled() and _any_requires_grad(*args)
    return (*args[:-1], _autotune.settings(args[-1], args[0], args[3].shape[-1], training))


_FORWARD_MATH = {CellForward: _differentiable.cell_forward,
                 SequenceForward: _differentiable.sequence_forward,
                 SequenceLengthsForward: _differentiable.sequence_forward,
                 StackForward: _differentiable.stack_forward,
                 StackLengthsForward: _differentiable.stack_forward}


def _eager(function, args):
    """eager_call outside transforms and autocast (``args``: the operator's,
    the settings last): through the Function's C apply where a gradient or a
    tangent is needed, else its operator alone."""
    if _backend.benchmark and function in _TUNED:
        args = _tuned(args)
    if (_grad_enabled() and _any_requires_grad(*args)) or _forward_ad._current_level >= 0:
        if any(map(_is_wrapped, args[:-1])):  # left over from a finished transform: apply unwraps
            return function.apply(*args)
        return function.c_apply(*args)
    return function.kernel(*args)  # no gradient to track: the autograd-free twin


# --- the operators' autograd kernels --------------------------------------------------
# Direct torch.ops.lltm calls, torch.compile, export and opcheck: the same
# Functions as eager_call (forward and forward mode). Without a gradient or a
# tangent to track, the underscored operator below autograd. torch.func's
# derivative transforms reach this kernel one level at a time, where a
# Function cannot be told apart from its transforms: they get a clear error
# (lltm.functional supports them); vmap alone is handled before autograd
# (lltm/_vmap.py).

def _has_tangent(args) -> bool:
    return _forward_ad._current_level >= 0 and any(
        _forward_ad.unpack_dual(a).tangent is not None for a in args)


def _transform_error(name: str) -> RuntimeError:
    functional = {"cell_forward": "lltm_cell", "sequence_forward": "lltm_sequence",
                  "stack_forward": "lltm_stack"}[name]
    return RuntimeError(
        f"torch.ops.lltm.{name}: torch.func's grad, vjp, jacrev, jvp, jacfwd and hessian "
        f"are not supported on the operator called directly; call "
        f"lltm.functional.{functional} (or the modules) instead, which supports them. "
        "torch.vmap alone works on the operator.")


_after_autograd = torch._C._after_autograd_keyset


_is_exporting = _settings.exporting


def _in_force(args: tuple, defaults: tuple) -> tuple:
    """A call's ``args`` whole (the trailing ones left out take their
    ``defaults``, the schema's), with the settings in force where it gave
    none (an exported program keeps NOT_GIVEN: lltm/_settings.py)."""
    args = args + defaults[len(args):]
    if args[-1] == _settings.NOT_GIVEN and not _is_exporting():
        return (*args[:-1], _current_settings())
    return args


def _defaults(op) -> tuple:
    return tuple(a.default_value if a.has_default_value() else None
                 for a in op._schema.arguments)


def _qualname(name: str, overload: str) -> str:
    return name if overload == "default" else f"{name}.{overload}"


def _register_autograd(name: str, function, overload: str = "default") -> None:
    kernel = getattr(getattr(torch.ops.lltm, "_" + name), overload)
    defaults = _defaults(kernel)
    tuned = function in _TUNED

    def autograd_kernel(keyset, *args):
        args = _in_force(args, defaults)
        if tuned and _backend.benchmark:  # (torch.compile's calls: at trace time)
            args = _tuned(args)
        if (_grad_enabled() and _any_requires_grad(*args)) or _has_tangent(args):
            if _transforms_active():
                raise _transform_error(name)
            return function.c_apply(*args)
        with torch._C._AutoDispatchBelowAutograd():
            return kernel.redispatch(keyset & _after_autograd, *args)

    _autograd_library.impl(_qualname(name, overload), autograd_kernel, "Autograd",
                           with_keyset=True)


def _register_not_differentiable(name: str, overload: str = "default") -> None:
    """The autograd kernel of a backward operator, which has no derivative of
    its own: the settings in force filled in, and a clear error instead of
    autograd's silent zeros if someone differentiates through it."""
    kernel = getattr(getattr(torch.ops.lltm, "_" + name), overload)
    defaults = _defaults(kernel)
    forward = name.replace("backward_gates", "forward").replace("backward", "forward")
    message = (f"lltm::{_qualname(name, overload)} is not differentiable. For second "
               f"derivatives differentiate lltm::{forward} (lltm.functional) with "
               "create_graph=True: its backward then runs in differentiable operations.")

    class Refusing(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *args):
            return kernel(*args)

        @staticmethod
        def backward(ctx, *grads):
            raise RuntimeError(message)

    def autograd_kernel(keyset, *args):
        args = _in_force(args, defaults)
        if _grad_enabled() and _any_requires_grad(*args):
            return Refusing.apply(*args)
        with torch._C._AutoDispatchBelowAutograd():
            return kernel.redispatch(keyset & _after_autograd, *args)

    _autograd_library.impl(_qualname(name, overload), autograd_kernel, "Autograd",
                           with_keyset=True)


_autograd_library = torch.library.Library("lltm", "IMPL")  # alive as long as the module
_register_autograd("cell_forward", CellForward)
_register_autograd("sequence_forward", SequenceForward)
_register_autograd("sequence_forward", SequenceLengthsForward, overload="lengths")
_register_autograd("stack_forward", StackForward)
_register_autograd("stack_forward", StackLengthsForward, overload="lengths")
for _name in ("cell_backward", "sequence_backward", "sequence_backward_gates", "stack_backward"):
    for _overload in ("default",) if _name == "cell_backward" else ("default", "lengths"):
        _register_not_differentiable(_name, _overload)
