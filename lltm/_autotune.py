"""CUDA sequence plans chosen by measurement: ``lltm.backends.cuda.benchmark``
(docs/design.md, "Measured plans"). Where it is on, a CUDA sequence call
with no plan forced runs the candidate measured fastest for its key, as plan
fields of its settings; its backward runs with its forward's fields
(``ctx.tuned_plan``). Measured at a key's first eager call for eager and
captured calls at once; under capture, torch.compile and torch.func only
looked up (a miss: the library's own choice). Ties go to the library.
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
MAX_STEPS = 64
WARMUP, REPS = 2, 5
FAMILIES = ("steps", "grid", "cluster", "block")

_cache: dict = {}  # key -> plan fields
_times: dict = {}  # key -> {plan fields: us}, of the keys measured here
_read: str | None = None  # the cache file read

_FORWARD = torch.ops.lltm._sequence_forward.default
_BACKWARD = torch.ops.lltm._sequence_backward.default


def forward_settings(ctx, given: int, x: torch.Tensor, H: int, training: bool) -> int:
    """A Function's forward settings ``given`` with the measured plan, kept in
    ``ctx`` for its backward (backward_settings)."""
    if not _backend.benchmark:
        return given
    tuned = settings(given, x, H, training)
    ctx.tuned_plan = tuned & PLAN_FIELDS
    return tuned


def backward_settings(ctx, settings: int) -> int:
    """A backward's ``settings`` with its forward's measured plan, if any."""
    tuned = getattr(ctx, "tuned_plan", None)
    return settings if tuned is None else (settings & ~PLAN_FIELDS) | tuned


def settings(settings: int, x: torch.Tensor, H: int, training: bool) -> int:
    """``settings`` of a sequence call over x [T, B, I] with the plan measured
    fastest for its key (measured now where it may be). Unchanged where a
    plan is forced or none given, off CUDA, and where nothing may be measured."""
    if settings == _settings.NOT_GIVEN or settings & PLAN_FIELDS:
        return settings
    index = _cuda_index(x)
    T, B, I = x.shape  # noqa: E741
    if index is None or not type(T) is type(B) is type(I) is type(H) is int or not T * B * I:
        return settings  # (symbolic sizes: torch.compile's dynamic shapes)
    captured = _capturing(index)
    key = _key(index, x.dtype, T, B, I, H, training, captured, settings)
    fields = _cache.get(key)
    if fields is None:
        _read_file()
        fields = _cache.get(key)
    if fields is None:
        if captured or not _may_measure(x):
            return settings
        tune(key, index, x.dtype, min(key[3], MAX_STEPS), B, I, H, settings)  # (T's bucket)
        fields = _cache[key]
    return settings | fields


def lookup(index: int, dtype, T: int, B: int, I: int, H: int, training: bool,  # noqa: E741
           captured: bool, settings: int) -> int | None:
    """The plan fields cached for a call, or None (lltm.explain)."""
    _read_file()
    return _cache.get(_key(index, dtype, T, B, I, H, training, captured, settings))


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


def tune(key: tuple, index: int, dtype, T: int, B: int, I: int, H: int,  # noqa: E741
         settings: int) -> None:
    """Measures the candidates that fit for ``key`` (an eager call's), keeping
    the fastest for it and for the same call captured."""
    fields = [f for f in candidates(dtype, settings)
              if f == 0 or _fits(dtype, T, B, I, H, index, settings | f)]
    try:
        times = _measure(fields, dtype, T, B, I, H, index, settings, key[7])  # (7: training)
    except RuntimeError:  # (no room for the scratch tensors: the library's own choice)
        times = {mode: [math.inf] * len(fields) for mode in (False, True)}
    for captured, us in times.items():
        at = key[:8] + (captured,) + key[9:]  # (8: captured)
        _cache[at] = fields[min(range(len(fields)), key=us.__getitem__)]
        _times[at] = dict(zip(fields, us))
    _write_file()


def _measure(fields: list[int], dtype, T: int, B: int, I: int, H: int,  # noqa: E741
             index: int, settings: int, training: bool) -> dict[bool, list[float]]:
    """{captured: microseconds of each candidate's call}, inf where one fails."""
    device = torch.device("cuda", index)
    generator = torch.Generator(device).manual_seed(0)  # (the caller's random state untouched)

    def randn(*shape, scale=1.0):
        return torch.randn(shape, generator=generator, device=device, dtype=dtype).mul_(scale)
    x, h0, c0 = randn(T, B, I), randn(B, H, scale=0.5), randn(B, H, scale=0.5)
    w, b = randn(3 * H, I + H, scale=(I + H) ** -0.5), randn(3 * H, scale=0.1)
    grads = randn(T, B, H), randn(B, H), randn(B, H)

    def call(s):
        out, _, _, cells, gates = _FORWARD(x, w, b, h0, c0, s)
        if training:
            _BACKWARD(*grads, x, w, h0, out, cells, gates, [True] * 5, s)

    times: dict[bool, list[float]] = {False: [], True: []}
    with torch.cuda.device(index), torch.no_grad(), torch.autocast("cuda", enabled=False):
        for f in fields:
            run = functools.partial(call, settings | f)
            times[False].append(_timed(run))
            times[True].append(_timed_graph(run) if times[False][-1] < math.inf else math.inf)
    return times


def _timed(run) -> float:
    """Median microseconds of REPS runs after WARMUP, each from an idle device."""
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
        return statistics.median(samples)
    except RuntimeError:
        return math.inf


def _timed_graph(run) -> float:
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            run()
    except RuntimeError:
        return math.inf
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
                    _cache.setdefault((device, sms, getattr(torch, dtype), *sizes), entry["fields"])


def _write_file() -> None:
    path = _backend.cache_file
    if path is None:
        return
    _read_file()
    out: dict = {}
    for key, fields in sorted(_cache.items(), key=repr):
        entry = {"fields": fields, "plan": describe(fields)}
        if key in _times:
            entry["us"] = {describe(f): round(t, 1) for f, t in _times[key].items()
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
