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
    s = for_call(module, x)
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
            raise ValueError(f"lltm.overrides.wavefront(chunks={forced}) cannot be exported to ONNX: "
                             "the chunks split T while exporting. Export without the "
                             "override (one call a layer)")
        return min(forced, T), 1
    if not _directions.concurrent(x):
        return 1, 1
    return automatic_schedule(T, B, I, H, L, x.dtype, x.device)
