"""Moving rows between a PackedSequence's layout and the kernels' padded one,
by gathers in both passes.

``index_select``'s gradient fills a zero tensor and scatter-adds into it (with
atomics on CUDA). Every move here is a one-to-one map of rows, or one with
padding rows that take no row, so its gradient is the gather by the inverse
map: one kernel a pass, no atomics, deterministic, and differentiable again
(the backward is itself a gather).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


class Gather(torch.autograd.Function):
    """``src.index_select(0, index)``, whose gradient is
    ``grad.index_select(0, back)``: ``back`` is the inverse of ``index``.
    With ``pad``, src gets one zero row at its end first, which is where
    ``index`` points for the rows that take none; ``back_pad`` says the same
    of the gradient's gather (``to_packed``'s gradient pads, as
    ``to_padded`` does)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(src, index, back, pad: bool, back_pad: bool):
        if pad:  # one zero row at the end of dim 0: one kernel
            src = F.pad(src, (0, 0) * (src.dim() - 1) + (0, 1))
        return src.index_select(0, index)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, index, back, pad, back_pad = inputs
        ctx.save_for_backward(index, back)
        ctx.pad, ctx.back_pad = pad, back_pad

    @staticmethod
    def backward(ctx, grad):
        index, back = ctx.saved_tensors
        return Gather.apply(grad, back, index, ctx.back_pad, ctx.pad), None, None, None, None


def to_padded(data: torch.Tensor, positions: torch.Tensor, sources: torch.Tensor,
              T: int, B: int) -> torch.Tensor:
    """[N, F] packed rows -> [T, B, F], zero where no row runs. positions [N]:
    the padded position (t*B + b) of each packed row; sources [T*B]: the
    packed row at each padded position, N where there is none."""
    return Gather.apply(data, sources, positions, True, False).view(T, B, -1)


def to_packed(padded: torch.Tensor, positions: torch.Tensor,
              sources: torch.Tensor) -> torch.Tensor:
    """[T, B, F] -> [N, F], the rows at positions (the inverse of to_padded)."""
    return Gather.apply(padded.reshape(-1, padded.shape[-1]), positions, sources, False, True)


class PermuteRows(torch.autograd.Function):
    """(h [L, B, H], c [L, B, H]) with their batch rows taken in ``order`` (a
    permutation whose inverse is ``inverse``): both states in one node, as
    host time per call is what this costs at the sizes where it runs."""

    generate_vmap_rule = True

    @staticmethod
    def forward(h, c, order, inverse):
        if h.shape[0] == 1:  # one layer: rows of [B, H], dim 0 is the faster kernel
            return (h[0].index_select(0, order).unsqueeze(0),
                    c[0].index_select(0, order).unsqueeze(0))
        return h.index_select(1, order), c.index_select(1, order)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[2], inputs[3])

    @staticmethod
    def backward(ctx, grad_h, grad_c):
        order, inverse = ctx.saved_tensors
        grad_h, grad_c = PermuteRows.apply(grad_h, grad_c, inverse, order)
        return grad_h, grad_c, None, None


def permute_rows(h: torch.Tensor, c: torch.Tensor, order: torch.Tensor,
                 inverse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """h, c [L, B, H] with their batch rows taken in ``order`` (a permutation
    whose inverse is ``inverse``)."""
    return PermuteRows.apply(h, c, order, inverse)


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
