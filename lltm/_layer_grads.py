"""A layer's weight and bias gradients formed once from all its time chunks.

The wavefront (lltm/_wavefront.py) runs a layer as C calls over time chunks.
Through lltm_sequence each call's backward would form that chunk's dW = dG^T
[h_prev | x] (two row joins and a product) and autograd would add the C
results; all of it on the layer's stream, between one chunk's recurrence and
the previous chunk's, which waits for it. Here each chunk's backward runs
the recurrence and dx only (lltm::sequence_backward_gates hands out dG, the
gates' gradients, instead of dW), and the layer's parameters reach its chunk
calls through :class:`LayerParameters`, whose backward runs once every chunk
has run: it forms dW from the chunks' dG and [h_prev | x], and the bias
gradient as the sum of the chunks'. On CUDA it runs on the layer's stream
after the layer's last chunk, while the layers below still run theirs. The
chunks before it (all but the first in time: the backward runs them last to
first) add their products to the layer's dW before that where the
recurrences leave the GPU room for them (:func:`early_products_pay`), each
once the next chunk's recurrence is queued, on a stream of the layer's own
beside it, so that what is left after the last chunk is that chunk's
products (the bottom layer's run after everything else): joined and one
product while its rows fit in the GPU's L2 cache, else products on views.

Used by the wavefront where gradients are recorded eagerly (or under CUDA
graph capture): not while torch.compile traces, under torch.func transforms
or forward-mode AD, nor where a layer's parameters need no gradient. A
backward that records its own graph (create_graph=True) runs each chunk's
backward in differentiable operations and passes dW through autograd as
lltm_sequence does.
"""
from __future__ import annotations

import contextlib

import torch
import torch.autograd.forward_ad as _forward_ad

from . import _autocast, _settings, _sharing
from ._ops import layer_grads

_forward = torch.ops.lltm._sequence_forward
_backward_gates = torch.ops.lltm._sequence_backward_gates


def wanted() -> bool:
    """Whether the wavefront's chunk calls record gradients this way here."""
    return (torch.is_grad_enabled() and not torch.compiler.is_compiling()
            and not torch._C._are_functorch_transforms_active()
            and _forward_ad._current_level < 0)


class Sink:
    """What a layer's chunk backwards leave for :class:`LayerParameters`, per
    backward pass (autograd's graph task): per chunk, (dG, the bias
    gradient, h0, output, input) of the call, and the products already added
    (:class:`Early`). ``early``: whether the chunks add theirs before the
    last, on ``stream`` beside the layer's (CUDA) or in place (the CPU: the
    same products as at the end); ``wants``: whether (weights, bias) want
    gradients."""

    def __init__(self, early: bool, stream=None, wants=(True, True)):
        self.passes: dict[int, dict[int, tuple]] = {}
        self.early: dict[int, Early] = {}
        self.fold, self.stream, self.wants = early, stream, wants
        self.node = None  # LayerParameters' node: the pass runs it or not

    def add(self, chunk: int, entry: tuple) -> None:
        task = torch._C._current_graph_task_id()
        if self.fold and torch._C._will_engine_execute_node(self.node):
            early = self.early.get(task)
            if early is None:
                early = self.early[task] = Early(entry, self.wants)
            # the chunk before this one (later in time) adds its products now
            # that this one's kernels are queued ahead of them
            early.add_held(self.stream)
            if chunk > 0:  # the first in time runs last: its products at the end
                early.hold(chunk, entry, self.stream)
        self.passes.setdefault(task, {})[chunk] = entry

    def take(self):
        """(this pass's entries not yet added in time order, its Early or
        None); the stream that ran the early products joined to the current
        one; entries of passes that never reached the parameters (a gradient
        of the input alone) dropped."""
        task = torch._C._current_graph_task_id()
        mine, early = self.passes.pop(task, {}), self.early.pop(task, None)
        self.passes.clear()
        self.early.clear()
        if early is None or not early.chunks:
            return [mine[k] for k in sorted(mine)], None
        if self.stream is not None:
            torch.cuda.current_stream(self.stream.device).wait_stream(self.stream)
        return [mine[k] for k in sorted(mine) if k not in early.chunks], early


class Early:
    """A layer's dW and bias gradient summed over the chunks that finished
    before its last, in place, in tensors made on the layer's stream (where
    the gradients are returned). A chunk's products run on the sink's stream
    once the chunk after it (earlier in time) is queued on the layer's, and
    wait for the chunk's own kernels by an event; the layer's stream waits
    for them before reading."""

    def __init__(self, entry, wants):
        dG, _, h0, _, x = entry
        G, K = dG.shape[2], h0.shape[1] + x.shape[2]
        self.weights = dG.new_empty(G, K) if wants[0] else None
        self.bias = dG.new_empty(G) if wants[1] else None
        self.chunks: set[int] = set()
        self.held = None

    def hold(self, chunk: int, entry: tuple, stream) -> None:
        event = None
        if stream is not None:  # the chunk's kernels, on the current stream
            event = torch.cuda.Event()
            event.record()
        self.held = (chunk, entry, event)

    def add_held(self, stream) -> None:
        if self.held is None:
            return
        (chunk, entry, event), self.held = self.held, None
        first = not self.chunks
        if event is not None:
            stream.wait_event(event)
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            if self.weights is not None:
                add_products(self.weights, entry, first)
            if self.bias is not None:
                if first:
                    self.bias.copy_(entry[1])
                else:
                    self.bias.add_(entry[1])
        self.chunks.add(chunk)


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
        entries, early = ctx.sink.take()
        d_weights = early.weights if early is not None else None
        d_bias = early.bias if early is not None else None
        if entries and ctx.needs_input_grad[0]:
            d_weights = _weight_grads(entries, d_weights)
        if entries and ctx.needs_input_grad[1]:
            rest = torch.stack([e[1] for e in entries]).sum(0) if len(entries) > 1 \
                else entries[0][1]
            d_bias = rest if d_bias is None else d_bias.add_(rest)
        d_weights = _add(grad_weights, d_weights)
        d_bias = _add(grad_bias, d_bias)
        return d_weights, d_bias, None


def _weight_grads(entries, into=None) -> torch.Tensor:
    """dW [G, H+I] = dG^T [h_prev | x] over the chunks' (dG, _, h0, output,
    input), h_prev the chunk's h0 at its first step and its output after,
    added to ``into`` in place where given: where the joined rows fit in
    join_limit bytes, the chunks' dG and [h_prev | x] joined and one product
    (fewest launches); past it products on the chunks' views, summed, no
    rows copied (at B1024/H256 in bfloat16 the joins' copies cost 8% of the
    step)."""
    dG0 = entries[0][0]
    G, K = dG0.shape[2], entries[0][2].shape[1] + entries[0][4].shape[2]
    rows = sum(e[0].shape[0] * e[0].shape[1] for e in entries)
    if rows * (G + K) * dG0.element_size() <= join_limit(dG0.device):
        dG = _join([e[0] for e in entries]).view(rows, G)
        h_prev = torch.cat([p for e in entries for p in (e[2].unsqueeze(0), e[3][:-1])])
        joined = torch.cat([h_prev, _join([e[4] for e in entries])], 2).view(rows, K)
        return torch.mm(dG.t(), joined) if into is None else into.addmm_(dG.t(), joined)
    first = into is None
    if first:
        into = dG0.new_empty(G, K)
    for entry in entries:
        add_products(into, entry, first)
        first = False
    return into


def _join(tensors):
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors)


def add_products(d_weights: torch.Tensor, entry: tuple, first: bool) -> None:
    """One chunk's dG^T [h_prev | x] into d_weights [G, H+I] (written where
    ``first``, else added), as products on views, no rows copied: dW_h from
    dG_0^T h0 and dG_{1..}^T output[:-1], dW_x from dG^T x."""
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
    """Bytes of joined rows (dG and [h_prev | x]) up to which a layer's dW
    joins its chunks' rows: the GPU's L2 cache, where the copies stay; on
    the CPU none (the products on views cost no more there)."""
    if device.type != "cuda":
        return 0
    return torch.cuda.get_device_properties(device).L2_cache_size


def early_products_pay(B: int, H: int) -> bool:
    """Whether a layer's chunks on CUDA add their products before its last
    (else all after it): where a step's recurrent product, [B, H] by [H, 3H],
    is under 3 * 2^24 multiply-adds (B H^2 < 2^24). The side products take
    SMs from the recurrences they run beside; a small recurrence leaves them
    idle, a large one fills them and slows down by more than the tail they
    save. Measured, 3 layers, T=100, graph replay on an H200: below the
    line 0.2% - 2.4% faster (bfloat16 B64/H128, B16/H256, B256/H128,
    B16/H512; float32 H64 - H256), at it either way (B64/H512 1.1% faster,
    B1024/H128 0.4%; B16/H1024 0.4% slower, B256/H256 0.6%), above it
    slower (B64/H1024 1.3%, B16/H2048 0.8%)."""
    return B * H * H < 1 << 24


def _add(a, b):
    return b if a is None else a if b is None else a + b


class ChunkCall(torch.autograd.Function):
    """One chunk's lltm_sequence call (the forward operator as it is) whose
    backward leaves dG and the bias gradient in ``sink`` instead of returning
    gradients for weights and bias."""

    @staticmethod
    def forward(ctx, input, weights, bias, h0, c0, sink, chunk, lengths):
        settings = _settings.current()
        if lengths is None:
            out, h_n, c_n, cells, gates = _forward.default(input, weights, bias, h0, c0,
                                                           settings)
        else:
            out, h_n, c_n, cells, gates = _forward.lengths(input, weights, bias, h0, c0, lengths,
                                                           settings)
        ctx.save_for_backward(input, weights, bias, h0, c0, out, cells, gates,
                              *(() if lengths is None else (lengths,)))
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
