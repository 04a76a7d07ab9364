"""Measurement overrides of what the CUDA library would choose by itself.

The library picks its own routes: the cell's matrix-product route (its fused
kernels or cuBLAS, by size) and the sequence's plan (per-step kernels, a
cooperative grid, or thread-block clusters, with their shapes). Tests and
timing tools force one through this module, never through the C core (which
reads no environment): from environment variables read once, when ``lltm`` is
imported, or with the context managers below. ``docs/cuda-plans.md`` lists
the variables and what each forces::

    with lltm.overrides.sequence_plan(family="grid", grid_shape="32x16"):
        output, _ = lltm.LLTM(32, 128).cuda()(x)

Without the CUDA library (a CPU-only install) the overrides are accepted and
have nothing to act on.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
from dataclasses import dataclass, fields, replace

from . import _native

MATMUL_POLICIES = {"auto": 0, "fused": 1, "cublas": 2}
FAMILIES = {"auto": 0, "steps": 1, "grid": 2, "cluster": 3}
CLUSTER_BLOCKS = (8, 16)
CLUSTER_CHUNKS = (4, 8, 16)
GRID_SHAPES = ("16x8", "16x32", "32x16", "32x32")


class _PlanOptions(ctypes.Structure):
    """lltm_sequence_plan_options of csrc/core/lltm.h (0: no constraint)."""
    _fields_ = [(name, ctypes.c_int) for name in
                ("family", "grid_lanes", "grid_values", "grid_groups_max", "cluster_blocks",
                 "cluster_chunk")]


@dataclass(frozen=True)
class SequencePlan:
    """Constraints on the CUDA sequence plan; None leaves a choice to the library."""
    family: str = "auto"
    cluster_blocks: int | None = None
    cluster_chunk: int | None = None
    grid_shape: str | None = None
    grid_groups: int | None = None

    def __post_init__(self):
        _check("family", self.family, FAMILIES)
        _check("cluster_blocks", self.cluster_blocks, CLUSTER_BLOCKS)
        _check("cluster_chunk", self.cluster_chunk, CLUSTER_CHUNKS)
        _check("grid_shape", self.grid_shape, GRID_SHAPES)
        groups = self.grid_groups
        if groups is not None and (isinstance(groups, bool) or not isinstance(groups, int)
                                   or groups < 1):
            raise ValueError(f"grid_groups must be an int >= 1 or None, got {groups!r}")

    def as_struct(self) -> _PlanOptions:
        lanes, values = map(int, self.grid_shape.split("x")) if self.grid_shape else (0, 0)
        return _PlanOptions(FAMILIES[self.family], lanes, values, self.grid_groups or 0,
                            self.cluster_blocks or 0, self.cluster_chunk or 0)


def _check(name, value, allowed):
    if value is not None and value not in allowed:
        raise ValueError(f"{name} must be one of {list(allowed)} or None, got {value!r}")


_matmul = "auto"
_plan = SequencePlan()


def _cuda_library():
    return _native._loaded.get("cuda")


def _apply() -> None:
    lib = _cuda_library()
    if lib is None:
        return
    lib.lltm_cuda_set_matmul_policy(MATMUL_POLICIES[_matmul])
    lib.lltm_cuda_set_sequence_plan_options(ctypes.byref(_plan.as_struct()))


def current_sequence_plan() -> SequencePlan:
    """The constraints in force."""
    return _plan


def current_matmul() -> str:
    return _matmul


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
def sequence_plan(**constraints):
    """Force the CUDA sequence plan inside the block (SequencePlan's fields;
    unnamed ones keep their current values), then restore it."""
    before = _plan
    names = {f.name for f in fields(SequencePlan)}
    unknown = set(constraints) - names
    if unknown:
        raise TypeError(f"unknown sequence plan constraints {sorted(unknown)}; "
                        f"expected some of {sorted(names)}")
    set_sequence_plan(replace(before, **constraints))
    try:
        yield _plan
    finally:
        set_sequence_plan(before)


@contextlib.contextmanager
def matmul(policy: str):
    """Force the cell's matrix-product route ("fused", "cublas" or "auto")."""
    before = _matmul
    set_matmul(policy)
    try:
        yield
    finally:
        set_matmul(before)


def _from_environment(environ=os.environ) -> tuple[str, SequencePlan]:
    def text(name):
        value = environ.get(name, "").strip()
        return value or None

    def integer(name):
        value = text(name)
        if value is None:
            return None
        try:
            return int(value)
        except ValueError:
            raise ValueError(f"{name} must be an integer, got {value!r}") from None

    try:
        policy = text("LLTM_CUDA_MATMUL") or "auto"
        _check("LLTM_CUDA_MATMUL", policy, MATMUL_POLICIES)
        plan = SequencePlan(family=text("LLTM_CUDA_SEQUENCE") or "auto",
                            cluster_blocks=integer("LLTM_CUDA_CLUSTER_BLOCKS"),
                            cluster_chunk=integer("LLTM_CUDA_CLUSTER_CHUNK"),
                            grid_shape=text("LLTM_CUDA_GRID_SHAPE"),
                            grid_groups=integer("LLTM_CUDA_GRID_GROUPS"))
    except ValueError as exc:
        raise ValueError(f"lltm: a measurement override in the environment is invalid: {exc} "
                         "(see lltm/overrides.py)") from None
    return policy, plan


def apply_environment() -> None:
    """Read the variables above (once, at import) and set the overrides."""
    global _matmul, _plan
    _matmul, _plan = _from_environment()
    _apply()
