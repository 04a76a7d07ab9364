"""Layers that run at once on one CUDA device: the two directions of a
bidirectional layer, each on its own stream. Inside :func:`sharing_device`
the calling thread's CUDA sequence calls plan for that many layers at once
(lltm_sequence_plan_options.concurrent in csrc/core/lltm.h: launches that
are resident together, so neither direction waits for the other to end);
outside, a layer plans for the whole device."""
from __future__ import annotations

import contextlib
import threading

from . import _native

_local = threading.local()


def concurrent_layers() -> int:
    """The layers this thread's sequence calls share the device with (1: none)."""
    return getattr(_local, "layers", 1)


def _set(layers: int) -> None:
    if layers not in (1, 2):
        raise ValueError(f"concurrent layers must be 1 or 2, got {layers!r}")
    lib = _native._loaded.get("cuda")
    if lib is not None and lib.lltm_cuda_set_concurrent_layers(layers) != 0:
        raise RuntimeError(f"lltm_cuda_set_concurrent_layers({layers}) failed")


@contextlib.contextmanager
def sharing_device(layers: int):
    """This thread's CUDA sequence calls inside plan for ``layers`` (1 or 2)
    layers running at once on the device."""
    before = concurrent_layers()
    _set(layers)
    _local.layers = layers
    try:
        yield
    finally:
        _set(before)
        _local.layers = before
