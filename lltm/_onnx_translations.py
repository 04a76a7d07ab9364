"""ONNX translations of lltm's forward operators for torch.onnx.export
(dynamo=True), registered by lltm/_onnx.py (imported only then: it needs
onnxscript). A layer (``sequence_forward``) is ONNX's LSTM where the dtype
allows, else a Scan over the cell's operations; the cell is its operations;
the stack is a layer after another. T and B stay symbolic.

ONNX's LSTM (gates i, o, f, c) is the LLTM step with g = Elu, h = Tanh, the
i, o and z rows of lltm's weights (input columns to W, state columns to R)
and a forget gate held at f = 1 (weights zero, bias FORGET_BIAS: sigmoid(40)
is exactly 1.0 in float32 in ONNX Runtime's CPU LSTM from opset 18, measured
with 1.32), so c' = c + i * z as in lltm. sequence_lens is lltm's lengths.
ONNX Runtime's LSTM runs no float64: float64 layers take the Scan. The half
types run in float32, rounded at the end, as lltm's kernels accumulate.

The operators' other outputs (cells and gates, kept for the backward) are
recomputed from the LSTM's outputs in a few whole-sequence operations; the
exporter's optimizer drops them for inference.
"""
from __future__ import annotations

from typing import TypeVar, Union

import onnx_ir as ir
import onnxscript
from onnxscript import BFLOAT16, DOUBLE, FLOAT, FLOAT16, INT64
from onnxscript.onnx_opset import opset18 as op

import torch

TFloat = TypeVar("TFloat", bound=Union[FLOAT16, FLOAT, DOUBLE, BFLOAT16])  # noqa: UP007

FORGET_BIAS = 40.0
_HALF = (ir.DataType.FLOAT16, ir.DataType.BFLOAT16)


def _ints(*values: int):
    return op.Constant(value_ints=list(values))


def _scalar(value: float, dtype: ir.DataType):
    return op.Constant(value=ir.tensor(value, dtype=dtype))


def _part(x, start: int, end: int, axis: int):
    return op.Slice(x, _ints(start), _ints(end), _ints(axis))


def _sizes(weights, h0) -> tuple[int, int]:
    """(H, I) of a layer, from its weights [3H, I+H], static in the graph."""
    H = h0.shape[-1]
    if not isinstance(H, int) or not isinstance(weights.shape[1], int):
        raise ValueError("lltm ONNX export: the state size and the input features must be "
                         "static; only T and B may be dynamic")
    return H, weights.shape[1] - H


def _bias_vector(bias, G: int):
    """bias [3H] (or the tutorial's [1, 3H]) as [3H]."""
    return bias if bias.shape is not None and len(bias.shape) == 1 else op.Reshape(bias, _ints(G))


def _live(input, lengths):
    """[T, B, 1] bool: step t of row b is within lengths[b]."""
    T = op.Squeeze(op.Shape(input, start=0, end=1), _ints(0))
    steps = op.Range(_scalar(0, ir.DataType.INT64), T, _scalar(1, ir.DataType.INT64))
    return op.Unsqueeze(op.Less(op.Unsqueeze(steps, _ints(1)),
                                op.Unsqueeze(lengths, _ints(0))), _ints(2))


def _activations(g, dtype: ir.DataType):
    """(i, o, z) of pre-activations g [..., 3H]."""
    g_i, g_o, g_z = op.Split(g, axis=-1, num_outputs=3)
    if dtype == ir.DataType.DOUBLE:
        # ONNX Runtime 1.32 runs no float64 Elu in a model of opset 20 (it
        # does at 18): exp(g) - 1 below 0 (lltm's expm1 differs by ~1e-16)
        z = op.Where(op.Greater(g_z, _scalar(0.0, dtype)), g_z,
                     op.Sub(op.Exp(op.Min(g_z, _scalar(0.0, dtype))), _scalar(1.0, dtype)))
    else:
        z = op.Elu(g_z)
    return op.Sigmoid(g_i), op.Sigmoid(g_o), z


# --- one layer as ONNX's LSTM ------------------------------------------------------------

def _lstm_layer(input, weights, bias, h0, c0, lengths, H: int, I: int):  # noqa: E741
    """(output [T,B,H], h_n, c_n, cells [T,B,H], gates [T,B,3H]), float32."""
    dtype = input.dtype
    w_x, w_h = _part(weights, H, H + I, 1), _part(weights, 0, H, 1)
    b = _bias_vector(bias, 3 * H)
    # rows i, o, z -> i, o, f, c with the forget gate's rows zero
    zeros_x = op.ConstantOfShape(_ints(H, I), value=ir.tensor([0.0], dtype=dtype))
    zeros_h = op.ConstantOfShape(_ints(H, H), value=ir.tensor([0.0], dtype=dtype))
    W = op.Concat(_part(w_x, 0, 2 * H, 0), zeros_x, _part(w_x, 2 * H, 3 * H, 0), axis=0)
    R = op.Concat(_part(w_h, 0, 2 * H, 0), zeros_h, _part(w_h, 2 * H, 3 * H, 0), axis=0)
    forget = op.ConstantOfShape(_ints(H), value=ir.tensor([FORGET_BIAS], dtype=dtype))
    B = op.Concat(_part(b, 0, 2 * H, 0), forget, _part(b, 2 * H, 3 * H, 0),
                  op.ConstantOfShape(_ints(4 * H), value=ir.tensor([0.0], dtype=dtype)), axis=0)
    sequence_lens = None if lengths is None else op.Cast(lengths, to=ir.DataType.INT32)
    Y, Y_h, Y_c = op.LSTM(input, op.Unsqueeze(W, _ints(0)), op.Unsqueeze(R, _ints(0)),
                          op.Unsqueeze(B, _ints(0)), sequence_lens, op.Unsqueeze(h0, _ints(0)),
                          op.Unsqueeze(c0, _ints(0)), hidden_size=H,
                          activations=["Sigmoid", "Elu", "Tanh"])
    output = op.Squeeze(Y, _ints(1))
    h_n, c_n = op.Squeeze(Y_h, _ints(0)), op.Squeeze(Y_c, _ints(0))
    # Each step's gates from the state before it (h0, then the outputs: a
    # row's outputs are valid up to its length, and past it its gates are
    # zeroed anyway); the cells as c0 plus the running sum of i * z.
    h_prev = op.Concat(op.Unsqueeze(h0, _ints(0)), _part(output, 0, -1, 0), axis=0)
    g = op.Add(op.MatMul(op.Concat(h_prev, input, axis=2), op.Transpose(weights, perm=[1, 0])),
               b)
    i, o, z = _activations(g, dtype)
    gates = op.Concat(i, o, z, axis=2)
    update = op.Mul(i, z)
    if lengths is not None:
        live = _live(input, lengths)
        zero = _scalar(0.0, dtype)
        gates, update = op.Where(live, gates, zero), op.Where(live, update, zero)
    cells = _part(op.CumSum(op.Concat(op.Unsqueeze(c0, _ints(0)), update, axis=0),
                            _ints(0)), 1, 2**62, 0)
    return output, h_n, c_n, cells, gates


# --- one layer as a Scan ------------------------------------------------------------------

def _value(name: str, dtype: ir.DataType, shape) -> ir.Value:
    return ir.Value(name=name, type=ir.TensorType(dtype), shape=ir.Shape(shape))


def _scan_body(H: int, dtype: ir.DataType, w_h_t: ir.Value, with_lengths: bool, tag: str):
    """The step: (h, c, x_t W_x^T + b [, live_t]) -> (h', c', output_t,
    cell_t, gates_t); W_h^T [H, 3H] read from the enclosing graph."""
    tape = ir.tape.Tape()
    h = _value(f"{tag}_h", dtype, ["B", H])
    c = _value(f"{tag}_c", dtype, ["B", H])
    xw = _value(f"{tag}_xw", dtype, ["B", 3 * H])
    inputs = [h, c, xw]
    g = tape.op("Add", [xw, tape.op("MatMul", [h, w_h_t])])
    g_i, g_o, g_z = tape.op_multi_out("Split", [g], {"axis": 1, "num_outputs": 3},
                                      num_outputs=3)
    zero = tape.op("Constant", [], {"value": ir.tensor(0.0, dtype=dtype)})
    one = tape.op("Constant", [], {"value": ir.tensor(1.0, dtype=dtype)})
    z = tape.op("Where", [tape.op("Greater", [g_z, zero]), g_z,  # Elu, as in _activations
                          tape.op("Sub", [tape.op("Exp", [tape.op("Min", [g_z, zero])]), one])])
    i, o = tape.op("Sigmoid", [g_i]), tape.op("Sigmoid", [g_o])
    c_new = tape.op("Add", [c, tape.op("Mul", [i, z])])
    h_new = tape.op("Mul", [tape.op("Tanh", [c_new]), o])
    gates = tape.op("Concat", [i, o, z], {"axis": 1})
    out = h_new
    if with_lengths:  # a row past its length keeps its state, outputs zeros
        live = _value(f"{tag}_live", ir.DataType.BOOL, ["B", 1])
        inputs.append(live)
        h_new = tape.op("Where", [live, h_new, h])
        c_new = tape.op("Where", [live, c_new, c])
        out = tape.op("Where", [live, out, zero])
        gates = tape.op("Where", [live, gates, zero])
    outputs = [tape.op("Identity", [v]) for v in (h_new, c_new, out, c_new, gates)]
    return ir.Graph(inputs, outputs, nodes=tape.nodes, name=f"{tag}_step")


_scans = 0


def _scan_layer(input, weights, bias, h0, c0, lengths, H: int, I: int):  # noqa: E741
    """(output, h_n, c_n, cells, gates) of one layer in input's dtype."""
    global _scans
    _scans += 1
    w_h_t = op.Transpose(_part(weights, 0, H, 1), perm=[1, 0])
    w_h_t.name = f"lltm_scan{_scans}_w_h_t"  # the body reads it from the graph around it
    xw = op.Add(op.MatMul(input, op.Transpose(_part(weights, H, H + I, 1), perm=[1, 0])),
                _bias_vector(bias, 3 * H))
    scanned = [xw]
    if lengths is not None:
        scanned.append(_live(input, lengths))
    body = _scan_body(H, input.dtype, w_h_t, lengths is not None, f"lltm_scan{_scans}")
    recorder = onnxscript.evaluator.default()
    node = ir.Node("", "Scan", [h0, c0, *scanned], num_outputs=5,
                   attributes=[ir.AttrGraph("body", body),
                               ir.AttrInt64("num_scan_inputs", len(scanned))])
    recorder.nodes.append(node)  # Scan's outputs are variadic: the node is built here
    h_n, c_n, output, cells, gates = node.outputs
    return output, h_n, c_n, cells, gates


# --- the operators ------------------------------------------------------------------------

def _layer(input, weights, bias, h0, c0, lengths=None, sizes=None):
    """One layer: (output, h_n, c_n, cells, gates); ``sizes`` (H, I) where
    the weights' shape is not known (the stack's)."""
    H, I = sizes or _sizes(weights, h0)  # noqa: E741
    if input.dtype == ir.DataType.DOUBLE:
        return _scan_layer(input, weights, bias, h0, c0, lengths, H, I)
    return _half_in_float32(_lstm_layer, (input, weights, bias, h0, c0), lengths, H, I)


def _half_in_float32(function, tensors: tuple, *rest):
    """``function(*tensors, *rest)``; for the half types in float32, its
    results rounded back."""
    dtype = tensors[0].dtype
    if dtype not in _HALF:
        return function(*tensors, *rest)
    results = function(*(op.Cast(t, to=ir.DataType.FLOAT) for t in tensors), *rest)
    return tuple(op.Cast(t, to=dtype) for t in results)


def _stack(input, weights0, weights, biases, h0, c0, lengths=None):
    L = h0.shape[0]
    H, I = _sizes(weights0, h0)  # noqa: E741
    if not isinstance(L, int):
        raise ValueError("lltm ONNX export: the number of stacked layers must be static")
    x, h_n, c_n, outputs, cells, gates = input, [], [], [], [], []
    for layer in range(L):
        w = weights0 if layer == 0 else op.Squeeze(_part(weights, layer - 1, layer, 0),
                                                   _ints(0))
        state = [op.Squeeze(_part(s, layer, layer + 1, 0), _ints(0)) for s in (h0, c0)]
        b = op.Squeeze(_part(biases, layer, layer + 1, 0), _ints(0))
        x, h, c, cell, gate = _layer(x, w, b, *state, lengths, (H, I if layer == 0 else H))
        if layer < L - 1:
            outputs.append(op.Unsqueeze(x, _ints(0)))
        for kept, t in ((h_n, h), (c_n, c), (cells, cell), (gates, gate)):
            kept.append(op.Unsqueeze(t, _ints(0)))
    if not outputs:  # [0, T, B, H]
        outputs.append(_part(op.Unsqueeze(x, _ints(0)), 0, 0, 0))
    return (x, *(op.Concat(*kept, axis=0) for kept in (h_n, c_n, outputs, cells, gates)))


def sequence_forward(input: TFloat, weights: TFloat, bias: TFloat, h0: TFloat, c0: TFloat,
                     settings: int = -1) -> tuple[TFloat, TFloat, TFloat, TFloat, TFloat]:
    """lltm::sequence_forward (the settings concern the native kernels only)."""
    return _layer(input, weights, bias, h0, c0)


def sequence_forward_lengths(input: TFloat, weights: TFloat, bias: TFloat, h0: TFloat,
                             c0: TFloat, lengths: INT64, settings: int = -1
                             ) -> tuple[TFloat, TFloat, TFloat, TFloat, TFloat]:
    """lltm::sequence_forward.lengths."""
    return _layer(input, weights, bias, h0, c0, lengths)


def stack_forward(input: TFloat, weights0: TFloat, weights: TFloat, biases: TFloat, h0: TFloat,
                  c0: TFloat, settings: int = -1
                  ) -> tuple[TFloat, TFloat, TFloat, TFloat, TFloat, TFloat]:
    """lltm::stack_forward: its layers one after the other."""
    return _stack(input, weights0, weights, biases, h0, c0)


def stack_forward_lengths(input: TFloat, weights0: TFloat, weights: TFloat, biases: TFloat,
                          h0: TFloat, c0: TFloat, lengths: INT64, settings: int = -1
                          ) -> tuple[TFloat, TFloat, TFloat, TFloat, TFloat, TFloat]:
    """lltm::stack_forward.lengths."""
    return _stack(input, weights0, weights, biases, h0, c0, lengths)


def cell_forward(input: TFloat, weights: TFloat, bias: TFloat, old_h: TFloat, old_cell: TFloat,
                 settings: int = -1) -> tuple[TFloat, TFloat, TFloat]:
    """lltm::cell_forward: (new_h, new_cell, gates [i | o | z])."""
    return _half_in_float32(_cell, (input, weights, bias, old_h, old_cell),
                            _sizes(weights, old_h)[0])


def _cell(input, weights, bias, old_h, old_cell, H: int):
    g = op.Gemm(op.Concat(old_h, input, axis=1), weights, _bias_vector(bias, 3 * H), transB=1)
    i, o, z = _activations(g, input.dtype)
    new_cell = op.Add(old_cell, op.Mul(i, z))
    return op.Mul(op.Tanh(new_cell), o), new_cell, op.Concat(i, o, z, axis=1)


def translations() -> dict:
    """{operator overload: translation}: the public operators and their
    autograd-free twins (the graph holds either, depending on how it was
    traced)."""
    table = {}
    for name, overloads in (("cell_forward", {"default": cell_forward}),
                            ("sequence_forward", {"default": sequence_forward,
                                                  "lengths": sequence_forward_lengths}),
                            ("stack_forward", {"default": stack_forward,
                                               "lengths": stack_forward_lengths})):
        for prefix in ("", "_"):
            packet = getattr(torch.ops.lltm, prefix + name)
            for overload, function in overloads.items():
                table[getattr(packet, overload)] = function
    return table
