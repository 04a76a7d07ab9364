"""Layers that run at once on one CUDA device (a bidirectional layer's
directions, each on its own stream): inside :func:`sharing_device` the
thread's CUDA sequence calls plan for that many at once, launches resident
together (lltm_sequence_plan_options.concurrent, csrc/core/lltm.h); the count
travels in each call's settings (lltm/_settings.py).
"""
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
    """This thread's CUDA sequence calls inside plan for ``layers`` (1 or 2) at once."""
    if layers not in (1, 2):
        raise ValueError(f"concurrent layers must be 1 or 2, got {layers!r}")
    before = concurrent_layers()
    _local.layers = layers
    try:
        yield
    finally:
        _local.layers = before
