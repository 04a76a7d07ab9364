"""Measurement overrides of what lltm would choose by itself, for tests and
timing tools: the CUDA cell's matrix-product route, the CUDA sequence plan
(csrc/core/lltm_cuda_rules.c picks both otherwise), and lltm.LLTM's own
choices for stacked layers (``wavefront(chunks=...)``, lltm/_wavefront.py;
``stacked_layers(mode)``, lltm/_stack.py). Set from environment variables
read once at import, or with the context managers below; what is forced
travels with each operator call in its ``settings`` argument
(lltm/_settings.py): the C core reads no environment. ``docs/cuda-plans.md``
lists the variables::

    with lltm.overrides.sequence_plan(family="grid", grid_shape="16x32"):
        output, _ = lltm.LLTM(32, 128).cuda()(x)

Without the CUDA library the CUDA overrides have nothing to act on.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
from dataclasses import dataclass, fields, replace

from . import _native

MATMUL_POLICIES = {"auto": 0, "fused": 1, "cublas": 2}
FAMILIES = {"auto": 0, "steps": 1, "grid": 2, "cluster": 3, "block": 4}
CLUSTER_BLOCKS = (16,)  # the clusters' only size (csrc/core/lltm.h)
CLUSTER_CHUNKS = (4, 8, 16)
GRID_SHAPES = ("16x8", "16x32", "32x16", "32x32", "8x64", "16x64")  # x64: half types only
GRID_CHUNKS = (4, 16)
BLOCK_CHUNKS = (1, 4)
BLOCK_UNITS = 64  # the block family's H: every unit in one block (lltm.h)
MAX_GRID_GROUPS = 255  # the settings argument's 8 bits
# The settings argument's fields a SequencePlan takes (csrc/binding/call_settings.h: 4 bits each,
# grid_groups two), and all of them as one mask
FAMILY_FIELD, GRID_TF32_FIELD = 3, 12
PLAN_FIELDS = sum(0xF << (4 * field) for field in range(FAMILY_FIELD, GRID_TF32_FIELD + 1))
GRID_TF32_CODES = {None: 0, True: 1, False: 2}
STACKED_LAYERS = ("auto", "on", "off")


def plan_field(packed: int, field: int) -> int:
    """The value of field ``field`` (FAMILY_FIELD, ...) in a packed settings value."""
    return packed >> (4 * field) & 0xF


class _Launch(ctypes.Structure):
    """lltm_sequence_launch of csrc/core/lltm.h."""
    _fields_ = [("lanes", ctypes.c_int), ("values", ctypes.c_int), ("rows", ctypes.c_int),
                ("chunk", ctypes.c_int), ("exchange", ctypes.c_int), ("tf32", ctypes.c_int),
                ("blocks", ctypes.c_int64), ("groups", ctypes.c_int64), ("smem", ctypes.c_size_t)]


_PLAN_TAIL = [("B", ctypes.c_int64), ("H", ctypes.c_int64), ("forward", _Launch),
              ("backward", _Launch), ("workspace_bytes", ctypes.c_size_t)]


class _Plan(ctypes.Structure):
    """lltm_sequence_plan of csrc/core/lltm.h."""
    _fields_ = [("family", ctypes.c_int), ("dtype", ctypes.c_int), *_PLAN_TAIL]


class _StackPlan(ctypes.Structure):
    """lltm_stack_plan of csrc/core/lltm_stack.h."""
    _fields_ = [("dtype", ctypes.c_int), ("layers", ctypes.c_int), *_PLAN_TAIL]


@dataclass(frozen=True)
class SequencePlan:
    """Constraints on the CUDA sequence plan; None leaves a choice to the library."""
    family: str = "auto"
    cluster_blocks: int | None = None
    cluster_chunk: int | None = None
    grid_shape: str | None = None
    grid_groups: int | None = None
    grid_chunk: int | None = None
    block_chunk: int | None = None
    grid_tf32: bool | None = None  # float32 where TF32 is allowed: the grid's TF32 build, or FFMA

    def __post_init__(self):
        _check("family", self.family, FAMILIES)
        _check("cluster_blocks", self.cluster_blocks, CLUSTER_BLOCKS)
        _check("cluster_chunk", self.cluster_chunk, CLUSTER_CHUNKS)
        _check("grid_shape", self.grid_shape, GRID_SHAPES)
        _check("grid_chunk", self.grid_chunk, GRID_CHUNKS)
        _check("block_chunk", self.block_chunk, BLOCK_CHUNKS)
        if self.grid_tf32 is not None and not isinstance(self.grid_tf32, bool):
            raise ValueError(f"grid_tf32 must be True, False or None, got {self.grid_tf32!r}")
        groups = self.grid_groups
        if groups is not None and (isinstance(groups, bool) or not isinstance(groups, int)
                                   or not 1 <= groups <= MAX_GRID_GROUPS):
            raise ValueError(f"grid_groups must be an int >= 1 and <= {MAX_GRID_GROUPS} or "
                             f"None, got {groups!r}")
        if groups is not None and self.family == "cluster":
            raise ValueError("grid_groups caps the grid and block families' batch groups; the "
                             "clusters run one a batch chunk (family 'cluster' takes no "
                             "grid_groups)")

    def packed(self) -> int:
        """These constraints as fields of an operator's settings argument
        (csrc/binding/call_settings.h: 4-bit fields, a size as log2 + 1)."""
        lanes, values = map(int, self.grid_shape.split("x")) if self.grid_shape else (0, 0)
        fields = {FAMILY_FIELD: FAMILIES[self.family], 4: _size_code(lanes),
                  5: _size_code(values), 6: self.grid_groups or 0,
                  8: _size_code(self.cluster_blocks), 9: _size_code(self.cluster_chunk),
                  10: _size_code(self.grid_chunk), 11: _size_code(self.block_chunk),
                  GRID_TF32_FIELD: GRID_TF32_CODES[self.grid_tf32]}
        return sum(value << (4 * index) for index, value in fields.items())


def _size_code(size: int | None) -> int:
    """0 for none, else log2(size) + 1 (sizes are powers of two)."""
    return (size or 0).bit_length()


def _check(name, value, allowed):
    if value is not None and value not in allowed:
        raise ValueError(f"{name} must be one of {list(allowed)} or None, got {value!r}")


_matmul = "auto"
_plan = SequencePlan()
_wavefront_chunks: int | None = None  # None: lltm.LLTM chooses (1 on the CPU)
_stacked_layers = "auto"
_packed = 0  # _matmul and _plan as fields of the settings argument, kept in step by _apply


def _cuda_library():
    return _native._loaded.get("cuda")


def _apply() -> None:
    global _packed
    _packed = (MATMUL_POLICIES[_matmul] << 4) | _plan.packed()


def packed() -> int:
    """What is forced now (the cell's route, the sequence plan), as fields of
    an operator's settings argument (lltm/_settings.py)."""
    return _packed


_DTYPE_CODES = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 3}
_FAMILY_NAMES = {v: k for k, v in FAMILIES.items()}
_EXCHANGES = {0: "none", 1: "global", 2: "broadcast", 3: "reduce-scatter", 4: "local"}


def _dtype_code(dtype) -> int:
    name = str(dtype).replace("torch.", "")
    if name not in _DTYPE_CODES:
        raise ValueError(f"dtype must be one of {list(_DTYPE_CODES)}, got {dtype!r}")
    return _DTYPE_CODES[name]


def _plan_dict(plan, **head) -> dict:
    """A plan struct (_Plan, _StackPlan) as a dict: ``head`` (its family
    first), the workspace, and per direction the launch (the per-step
    family has none)."""
    out = {**head, "workspace_bytes": plan.workspace_bytes}
    if head["family"] != "steps":
        for direction in ("forward", "backward"):
            launch = getattr(plan, direction)
            out[direction] = {name: getattr(launch, name) for name, _ in _Launch._fields_}
            out[direction].update(exchange=_EXCHANGES.get(launch.exchange, launch.exchange),
                                  tf32=bool(launch.tf32))
    return out


def _ask_in_force(name: str, argtypes: list, dtype, device: int | None, *args,
                  settings: int | None = None) -> int | None:
    """``lltm_cuda_<name>_in_force(device, dtype, settings, *args)`` of the
    CUDA library for a call made now with ``settings`` (default: those in
    force) on ``device`` (an ordinal, default the current device); None
    without the library."""
    lib = _cuda_library()
    if lib is None:
        return None
    import torch

    from . import _settings
    fn = getattr(lib, f"lltm_cuda_{name}_in_force")
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64] + argtypes
    index = torch.cuda.current_device() if device is None else device
    return fn(index, _dtype_code(dtype), _settings.current() if settings is None else settings,
              *args)


_SIZES = [ctypes.c_int64] * 4  # T, B, I, H


def sequence_plan_in_force(dtype, T: int, B: int, I: int, H: int,  # noqa: E741
                           device: int | None = None, settings: int | None = None
                           ) -> dict | None:
    """The plan the CUDA sequence operators would run now for one layer of
    these sizes, eager or captured as the current stream is
    (docs/cuda-plans.md), as a dict: family, and per direction the launch
    (lanes, values, rows, chunk, exchange, blocks, groups, smem, tf32). None
    where a forced family does not fit, or without the CUDA library.
    ``settings``: those of a call (lltm/_settings.py) instead of those in force."""
    plan = _Plan()
    status = _ask_in_force("sequence_plan", _SIZES + [ctypes.c_void_p], dtype, device,
                           T, B, I, H, ctypes.byref(plan), settings=settings)
    if status != 0:
        return None
    return _plan_dict(plan, family=_FAMILY_NAMES.get(plan.family, plan.family))


def wavefront_in_force(dtype, T: int, B: int, H: int, device: int | None = None,
                       settings: int | None = None) -> tuple[int, int] | None:
    """(chunks, sharing): the time chunks over which lltm.LLTM overlaps
    stacked layers of these sizes in a call made now, each chunk call planned
    for ``sharing`` layers at once; None where no plan fits, or without the
    CUDA library."""
    chunks, sharing = ctypes.c_int(), ctypes.c_int()
    status = _ask_in_force("wavefront", [ctypes.c_int64] * 3 + [ctypes.c_void_p] * 2, dtype,
                           device, T, B, H, ctypes.byref(chunks), ctypes.byref(sharing),
                           settings=settings)
    return (chunks.value, sharing.value) if status == 0 else None


def grid_tensor_cores(dtype, device: int | None = None) -> bool:
    """Whether the grid family's kernels of ``dtype`` form their products on
    tensor cores on ``device`` (the half types from compute capability 8.0,
    float32 there while torch allows TF32); False without the CUDA library."""
    found = ctypes.c_int()
    status = _ask_in_force("grid_tensor_cores", [ctypes.c_void_p], dtype, device,
                           ctypes.byref(found))
    return status == 0 and bool(found.value)


def stack_plan_in_force(dtype, L: int, T: int, B: int, I: int, H: int,  # noqa: E741
                        device: int | None = None) -> dict | None:
    """The stacked launch lltm::stack_forward would run now for L layers of
    these sizes on CUDA, as a dict like :func:`sequence_plan_in_force`'s
    (family "stack", layers); None where none runs them (the operator then
    calls the layers one by one), or without the CUDA library."""
    plan = _StackPlan()
    status = _ask_in_force("stack_plan", [ctypes.c_int64] + _SIZES + [ctypes.c_void_p], dtype,
                           device, L, T, B, I, H, ctypes.byref(plan))
    return _plan_dict(plan, family="stack", layers=plan.layers) if status == 0 else None


def stack_route_in_force(dtype, L: int, T: int, B: int, I: int, H: int,  # noqa: E741
                         device: int | None = None) -> bool:
    """Whether lltm.LLTM runs L stacked layers of these sizes through one
    stacked launch in a call made now (one fits and the rules find it the
    faster route); False without the CUDA library."""
    stacked = ctypes.c_int()
    status = _ask_in_force("stack_route", [ctypes.c_int64] + _SIZES + [ctypes.c_void_p], dtype,
                           device, L, T, B, I, H, ctypes.byref(stacked))
    return status == 0 and bool(stacked.value)


def cell_route_in_force(dtype, B: int, I: int, H: int,  # noqa: E741
                        device: int | None = None) -> str | None:
    """The matrix-product route ("fused" or "cublas") the CUDA cell operators
    would take now for a step of these sizes; None without the CUDA library."""
    route = _ask_in_force("cell_route", [ctypes.c_int64] * 3, dtype, device, B, I, H)
    return {v: k for k, v in MATMUL_POLICIES.items()}.get(route)


def set_sequence_plan(plan: SequencePlan) -> None:
    global _plan
    if not isinstance(plan, SequencePlan):
        raise TypeError(f"expected an lltm.overrides.SequencePlan, got {type(plan).__name__}")
    _plan = plan
    _apply()


def set_matmul(policy: str) -> None:
    global _matmul
    _check("matmul policy", policy, MATMUL_POLICIES)
    _matmul = policy
    _apply()


@contextlib.contextmanager
def _forced(name: str, value):
    """This module's ``name`` set to ``value`` (checked by the caller) inside
    the block, then restored."""
    before = globals()[name]
    globals()[name] = value
    _apply()
    try:
        yield value
    finally:
        globals()[name] = before
        _apply()


def sequence_plan(**constraints):
    """Force the CUDA sequence plan inside the block (SequencePlan's fields;
    unnamed ones keep their current values)."""
    names = {f.name for f in fields(SequencePlan)}
    unknown = set(constraints) - names
    if unknown:
        raise TypeError(f"unknown sequence plan constraints {sorted(unknown)}; "
                        f"expected some of {sorted(names)}")
    return _forced("_plan", replace(_plan, **constraints))


def matmul(policy: str):
    """Force the cell's matrix-product route ("fused", "cublas" or "auto")."""
    _check("matmul policy", policy, MATMUL_POLICIES)
    return _forced("_matmul", policy)


def current_stacked_layers() -> str:
    """How lltm.LLTM runs its stacked unidirectional layers: "auto" (its own
    choice), "on" (through lltm::stack_forward wherever the module allows
    it, on any device) or "off" (a call of the sequence operator a layer)."""
    return _stacked_layers


def _check_stacked(name: str, mode) -> None:
    if mode not in STACKED_LAYERS:
        raise ValueError(f"{name} must be one of {list(STACKED_LAYERS)}, got {mode!r}")


def stacked_layers(mode: str):
    """Force how lltm.LLTM runs its stacked layers inside the block
    (:func:`current_stacked_layers`)."""
    _check_stacked("stacked layers", mode)
    return _forced("_stacked_layers", mode)


def _check_chunks(name: str, chunks) -> None:
    if chunks is not None and (isinstance(chunks, bool) or not isinstance(chunks, int)
                               or chunks < 1):
        raise ValueError(f"{name} must be an int >= 1 or None, got {chunks!r}")


def current_wavefront_chunks() -> int | None:
    """The time chunks forced on stacked layers (None: lltm.LLTM chooses)."""
    return _wavefront_chunks


def wavefront(chunks: int | None):
    """Force the number of time chunks over which lltm.LLTM pipelines its
    stacked unidirectional layers inside the block (1: the layers one after
    the other; None: its own choice), on any device."""
    _check_chunks("chunks", chunks)
    return _forced("_wavefront_chunks", chunks)


def _from_environment(environ=os.environ) -> tuple[str, SequencePlan]:
    def text(name):
        return environ.get(name, "").strip() or None

    def integer(name):
        value = text(name)
        if value is None:
            return None
        try:
            return int(value)
        except ValueError:
            raise ValueError(f"{name} must be an integer, got {value!r}") from None

    policy = text("LLTM_CUDA_MATMUL") or "auto"
    _check("LLTM_CUDA_MATMUL", policy, MATMUL_POLICIES)
    return policy, SequencePlan(family=text("LLTM_CUDA_SEQUENCE") or "auto",
                                cluster_blocks=integer("LLTM_CUDA_CLUSTER_BLOCKS"),
                                cluster_chunk=integer("LLTM_CUDA_CLUSTER_CHUNK"),
                                grid_shape=text("LLTM_CUDA_GRID_SHAPE"),
                                grid_groups=integer("LLTM_CUDA_GRID_GROUPS"),
                                grid_chunk=integer("LLTM_CUDA_GRID_CHUNK"),
                                block_chunk=integer("LLTM_CUDA_BLOCK_CHUNK"))


def apply_environment(environ=os.environ) -> None:
    """Read the variables (once, at import) and set the overrides."""
    global _matmul, _plan, _wavefront_chunks, _stacked_layers
    chunks = environ.get("LLTM_WAVEFRONT_CHUNKS", "").strip()
    stacked = environ.get("LLTM_STACKED_LAYERS", "").strip() or "auto"
    try:
        matmul_policy, plan = _from_environment(environ)
        if chunks in ("", "auto"):
            chunks = None
        with contextlib.suppress(ValueError, TypeError):  # (not an integer: refused below)
            chunks = int(chunks)
        _check_chunks("LLTM_WAVEFRONT_CHUNKS", chunks)
        _check_stacked("LLTM_STACKED_LAYERS", stacked)
    except ValueError as exc:
        raise ValueError(f"lltm: a measurement override in the environment is invalid: {exc} "
                         "(see lltm/overrides.py)") from None
    _matmul, _plan, _wavefront_chunks, _stacked_layers = matmul_policy, plan, chunks, stacked
    _apply()
