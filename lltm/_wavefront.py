"""Stacked unidirectional layers of :class:`lltm.LLTM` pipelined over time
chunks (a wavefront): the layers overlap instead of running one after the
other.

T steps are split into C chunks. Layer l's chunk k is one call of the
sequence operator (``lltm.functional.lltm_sequence``) whose initial state is
the state at the end of its chunk k-1 and whose input is layer l-1's output
of chunk k. On CUDA each layer has its own stream (layer 0 the current one,
layers above side streams): chunk (l, k) waits for (l-1, k) through an event,
and for (l, k-1) by stream order, so up to min(L, C) chunks run at once, the
calls issued diagonal by diagonal. The current stream joins the side streams
at the end. Autograd runs each call's backward on the stream its forward ran
on, with the engine's cross-stream synchronisation, so the backward overlaps
the same way (in reverse). One layer of T steps costing t, L layers cost
about (C + L - 1) / C * t plus C - 1 more calls a layer (each pays its
launches and its input projection's set-up) instead of L * t.

The same chunked calls run without streams on the CPU, under torch.compile
and under torch.func transforms (one after the other: correct, no overlap);
there C = 1 (one call a layer, the plain path) unless
``lltm.overrides.wavefront(chunks=...)`` forces a count, which the tests use
to compare the chunked path with the plain one everywhere.

Rows of variable lengths are chunked too: in chunk (t0, Tc) row b runs
clamp(length - t0, 0, Tc) steps; a row that finished before the chunk starts
runs one step there (the operator takes lengths >= 1) whose output and state
are replaced by 0 and the state it came in with (the gradients of that step
are then zero). Not chunked: a single layer, and bidirectional layers (the
reverse direction needs the whole of the layer below).
docs/design.md ("Stacked layers") has how C is chosen.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from . import _directions, _layer_grads, _native, _settings, _sharing, overrides

# The automatic choice (automatic_schedule; docs/design.md, "Stacked layers"):
# no chunk shorter than MIN_CHUNK_STEPS steps, at most MAX_CHUNKS chunks; a
# call costs CALL_US[family] of GPU time besides its steps (its launches, the
# input projection's and the persistent kernels' start, the backward's
# products' set-up; measured by dev/timing/wavefront_timing.py on an H100:
# ~110 us for the grid family's cooperative launches, 25 - 50 us for the
# block and cluster families') and, in eager mode, HOST_CALL_US of host
# time (forward and backward), plus HOST_STEP_US a step for the per-step
# family, whose launches the host pays each step (forward and backward:
# 37 - 45 us a layer and step on the H100 machine's host, from eager steps
# of 3 bfloat16 layers at H 1024 - 2048 in one call a layer); chunked only
# where predicted to take at most GAIN of the time.
MIN_CHUNK_STEPS = 8
MAX_CHUNKS = 16
CALL_US = {"grid": 110.0, "steps": 110.0, "cluster": 40.0, "block": 40.0}
HOST_CALL_US = 200.0
HOST_STEP_US = 40.0
GAIN = 0.9
FFMA_OVERLAP = 0.25  # the per-step family on FFMA: layers_at_once

_STREAMS: dict = {}
_CHOICES: dict = {}
_CHOICES_SIZE = 256


def _streams(device: torch.device, count: int, use: str = "layers") -> list:
    """``count`` side streams of ``device`` for ``use``, made once and reused
    ("layers": one per layer above the first; "parameters": one per layer,
    for its weight gradient's early products)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    pool = _STREAMS.setdefault((index, use), [])
    while len(pool) < count:
        pool.append(torch.cuda.Stream(device=index))
    return pool[:count]


def _split(T: int, chunks: int) -> list[int]:
    """T steps in ``chunks`` (<= T) near-equal chunks, the longer ones first."""
    base, extra = divmod(T, chunks)
    return [base + (k < extra) for k in range(chunks)]


def predicted_time(C: int, L: int, T: int, call_us: float, step_us: float, concurrent: float,
                   host_us: float = 0.0, host_step_us: float = 0.0,
                   whole_launches: bool = False) -> float:
    """Microseconds of one forward + backward of L layers over T steps in C
    chunks: a call costs call_us plus step_us a step (on the GPU) and host_us
    plus host_step_us a step of host time; at most ``concurrent`` layers'
    kernels fit on the GPU at once. Kernels whose parts start as they fit
    (the per-step family's, the cluster and block families' clusters and
    blocks) share the GPU as they come: the wavefront takes C + L - 1 chunk
    times, or with fewer than L layers at once the L C chunk calls shared
    out over ``concurrent`` (1.75: a layer and three quarters). With
    ``whole_launches`` (the grid family, whose blocks meet every step) a
    launch runs only once all of it is resident and holds its SMs to its
    end: chunk calls take ``concurrent`` whole slots (:func:`makespan`;
    three layers in two slots: 6 chunk times in 3 chunks, not 5). The host
    issues L C calls."""
    chunk = call_us + step_us * T / C
    host = host_us + host_step_us * T / C
    if C == 1:
        return L * max(chunk, host)
    if whole_launches:
        times = makespan(L, C, max(1, int(concurrent)))
    else:
        times = max(C + L - 1, L * C / concurrent)
    return max(times * chunk, L * C * host)


def makespan(L: int, C: int, slots: int) -> int:
    """Chunk times for the L x C chunk calls, call (l, k) after (l - 1, k)
    and (l, k - 1), at most ``slots`` at once, each time the ready calls
    taken in diagonal order (lower l + k first, the deeper layer first
    within a diagonal)."""
    if slots >= L:
        return C + L - 1
    done = [0] * L  # chunks each layer has finished
    times = 0
    while done[-1] < C:
        ready = [l for l in range(L)
                 if done[l] < C and (l == 0 or done[l - 1] > done[l])]
        ready.sort(key=lambda l: (l + done[l], -l))
        for l in ready[:slots]:
            done[l] += 1
        times += 1
    return times


def best_chunks(L: int, T: int, call_us: float, step_us: float, concurrent: float,
                host_us: float = 0.0, gain: float = GAIN, host_step_us: float = 0.0,
                whole_launches: bool = False) -> int:
    """The chunk count (1 .. T // MIN_CHUNK_STEPS, at most MAX_CHUNKS) of the
    least :func:`predicted_time`; 1 unless that takes at most ``gain`` of the
    layers one after the other."""
    top = max(1, min(MAX_CHUNKS, T // MIN_CHUNK_STEPS))
    times = {C: predicted_time(C, L, T, call_us, step_us, concurrent, host_us, host_step_us,
                               whole_launches)
             for C in range(1, top + 1)}
    best = min(times, key=times.get)
    return best if times[best] <= gain * times[1] else 1


def automatic_schedule(T: int, B: int, I: int, H: int, L: int,  # noqa: E741
                       dtype: torch.dtype, device: torch.device) -> tuple[int, int]:
    """(chunks, sharing): how the wavefront runs L layers of these sizes on
    ``device`` by itself, for a call on the device's current stream as it is:
    captured into a CUDA graph or eager (the state the library's plans and
    costs are asked in). CUDA only; (1, 1) elsewhere. Each chunk call is
    planned for the whole device (sharing 1) or for two layers at once on it
    (sharing 2: _sharing.sharing_device; plans of which two launches are
    resident together, taken only where their products run on tensor cores,
    the grid's or the per-step family's, and only under CUDA-graph capture).
    For each (:func:`model_inputs`), :func:`best_chunks` for the plan the
    library would then run a layer with: its time per step from the
    library's cost model, CALL_US of its family a call, as many layers at
    once as :func:`layers_at_once` finds, and in eager mode HOST_CALL_US of
    host time a call (plus HOST_STEP_US a step for the per-step family);
    the least predicted time, if it saves at least 1 - GAIN of the layers
    one after the other (planned for the whole device), else (1, 1)."""
    if device.type != "cuda" or L < 2 or T < 2 * MIN_CHUNK_STEPS or B == 0:
        return 1, 1
    index = device.index if device.index is not None else torch.cuda.current_device()
    capturing = _native.stream_capturing(index)
    # (the settings a call would run with: the choice follows every one of them)
    settings = _settings.current(1)
    tf32 = dtype == torch.float32 and bool(settings & _settings.TF32)
    key = (index, dtype, T, B, I, H, L, capturing, settings)
    found = _CHOICES.get(key)
    if found is None:
        found = _choose(T, B, H, L, dtype, index, capturing, tf32)
        if len(_CHOICES) >= _CHOICES_SIZE:
            del _CHOICES[next(iter(_CHOICES))]
        _CHOICES[key] = found
    return found


def _choose(T, B, H, L, dtype, index, capturing, tf32=False) -> tuple[int, int]:
    weighed = model_inputs(T, B, H, L, dtype, index, capturing, tf32)
    if 1 not in weighed:
        return 1, 1
    plain = predicted_time(1, L, T, **weighed[1][1])
    best, best_time = (1, 1), float("inf")
    for sharing, (_, args) in weighed.items():
        chunks = best_chunks(L, T, gain=1.0, **args)
        if chunks == 1:
            continue  # a layer alone on the device: planned for the whole of it
        time = predicted_time(chunks, L, T, **args)
        if time <= GAIN * plain and time < best_time:
            best, best_time = (chunks, sharing), time
    return best


def model_inputs(T: int, B: int, H: int, L: int, dtype: torch.dtype, index: int,  # noqa: E741
                 capturing: bool, tf32: bool = False) -> dict:
    """What :func:`automatic_schedule` weighs for L layers of these sizes on
    device ``index`` (``capturing``: under CUDA-graph capture; ``tf32``:
    float32 whose products torch lets use TF32): {sharing: (family, args)}
    for each sharing it considers, the plan's family and the keyword
    arguments of :func:`predicted_time` and :func:`best_chunks` besides C,
    L and T (call_us, step_us, concurrent, host_us, host_step_us,
    whole_launches). A sharing without a plan, or one not taken, is left
    out. ``dev/timing/wavefront_timing.py --model`` sets these predictions
    beside the measured times."""
    host_us = 0.0 if capturing else HOST_CALL_US
    l2_bytes = torch.cuda.get_device_properties(index).L2_cache_size
    weighed = {}
    # Shared plans only in CUDA graphs: in eager mode the per-step family they
    # bring pays each step's launches on the host (~50 us a layer and step on
    # the H100's host: 3 layers at bfloat16 B64/H256, 3.3 -> 15.8 ms a step),
    # which the persistent plan it replaces does not.
    for sharing in ((1, 2) if capturing else (1,)):
        answer = library_answer(T, B, H, dtype, index, sharing)
        if answer is None:
            continue
        plan, step_us, resident = answer
        if sharing == 2 and not _products_on_tensor_cores(plan, dtype, index, tf32):
            # Persistent plans halved to share the device, their products on
            # FFMA: the model predicted 12% - 32% gains for them on an H100,
            # and they gained little or lost up to a fifth. The per-step
            # family's overlap it predicts within a few percent, and the
            # grid's on tensor cores within 10% where it gains
            # (docs/performance.md, "Stacked layers overlapped in time
            # chunks"). The per-step family on FFMA in the place of a
            # persistent plan lost at every chunk count (float32 B1/H1024,
            # B16/H1024, B64/H256, B64/H512 on an H200: 1.02x - 2.05x of one
            # call a layer); where it is the whole device's plan, it is this
            # one.
            continue
        if resident is not None and not capturing:
            # eager: whole layers only; part of a layer at once did not pay
            # for the calls it adds, each issued by the host (3 float32
            # layers B64/H128 on an H100: 2 chunks 3,263 us a step, one call
            # a layer 1,861; captured, 3 chunks 0.90x)
            resident = float(int(resident))
        # float32's per-step products on TF32 overlap as the half types' in
        # CUDA graphs; in eager calls chunking them lost (3 layers B256/H1024
        # on an H100: 0.85x cuDNN's eager step chunked, 1.06x a call a layer
        # in another run)
        family = plan["family"]
        weighed[sharing] = family, dict(
            call_us=CALL_US[family],
            step_us=step_us,
            concurrent=layers_at_once(plan, L, B, H, dtype, resident, l2_bytes,
                                      tf32 and capturing, capturing),
            host_us=host_us,
            host_step_us=HOST_STEP_US if host_us and family == "steps" else 0.0,
            whole_launches=family == "grid")
    return weighed


def library_answer(T: int, B: int, H: int, dtype: torch.dtype, index: int,  # noqa: E741
                   sharing: int) -> tuple | None:
    """What the library answers for a layer above the first (H features in)
    of these sizes, planned for ``sharing`` layers at once on device
    ``index``, for a call on its current stream as it is: (plan, its time a
    step from the cost model at T and T/2 steps, its layers resident at once
    by :func:`resident_layers`, None for the per-step family, whose count is
    layers_at_once's own); None where no plan fits. The answers the chooser's
    rules (:func:`model_inputs`) start from; ``dev/timing/wavefront_timing.py
    --record`` keeps them."""
    with _sharing.sharing_device(sharing):
        long = overrides.sequence_cost_in_force(dtype, T, B, H, H, device=index)
        short = overrides.sequence_cost_in_force(dtype, T // 2, B, H, H, device=index)
        if long is None or short is None:
            return None
        plan, cost = long
        resident = None if plan["family"] == "steps" else resident_layers(
            overrides.sequence_residency_in_force(dtype, T, B, H, H, device=index))
    return plan, max(0.0, (cost - short[1]) / (T - T // 2)), resident


def _products_on_tensor_cores(plan: dict, dtype: torch.dtype, index: int, tf32: bool) -> bool:
    """Whether ``plan``'s recurrent products run on tensor cores: the grid's
    (:func:`_grid_on_tensor_cores`), the per-step family's in the half types
    and in float32 where torch lets its products use TF32 (``tf32``)."""
    if plan["family"] == "steps":
        return dtype in (torch.float16, torch.bfloat16) or (dtype == torch.float32 and tf32)
    return _grid_on_tensor_cores(plan, dtype, index)


def _grid_on_tensor_cores(plan: dict, dtype: torch.dtype, index: int) -> bool:
    """Whether ``plan`` is the grid family forming its products on tensor
    cores: the half types' where the device has them, float32's where the
    plan took the TF32 build (its FFMA build is a choice too where TF32 is
    allowed)."""
    return (plan["family"] == "grid" and overrides.grid_tensor_cores(dtype, device=index)
            and (dtype != torch.float32 or bool(plan["forward"].get("tf32"))))


def resident_layers(residency) -> float | None:
    """How many layers the device holds at once by a persistent plan's
    residency (lltm.overrides.sequence_residency_in_force: per direction,
    (parts resident at once, parts a call launches)): of the direction that
    holds fewer, the resident parts over a call's, a fraction where the
    parts start as they fit (7 clusters of a layer's 4: 1.75; the grid's one
    part a launch: whole launches). None without an answer or for the
    per-step family (no parts)."""
    counts = [resident / parts for resident, parts in residency or () if parts]
    return min(counts) if counts else None


def layers_at_once(plan: dict, L: int, B: int, H: int, dtype: torch.dtype,
                   resident: float | None, l2_bytes: int = 0, tf32: bool = False,
                   captured: bool = False) -> float:
    """How many layers' kernels run at once at full speed: for the persistent
    plans, ``resident``, as many as the library finds resident together
    (:func:`resident_layers`; by their blocks, or their clusters, which need
    free SMs within one GPU processing cluster: an H100 holds 7 clusters of
    16 blocks, a layer of 4 such clusters and three quarters of another,
    though two layers' 128 blocks are fewer than its 132 SMs), at least 1
    and at most L. For the per-step family, whose products spread over the GPU:
    on FFMA, float32's a little more than one in CUDA graphs (``captured``),
    1 + FFMA_OVERLAP (2^26 / (B H^2))^0.6, at most 1 + FFMA_OVERLAP: a
    step's product (3 B H^2 multiply-adds) leaves SMs idle that another
    layer's fills, less the larger it is (3 float32 layers on an H200, the
    best chunk count against one call a layer: 0.80x - 0.89x at B H^2 of
    2^24 - 2^26, 0.94x - 0.97x at 2^28 - 2^30), with no bound from the L2
    cache (at H=2048 a layer's 100 MB of weights are read from memory each
    step anyway: B1 and B16 0.82x, 0.83x); one in eager calls and in
    float64; on tensor cores, the half types and float32
    where torch lets its products use TF32 (``tf32``; taken as the half
    types'), from 3 at B*H = 32768 down to 1.6 at 262144 (measured in
    bfloat16), as 3 (32768 / (B H))^0.3, and at most
    as many layers as their weights (3H x 2H each) fit in ``l2_bytes`` of L2
    cache: each step reads a layer's recurrent weights, and layers that
    evict each other's read them from memory (3 bfloat16 layers at H=2048,
    25 MB of W_h each, an H100's 50 MB L2: B1 7,081 us in one call a layer
    against 7,593 in 7 chunks, B16 7,495 against 8,730)."""
    if plan["family"] == "steps":
        if dtype == torch.float32 and not tf32:
            if not captured:
                return 1
            return min(float(L), 1 + FFMA_OVERLAP * min(1.0, (2**26 / max(B * H * H, 1)) ** 0.6))
        if dtype not in (torch.float16, torch.bfloat16, torch.float32):
            return 1
        at_once = min(float(L), 3 * (32768 / max(B * H, 1)) ** 0.3)
        if l2_bytes:
            at_once = min(at_once, l2_bytes / (6 * H * H * dtype.itemsize))
        return max(1.0, at_once)
    return max(1, min(L, resident or 1))


def schedule_for(x: torch.Tensor, H: int, L: int) -> tuple[int, int]:
    """(chunks, sharing) for L stacked layers over x [T, B, I]: the chunk
    count forced by ``lltm.overrides.wavefront`` (at most T; the calls planned
    for the whole device), else :func:`automatic_schedule` ((1, 1) under
    torch.compile and torch.func)."""
    T, B, I = x.shape
    if T < 2 or L < 2:
        return 1, 1
    forced = overrides.current_wavefront_chunks()
    if forced is not None:
        if _settings.onnx_exporting():  # (a dynamic T would be fixed to the example's)
            raise ValueError(f"lltm.overrides.wavefront(chunks={forced}) cannot be exported to ONNX: "
                             "the chunks split T while exporting. Export without the "
                             "override (one call a layer)")
        return min(forced, T), 1
    if not _directions.concurrent(x):
        return 1, 1
    return automatic_schedule(T, B, I, H, L, x.dtype, x.device)


def _chunk_lengths(lengths: torch.Tensor, sizes: list[int]):
    """Per chunk (t0, Tc): the rows' lengths within it, clamp(length - t0, 1,
    Tc), and [B, 1] True where a row finished before the chunk starts (None
    for the first chunk, where none has). A finished row runs one step there
    (the operator takes lengths >= 1) whose results the caller discards."""
    per_chunk, finished, t0 = [], [], 0
    for size in sizes:
        per_chunk.append((lengths - t0).clamp(1, size))
        finished.append((lengths <= t0).unsqueeze(1) if t0 else None)
        t0 += size
    return per_chunk, finished


def run(module, x: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor, chunks: int,
        lengths: torch.Tensor | None = None, sharing: int = 1):
    """All of ``module``'s (an lltm.LLTM, one direction, native layers)
    layers over x [T, B, I] in ``chunks`` time chunks; h0, c0 [L, B, H];
    row b stops after lengths[b] steps (an int64 [B] tensor on x's device,
    each in [1, T]; None: all T); each call (and its backward) planned for
    ``sharing`` layers at once on the device. Returns (output [T, B, H],
    (h_n, c_n)) as LLTM._run does."""
    from .functional import lltm_sequence

    L = module.num_layers
    dropout = module.dropout if module.training and module.dropout > 0 else 0.0
    sizes = _split(x.shape[0], chunks)
    inputs = list(x.split(sizes, dim=0))  # layer 0's, then each layer's
    states = [(h0[k], c0[k]) for k in range(L)]
    params = [module.layer_parameters(k) for k in range(L)]
    last = [None] * chunks  # the top layer's output chunks
    chunk_lengths, finished = _chunk_lengths(lengths, sizes) if lengths is not None else ((), ())

    streams = None
    if _directions.concurrent(x):
        current = torch.cuda.current_stream(x.device)
        streams = [current, *_streams(x.device, L - 1)]
        for side in streams[1:]:  # after the work that made x, h0, c0 and the parameters
            side.wait_stream(current)
            if lengths is not None:  # made here, read there
                for t in (*chunk_lengths, *finished[1:]):
                    t.record_stream(side)

    # Each layer's weight and bias gradients formed once from all its chunks
    # (lltm/_layer_grads.py), where they are wanted; the parameters pass
    # through on the layer's stream, where that backward then runs.
    sinks = [None] * L
    if chunks > 1 and _layer_grads.wanted():
        for layer, (weights, bias) in enumerate(params):
            if bias is None:
                bias = weights.new_zeros(weights.shape[0])
            if not (weights.requires_grad or bias.requires_grad):
                continue
            early = not x.is_cuda or _layer_grads.early_products_pay(x.shape[1], h0.shape[2])
            sinks[layer] = sink = _layer_grads.Sink(
                early, _streams(x.device, L, "parameters")[layer] if early and streams else None,
                (weights.requires_grad, bias.requires_grad))
            with torch.cuda.stream(streams[layer]) if streams else contextlib.nullcontext():
                params[layer] = _layer_grads.LayerParameters.apply(weights, bias, sink)
            sink.node = params[layer][0].grad_fn

    def run_chunk(k: int, layer: int, state, chunk_lengths=None):
        weights, bias = params[layer]
        if sinks[layer] is None:
            return lltm_sequence(inputs[k], weights, bias, *state, lengths=chunk_lengths)
        return _layer_grads.chunk_call(inputs[k], weights, bias, *state, sinks[layer], k,
                                       chunk_lengths)

    def call(k: int, layer: int) -> None:
        if lengths is None:
            out, states[layer] = run_chunk(k, layer, states[layer])
        else:
            out, (h, c) = run_chunk(k, layer, states[layer], chunk_lengths[k])
            done = finished[k]
            if done is not None:  # rows finished before this chunk: output 0, state kept
                out = out.masked_fill(done, 0)
                h0_k, c0_k = states[layer]
                h, c = torch.where(done, h0_k, h), torch.where(done, c0_k, c)
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
