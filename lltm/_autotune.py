"""CUDA sequence plans chosen by measurement: ``lltm.backends.cuda.benchmark``
(docs/design.md, "Measured plans"). Where it is on, a CUDA sequence call
with no plan forced runs the candidate measured fastest for its key, as plan
fields of its settings; its backward runs the candidate measured fastest for
the backward (``ctx.tuned_plan``). Measured at a key's first eager call for
eager and captured calls at once; under capture, torch.compile and
torch.func only looked up (a miss: the library's own choice). A candidate
replaces the library's choice only where every sample of it is faster than
every sample of the library's.
"""
from __future__ import annotations

import functools
import json
import math
import os
import statistics

import torch

from . import _native, _settings, overrides
from .backends import cuda as _backend

PLAN_FIELDS = overrides.PLAN_FIELDS
FLAGS = _settings.TF32 | _settings.DETERMINISTIC
MAX_STEPS = 128  # the longest sequence measured (T's bucket, at most this)
WARMUP, REPS = 2, 7
FAMILIES = ("steps", "grid", "cluster", "block")

_cache: dict = {}  # key -> (forward's plan fields, backward's)
_times: dict = {}  # key -> {direction: {plan fields: us}}, of the keys measured here
_read: str | None = None  # the cache file read

_FORWARD = torch.ops.lltm._sequence_forward.default
_BACKWARD = torch.ops.lltm._sequence_backward.default


def forward_settings(ctx, given: int, x: torch.Tensor, H: int, training: bool) -> int:
    """A Function's forward settings ``given`` with the measured plan, and
    its backward's measured plan in ``ctx`` (backward_settings)."""
    if not _backend.benchmark:
        return given
    tuned = settings(given, x, H, training)
    ctx.tuned_plan = backward_plan(tuned, x, H)
    return tuned


def backward_settings(ctx, settings: int) -> int:
    """A backward's ``settings`` with the plan measured for it, if any."""
    tuned = getattr(ctx, "tuned_plan", None)
    return settings if tuned is None else (settings & ~PLAN_FIELDS) | tuned


def settings(settings: int, x: torch.Tensor, H: int, training: bool) -> int:
    """``settings`` of a sequence call over x [T, B, I] with the plan measured
    fastest for its key (measured now where it may be). Unchanged where a
    plan is forced or none given, off CUDA, and where nothing may be measured."""
    if settings == _settings.NOT_GIVEN or settings & PLAN_FIELDS:
        return settings
    found = _call_key(settings, x, H, training)
    if found is None:
        return settings
    index, key = found
    plans = cached(key)
    if plans is None:
        if key[8] or not _may_measure(x):  # (8: captured)
            return settings
        tune(key, index, x.dtype, settings)
        plans = _cache[key]
    return settings | plans[0]


def backward_plan(forward: int, x: torch.Tensor, H: int) -> int | None:
    """The plan fields measured for the backward of a training forward that
    ran with settings ``forward`` (from :func:`settings`); None where its
    plan was not measured (forced, none given, or nothing cached)."""
    if forward == _settings.NOT_GIVEN or _settings.current() & PLAN_FIELDS:
        return None
    found = _call_key(forward, x, H, True)
    plans = None if found is None else _cache.get(found[1])
    return plans[1] if plans is not None and plans[0] == forward & PLAN_FIELDS else None


def cached(key: tuple):
    """What is kept for ``key`` (measured here or read from the cache file), or None."""
    found = _cache.get(key)
    if found is None:
        _read_file()
        found = _cache.get(key)
    return found


def keep(key: tuple, value) -> None:
    """Keeps ``value`` for ``key``, in the cache file too where one is set."""
    _cache[key] = value
    _write_file()


def lookup(index: int, dtype, T: int, B: int, I: int, H: int, training: bool,  # noqa: E741
           captured: bool, settings: int) -> tuple[int, int] | None:
    """(the forward's plan fields, the backward's) cached for a call, or None."""
    _read_file()
    return _cache.get(_key(index, dtype, T, B, I, H, training, captured, settings))


def _call_key(settings: int, x: torch.Tensor, H: int, training: bool) -> tuple | None:
    """(device index, key) of a call; None off CUDA and for symbolic sizes
    (torch.compile's dynamic shapes)."""
    index = _cuda_index(x)
    T, B, I = x.shape  # noqa: E741
    if index is None or not type(T) is type(B) is type(I) is type(H) is int or not T * B * I:
        return None
    return index, _key(index, x.dtype, T, B, I, H, training, _capturing(index), settings)


def _key(index, dtype, T, B, I, H, training, captured, settings) -> tuple:  # noqa: E741
    return (*_device(index), dtype, 1 << (T - 1).bit_length(), B, I, H, bool(training),
            bool(captured), settings & FLAGS,
            max(1, settings >> _settings.CONCURRENT_SHIFT & 0xF))


def _cuda_index(x: torch.Tensor) -> int | None:
    return _native.cuda_index(x.device) if x.is_cuda else None


@functools.lru_cache(maxsize=None)
def _device(index: int) -> tuple[str, int]:
    props = torch.cuda.get_device_properties(index)
    return props.name, props.multi_processor_count


def _capturing(index: int) -> bool:
    return _native.stream_capturing(index)


def _may_measure(x: torch.Tensor) -> bool:
    """Not while torch.compile traces, nor under torch.func transforms."""
    return (type(x) in (torch.Tensor, torch.nn.Parameter) and not torch.compiler.is_compiling()
            and not torch._C._are_functorch_transforms_active())


def candidates(dtype, settings: int) -> list[int]:
    """The plan fields to measure: the library's choice (0), then each family
    forced (float32's grid as TF32 and FFMA builds where TF32 is allowed)."""
    plans = [overrides.SequencePlan(family=f) for f in FAMILIES]
    if dtype == torch.float32 and settings & _settings.TF32:
        plans[1:2] = [overrides.SequencePlan(family="grid", grid_tf32=t) for t in (True, False)]
    return [0] + [p.packed() for p in plans]


def _fits(dtype, T, B, I, H, index, settings) -> bool:  # noqa: E741
    return overrides.sequence_plan_in_force(dtype, T, B, I, H, device=index,
                                            settings=settings) is not None


def tune(key: tuple, index: int, dtype, settings: int) -> None:
    """Measures the candidates that fit for ``key`` (an eager call's) at T's
    bucket (at most MAX_STEPS), keeping for it and for the same call
    captured the clear winner of each direction (:func:`clear_winner`)."""
    bucket, B, I, H, training = key[3:8]  # noqa: E741
    T = min(bucket, MAX_STEPS)
    fields = [f for f in candidates(dtype, settings)
              if f == 0 or _fits(dtype, T, B, I, H, index, settings | f)]
    try:
        samples = _measure(fields, dtype, T, B, I, H, index, settings, training)
    except RuntimeError:  # (no room for the scratch tensors: the library's own choice)
        samples = {}
    for captured in (False, True):
        at = key[:8] + (captured,) + key[9:]  # (8: captured)
        plans, times = [], {}
        for direction in ("forward", "backward"):
            runs = samples.get((captured, direction))
            plans.append(0 if runs is None else fields[clear_winner(runs)])
            if runs is not None:
                times[direction] = {f: statistics.median(r) for f, r in zip(fields, runs)}
        _cache[at] = tuple(plans)
        _times[at] = times
    _write_file()


def clear_winner(runs: list[list[float]]) -> int:
    """Of each candidate's samples (the library's first), the index of the
    fastest by median among those whose every sample beats every sample of
    the library's; 0 (the library) where none does."""
    library = min(runs[0])
    winners = [i for i, r in enumerate(runs) if i and max(r) < library]
    return min(winners, key=lambda i: statistics.median(runs[i]), default=0)


def _measure(fields: list[int], dtype, T: int, B: int, I: int, H: int,  # noqa: E741
             index: int, settings: int, training: bool) -> dict[tuple, list[list[float]]]:
    """{(captured, "forward" | "backward"): each candidate's samples in
    microseconds}, the backward's where training (on the forward outputs of
    the library's plan); inf where a candidate fails."""
    device = torch.device("cuda", index)
    generator = torch.Generator(device).manual_seed(0)  # (the caller's random state untouched)

    def randn(*shape, scale=1.0):
        return torch.randn(shape, generator=generator, device=device, dtype=dtype).mul_(scale)
    x, h0, c0 = randn(T, B, I), randn(B, H, scale=0.5), randn(B, H, scale=0.5)
    w, b = randn(3 * H, I + H, scale=(I + H) ** -0.5), randn(3 * H, scale=0.1)
    grads = randn(T, B, H), randn(B, H), randn(B, H)
    runs: dict[tuple, list[list[float]]] = {}
    with torch.cuda.device(index), torch.no_grad(), torch.autocast("cuda", enabled=False):
        out, _, _, cells, gates = _FORWARD(x, w, b, h0, c0, settings)
        calls = {"forward": lambda s: _FORWARD(x, w, b, h0, c0, s)}
        if training:
            calls["backward"] = lambda s: _BACKWARD(*grads, x, w, h0, out, cells, gates,
                                                    [True] * 5, s)
        for direction, call in calls.items():
            for f in fields:
                run = functools.partial(call, settings | f)
                eager = _timed(run)
                runs.setdefault((False, direction), []).append(eager)
                runs.setdefault((True, direction), []).append(
                    _timed_graph(run) if math.inf not in eager else eager)
    return runs


def _timed(run) -> list[float]:
    """Microseconds of REPS runs after WARMUP, each from an idle device."""
    try:
        for _ in range(WARMUP):
            run()
        samples = []
        for _ in range(REPS):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            run()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) * 1e3)
        return samples
    except RuntimeError:
        return [math.inf]


def _timed_graph(run) -> list[float]:
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            run()
    except RuntimeError:
        return [math.inf]
    return _timed(graph.replay)


# --- the cache file (lltm.backends.cuda.cache_file) -------------------------------------

def clear() -> None:
    global _read
    _cache.clear()
    _times.clear()
    _read = None


def _read_file() -> None:
    """Reads the cache file once (again when it changes), keeping the plans
    measured here over its."""
    global _read
    path = _backend.cache_file
    if path is None or os.fspath(path) == _read:
        return
    _read = os.fspath(path)
    if os.path.exists(path):
        with open(path) as f:
            for device, entries in json.load(f).items():
                for rest, entry in entries.items():
                    sms, dtype, *sizes = json.loads(rest)
                    if "schedule" in entry:
                        value = tuple(entry["schedule"])
                    elif "forward" in entry:
                        value = (entry["forward"], entry["backward"])
                    else:  # (an entry of an older lltm: measured again)
                        continue
                    _cache.setdefault((device, sms, getattr(torch, dtype), *sizes), value)


def _write_file() -> None:
    path = _backend.cache_file
    if path is None:
        return
    _read_file()
    out: dict = {}
    for key, plans in sorted(_cache.items(), key=repr):
        if "schedule" in key:  # (lltm.LLTM's stacked layers: lltm/_schedule.py)
            entry = {"schedule": plans}
        else:
            entry = {"forward": plans[0], "backward": plans[1],
                     "plans": [describe(plans[0]), describe(plans[1])]}
        for direction, times in _times.get(key, {}).items():
            entry[f"{direction} us"] = {describe(f): round(t, 1) for f, t in times.items()
                                        if t < math.inf}
        rest = [key[1], str(key[2]).replace("torch.", ""), *key[3:]]
        out.setdefault(key[0], {})[json.dumps(rest)] = entry
    temporary = f"{os.fspath(path)}.{os.getpid()}.tmp"
    with open(temporary, "w") as f:
        json.dump(out, f, indent=1)
    os.replace(temporary, path)


def describe(fields: int) -> str:
    """A candidate's name: "library" (its own choice) or the family forced."""
    if not fields:
        return "library"
    family = overrides._FAMILY_NAMES[overrides.plan_field(fields, overrides.FAMILY_FIELD)]
    tf32 = overrides.plan_field(fields, overrides.GRID_TF32_FIELD)
    return family + {0: "", 1: " tf32", 2: " ffma"}[tf32]
