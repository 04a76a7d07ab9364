"""What :class:`lltm.LLTM` runs for a call, decided in one place.

:func:`for_call` takes the module, the input and the state the call runs in
(device, dtype, sizes, eager, captured or compiled, torch's settings, the
overrides) and returns a :class:`Schedule`: how the layers run (a call a
layer; groups of stacked layers, lltm/_stack.py; or a wavefront,
lltm/_wavefront.py), how a bidirectional layer's directions run, and why.
Whether stacking or chunking is faster, the measured rules of
csrc/core/lltm_cuda_rules.c say; each layer's kernel plan is the CUDA
library's, which :func:`explain` shows beside it.
"""
from __future__ import annotations

import functools
import math
import threading
from typing import NamedTuple

import torch

from . import _autotune, _directions, _native, _settings, _sharing, _wavefront, overrides
from .backends import cuda as _backend

CHOICES_CACHED = 256  # choices kept per rule (shapes, devices, capture or not, settings)


class Schedule(NamedTuple):
    """How lltm.LLTM runs one call. ``route``: "layers" (a call a layer),
    "stacked" (``groups``: the layer groups' sizes, bottom up, a
    lltm::stack_forward call each) or "wavefront" (``chunks`` time chunks,
    each call planned for ``sharing`` layers at once). ``directions``
    (bidirectional): "one node" (both in one autograd node), "side stream"
    (a call each, the reverse one on a side stream) or "in line". ``why``:
    the rule that decided the route."""
    route: str = "layers"
    groups: tuple = ()
    chunks: int = 1
    sharing: int = 1
    directions: str = ""
    why: str = ""


def for_call(module, x: torch.Tensor, measure: bool = True) -> Schedule:
    """The schedule of ``module`` (an lltm.LLTM) over x [T, B, I]; with
    ``measure`` False, one lltm.backends.cuda.benchmark would measure is the
    rules' until it is."""
    if module.num_directions == 2:
        return Schedule(directions=_directions_of(module, x), why="bidirectional: a call a layer")
    if module.impl != "native":
        return Schedule(why=f"impl={module.impl!r}: a loop of cell calls a layer")
    measuring = getattr(_measuring, "schedule", None)
    if measuring is not None:  # (a candidate of _measure_schedules)
        return _by_rules(module, x) if measuring is _RULES else measuring
    rules = _by_rules(module, x)
    return _tuned_schedule(module, x, rules, measure) if _backend.benchmark else rules


def _by_rules(module, x: torch.Tensor) -> Schedule:
    groups = stack_groups(module, x)
    if groups is not None:
        return Schedule("stacked", groups=tuple(groups),
                        why=_STACK_WHY[overrides.current_stacked_layers()])
    chunks, sharing = wavefront_chunks(x, module.hidden_size, module.num_layers)
    if chunks > 1:
        forced = overrides.current_wavefront_chunks() is not None
        return Schedule("wavefront", chunks=chunks, sharing=sharing,
                        why="forced by lltm.overrides.wavefront" if forced else
                        "the layers' kernels overlap on the device (captured)")
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
    takes it) here and now, and why: the schedule and, on CUDA, each layer's
    kernel plan. For users and bug reports; runs nothing."""
    x = module._time_major(input)
    T, B, I = x.shape
    s = for_call(module, x, measure=False)
    H, L, dtype = module.hidden_size, module.num_layers, x.dtype
    lines = [f"lltm.LLTM {I} -> {H}, {L} layer(s), {module.num_directions} direction(s); "
             f"input T={T} B={B} {dtype} on {x.device}",
             f"route: {s.route}" + (f" groups={list(s.groups)}" if s.groups else "")
             + (f" chunks={s.chunks} sharing={s.sharing}" if s.route == "wavefront" else "")
             + (f"; directions: {s.directions}" if s.directions else ""),
             f"why: {s.why}"]
    if x.is_cuda and module.impl == "native" and T and B:
        index = _native.cuda_index(x.device)
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
    plans = _autotune.lookup(index, dtype, T, B, I, H, training, captured, settings)
    if plans is None:
        return "not yet (measured at the first eager call; until then the plan above)"
    texts = []
    for direction, fields in zip(("forward", "backward")[:1 + training], plans):
        plan = overrides.sequence_plan_in_force(dtype, T, B, I, H, device=index,
                                                settings=settings | fields)
        texts.append(f"{direction} {_autotune.describe(fields)}: {_plan_text(plan)}")
    return "; ".join(texts)


def _plan_text(plan) -> str:
    if plan is None:
        return "no plan fits"
    fwd = plan.get("forward", {})
    detail = ", ".join(f"{k}={v}" for k, v in fwd.items() if v not in (0, None))
    return f"{plan['family']} ({detail})" if detail else plan["family"]


# --- groups of stacked layers in one launch (lltm/_stack.py) ----------------------------
# On CUDA, eagerly or captured, where the stacked launch runs every group, no
# dropout (in training) is between layers, and lltm_stack_rule_cuda finds it
# faster; anywhere with lltm.overrides.stacked_layers("on").
MAX_GROUP = 3  # the most layers one stacked launch holds (LLTM_STACK_MAX_LAYERS)


def groups(L: int) -> list[int]:
    """L layers in groups of at most MAX_GROUP, as even as they come, the
    larger first: 4 -> [2, 2], 5 -> [3, 2], 7 -> [3, 2, 2]."""
    return _wavefront._split(L, -(-L // MAX_GROUP))


def _automatic(x: torch.Tensor, H: int, sizes: list[int]) -> bool:
    if not x.is_cuda or torch.compiler.is_compiling() or (
            torch._C._are_functorch_transforms_active()):
        return False
    T, B, I = x.shape
    index = _native.cuda_index(x.device)
    return _choice(index, x.dtype, T, B, I, H, tuple(sizes),
                   _native.stream_capturing(index), _settings.current())


@functools.lru_cache(maxsize=CHOICES_CACHED)
def _choice(index: int, dtype, T: int, B: int, I: int, H: int,  # noqa: E741
            sizes: tuple, capturing: bool, _settings_in_force: int) -> bool:
    """_automatic's answer, kept per key."""
    return all(overrides.stack_route_in_force(dtype, L, T, B, I if k == 0 else H, H, device=index)
               for k, L in enumerate(sizes))


def stack_groups(module, x: torch.Tensor) -> list[int] | None:
    """The layer groups' sizes (bottom up) in which ``module`` (one direction,
    native layers) runs x through lltm::stack_forward, or None."""
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


# --- stacked layers in time chunks (lltm/_wavefront.py) ---------------------------------
# Under CUDA-graph capture, by lltm_wavefront_rule_cuda; eagerly a call a layer.

def automatic_schedule(T: int, B: int, I: int, H: int, L: int,  # noqa: E741
                       dtype: torch.dtype, device: torch.device) -> tuple[int, int]:
    """(chunks, sharing): how the wavefront runs L layers of these sizes on
    ``device`` for a call on its current stream as it is, each chunk call
    planned for ``sharing`` layers at once. (1, 1) off CUDA and eagerly."""
    if device.type != "cuda" or L < 2 or B == 0:
        return 1, 1
    index = _native.cuda_index(device)
    if not _native.stream_capturing(index):
        return 1, 1
    return _chunks(index, dtype, T, B, H, _settings.current(1))


@functools.lru_cache(maxsize=CHOICES_CACHED)
def _chunks(index: int, dtype, T: int, B: int, H: int, settings: int) -> tuple[int, int]:
    """automatic_schedule's answer under capture, kept per key."""
    return overrides.wavefront_in_force(dtype, T, B, H, device=index, settings=settings) or (1, 1)


def wavefront_chunks(x: torch.Tensor, H: int, L: int) -> tuple[int, int]:
    """(chunks, sharing) for L stacked layers over x [T, B, I]: those forced
    by ``lltm.overrides.wavefront`` (at most T), else :func:`automatic_schedule`."""
    T, B, I = x.shape
    if T < 2 or L < 2:
        return 1, 1
    forced = overrides.current_wavefront_chunks()
    if forced is not None:
        if _settings.onnx_exporting():  # (a dynamic T would be fixed to the example's)
            raise ValueError(f"lltm.overrides.wavefront(chunks={forced}) cannot be exported to "
                             "ONNX: the chunks split T while exporting. Export without the "
                             "override (one call a layer)")
        return min(forced, T), 1
    if not _directions.concurrent(x):
        return 1, 1
    return automatic_schedule(T, B, I, H, L, x.dtype, x.device)


# --- lltm.backends.cuda.benchmark: the schedule measured ---------------------------------
# Stacked layers of one direction, nothing forced, no dropout in training: at
# the first eager call of a key (lltm/_autotune.py's, with the layers) the
# rules' schedule, a call a layer, the stacked launch where its plans fit and
# (captured) 2 and 4 time chunks planned for one and two layers at once, run
# on scratch tensors of the call's sizes, eager and captured; a candidate
# replaces the rules' only where it clearly wins (_autotune.clear_winner).

_measuring = threading.local()  # .schedule: for_call's answer while a candidate runs
_RULES = Schedule(why="the rules (measured: none clearly faster)")  # the candidate "rules"


def _tuned_schedule(module, x: torch.Tensor, rules: Schedule, measure: bool) -> Schedule:
    L = module.num_layers
    if (L < 2 or (module.dropout > 0 and module.training)
            or torch.is_autocast_enabled("cuda")  # (x is not yet in the dtype the layers run)
            or overrides.current_stacked_layers() != "auto"
            or overrides.current_wavefront_chunks() is not None):
        return rules
    settings = _settings.current(1)
    if settings & _autotune.PLAN_FIELDS:
        return rules
    training = torch.is_grad_enabled() and (
        x.requires_grad or any(p.requires_grad for p in module.parameters()))
    found = _autotune._call_key(settings, x, module.hidden_size, training)
    if found is None:
        return rules
    index, key = found
    key = (*key, "schedule", L)
    chosen = _autotune.cached(key)
    if chosen is None:
        if key[8] or not measure or not _autotune._may_measure(x):  # (8: captured)
            return rules._replace(why=rules.why + " (lltm.backends.cuda.benchmark: not yet "
                                  "measured; measured at the first eager call)")
        _measure_schedules(module, x, index, key)
        chosen = _autotune.cached(key)
    route, groups, chunks, sharing = chosen
    if route == "rules":
        return rules
    return Schedule(route, tuple(groups), chunks, sharing,
                    why="measured fastest (lltm.backends.cuda.benchmark)")


def _candidates(module, x, T: int, index: int, captured: bool) -> list[Schedule]:
    """The rules' schedule, a call a layer, the stacked launch where it
    fits, and (captured) time chunks (the rules' may be one of the others)."""
    B, I, H = x.shape[1], x.shape[2], module.hidden_size  # noqa: E741
    out = [_RULES, Schedule("layers")]
    sizes, first = groups(module.num_layers), 0
    fits = []
    for size in sizes:
        fits.append(overrides.stack_plan_in_force(x.dtype, size, T, B, I if not first else H, H,
                                                  device=index) is not None)
        first += size
    if all(fits):
        out.append(Schedule("stacked", groups=tuple(sizes)))
    if captured:
        out += [Schedule("wavefront", chunks=c, sharing=s) for c in (2, 4) for s in (1, 2)
                if T // c >= 8]
    return out


def _measure_schedules(module, x: torch.Tensor, index: int, key: tuple) -> None:
    """Times every candidate of ``key`` (training: the forward and the
    gradients of the input and the parameters; else the forward), eager
    and captured, and keeps the clear winner of each for ``key``."""
    training = key[7]
    T, (_, B, I) = min(key[3], _autotune.MAX_STEPS), x.shape  # noqa: E741
    H, L = module.hidden_size, module.num_layers
    generator = torch.Generator(x.device).manual_seed(0)

    def randn(*shape):
        return torch.randn(shape, generator=generator, device=x.device, dtype=x.dtype)
    xs = randn(T, B, I).requires_grad_(training)
    h0, c0, grad = randn(L, B, H).mul_(0.5), randn(L, B, H).mul_(0.5), randn(T, B, H)
    leaves = [xs, *(p for p in module.parameters() if p.requires_grad)]

    def run(schedule):
        _measuring.schedule = schedule
        try:
            with torch.set_grad_enabled(training):
                out, _ = module._run(xs, h0, c0, None)
                if training:
                    torch.autograd.grad(out, leaves, grad)
        finally:
            _measuring.schedule = None
    chosen = {}
    with torch.cuda.device(index), torch.autocast("cuda", enabled=False):
        for captured in (False, True):
            candidates = _candidates(module, xs, T, index, captured)
            runs = [_autotune._timed(functools.partial(run, c)) if not captured
                    else _timed_captured(functools.partial(run, c)) for c in candidates]
            best = candidates[_autotune.clear_winner(runs)]
            chosen[captured] = ("rules" if best is _RULES else best.route, list(best.groups),
                                best.chunks, best.sharing)
    for captured, value in chosen.items():
        _autotune.keep(key[:8] + (captured,) + key[9:], value)


def _timed_captured(run) -> list[float]:
    """_autotune._timed of ``run`` captured into a CUDA graph (warmed up on
    a side stream first, as torch.cuda.graph asks)."""
    stream = torch.cuda.Stream()
    try:
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            run()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            run()
    except RuntimeError:
        return [math.inf]
    return _autotune._timed(graph.replay)
