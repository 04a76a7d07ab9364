"""What :class:`lltm.LLTM` runs for a call, decided in one place.

:func:`for_call` takes the module, the input and the state the call runs in
(device, dtype, sizes, eager or captured or compiled, the torch settings in
force, the overrides) and returns a :class:`Schedule`: how the layers run
(one operator call a layer; groups of stacked layers in one call each,
lltm/_stack.py; or stacked layers overlapped in time chunks, a wavefront,
lltm/_wavefront.py), how a bidirectional layer's directions run, and why.
lltm.LLTM executes it and nothing else decides; each layer's kernel plan is
the CUDA library's (``lltm.overrides.sequence_plan_in_force``), which
:func:`explain` shows beside it. The rules and their constants below each
say which measurement they come from.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from . import _autotune, _directions, _native, _settings, _sharing, overrides
from .backends import cuda as _backend

CHOICES_CACHED = 256  # choices kept per rule (shapes, devices, capture or not, settings)


class Schedule(NamedTuple):
    """How lltm.LLTM runs one call. ``route``: "layers" (one operator call
    a layer, or a loop of reference cells for impl="reference"),
    "stacked" (``groups``: the layer groups' sizes, bottom up, one call of
    lltm::stack_forward each) or "wavefront" (``chunks`` time chunks, each
    chunk call planned for ``sharing`` layers at once on the device).
    ``directions`` (bidirectional layers): "one node" (both directions in one
    autograd node, the reverse one on a side stream on CUDA), "side stream"
    (an operator call each, the reverse one on a side stream) or "in line".
    ``why``: the rule that decided the route."""
    route: str = "layers"
    groups: tuple = ()
    chunks: int = 1
    sharing: int = 1
    directions: str = ""
    why: str = ""


def for_call(module, x: torch.Tensor) -> Schedule:
    """The schedule of ``module`` (an lltm.LLTM) over x [T, B, I]."""
    if module.num_directions == 2:
        return Schedule(directions=_directions_of(module, x), why="bidirectional: a call a layer")
    if module.impl != "native":
        return Schedule(why=f"impl={module.impl!r}: a loop of cell calls a layer")
    groups = stack_groups(module, x)
    if groups is not None:
        return Schedule("stacked", groups=tuple(groups), why=_STACK_WHY[overrides.current_stacked_layers()])
    chunks, sharing = wavefront_chunks(x, module.hidden_size, module.num_layers)
    if chunks > 1:
        forced = overrides.current_wavefront_chunks() is not None
        return Schedule("wavefront", chunks=chunks, sharing=sharing,
                        why="forced by lltm.overrides.wavefront" if forced else
                        "predicted at most GAIN of the time of a call a layer")
    return Schedule(why=_layers_why(module, x))


_STACK_WHY = {"on": "forced by lltm.overrides.stacked_layers('on')",
              "auto": "the stacked launch fits every group and is the faster route here"}


def _layers_why(module, x) -> str:
    if module.num_layers == 1:
        return "one layer"
    if not _directions.concurrent(x):
        return "not on CUDA streams here (CPU, torch.compile or torch.func)"
    return "neither the stacked launch nor time chunks predicted faster"


def _directions_of(module, x) -> str:
    if module.impl == "native" and _directions.fused(x):
        return "one node"
    return "side stream" if _directions.concurrent(x) else "in line"


def explain(module, input: torch.Tensor) -> str:
    """What ``module`` (an lltm.LLTM) would run for ``input`` (as its forward
    takes it: [T, B, I], [B, T, I] with batch_first, or unbatched [T, I]),
    in the state this is called in, and why: the schedule and, on CUDA,
    each layer's kernel plan. For users and bug reports; runs nothing."""
    x = input if input.dim() == 3 else input.unsqueeze(1)
    if module.batch_first and input.dim() == 3:
        x = x.transpose(0, 1)
    T, B, I = x.shape
    s = for_call(module, x)
    H, L, dtype = module.hidden_size, module.num_layers, x.dtype
    lines = [f"lltm.LLTM {I} -> {H}, {L} layer(s), {module.num_directions} direction(s); "
             f"input T={T} B={B} {dtype} on {x.device}",
             f"route: {s.route}" + (f" groups={list(s.groups)}" if s.groups else "")
             + (f" chunks={s.chunks} sharing={s.sharing}" if s.route == "wavefront" else "")
             + (f"; directions: {s.directions}" if s.directions else ""),
             f"why: {s.why}"]
    if x.is_cuda and module.impl == "native" and T and B:
        index = x.device.index if x.device.index is not None else torch.cuda.current_device()
        settings = _settings.current()
        captured = _native.stream_capturing(index)
        lines.append(f"settings: tf32={bool(settings & _settings.TF32)} "
                     f"deterministic={bool(settings & _settings.DETERMINISTIC)}"
                     f"{' (captured)' if captured else ''}")
        tuning = (_backend.benchmark and s.route != "stacked"
                  and not settings & _autotune.PLAN_FIELDS)
        if _backend.benchmark:
            lines.append("lltm.backends.cuda.benchmark: on, each layer's plan measured" if tuning
                         else "lltm.backends.cuda.benchmark: on, not used here (a plan forced "
                         "or the stacked launch)")
        if s.route == "stacked":
            first = 0
            for size in s.groups:
                plan = overrides.stack_plan_in_force(dtype, size, T, B, I if first == 0 else H, H,
                                                     device=index)
                lines.append(f"layers {first}-{first + size - 1}: " + (
                    f"one launch, {_plan_text(plan)}" if plan else "one call, the layers in turn"))
                first += size
        else:
            sharing = s.sharing if s.route == "wavefront" else (2 if s.directions in (
                "one node", "side stream") else 1)
            Tc = -(-T // s.chunks)
            with _sharing.sharing_device(sharing):
                for k in range(L):
                    I_k = I if k == 0 else H * module.num_directions
                    plan = overrides.sequence_plan_in_force(dtype, Tc, B, I_k, H, device=index)
                    lines.append(f"layer {k}: {_plan_text(plan)}")
                    if tuning:
                        lines.append("  measured: " + _tuned_text(module, index, dtype, Tc, B,
                                                                  I_k, H, captured))
    elif module.impl == "native":
        lines.append("layers: the C CPU kernels" if not x.is_cuda else "layers: nothing to run")
    return "\n".join(lines)


def _tuned_text(module, index, dtype, T, B, I, H, captured) -> str:  # noqa: E741
    """The plan lltm.backends.cuda.benchmark chose for a layer, where cached."""
    settings = _settings.current()
    training = torch.is_grad_enabled() and any(p.requires_grad for p in module.parameters())
    fields = _autotune.lookup(index, dtype, T, B, I, H, training, captured, settings)
    if fields is None:
        return "not yet (measured at the first eager call; until then the plan above)"
    plan = overrides.sequence_plan_in_force(dtype, T, B, I, H, device=index,
                                            settings=settings | fields)
    return f"{_autotune.describe(fields)}: {_plan_text(plan)}"


def _plan_text(plan) -> str:
    if plan is None:
        return "no plan fits"
    fwd = plan.get("forward", {})
    detail = ", ".join(f"{k}={v}" for k, v in fwd.items() if v not in (0, None))
    return f"{plan['family']} ({detail})" if detail else plan["family"]


# --- groups of stacked layers in one launch (lltm/_stack.py) ----------------------------
#
# lltm.LLTM takes the stacked route (stack_groups) on CUDA where the
# operator's stacked launch runs every group of these sizes, no layer has
# dropout (in training) before the next, and (measured, docs/performance.md,
# "Stacked layers in one launch"):
#   - float32 (and the half types on GPUs before compute capability 8.0),
#     under CUDA-graph capture, where a layer alone would run the grid family
#     in GRID_GROUPS batch groups (B about 5 - 16 on an H100 or H200 at
#     H 129 - 256): stacked 0.67x - 0.94x of a call a layer; in one group
#     (B <= 4) 0.84x - 0.96x for two layers, even for three (0.97x - 1.08x).
#     With 8 groups or more the stacked launch's layout is as fast or slower
#     (0.99x - 4.8x); the cluster and block families (H <= 128) are faster
#     than it (1.05x - 4.7x); eagerly, where B x H <= EAGER_MAX_BH: 0.32x -
#     0.94x (a call a layer is bound by the host's time there; two of 84 rows
#     1.02x and 1.20x); above, 0.83x - 2.6x, slower but at B32 with two layers;
#   - float16 and bfloat16 on tensor-core GPUs, where the stacked launch forms
#     its products on tensor cores with 16 units a block (bfloat16 on an
#     H200, against a call a layer with the wavefront's time chunks): under
#     capture where HALF_CAPTURED_BH[0] <= B x H <= HALF_CAPTURED_BH[1] and
#     H >= HALF_MIN_H, 0.71x - 1.00x (B32 - B256 at H 128 - 256; one row of
#     15, three layers B128/H128, 1.07x); below that B x H the cluster family
#     runs a layer in a fraction of the stacked step (0.99x - 1.73x at B <=
#     32, one row 0.89x), above it the stacked launch's blocks each carry
#     several 16-row chunks (0.96x - 1.21x), and at H = 64 the block family
#     is 2.1x - 2.4x faster; eagerly where B x H <= HALF_EAGER_MAX_BH: 0.29x -
#     0.95x (B4 - B512, H 64 - 256; above, 0.98x - 1.07x).
# Not under torch.compile or torch.func transforms (one call of the sequence
# operator a layer there), unless ``lltm.overrides.stacked_layers`` forces it
# ("on": on any device, wherever the module allows it, the operator then
# calling layer after layer where no stacked launch fits; "off": never).
MAX_GROUP = 3  # the most layers one stacked launch holds (LLTM_STACK_MAX_LAYERS)
GRID_GROUPS = (2, 4)  # captured: a layer's grid plan in this many batch groups (1 for 2 layers)
EAGER_MAX_BH = 4096   # eager: B x H at most this
# the half types on tensor-core GPUs (the stacked launch on tensor cores):
HALF_CAPTURED_BH = (8192, 32768)  # captured: B x H within these
HALF_MIN_H = 128                  # captured: H at least this
HALF_EAGER_MAX_BH = 32768         # eager: B x H at most this


def groups(L: int) -> list[int]:
    """L layers in groups of at most MAX_GROUP, as even as they come (the
    larger first): 4 -> [2, 2], 5 -> [3, 2], 7 -> [3, 2, 2]."""
    count = -(-L // MAX_GROUP)
    base, extra = divmod(L, count)
    return [base + (k < extra) for k in range(count)]


def _automatic(x: torch.Tensor, H: int, sizes: list[int]) -> bool:
    if not x.is_cuda or torch.compiler.is_compiling() or (
            torch._C._are_functorch_transforms_active()):
        return False
    T, B, I = x.shape
    index = x.device.index if x.device.index is not None else torch.cuda.current_device()
    return _choice(index, x.dtype, T, B, I, H, tuple(sizes),
                   _native.stream_capturing(index), _settings.current())


@functools.lru_cache(maxsize=CHOICES_CACHED)
def _choice(index: int, dtype, T: int, B: int, I: int, H: int,  # noqa: E741
            sizes: tuple, capturing: bool, _settings_in_force: int) -> bool:
    """_automatic's answer, kept per key (the settings a call would run
    with, which the queries below follow: lltm._settings)."""
    return all(overrides.stack_plan_in_force(dtype, L, T, B, I if k == 0 else H, H, device=index)
               is not None for k, L in enumerate(sizes)) and _faster(
                   dtype, T, B, H, index, capturing, sizes)


def _faster(dtype, T: int, B: int, H: int, index: int, capturing: bool, sizes) -> bool:
    """Whether the stacked launch is the faster route for groups of
    ``sizes`` layers (the module's docstring)."""
    if dtype in (torch.float16, torch.bfloat16) and overrides.grid_tensor_cores(dtype,
                                                                               device=index):
        if not capturing:
            return B * H <= HALF_EAGER_MAX_BH
        return H >= HALF_MIN_H and HALF_CAPTURED_BH[0] <= B * H <= HALF_CAPTURED_BH[1]
    if not capturing:
        return B * H <= EAGER_MAX_BH
    layer = overrides.sequence_plan_in_force(dtype, T, B, H, H, device=index)
    if layer is None or layer["family"] != "grid":
        return False
    batch_groups = layer["forward"]["groups"]
    return all(GRID_GROUPS[0] <= batch_groups <= GRID_GROUPS[1] or (batch_groups == 1 and L == 2)
               for L in sizes)


def stack_groups(module, x: torch.Tensor) -> list[int] | None:
    """The layer groups (their sizes, bottom up) in which ``module`` (an
    lltm.LLTM of one direction and native layers) runs x [T, B, I] through
    lltm::stack_forward, or None: a call of the sequence operator a layer."""
    L = module.num_layers
    mode = overrides.current_stacked_layers()
    if L < 2 or mode == "off" or (module.dropout > 0 and module.training):
        return None
    sizes = groups(L)
    if mode == "on":
        return sizes
    if x.shape[0] == 0 or x.shape[1] == 0 or overrides.current_wavefront_chunks() is not None:
        return None
    return sizes if _automatic(x, module.hidden_size, sizes) else None


# --- stacked layers in time chunks (lltm/_wavefront.py) ----------------------------------

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
_CHOICES: dict = {}


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
        if len(_CHOICES) >= CHOICES_CACHED:
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


def wavefront_chunks(x: torch.Tensor, H: int, L: int) -> tuple[int, int]:
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
