"""Functional forms of the LLTM operators."""
from __future__ import annotations

import torch

from ._ops import CellForward, SequenceForward, eager_call

_CELL_ARGS = ("input", "weights", "bias", "old_h", "old_cell")
_SEQUENCE_ARGS = ("input", "weights", "bias", "h0", "c0")


def _check_tensors(op: str, names, args, optional=()) -> None:
    """A TypeError naming the first argument that is not a Tensor. Run after
    a call failed, so it costs nothing on the way that works."""
    for name, a in zip(names, args):
        if not isinstance(a, torch.Tensor) and not (a is None and name in optional):
            raise TypeError(f"lltm.functional.{op}: {name} must be a Tensor, got "
                            f"{'None' if a is None else type(a).__name__}")


def lltm_cell(input: torch.Tensor, weights: torch.Tensor, bias: torch.Tensor,
              old_h: torch.Tensor, old_cell: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One LLTM step through the native kernels.

    Shapes: input [B, I], weights [3H, I+H], bias [3H] (or [1, 3H]),
    old_h [B, H], old_cell [B, H]. Returns (new_h, new_cell), each [B, H].
    Differentiable in every argument.
    """
    try:
        new_h, new_cell, _gates = eager_call(CellForward, torch.ops.lltm.cell_forward.default,
                                             input, weights, bias, old_h, old_cell)
    except (AttributeError, TypeError, RuntimeError):
        _check_tensors("lltm_cell", _CELL_ARGS, (input, weights, bias, old_h, old_cell))
        raise
    return new_h, new_cell


def lltm_sequence(input: torch.Tensor, weights: torch.Tensor, bias: torch.Tensor | None,
                  h0: torch.Tensor, c0: torch.Tensor
                  ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """One LLTM layer over a whole sequence through the native kernels: the
    time loop runs in C (CPU) or on the GPU, not in Python.

    Shapes: input [T, B, I], weights [3H, I+H], bias [3H] (or [1, 3H], or None
    for no bias), h0 [B, H], c0 [B, H]. Returns (output [T, B, H], (h_n, c_n)),
    h_n and c_n [B, H] (h0 and c0 when T == 0). Differentiable in every
    argument, through output, h_n and c_n.
    """
    try:
        if bias is None:
            bias = weights.new_zeros(weights.shape[0])
        output, h_n, c_n, _cells, _gates = eager_call(
            SequenceForward, torch.ops.lltm.sequence_forward.default, input, weights, bias, h0, c0)
    except (AttributeError, TypeError, RuntimeError):
        _check_tensors("lltm_sequence", _SEQUENCE_ARGS, (input, weights, bias, h0, c0),
                       optional=("bias",))
        raise
    return output, (h_n, c_n)
