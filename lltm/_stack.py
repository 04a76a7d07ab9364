"""Stacked unidirectional layers of :class:`lltm.LLTM` through
``lltm::stack_forward``: groups of 2 - 3 layers in one call each, which on
CUDA runs a group's recurrences in one launch a direction (layer l takes its
step t at global step t + l, sharing each step's grid barrier;
csrc/core/lltm_stack.h). Where a layer's step mostly waits on the barrier
(small B x H), a group costs about two layers' time; eagerly it also spares
the host a call a layer. lltm/_schedule.py decides where.
"""
from __future__ import annotations

import torch

from . import _ops


def run(module, x: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor, sizes: list[int],
        lengths: torch.Tensor | None = None):
    """LLTM._run for ``module`` in groups of ``sizes`` layers, a call a group."""
    h_n, c_n, first = [], [], 0
    for size in sizes:
        params = [module.layer_parameters(k) for k in range(first, first + size)]
        weights0 = params[0][0]
        weights = (torch.stack([w for w, _ in params[1:]]) if size > 1 else
                   weights0.new_empty(0, weights0.shape[0], 2 * module.hidden_size))
        if params[0][1] is None:
            biases = weights0.new_zeros(size, weights0.shape[0])
        else:
            biases = torch.stack([b for _, b in params])
        x, h, c, *_ = _ops.eager_call(*_FUNCTIONS[lengths is not None], x, weights0, weights,
                                      biases, h0[first:first + size], c0[first:first + size],
                                      *_ops.lengths_tail(lengths))
        h_n.append(h)
        c_n.append(c)
        first += size
    if len(h_n) == 1:
        return x, (h_n[0], c_n[0])
    return x, (torch.cat(h_n), torch.cat(c_n))


_FUNCTIONS = ((_ops.StackForward, torch.ops.lltm.stack_forward.default),  # without lengths, with
              (_ops.StackLengthsForward, torch.ops.lltm.stack_forward.lengths))
