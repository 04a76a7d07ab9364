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


class Gather(torch.autograd.Function):
    """``src.index_select(dim, index)``, whose gradient is
    ``grad.index_select(dim, back)``: ``back`` is the inverse of ``index``.
    With ``pad``, src gets one zero row at its end first (dim 0), which is
    where ``index`` points for the rows that take none; ``back_pad`` says
    the same of the gradient's gather (``to_packed``'s gradient pads, as
    ``to_padded`` does; a permutation pads in neither direction)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(src, dim: int, index, back, pad: bool, back_pad: bool):
        if pad:
            src = torch.cat([src, src.new_zeros((1,) + tuple(src.shape[1:]))])
        if dim == 1 and src.shape[0] == 1:  # one layer's state: rows of [B, H], a faster kernel
            return src[0].index_select(0, index).unsqueeze(0)
        return src.index_select(dim, index)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, dim, index, back, pad, back_pad = inputs
        ctx.save_for_backward(index, back)
        ctx.dim, ctx.pad, ctx.back_pad = dim, pad, back_pad

    @staticmethod
    def backward(ctx, grad):
        index, back = ctx.saved_tensors
        return (Gather.apply(grad, ctx.dim, back, index, ctx.back_pad, ctx.pad),
                None, None, None, None, None)


def to_padded(data: torch.Tensor, positions: torch.Tensor, sources: torch.Tensor,
              T: int, B: int) -> torch.Tensor:
    """[N, F] packed rows -> [T, B, F], zero where no row runs. positions [N]:
    the padded position (t*B + b) of each packed row; sources [T*B]: the
    packed row at each padded position, N where there is none."""
    return Gather.apply(data, 0, sources, positions, True, False).view(T, B, -1)


def to_packed(padded: torch.Tensor, positions: torch.Tensor,
              sources: torch.Tensor) -> torch.Tensor:
    """[T, B, F] -> [N, F], the rows at positions (the inverse of to_padded)."""
    return Gather.apply(padded.reshape(-1, padded.shape[-1]), 0, positions, sources, False,
                        True)


def permute_rows(state: torch.Tensor, order: torch.Tensor, inverse: torch.Tensor
                 ) -> torch.Tensor:
    """state [L, B, H] with its batch rows taken in ``order`` (a permutation
    whose inverse is ``inverse``)."""
    return Gather.apply(state, 1, order, inverse, False, False)


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
