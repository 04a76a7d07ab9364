"""A layer's weight and bias gradients formed once from all its time chunks.

Through lltm_sequence each of the wavefront's chunk calls (lltm/_wavefront.py)
would form its own dW = dG^T [h_prev | x] in its backward, on the layer's
stream, between one chunk's recurrence and the previous chunk's, which waits
for it. Here each chunk's backward runs the recurrence and dx only
(lltm::sequence_backward_gates hands out dG), and the parameters reach the
chunk calls through :class:`LayerParameters`, whose backward forms dW and the
bias gradient once every chunk has run, while the layers below still run.

Used where gradients are recorded eagerly or under CUDA graph capture; not
under torch.compile, torch.func or forward-mode AD, nor for parameters
without gradients. Under create_graph=True each chunk's backward runs in
differentiable operations and dW passes through autograd.
"""
from __future__ import annotations

import torch
import torch.autograd.forward_ad as _forward_ad

from . import _autocast, _autotune, _settings, _sharing
from ._ops import layer_grads, lengths_tail, overload

_forward = torch.ops.lltm._sequence_forward
_backward_gates = torch.ops.lltm._sequence_backward_gates


def wanted() -> bool:
    """Whether the wavefront's chunk calls record gradients this way here."""
    return (torch.is_grad_enabled() and not torch.compiler.is_compiling()
            and not torch._C._are_functorch_transforms_active()
            and _forward_ad._current_level < 0)


class Sink:
    """Per backward pass (autograd's graph task) and chunk, what the chunk's
    backward leaves for :class:`LayerParameters`: (dG, d_bias, h0, output, input)."""

    def __init__(self):
        self.passes: dict[int, dict[int, tuple]] = {}

    def add(self, chunk: int, entry: tuple) -> None:
        self.passes.setdefault(torch._C._current_graph_task_id(), {})[chunk] = entry

    def take(self) -> list:
        """This pass's entries in time order; other passes' (which never
        reached the parameters) dropped."""
        mine = self.passes.pop(torch._C._current_graph_task_id(), {})
        self.passes.clear()
        return [mine[k] for k in sorted(mine)]


class LayerParameters(torch.autograd.Function):
    """(weights, bias) as they are; the backward forms their gradients from
    the chunks in ``sink``."""

    @staticmethod
    def forward(ctx, weights, bias, sink):
        ctx.sink = sink
        ctx.set_materialize_grads(False)
        return weights.view_as(weights), bias.view_as(bias)

    @staticmethod
    def backward(ctx, grad_weights, grad_bias):
        # grad_weights / grad_bias: what came through autograd (the chunks'
        # differentiable backwards under create_graph), else None
        entries = ctx.sink.take()
        d_weights = d_bias = None
        if entries and ctx.needs_input_grad[0]:
            d_weights = _weight_grads(entries)
        if entries and ctx.needs_input_grad[1]:
            d_bias = torch.stack([e[1] for e in entries]).sum(0) if len(entries) > 1 \
                else entries[0][1]
        d_weights = _add(grad_weights, d_weights)
        d_bias = _add(grad_bias, d_bias)
        return d_weights, d_bias, None


def _weight_grads(entries) -> torch.Tensor:
    """dW [G, H+I] = dG^T [h_prev | x] over the chunks: rows joined and one
    product where they fit in join_limit bytes, else products on views (at
    B1024/H256 in bfloat16 the joins' copies cost 8% of the step)."""
    dG0 = entries[0][0]
    G, K = dG0.shape[2], entries[0][2].shape[1] + entries[0][4].shape[2]
    rows = sum(e[0].shape[0] * e[0].shape[1] for e in entries)
    if rows * (G + K) * dG0.element_size() <= join_limit(dG0.device):
        dG = _join([e[0] for e in entries]).view(rows, G)
        h_prev = torch.cat([p for e in entries for p in (e[2].unsqueeze(0), e[3][:-1])])
        joined = torch.cat([h_prev, _join([e[4] for e in entries])], 2).view(rows, K)
        return torch.mm(dG.t(), joined)
    into = dG0.new_empty(G, K)
    for k, entry in enumerate(entries):
        add_products(into, entry, k == 0)
    return into


def _join(tensors):
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors)


def add_products(d_weights: torch.Tensor, entry: tuple, first: bool) -> None:
    """One chunk's dG^T [h_prev | x] into d_weights [G, H+I] (written where
    ``first``, else added), as products on views."""
    dG, _, h0, out, x = entry
    T, B, G = dG.shape
    H = h0.shape[1]
    flat = dG.reshape(T * B, G)
    d_h, d_x = d_weights[:, :H], d_weights[:, H:]
    _product_into(d_h, dG[0].t(), h0, first)
    if T > 1:
        d_h.addmm_(flat[B:].t(), out[:-1].reshape(-1, H))
    _product_into(d_x, flat.t(), x.reshape(T * B, x.shape[2]), first)


def _product_into(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, first: bool) -> None:
    if first:
        torch.mm(a, b, out=out)
    else:
        out.addmm_(a, b)


def join_limit(device: torch.device) -> int:
    """Bytes of joined rows up to which dW joins its chunks' rows: the GPU's
    L2 cache, where the copies stay; none on the CPU."""
    if device.type != "cuda":
        return 0
    return torch.cuda.get_device_properties(device).L2_cache_size


def _add(a, b):
    return b if a is None else a if b is None else a + b


class ChunkCall(torch.autograd.Function):
    """One chunk's lltm_sequence call whose backward leaves dG and the bias
    gradient in ``sink`` instead of returning them."""

    @staticmethod
    def forward(ctx, input, weights, bias, h0, c0, sink, chunk, lengths):
        # (its backward's measured plan too: layer_grads)
        settings = _autotune.forward_settings(ctx, _settings.current(), input, h0.shape[-1], True)
        tail = lengths_tail(lengths)
        out, h_n, c_n, cells, gates = overload(_forward, tail)(
            input, weights, bias, h0, c0, *tail, settings)
        ctx.save_for_backward(input, weights, bias, h0, c0, out, cells, gates, *tail)
        ctx.sink, ctx.chunk = sink, chunk
        ctx.concurrent_layers = _sharing.concurrent_layers()
        ctx.set_materialize_grads(False)
        return out, h_n, c_n

    @staticmethod
    def backward(ctx, grad_output, grad_h_n, grad_c_n):
        need = ctx.needs_input_grad
        (d_input, second, d_bias, d_h0, d_c0), saved = layer_grads(
            ctx, grad_output, grad_h_n, grad_c_n, _backward_gates,
            [need[0], True, need[2], need[3], need[4]])
        if torch.is_grad_enabled():  # create_graph: the backward's own graph, dW through it
            return d_input, second, d_bias, d_h0, d_c0, None, None, None
        input, _, _, h0, _, out = saved[:6]
        ctx.sink.add(ctx.chunk, (second, d_bias, h0, out, input))  # second: dG
        return d_input, None, None, d_h0, d_c0, None, None, None


def chunk_call(input, weights, bias, h0, c0, sink, chunk, lengths=None):
    """(output, (h_n, c_n)) of one chunk, as lltm_sequence returns them;
    weights and bias from :class:`LayerParameters` with the same ``sink``."""
    args = (input, weights, bias, h0, c0, sink, chunk, lengths)
    if torch._C._is_any_autocast_enabled():
        out, h_n, c_n = _autocast.eager_call(lambda a: ChunkCall.apply(*a), args)
    else:
        out, h_n, c_n = ChunkCall.apply(*args)
    return out, (h_n, c_n)
