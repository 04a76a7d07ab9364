"""Functional forms of the LLTM operators."""
from __future__ import annotations

import torch


def lltm_cell(input: torch.Tensor, weights: torch.Tensor, bias: torch.Tensor,
              old_h: torch.Tensor, old_cell: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One LLTM step through the native kernels.

    Shapes: input [B, I], weights [3H, I+H], bias [3H] (or [1, 3H]),
    old_h [B, H], old_cell [B, H]. Returns (new_h, new_cell), each [B, H].
    Differentiable in every argument.
    """
    new_h, new_cell, _gates = torch.ops.lltm.cell_forward(input, weights, bias, old_h, old_cell)
    return new_h, new_cell
