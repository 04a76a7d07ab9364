"""Finding, building if needed, and loading the native libraries: those
beside this file (a wheel, ``pip install .``; in a source checkout rebuilt in
place when their build key is stale), else the just-in-time build
(``lltm.build.load``), else a clear error. Right after loading a library,
``lltm_resolve_torch`` finds the stable-ABI functions it calls in the torch
libraries already loaded (import torch first); a torch lacking one gives a
NativeLibraryError naming it.
"""
from __future__ import annotations

import ctypes
import functools
import os
import warnings
from pathlib import Path
from typing import NamedTuple

import torch

from . import _archs, build

PACKAGE_DIR = Path(__file__).resolve().parent

_loaded: dict[str, ctypes.CDLL] = {}
_loaded_from: dict[str, Path] = {}


class NativeLibraryError(ImportError):
    """The native library is missing or could not be loaded."""


def _call_entry(lib: ctypes.CDLL, symbol: str) -> str | None:
    """Calls ``int symbol(char *err, size_t err_len)``; None, or its message."""
    fn = getattr(lib, symbol)
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    err = ctypes.create_string_buffer(512)
    if fn(err, len(err)) != 0:
        return err.value.decode(errors="replace") or "(no message)"
    return None


def _resolve_torch(lib: ctypes.CDLL, path: Path) -> None:
    """Fills the library's pointers to torch's stable C ABI from the torch
    libraries loaded in this process (csrc/binding/torch_abi_loader.c)."""
    problem = _call_entry(lib, "lltm_resolve_torch")
    if problem is not None:
        raise NativeLibraryError(
            f"lltm: {path.name} cannot use the torch imported (torch {torch.__version__}, "
            f"{Path(torch.__file__).parent}): {problem}. lltm calls torch's stable C ABI and "
            f"needs torch >= {build.TORCH_MIN_VERSION} (pip install "
            f"'torch>={build.TORCH_MIN_VERSION}').")


def _register(lib: ctypes.CDLL, symbol: str) -> None:
    problem = _call_entry(lib, symbol)
    if problem is not None:
        raise NativeLibraryError(f"lltm: {symbol} failed: {problem}")


def _register_cuda_kernels(lib: ctypes.CDLL, archs: list[str] | None) -> None:
    """Registers the CUDA kernels once CUDA is initialised, if the library has
    code for a visible GPU (else each operator on a CUDA tensor raises the
    error naming the GPU and how to rebuild); GPUs it lacks code for warn."""
    def register():
        problems = {}
        if archs is not None:
            for i in range(torch.cuda.device_count()):
                msg = _archs.unsupported_gpu_message(i, torch.cuda.get_device_name(i),
                                              torch.cuda.get_device_capability(i), archs)
                if msg:
                    problems[i] = msg
        if problems and len(problems) == torch.cuda.device_count():
            _register_refusing_cuda_kernels(next(iter(problems.values())))
            return
        _register(lib, "lltm_cuda_register")
        for msg in problems.values():
            warnings.warn(msg, RuntimeWarning, stacklevel=2)

    torch.cuda._lazy_call(register)


_refusing_library = None


def _register_refusing_cuda_kernels(message: str) -> None:
    global _refusing_library

    def refuse(*args, **kwargs):
        raise RuntimeError(message)

    _refusing_library = torch.library.Library("lltm", "IMPL")  # noqa: TOR901
    for name in operator_names():
        _refusing_library.impl(name, refuse, "CUDA")


class Operator(NamedTuple):
    """An operator's table (csrc/binding/ops.c): its tensor arguments' and
    results' (name, shape) in lltm.h's notation ("[T, B, 3H]", "[3H] (or
    [1, 3H])"), the arguments that give the sizes (``input``: T, B, I;
    ``state``: H, L), whether it is a backward (an output_mask after the
    tensors), whether it has a lengths overload, and the results only a
    backward reads (``kept``: bits; not made on the CPU in inference,
    lltm/_settings.INFERENCE)."""
    name: str
    args: tuple
    results: tuple
    input: int
    state: int
    backward: bool
    lengths: bool
    kept: int


class _OpTable(ctypes.Structure):  # lltm_op (csrc/binding/tensor_args.h)
    _fields_ = [("name", ctypes.c_char_p), ("n_args", ctypes.c_int),
                ("n_results", ctypes.c_int), ("input", ctypes.c_int), ("state", ctypes.c_int),
                ("backward", ctypes.c_bool), ("lengths", ctypes.c_bool),
                ("always", ctypes.c_uint), ("kept", ctypes.c_uint),
                ("args", (ctypes.c_char_p * 2) * 12),
                ("results", (ctypes.c_char_p * 2) * 6), ("parsed", ctypes.c_void_p)]


@functools.lru_cache(maxsize=None)
def operators() -> tuple[Operator, ...]:
    """Every operator's table, from the CPU library."""
    table = ensure_loaded().lltm_operator
    table.restype, table.argtypes = ctypes.POINTER(_OpTable), [ctypes.c_int]

    def pairs(entries, n):
        return tuple((name.decode(), shape.decode()) for name, shape in entries[:n])
    found = []
    while op := table(len(found)):
        op = op.contents
        found.append(Operator(op.name.decode(), pairs(op.args, op.n_args),
                              pairs(op.results, op.n_results), op.input, op.state,
                              op.backward, op.lengths, op.kept))
    return tuple(found)


@functools.lru_cache(maxsize=None)
def size_symbols() -> dict[str, str]:
    """{symbol: what it is} of the tables' shapes, for messages (``%s``: the
    name of the argument that gives H and L)."""
    symbol = ensure_loaded().lltm_size_symbol
    symbol.restype = ctypes.c_char_p
    symbol.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    found, what = {}, ctypes.c_char_p()
    while (name := symbol(len(found), ctypes.byref(what))) is not None:
        found[name.decode()] = what.value.decode()
    return found


def operator_names() -> list[str]:
    """Every lltm operator with its overload ("stack_forward.lengths"): the
    public ones and their autograd-free twins (lltm/_ops.py)."""
    return [prefix + op.name.split("::")[1] + overload for op in operators()
            for prefix in ("", "_") for overload in ("", ".lengths")[:1 + op.lengths]]


def load_from(paths: dict[str, Path]) -> ctypes.CDLL:
    """Load the libraries in ``paths`` ({"cpu": ..., "cuda": ...}) and register
    their operators. Loading twice is harmless."""
    if "cpu" not in _loaded:
        lib = ctypes.CDLL(str(paths["cpu"]))
        _resolve_torch(lib, Path(paths["cpu"]))
        _register(lib, "lltm_register")
        _loaded["cpu"], _loaded_from["cpu"] = lib, Path(paths["cpu"])
    cuda_path = paths.get("cuda")
    if cuda_path is not None and "cuda" not in _loaded and torch.version.cuda is not None:
        lib = ctypes.CDLL(str(cuda_path))
        _resolve_torch(lib, Path(cuda_path))
        _loaded["cuda"], _loaded_from["cuda"] = lib, Path(cuda_path)
        info = build.read_build_info(Path(cuda_path).parent) or {}
        _register_cuda_kernels(_loaded["cuda"], info.get("cuda_archs"))
    return _loaded["cpu"]


def _built_with_cuda() -> bool | None:
    """The package folder's libraries keep their CPU / CUDA choice when rebuilt
    (LLTM_BUILD_CUDA overrides; None: the build's default)."""
    info = build.read_build_info(PACKAGE_DIR)
    if info is None or "LLTM_BUILD_CUDA" in os.environ:
        return None
    return "cuda" in info.get("libraries", {})


def ensure_loaded() -> ctypes.CDLL:
    if "cpu" in _loaded:
        return _loaded["cpu"]
    installed = PACKAGE_DIR / build.CPU_LIBRARY
    try:
        if build.CSRC.is_dir() and PACKAGE_DIR.parent == build.REPO_ROOT:  # a source checkout
            if installed.exists():  # editable install or --inplace: keep it current
                return load_from(build.build_libraries(PACKAGE_DIR, cuda=_built_with_cuda()))
            return build.load()
        if installed.exists():
            cuda = PACKAGE_DIR / build.CUDA_LIBRARY
            return load_from({"cpu": installed, **({"cuda": cuda} if cuda.exists() else {})})
    except build.BuildError as exc:
        raise NativeLibraryError(
            f"lltm: building the native library failed: {exc}. A C compiler (cc) is "
            "needed (nvcc for the CUDA library); see README.md.") from exc
    except OSError as exc:
        raise NativeLibraryError(f"lltm: could not load the native library: {exc}") from exc
    raise NativeLibraryError(
        f"lltm: the native library {installed} is missing and no C sources are beside "
        "the package to build it. Reinstall lltm (pip install lltm-*.whl, or "
        "`pip install .` from a source checkout).")


CPU_ISAS = ("baseline", "avx2", "avx512")  # lltm.h's LLTM_ISA_* 1, 2, 3


def cpu_isa(force: str | None = None) -> str:
    """The instruction set of the CPU kernels' float32 products; ``force``
    (one of CPU_ISAS, or "auto": the best this CPU has) sets it first, for
    tests and measurements."""
    hook = ensure_loaded().lltm_cpu_isa_hook
    hook.restype, hook.argtypes = ctypes.c_int, [ctypes.c_int]
    code = -1 if force is None else 0 if force == "auto" else \
        CPU_ISAS.index(force) + 1 if force in CPU_ISAS else None
    if code is None:
        raise ValueError(f"cpu_isa: {force!r} is none of auto, {', '.join(CPU_ISAS)}")
    got = hook(code)
    if got < 1:
        raise ValueError(f"cpu_isa: this CPU cannot run {force!r}")
    return CPU_ISAS[got - 1]


def has_cuda_kernels() -> bool:
    return "cuda" in _loaded


def cuda_index(device: torch.device) -> int:
    """A CUDA device's index: the current device's where ``device`` names none."""
    return device.index if device.index is not None else torch.cuda.current_device()


def stream_capturing(index: int) -> bool:
    """Whether the current stream of CUDA device ``index`` is being captured."""
    if index == torch.cuda.current_device():
        return torch.cuda.is_current_stream_capturing()
    with torch.cuda.device(index):
        return torch.cuda.is_current_stream_capturing()


def build_info() -> dict:
    """How the loaded native libraries were built (torch versions, CPU / CUDA,
    GPU architectures, compilers, flags, build key) and where they came from."""
    ensure_loaded()
    info = dict(build.read_build_info(_loaded_from["cpu"].parent) or {})
    info["cpu"] = True
    info["cuda"] = "cuda" in _loaded
    info["loaded_from"] = {k: str(p) for k, p in _loaded_from.items()}
    info.setdefault("cuda_archs", [])
    return info
