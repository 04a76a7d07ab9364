"""Moving rows between a PackedSequence's layout and the kernels' padded one
by gathers in both passes: each move is a one-to-one map of rows (padding
rows take none), so its gradient is the gather by the inverse map, with no
zero fill and scatter-add (index_select's: atomics on CUDA), deterministic
and differentiable again. The rows and the state's batch order move in one
autograd node each way: at host-bound sizes each node's Python costs about
as much as its kernels.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _permute(state: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """state [L, B, H] with its batch rows taken in ``order``."""
    if state.shape[0] == 1:  # one layer: rows of [B, H], dim 0 is the faster kernel
        return state[0].index_select(0, order).unsqueeze(0)
    return state.index_select(1, order)


class Move(torch.autograd.Function):
    """(rows [M, F], *states [L, B, H]) -> (rows.index_select(0, index),
    *states with their batch rows in ``order``); with ``pad``, rows get a zero
    row at their end first (where ``index`` points for rows taking none). The
    gradient is the move back by ``back`` (padding where ``back_pad``) and
    ``inverse``. Entered through :func:`_move`."""

    generate_vmap_rule = True

    @staticmethod
    def forward(rows, index, back, pad: bool, back_pad: bool, order, inverse, *states):
        if pad:  # one zero row at the end of dim 0: one kernel
            rows = F.pad(rows, (0, 0) * (rows.dim() - 1) + (0, 1))
        return (rows.index_select(0, index), *(_permute(s, order) for s in states))

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, index, back, pad, back_pad, order, inverse = inputs[:7]
        ctx.save_for_backward(index, back, order, inverse)
        ctx.pad, ctx.back_pad = pad, back_pad

    @staticmethod
    def backward(ctx, grad_rows, *grad_states):
        index, back, order, inverse = ctx.saved_tensors
        grads = _move(grad_rows, back, index, ctx.back_pad, ctx.pad, inverse, order,
                      *grad_states)
        return (grads[0], None, None, None, None, None, None, *grads[1:])


# Function.apply's Python wrapper (for functorch) costs more host time than a
# small move: outside transforms the C apply is entered, as in lltm/_ops.py.
_c_apply = super(torch.autograd.Function, Move).apply
_transforms_active = torch._C._are_functorch_transforms_active


def _move(*args):
    return Move.apply(*args) if _transforms_active() else _c_apply(*args)


def to_padded(data: torch.Tensor, positions: torch.Tensor, sources: torch.Tensor, T: int,
              B: int, states: tuple = (), order=None, inverse=None) -> tuple:
    """(padded [T, B, F] from packed rows [N, F], zero where no row runs,
    *``states`` [L, B, H] with their rows in ``order`` if given). positions
    [N]: each packed row's padded position t*B + b; sources [T*B]: the packed
    row at each padded position, N where none."""
    if order is None:
        states = ()
    moved = _move(data, sources, positions, True, False, order, inverse, *states)
    return (moved[0].view(T, B, -1), *moved[1:])


def to_packed(padded: torch.Tensor, positions: torch.Tensor, sources: torch.Tensor,
              states: tuple = (), order=None, inverse=None) -> tuple:
    """(data [N, F], *states): the inverse of to_padded."""
    if order is None:
        states = ()
    return _move(padded.reshape(-1, padded.shape[-1]), positions, sources, False, True, order,
                 inverse, *states)


def layout(batch_sizes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(positions [N], sources [T*B], lengths [B]) on the CPU for a
    PackedSequence's batch_sizes (see to_padded)."""
    T = len(batch_sizes)
    B = int(batch_sizes[0]) if T else 0
    live = torch.arange(B).unsqueeze(0) < batch_sizes.unsqueeze(1)  # [T, B]
    positions = live.flatten().nonzero().squeeze(1)
    sources = torch.full((T * B,), len(positions), dtype=torch.int64)
    sources[positions] = torch.arange(len(positions))
    return positions, sources, live.sum(0)
