"""Stacked unidirectional layers of :class:`lltm.LLTM` pipelined over time
chunks (a wavefront): the layers overlap instead of running in turn.

T steps are split into C chunks; layer l's chunk k is one sequence call whose
initial state is its chunk k-1's final one and whose input is layer l-1's
chunk k output. On CUDA each layer has its own stream: chunk (l, k) waits for
(l-1, k) and, by stream order, (l, k-1), so up to min(L, C) chunks run at
once; autograd runs each backward on its forward's stream, so the backward
overlaps the same way. L layers then cost about (C + L - 1) / C layers' time
plus C - 1 more calls a layer, instead of L.

Without streams (CPU, torch.compile, torch.func) the chunks run in turn and
C = 1 unless ``lltm.overrides.wavefront(chunks=...)`` forces a count (the
tests compare the chunked path with the plain one so). Rows of variable
lengths run clamp(length - t0, 0, Tc) steps of chunk (t0, Tc); a row that
finished before the chunk runs one step there (the operator takes lengths
>= 1) whose output and state are replaced by 0 and its state. Not chunked:
one layer, and bidirectional layers (the reverse direction needs the whole
layer below). lltm/_schedule.py chooses C.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from . import _directions, _layer_grads, _sharing


def _split(T: int, chunks: int) -> list[int]:
    """T steps (or layers) in ``chunks`` (<= T) near-equal parts, the longer first."""
    base, extra = divmod(T, chunks)
    return [base + (k < extra) for k in range(chunks)]


def _chunk_lengths(lengths: torch.Tensor, sizes: list[int]):
    """Per chunk (t0, Tc): the rows' lengths within it, clamp(length - t0, 1,
    Tc), and [B, 1] True where a row finished before the chunk (None for the
    first chunk)."""
    per_chunk, finished, t0 = [], [], 0
    for size in sizes:
        per_chunk.append((lengths - t0).clamp(1, size))
        finished.append((lengths <= t0).unsqueeze(1) if t0 else None)
        t0 += size
    return per_chunk, finished


def run(module, x: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor, chunks: int,
        lengths: torch.Tensor | None = None, sharing: int = 1):
    """LLTM._run for ``module`` (one direction, native layers) in ``chunks``
    time chunks, each call (and its backward) planned for ``sharing`` layers
    at once on the device."""
    from .functional import lltm_sequence

    L = module.num_layers
    dropout = module.dropout if module.training and module.dropout > 0 else 0.0
    sizes = _split(x.shape[0], chunks)
    inputs = list(x.split(sizes, dim=0))  # layer 0's, then each layer's
    states = [(h0[k], c0[k]) for k in range(L)]
    params = [module.layer_parameters(k) for k in range(L)]
    last = [None] * chunks  # the top layer's output chunks
    chunk_lengths, finished = (_chunk_lengths(lengths, sizes) if lengths is not None
                               else ([None] * chunks, [None] * chunks))

    streams = None
    if _directions.concurrent(x):
        current = torch.cuda.current_stream(x.device)
        streams = [current, *_directions.side_streams(x.device, L - 1)]
        for side in streams[1:]:  # after the work that made x, h0, c0 and the parameters
            side.wait_stream(current)
            if lengths is not None:  # made here, read there
                for t in (*chunk_lengths, *finished[1:]):
                    t.record_stream(side)

    # Each layer's weight and bias gradients formed once from all its chunks
    # (lltm/_layer_grads.py), on the layer's stream.
    sinks = [None] * L
    if chunks > 1 and _layer_grads.wanted():
        for layer, (weights, bias) in enumerate(params):
            if bias is None:
                bias = weights.new_zeros(weights.shape[0])
            if not (weights.requires_grad or bias.requires_grad):
                continue
            sinks[layer] = sink = _layer_grads.Sink()
            with torch.cuda.stream(streams[layer]) if streams else contextlib.nullcontext():
                params[layer] = _layer_grads.LayerParameters.apply(weights, bias, sink)

    def call(k: int, layer: int) -> None:
        (weights, bias), state, sink = params[layer], states[layer], sinks[layer]
        if sink is None:
            out, (h, c) = lltm_sequence(inputs[k], weights, bias, *state,
                                        lengths=chunk_lengths[k])
        else:
            out, (h, c) = _layer_grads.chunk_call(inputs[k], weights, bias, *state, sink, k,
                                                  chunk_lengths[k])
        done = finished[k]
        if done is not None:  # rows finished before this chunk: output 0, state kept
            out = out.masked_fill(done, 0)
            h, c = torch.where(done, state[0], h), torch.where(done, state[1], c)
        states[layer] = (h, c)
        if layer < L - 1:
            if dropout:
                out = F.dropout(out, p=dropout, training=True)
            inputs[k] = out  # layer + 1 reads it next
        else:
            last[k] = out

    # Diagonal d holds the chunks (layer, d - layer); each is issued after the
    # chunk below it (previous diagonal) and its own layer's previous chunk.
    # Top layer first within a diagonal: when (layer, k) waits on layer - 1's
    # stream, the newest work there is (layer - 1, k), not (layer - 1, k + 1).
    with _sharing.sharing_device(sharing) if sharing > 1 else contextlib.nullcontext():
        for d in range(chunks + L - 1):
            for layer in range(min(d, L - 1), -1, -1):
                k = d - layer
                if k >= chunks:
                    break
                if streams is None:
                    call(k, layer)
                    continue
                stream = streams[layer]
                if layer:
                    stream.wait_stream(streams[layer - 1])
                    inputs[k].record_stream(stream)  # made on the stream below, read here
                with torch.cuda.stream(stream):
                    call(k, layer)

    if streams is not None:
        for side in streams[1:]:
            current.wait_stream(side)
        if L > 1:  # made on side streams, read on the current one from here on
            for t in (*last, *(t for layer in range(1, L) for t in states[layer])):
                t.record_stream(current)
    output = last[0] if chunks == 1 else torch.cat(last, dim=0)
    return output, (torch.stack([h for h, _ in states]), torch.stack([c for _, c in states]))
