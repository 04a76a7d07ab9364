"""lltm's operators in torch.onnx.export (dynamo=True): their translations
(lltm/_onnx_translations.py) join the registry torch's exporter builds its
own from (torch's private route, ``onnx_impl``), so an export needs no
``custom_translation_table``. That registry imports onnxscript, slow and
optional, which importing lltm must not load: :func:`install` watches for
the registry's import (a finder on ``sys.meta_path``, removed once it served)
and registers right after it. Where a torch release moves those modules,
export names the operator it finds no translation for; registering warns.
"""
from __future__ import annotations

import importlib.abc
import sys
import warnings

# the registry and its entries' module import each other: both must have run
REGISTRY_MODULE = "torch.onnx._internal.exporter._torchlib._torchlib_registry"
ENTRY_MODULE = "torch.onnx._internal.exporter._registration"
_WATCHED = {REGISTRY_MODULE: "onnx_impl", ENTRY_MODULE: "OnnxDecompMeta"}

_registered = False


def _ready() -> bool:
    return all(hasattr(sys.modules.get(name), attribute) for name, attribute in _WATCHED.items())


def register() -> None:
    """Adds the translations to the registry once both modules ran."""
    global _registered
    if _registered or not _ready():
        return
    _registered = True
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Finder)]
    try:
        from torch.onnx._internal.exporter._torchlib._torchlib_registry import onnx_impl

        from . import _onnx_translations
        for target, function in _onnx_translations.translations().items():
            onnx_impl(target, trace_only=True)(function)
    except Exception as e:  # torch's exporter moved: export then names the missing operator
        warnings.warn(f"lltm: its ONNX translations could not be registered with "
                      f"torch.onnx's exporter ({type(e).__name__}: {e}); torch.onnx.export "
                      "of lltm's operators will fail", RuntimeWarning, stacklevel=2)


class _Loader(importlib.abc.Loader):
    """A watched module's own loader, registering after the module ran."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        register()

    def __getattr__(self, name):  # get_source, get_code, ... as the original
        return getattr(self._loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in _WATCHED:
            return None
        for finder in sys.meta_path:  # the spec the others give, its loader wrapped
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _Loader(spec.loader)
                return spec
        return None


def install() -> None:
    """Registers the translations when torch's exporter registry is imported
    (now, if it was)."""
    if _ready():
        register()
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
