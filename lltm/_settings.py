"""The settings an lltm operator call runs with: every operator's last
argument, ``settings``, one packed integer (csrc/binding/call_settings.h
documents the fields).

What it carries: torch's own settings that the CUDA library follows (TF32
for float32 products, deterministic algorithms), how many layers run at once
on the device (lltm._sharing), and what lltm.overrides forces, for tests and
measurements. The stable C ABI reads none of torch's settings and the
libraries keep no copy of them: they are read here with each call, so no
result depends on what ran before it.

- Eager calls (and calls captured into a CUDA graph) read them when made.
- Under torch.compile the traced code reads them (:func:`traced`): the graph
  holds the values of its trace, and torch traces anew when they change (it
  guards its graphs on TF32 and deterministic mode, as for its own products,
  and on lltm.overrides' state, which the trace reads).
- An exported program (torch.export) holds :data:`NOT_GIVEN`: it may run
  under other settings than it was exported under, so its products go
  through aten::mm, which reads torch's settings itself when it runs, and
  lltm's own kernels keep float32 in float32.
- A direct call of a public operator without the argument gets the settings
  in force from its autograd kernel (lltm._ops); where no autograd kernel
  runs (torch.inference_mode) it runs as NOT_GIVEN.
"""
from __future__ import annotations

import sys

import torch

from . import _sharing, overrides

NOT_GIVEN = -1
TF32 = 1           # float32 products may run on TF32 tensor cores
DETERMINISTIC = 2  # torch.use_deterministic_algorithms (warn-only too)
CONCURRENT_SHIFT = 8  # the field of the layers running at once


_fp32_precision = getattr(torch._C, "_get_fp32_precision_getter", None)  # (bound once)


def float32_tf32() -> bool:
    """Whether torch lets float32 matrix products (aten::mm) run on TF32:
    torch.backends.cuda.matmul.fp32_precision (which also reflects the older
    allow_tf32 and set_float32_matmul_precision), read the cheap way."""
    try:
        return _fp32_precision("cuda", "matmul") == "tf32"
    except (TypeError, RuntimeError):  # (TypeError: a torch without the getter)
        try:
            return bool(torch.backends.cuda.matmul.allow_tf32)
        except RuntimeError:
            return False


_deterministic = torch.are_deterministic_algorithms_enabled  # warn-only counts as on


@torch.compiler.assume_constant_result
def torch_flags() -> int:
    """TF32 | DETERMINISTIC as torch's settings are now. torch.compile takes
    the value of the trace as a constant: its graphs are guarded on both
    settings, so a change traces anew."""
    return (TF32 if float32_tf32() else 0) | (DETERMINISTIC if _deterministic() else 0)


_threads = _sharing._local  # (read directly: current() runs at every eager call)


def current(concurrent: int | None = None) -> int:
    """The settings of a call made now, planned for ``concurrent`` layers at
    once on the device (default: this thread's, lltm._sharing)."""
    layers = _threads.layers if concurrent is None else concurrent
    return torch_flags() | overrides._packed | (layers << CONCURRENT_SHIFT)


@torch.compiler.assume_constant_result
def exporting() -> bool:
    """torch.compiler.is_exporting(), as torch.export's flag is, also where
    torch.compile traces the caller (torch 2.11's torch.compile takes the
    call for True while it traces)."""
    return torch.compiler.is_exporting()


@torch.compiler.assume_constant_result
def onnx_exporting() -> bool:
    """torch.onnx.is_in_onnx_export(): torch.onnx.export is running, its
    capture by torch.export included (never true unless torch.onnx is loaded).
    Called, not traced, by torch.export's strict mode (dynamo takes
    is_in_onnx_export for False while it traces)."""
    onnx = sys.modules.get("torch.onnx")
    return onnx is not None and onnx.is_in_onnx_export()


def traced() -> int:
    """The settings a graph traced now holds: :func:`current` for one layer
    at a time (torch.compile traces one stream), NOT_GIVEN in an exported
    program."""
    return NOT_GIVEN if exporting() else current(1)
