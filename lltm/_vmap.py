"""Batching rules for torch.vmap over the LLTM operators.

The forward operators fold a vmapped dimension of input and state into the
batch dimension B when weights and bias are shared (not vmapped): one call
of the native kernel for the whole vmapped batch. Otherwise, for the
backward operators (whose weight gradients are sums over B, so instances
cannot share a call) and for the stacked layers' operators, one call per
vmapped instance.
"""
from __future__ import annotations

import torch


def _front(t: torch.Tensor, dim: int | None, n: int) -> torch.Tensor:
    """``t`` with its vmapped dimension first ([N, ...]); expanded if none."""
    return t.expand(n, *t.shape) if dim is None else t.movedim(dim, 0)


def _loop(op, info, in_dims, args):
    n = info.batch_size
    results = [op(*(a.select(d, k) if isinstance(d, int) else a for a, d in zip(args, in_dims)))
               for k in range(n)]
    # (a backward operator's output_mask may leave results out: None)
    outputs = tuple(None if parts[0] is None else torch.stack(parts) for parts in zip(*results))
    return outputs, tuple(None if o is None else 0 for o in outputs)


def _cell_forward_vmap(op):
    def rule(info, in_dims, input, weights, bias, old_h, old_cell, *settings):
        # (settings: where the call gave them; its default left out otherwise)
        if in_dims[1] is not None or in_dims[2] is not None:
            return _loop(op, info, in_dims, (input, weights, bias, old_h, old_cell, *settings))
        n = info.batch_size
        x, h, c = (_front(t, d, n) for t, d in ((input, in_dims[0]), (old_h, in_dims[3]),
                                                 (old_cell, in_dims[4])))
        B = x.shape[1]
        outs = op(x.reshape(n * B, -1), weights, bias, h.reshape(n * B, -1),
                  c.reshape(n * B, -1), *settings)
        return tuple(o.view(n, B, -1) for o in outs), (0, 0, 0)
    return rule


def _sequence_forward_vmap(op):
    def rule(info, in_dims, input, weights, bias, h0, c0, *rest):
        # the lengths overload's [B] (folded into the batch like the state),
        # then the settings where the call gave them
        lengths = rest[:1] if rest and isinstance(rest[0], torch.Tensor) else ()
        settings = rest[len(lengths):]
        if in_dims[1] is not None or in_dims[2] is not None:
            return _loop(op, info, in_dims, (input, weights, bias, h0, c0, *rest))
        n = info.batch_size
        x = _front(input, in_dims[0], n).movedim(0, 1)  # [T, N, B, I]
        h, c = _front(h0, in_dims[3], n), _front(c0, in_dims[4], n)
        T, _, B, I = x.shape
        folded = [_front(lengths[0], in_dims[5], n).reshape(n * B)] if lengths else []
        out, h_n, c_n, cells, gates = op(x.reshape(T, n * B, I), weights, bias,
                                         h.reshape(n * B, -1), c.reshape(n * B, -1), *folded,
                                         *settings)
        return ((out.view(T, n, B, -1), h_n.view(n, B, -1), c_n.view(n, B, -1),
                 cells.view(T, n, B, -1), gates.view(T, n, B, -1)), (1, 0, 0, 1, 1))
    return rule


def _looped_vmap(op):
    def rule(info, in_dims, *args):
        return _loop(op, info, in_dims, args)
    return rule


# Each rule calls the operator it batches: the public one, or its
# autograd-free twin (lltm/_ops.py), which the autograd formulas call.
for _prefix in ("", "_"):
    for _name, _make in (("cell_forward", _cell_forward_vmap),
                         ("cell_backward", _looped_vmap),
                         ("sequence_forward", _sequence_forward_vmap),
                         ("sequence_backward", _looped_vmap),
                         ("stack_forward", _looped_vmap),
                         ("stack_backward", _looped_vmap)):
        _packet = getattr(torch.ops.lltm, _prefix + _name)
        for _overload in (("default", "lengths") if _name.startswith(("sequence", "stack"))
                          else ("default",)):
            _qualname = f"lltm::{_prefix}{_name}" + (
                "" if _overload == "default" else f".{_overload}")
            torch.library.register_vmap(_qualname, _make(getattr(_packet, _overload)))
