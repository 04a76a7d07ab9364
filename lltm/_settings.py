"""The settings an lltm operator call runs with: every operator's last
argument, ``settings``, one packed integer (csrc/binding/call_settings.h):
torch's settings that the CUDA library follows (TF32, deterministic
algorithms), how many layers share the device (lltm._sharing), and what
lltm.overrides forces. The stable C ABI reads none of torch's settings and
the libraries keep no copy: they are read with each call.

- Eager and captured calls read them when made.
- torch.compile's graphs hold the values of their trace (:func:`traced`);
  torch guards on TF32, deterministic mode and lltm.overrides' state.
- An exported program holds :data:`NOT_GIVEN`: its products go through
  aten::mm, which reads torch's settings when it runs.
- A public operator called without the argument gets the settings in force
  from its autograd kernel (lltm._ops); without one (inference_mode) NOT_GIVEN.
"""
from __future__ import annotations

import sys

import torch

from . import _sharing, overrides

NOT_GIVEN = -1
TF32 = 1           # float32 products may run on TF32 tensor cores
DETERMINISTIC = 2  # torch.use_deterministic_algorithms (warn-only too)
INFERENCE = 4      # a forward no backward reads: the CPU library keeps nothing
CONCURRENT_SHIFT = 8  # the field of the layers running at once


_fp32_precision = getattr(torch._C, "_get_fp32_precision_getter", None)  # (bound once)


def float32_tf32() -> bool:
    """Whether torch lets float32 matrix products run on TF32
    (torch.backends.cuda.matmul.fp32_precision, read the cheap way)."""
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
    """TF32 | DETERMINISTIC as torch's settings are now (a constant to
    torch.compile, whose graphs are guarded on both)."""
    return (TF32 if float32_tf32() else 0) | (DETERMINISTIC if _deterministic() else 0)


_threads = _sharing._local  # (read directly: current() runs at every eager call)


def current(concurrent: int | None = None) -> int:
    """The settings of a call made now, planned for ``concurrent`` layers at
    once on the device (default: this thread's, lltm._sharing)."""
    layers = _threads.layers if concurrent is None else concurrent
    return torch_flags() | overrides._packed | (layers << CONCURRENT_SHIFT)


@torch.compiler.assume_constant_result
def exporting() -> bool:
    """torch.compiler.is_exporting(), also where torch.compile traces the
    caller (torch 2.11's torch.compile takes the call for True)."""
    return torch.compiler.is_exporting()


@torch.compiler.assume_constant_result
def onnx_exporting() -> bool:
    """torch.onnx.is_in_onnx_export(), its capture by torch.export included
    (called, not traced: dynamo takes it for False)."""
    onnx = sys.modules.get("torch.onnx")
    return onnx is not None and onnx.is_in_onnx_export()


def traced() -> int:
    """The settings a graph traced now holds: :func:`current` for one layer
    at a time (one stream), NOT_GIVEN in an exported program."""
    return NOT_GIVEN if exporting() else current(1)
