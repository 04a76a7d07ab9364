"""Moving rows between a PackedSequence's layout and the kernels' padded one,
by gathers in both passes.

``index_select``'s gradient fills a zero tensor and scatter-adds into it (with
atomics on CUDA). Every move here is a one-to-one map of rows, or one with
padding rows that take no row, so its gradient is the gather by the inverse
map: one kernel a pass, no atomics, deterministic, and differentiable again
(the backward is itself a move).

A move into the padded layout and the state's rows into the packed order are
one autograd node, as are the way back out: at the sizes where a packed step
is host-bound, each node's Python costs about as much as its kernels. The
node works under torch.func transforms (setup_context, a generated vmap
rule) and is entered through the C apply outside them (_move).
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
    *states with their batch rows taken in ``order``). With ``pad``, rows
    get one zero row at their end first, which is where ``index`` points for
    the rows that take none. The gradient is the same move back: ``back``
    (the inverse of index; ``back_pad`` says whether that gather pads) and
    ``inverse`` (of order). Entered through :func:`_move`."""

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


# Function.apply's Python wrapper binds the arguments to forward's signature
# (inspect.signature) on every call, for functorch transforms: more host
# time than the move itself at small sizes. Outside transforms the C apply it
# ends in is entered directly, as lltm/_ops.py does for the operators.
_c_apply = super(torch.autograd.Function, Move).apply
_transforms_active = torch._C._are_functorch_transforms_active


def _move(*args):
    return Move.apply(*args) if _transforms_active() else _c_apply(*args)


def to_padded(data: torch.Tensor, positions: torch.Tensor, sources: torch.Tensor, T: int,
              B: int, states: tuple = (), order=None, inverse=None) -> tuple:
    """[N, F] packed rows -> [T, B, F], zero where no row runs; and each of
    ``states`` [L, B, H] with its rows taken in ``order`` (inverse:
    ``inverse``), if given. positions [N]: the padded position (t*B + b) of
    each packed row; sources [T*B]: the packed row at each padded position,
    N where there is none. Returns (padded, *states)."""
    if order is None:
        states = ()
    moved = _move(data, sources, positions, True, False, order, inverse, *states)
    return (moved[0].view(T, B, -1), *moved[1:])


def to_packed(padded: torch.Tensor, positions: torch.Tensor, sources: torch.Tensor,
              states: tuple = (), order=None, inverse=None) -> tuple:
    """[T, B, F] -> [N, F], the rows at positions (the inverse of to_padded);
    and ``states`` reordered as there. Returns (data, *states)."""
    if order is None:
        states = ()
    return _move(padded.reshape(-1, padded.shape[-1]), positions, sources, False, True, order,
                 inverse, *states)


def layout(batch_sizes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(positions [N], sources [T*B], lengths [B]) on the CPU for a
    PackedSequence's batch_sizes (see to_padded): step t holds its first
    batch_sizes[t] rows, so element k of the data sits at t*B + b."""
    T = len(batch_sizes)
    B = int(batch_sizes[0]) if T else 0
    live = torch.arange(B).unsqueeze(0) < batch_sizes.unsqueeze(1)  # [T, B]
    positions = live.flatten().nonzero().squeeze(1)
    sources = torch.full((T * B,), len(positions), dtype=torch.int64)
    sources[positions] = torch.arange(len(positions))
    return positions, sources, live.sum(0)
