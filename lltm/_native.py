"""Finding, building if needed, and loading the native libraries.

Order: the library installed beside this file (``pip install .``; in a source
checkout it is rebuilt in place when a source is newer), else the just-in-time
build into a cache directory (``lltm.build.load``), else a clear error.
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from . import build

PACKAGE_DIR = Path(__file__).resolve().parent

_loaded: dict[str, ctypes.CDLL] = {}


class NativeLibraryError(ImportError):
    """The native library is missing or could not be loaded."""


def _register(lib: ctypes.CDLL, symbol: str) -> None:
    fn = getattr(lib, symbol)
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    err = ctypes.create_string_buffer(512)
    if fn(err, len(err)) != 0:
        raise NativeLibraryError(f"lltm: {symbol} failed: {err.value.decode()}")


def load_from(paths: dict[str, Path]) -> ctypes.CDLL:
    """Load the libraries in ``paths`` ({"cpu": ..., "cuda": ...}) and register
    their operators. Loading twice is harmless."""
    if "cpu" not in _loaded:
        _loaded["cpu"] = ctypes.CDLL(str(paths["cpu"]))
        _register(_loaded["cpu"], "lltm_register")
    cuda_path = paths.get("cuda")
    if cuda_path is not None and "cuda" not in _loaded and torch.version.cuda is not None:
        _loaded["cuda"] = ctypes.CDLL(str(cuda_path))
        _register(_loaded["cuda"], "lltm_cuda_register")
    return _loaded["cpu"]


def _installed_paths(directory: Path) -> dict[str, Path]:
    paths = {"cpu": directory / build.CPU_LIBRARY}
    if (directory / build.CUDA_LIBRARY).exists():
        paths["cuda"] = directory / build.CUDA_LIBRARY
    return paths


def _in_source_checkout() -> bool:
    return build.CSRC.is_dir() and PACKAGE_DIR.parent == build.REPO_ROOT


def ensure_loaded() -> ctypes.CDLL:
    if "cpu" in _loaded:
        return _loaded["cpu"]
    installed = PACKAGE_DIR / build.CPU_LIBRARY
    try:
        if installed.exists():
            if _in_source_checkout():  # editable install: keep it current
                build.build_libraries(PACKAGE_DIR)
            return load_from(_installed_paths(PACKAGE_DIR))
        if _in_source_checkout():
            return build.load()
    except build.BuildError as exc:
        raise NativeLibraryError(
            f"lltm: building the native library failed: {exc}. A C compiler (cc) and "
            "torch's headers are needed; see README.md.") from exc
    except OSError as exc:
        raise NativeLibraryError(f"lltm: could not load the native library: {exc}") from exc
    raise NativeLibraryError(
        f"lltm: the native library {installed} is missing and no C sources are beside "
        "the package to build it. Reinstall with `pip install --no-build-isolation .` "
        "from a source checkout, or run `python -m lltm.build --inplace` there.")


def has_cuda_kernels() -> bool:
    return "cuda" in _loaded
