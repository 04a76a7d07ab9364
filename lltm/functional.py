"""Functional forms of the LLTM operators."""
from __future__ import annotations

import torch

from . import _ops
from ._ops import SequenceForward, SequenceLengthsForward, eager_call

_sequence_forward = torch.ops.lltm.sequence_forward  # bound once

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
        return _ops.cell(input, weights, bias, old_h, old_cell)
    except (AttributeError, TypeError, RuntimeError):
        _check_tensors("lltm_cell", _CELL_ARGS, (input, weights, bias, old_h, old_cell))
        raise


def _host_lengths(lengths, input: torch.Tensor) -> torch.Tensor:
    """lengths as an int64 CPU tensor, its values checked against input's T
    (on another device the operator could not check them without a sync)."""
    host = torch.as_tensor(lengths, dtype=torch.int64, device="cpu")
    if host.dim() == 1 and input.dim() == 3 and host.numel() > 0:
        T = input.shape[0]
        bad = ((host < 1) | (host > T)).nonzero()
        if bad.numel():
            b = bad[0, 0].item()
            raise RuntimeError(f"lltm.functional.lltm_sequence: lengths[{b}] = "
                               f"{host[b].item()}; every length must be in [1, T] with T = {T} "
                               "steps in input")
    return host


def lltm_sequence(input: torch.Tensor, weights: torch.Tensor, bias: torch.Tensor | None,
                  h0: torch.Tensor, c0: torch.Tensor, lengths=None
                  ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """One LLTM layer over a whole sequence, the time loop in the native kernels.

    Shapes: input [T, B, I], weights [3H, I+H], bias [3H] (or [1, 3H], or None),
    h0 [B, H], c0 [B, H]. Returns (output [T, B, H], (h_n, c_n)), h_n and c_n
    [B, H] (h0 and c0 when T == 0). Differentiable in every argument.

    lengths: None, or B lengths in [1, T] (an int64 tensor, best on input's
    device, or a list of ints): row b stops after lengths[b] steps, its output
    0 beyond them. Checked on the CPU; a CUDA tensor's values are not read
    back (that would synchronize): out of range, the results are undefined.
    """
    try:
        if bias is None:
            bias = weights.new_zeros(weights.shape[0])
        if lengths is None:
            function, op, tail = SequenceForward, _sequence_forward.default, ()
        else:
            if not isinstance(lengths, torch.Tensor) or lengths.device != input.device:
                lengths = _host_lengths(lengths, input).to(input.device)
            function, op, tail = SequenceLengthsForward, _sequence_forward.lengths, (lengths,)
        output, h_n, c_n, _cells, _gates = eager_call(function, op, input, weights, bias, h0,
                                                      c0, *tail)
    except (AttributeError, TypeError, RuntimeError):
        _check_tensors("lltm_sequence", _SEQUENCE_ARGS, (input, weights, bias, h0, c0),
                       optional=("bias",))
        raise
    return output, (h_n, c_n)
