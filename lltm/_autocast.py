"""torch.autocast for the LLTM operators, as PyTorch treats linear and
lstm_cell: the forward operators run in the context's dtype, inputs cast by
differentiable ``Tensor.to`` (gradients reach float32 parameters in
float32); float64 tensors and other devices' are left alone. Kernels at the
AutocastCPU / AutocastCUDA keys serve direct operator calls, torch.compile
and export; :func:`eager_call` casts before lltm.functional's eager
autograd.Function, so that autograd records the casts.
"""
from __future__ import annotations

import torch

_DEVICE_KEYS = {"cpu": "AutocastCPU", "cuda": "AutocastCUDA"}
_AUTOCAST_KEYS = (torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)
                  | torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCUDA))
FORWARD_OPS = ("cell_forward", "sequence_forward", "sequence_forward.lengths",
               "stack_forward", "stack_forward.lengths")


def cast(args, device_type: str):
    """``args`` with every floating tensor on ``device_type`` other than
    float64 cast to the autocast dtype of ``device_type``."""
    dtype = torch.get_autocast_dtype(device_type)
    return tuple(
        a.to(dtype) if (isinstance(a, torch.Tensor) and a.device.type == device_type
                        and a.is_floating_point() and a.dtype not in (dtype, torch.float64))
        else a
        for a in args)


def _kernel(op, device_type: str):
    def autocast_kernel(*args):
        with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_KEYS):
            return op(*cast(args, device_type))
    autocast_kernel.__name__ = f"{op.__name__}_autocast_{device_type}"
    return autocast_kernel


_library = torch.library.Library("lltm", "IMPL")  # alive as long as the module
for _name in FORWARD_OPS:
    _packet, _, _overload = _name.partition(".")
    _op = getattr(getattr(torch.ops.lltm, _packet), _overload or "default")
    for _device_type, _key in _DEVICE_KEYS.items():
        _library.impl(_name, _kernel(_op, _device_type), _key)


def eager_call(call, args):
    """``call(args)`` with ``args`` cast for every autocast context on, the
    Autocast keys skipped below (the casts are done, recorded by autograd)."""
    for device_type in _DEVICE_KEYS:
        if torch.is_autocast_enabled(device_type):
            args = cast(args, device_type)
    with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_KEYS):
        return call(args)
