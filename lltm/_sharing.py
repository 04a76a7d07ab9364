"""Layers that run at once on one CUDA device: the two directions of a
bidirectional layer, each on its own stream. Inside :func:`sharing_device`
the calling thread's CUDA sequence calls plan for that many layers at once
(lltm_sequence_plan_options.concurrent in csrc/core/lltm.h: launches that
are resident together, so neither direction waits for the other to end);
outside, a layer plans for the whole device. The count travels with each
call, in its settings argument (lltm/_settings.py)."""
from __future__ import annotations

import contextlib
import threading


class _Layers(threading.local):
    layers = 1  # (a class attribute: read on every call, a miss would cost microseconds)


_local = _Layers()


def concurrent_layers() -> int:
    """The layers this thread's sequence calls share the device with (1: none)."""
    return _local.layers


@contextlib.contextmanager
def sharing_device(layers: int):
    """This thread's CUDA sequence calls inside plan for ``layers`` (1 or 2)
    layers running at once on the device."""
    if layers not in (1, 2):
        raise ValueError(f"concurrent layers must be 1 or 2, got {layers!r}")
    before = concurrent_layers()
    _local.layers = layers
    try:
        yield
    finally:
        _local.layers = before
