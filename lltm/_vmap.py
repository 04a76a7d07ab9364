"""Batching rules for torch.vmap over the LLTM operators: the forward
operators fold a vmapped dimension of input and state into B when weights
and bias are shared (one kernel call); otherwise, and for the backward
operators (whose weight gradients sum over B) and the stacked layers, one
call per vmapped instance.
"""
from __future__ import annotations

import functools

import torch


def _front(t: torch.Tensor, dim: int | None, n: int) -> torch.Tensor:
    """``t`` with its vmapped dimension first ([N, ...]); expanded if none."""
    return t.expand(n, *t.shape) if dim is None else t.movedim(dim, 0)


def _loop(op, info, in_dims, *args):
    """One call of ``op`` per vmapped instance, the results stacked."""
    n = info.batch_size
    results = [op(*(a.select(d, k) if isinstance(d, int) else a for a, d in zip(args, in_dims)))
               for k in range(n)]
    # (a backward operator's output_mask may leave results out: None)
    outputs = tuple(None if parts[0] is None else torch.stack(parts) for parts in zip(*results))
    return outputs, tuple(None if o is None else 0 for o in outputs)


def _forward_vmap(op):
    def rule(info, in_dims, input, weights, bias, h0, c0, *rest):
        # rest: a lengths overload's [B] (folded into the batch like the
        # state), then the settings where the call gave them
        if in_dims[1] is not None or in_dims[2] is not None:
            return _loop(op, info, in_dims, input, weights, bias, h0, c0, *rest)
        n = info.batch_size
        x = _front(input, in_dims[0], n).movedim(0, -3)  # [N, B, I] or [T, N, B, I]
        h, c = _front(h0, in_dims[3], n), _front(c0, in_dims[4], n)
        B = h.shape[1]
        folded = [_front(r, d, n).reshape(n * B) if isinstance(r, torch.Tensor) else r
                  for r, d in zip(rest, in_dims[5:])]
        outs = op(x.reshape(*x.shape[:-3], n * B, x.shape[-1]), weights, bias,
                  h.reshape(n * B, -1), c.reshape(n * B, -1), *folded)
        # [N*B, .] -> [N, B, .] (vmapped dim 0), [T, N*B, .] -> [T, N, B, .] (dim 1)
        return (tuple(o.view(*o.shape[:-2], n, B, -1) for o in outs),
                tuple(o.dim() - 2 for o in outs))
    return rule


def _looped_vmap(op):
    return functools.partial(_loop, op)


# Each rule calls the operator it batches: the public one, or its
# autograd-free twin (lltm/_ops.py), which the autograd formulas call.
for _prefix in ("", "_"):
    for _name, _make in (("cell_forward", _forward_vmap),
                         ("cell_backward", _looped_vmap),
                         ("sequence_forward", _forward_vmap),
                         ("sequence_backward", _looped_vmap),
                         ("stack_forward", _looped_vmap),
                         ("stack_backward", _looped_vmap)):
        _packet = getattr(torch.ops.lltm, _prefix + _name)
        for _overload in (("default", "lengths") if _name.startswith(("sequence", "stack"))
                          else ("default",)):
            _qualname = f"lltm::{_prefix}{_name}" + (
                "" if _overload == "default" else f".{_overload}")
            torch.library.register_vmap(_qualname, _make(getattr(_packet, _overload)))
