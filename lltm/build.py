"""Building the native libraries: the one build description of the project.

``pip install .`` (through setup.py), the just-in-time route ``lltm.build.load()``
and ``python -m lltm.build`` all call :func:`build_libraries`. It compiles the C
core and the C binding into ``liblltm.so`` (CPU, links only libtorch_cpu), and,
where torch has CUDA and ``nvcc`` is found, the CUDA kernels and their C binding
into ``liblltm_cuda.so``. Objects are rebuilt only when a source or header is
newer, so a second build takes milliseconds.

This module must import without the package's native library (setup.py loads it
by path before anything is built).
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
CSRC = REPO_ROOT / "csrc"

CPU_LIBRARY = "liblltm.so"
CUDA_LIBRARY = "liblltm_cuda.so"

CPU_SOURCES = [
    "core/lltm_cpu.c",
    "binding/tensor_args.c",
    "binding/cell_cpu.c",
    "core/lltm_sequence_cpu.c",
    "binding/sequence_args.c",
    "binding/sequence_cpu.c",
    "binding/register_cpu.c",
]
# The CUDA library: kernels (.cu, C launchers) plus its own C binding.
CUDA_SOURCES = [
    "core/lltm_cpu.c",  # lltm_status_string, lltm_dtype_size
    "binding/tensor_args.c",
    "binding/sequence_args.c",
]
CUDA_ONLY_SOURCES = [
    "core/lltm_cuda_cell_forward.cu",
    "core/lltm_cuda_cell_backward.cu",
    "core/lltm_cuda_cell_pointwise.cu",
    "binding/cell_cuda.c",
    "core/lltm_cuda_sequence.cu",
    "core/lltm_cuda_sequence_plan.cu",
    "core/lltm_cuda_sequence_steps.cu",
    "core/lltm_cuda_seq_grid_f32.cu",
    "core/lltm_cuda_seq_grid_f64.cu",
    "core/lltm_cuda_seq_grid_f16.cu",
    "core/lltm_cuda_seq_grid_bf16.cu",
    "core/lltm_cuda_seq_cfwd_f32.cu",
    "core/lltm_cuda_seq_cfwd_f64.cu",
    "core/lltm_cuda_seq_cfwd_f16.cu",
    "core/lltm_cuda_seq_cfwd_bf16.cu",
    "core/lltm_cuda_seq_cbwd_f32.cu",
    "core/lltm_cuda_seq_cbwd_f64.cu",
    "core/lltm_cuda_seq_cbwd_f16.cu",
    "core/lltm_cuda_seq_cbwd_bf16.cu",
    "core/lltm_cuda_util.cu",
    "binding/sequence_cuda.c",
    "binding/register_cuda.c",
]

# -fno-trapping-math / -fno-math-errno let the pointwise loops vectorise
# (branch-free selects, no errno side effects); IEEE results are unchanged.
C_FLAGS = ["-std=c11", "-O3", "-fPIC", "-fexceptions", "-fvisibility=hidden",
           "-fno-trapping-math", "-fno-math-errno", "-Wall", "-Wextra"]
# Hopper is the target; other architectures by LLTM_CUDA_ARCHS="80;90".
DEFAULT_CUDA_ARCHS = "90"


class BuildError(RuntimeError):
    """The native library could not be built."""


def _torch_paths():
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - torch is a hard requirement
        raise BuildError("building lltm needs torch installed first "
                         "(pip install torch==2.13.0)") from exc
    root = Path(torch.__file__).resolve().parent
    return root / "include", root / "lib", torch


def find_nvcc() -> str | None:
    """nvcc from $CUDA_HOME, $CUDA_PATH, PATH or /usr/local/cuda."""
    for env in ("CUDA_HOME", "CUDA_PATH"):
        home = os.environ.get(env)
        if home and (Path(home) / "bin" / "nvcc").exists():
            return str(Path(home) / "bin" / "nvcc")
    found = shutil.which("nvcc")
    if found:
        return found
    default = Path("/usr/local/cuda/bin/nvcc")
    return str(default) if default.exists() else None


def _headers_mtime() -> float:
    """Newest header (C or CUDA): any header change rebuilds every object."""
    return max(p.stat().st_mtime for pattern in ("*.h", "*.cuh") for p in CSRC.rglob(pattern))


def _stale(target: Path, inputs: list[Path], extra_mtime: float = 0.0) -> bool:
    if not target.exists():
        return True
    newest = max([p.stat().st_mtime for p in inputs] + [extra_mtime])
    return newest > target.stat().st_mtime


def _run(cmd: list[str], verbose: bool) -> None:
    if verbose:
        print(" ".join(cmd), flush=True)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.stdout and (verbose or proc.returncode != 0):
        print(proc.stdout, end="", file=sys.stderr)
    if proc.returncode != 0:
        raise BuildError(f"command failed ({proc.returncode}): {' '.join(cmd)}")


def _cc() -> str:
    return os.environ.get("CC") or sysconfig.get_config_var("CC").split()[0] or "cc"


def _atomic_output(target: Path) -> Path:
    """A private temporary name beside ``target``: each output is written there
    and renamed into place, so concurrent builds (two test processes, say)
    never see or link a half-written file."""
    return target.with_name(f".{target.name}.{os.getpid()}.tmp")


def _run_to(cmd_without_output: list[str], target: Path, verbose: bool) -> None:
    tmp = _atomic_output(target)
    try:
        _run([*cmd_without_output, "-o", str(tmp)], verbose)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def _compile_c(src: Path, obj: Path, extra: list[str], verbose: bool) -> None:
    flags = C_FLAGS + (["-Werror"] if os.environ.get("LLTM_WERROR") else []) + extra
    _run_to([_cc(), *flags, "-c", str(src)], obj, verbose)


def _nvcc_flags() -> list[str]:
    archs = os.environ.get("LLTM_CUDA_ARCHS", DEFAULT_CUDA_ARCHS).replace(",", ";").split(";")
    gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs if a]
    return ["-O3", "-std=c++17", "-Xcompiler", "-fPIC,-fvisibility=hidden",
            "--expt-relaxed-constexpr", *gencode]


def cuda_object_fingerprint(nvcc: str, src: Path) -> str:
    """What a CUDA object depends on: nvcc's version, the flags, the source
    and every header of csrc/ (names and bytes)."""
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    digest = hashlib.sha256(version.strip().splitlines()[-1].encode() if version else b"")
    digest.update(repr(_nvcc_flags()).encode())
    headers = sorted(p for pattern in ("*.h", "*.cuh") for p in CSRC.rglob(pattern))
    for path in [src, *headers]:
        digest.update(str(path.relative_to(CSRC)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _prebuilt_cuda_object(nvcc: str, src: Path) -> Path | None:
    """An object of src compiled elsewhere (scripts/prebuild_cuda.py), from
    $LLTM_PREBUILT_CUDA, when its recorded fingerprint matches this build's:
    the GPU machine then links objects compiled beforehand on a machine
    without a GPU instead of spending minutes of its time in nvcc."""
    folder = os.environ.get("LLTM_PREBUILT_CUDA")
    if not folder:
        return None
    obj = Path(folder) / (src.name + ".o")
    record = obj.with_name(obj.name + ".sha256")
    if obj.exists() and record.exists() and \
            record.read_text().strip() == cuda_object_fingerprint(nvcc, src):
        return obj
    return None


def _compile_cu(nvcc: str, src: Path, obj: Path, verbose: bool) -> None:
    prebuilt = _prebuilt_cuda_object(nvcc, src)
    if prebuilt is not None:
        if verbose:
            print(f"lltm: {src.name}: the prebuilt object {prebuilt}", flush=True)
        tmp = _atomic_output(obj)
        shutil.copyfile(prebuilt, tmp)
        os.replace(tmp, obj)
        return
    _run_to([nvcc, *_nvcc_flags(), "-c", str(src)], obj, verbose)


def _objects(sources: list[str], obj_dir: Path, tag: str, nvcc: str | None,
             extra_c: list[str], verbose: bool) -> tuple[list[Path], bool]:
    objs, rebuilt = [], False
    headers = _headers_mtime()
    # Objects are named after the compiler and flags too, so changing either
    # rebuilds them (mtimes alone would keep objects built with old flags).
    recipe = repr((_cc(), nvcc, C_FLAGS, extra_c, os.environ.get("LLTM_WERROR"),
                   os.environ.get("LLTM_CUDA_ARCHS", DEFAULT_CUDA_ARCHS)))
    tag = f"{tag}-{hashlib.sha1(recipe.encode()).hexdigest()[:10]}"
    for rel in sources:
        src = CSRC / rel
        obj = obj_dir / (rel.replace("/", "_") + f".{tag}.o")
        if _stale(obj, [src], headers):
            if src.suffix == ".cu":
                _compile_cu(nvcc, src, obj, verbose)
            else:
                _compile_c(src, obj, extra_c, verbose)
            rebuilt = True
        objs.append(obj)
    return objs, rebuilt


def cuda_wanted(torch_module) -> bool:
    """Build the CUDA library? LLTM_BUILD_CUDA=0/1 overrides the default, which
    is: torch has CUDA and nvcc is found."""
    flag = os.environ.get("LLTM_BUILD_CUDA")
    if flag is not None:
        return flag not in ("0", "", "false", "no")
    return torch_module.version.cuda is not None and find_nvcc() is not None


def _link_record(lib: Path) -> Path:
    return lib.with_name(lib.name + ".objects")


def _needs_link(lib: Path, objs: list[Path], rebuilt: bool) -> bool:
    """Relink when an object changed, or when the library was linked from
    other objects (other flags) than the ones wanted now."""
    record = _link_record(lib)
    wanted = "\n".join(map(str, objs))
    return (rebuilt or not lib.exists() or not record.exists()
            or record.read_text() != wanted or _stale(lib, objs))


def _record_link(lib: Path, objs: list[Path]) -> None:
    _link_record(lib).write_text("\n".join(map(str, objs)))


def build_libraries(out_dir: str | os.PathLike, verbose: bool = False,
                    cuda: bool | None = None,
                    obj_dir: str | os.PathLike | None = None) -> dict[str, Path]:
    """Build (incrementally) the native libraries into ``out_dir``, objects into
    ``obj_dir`` (default: ``out_dir/obj``, or ``build/obj`` of the checkout when
    building into the package folder).

    Returns {"cpu": path, "cuda": path (only when built)}."""
    if not CSRC.is_dir():
        raise BuildError(f"the C sources are not at {CSRC}: build from a source checkout")
    _, torch_lib, torch = _torch_paths()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if obj_dir is None:
        in_package = out.resolve() == Path(__file__).resolve().parent
        obj_dir = REPO_ROOT / "build" / "obj" if in_package else out / "obj"
    obj_dir = Path(obj_dir)
    obj_dir.mkdir(parents=True, exist_ok=True)
    link_torch = [f"-L{torch_lib}", "-ltorch_cpu", "-lc10", f"-Wl,-rpath,{torch_lib}", "-lm"]
    built: dict[str, Path] = {}

    start = time.perf_counter()
    objs, rebuilt = _objects(CPU_SOURCES, obj_dir, "cpu", None, [], verbose)
    lib = out / CPU_LIBRARY
    if _needs_link(lib, objs, rebuilt):
        _run_to([_cc(), "-shared", *map(str, objs), *link_torch], lib, verbose)
        _record_link(lib, objs)
    built["cpu"] = lib

    if cuda is None:
        cuda = cuda_wanted(torch)
    if cuda and CUDA_ONLY_SOURCES:
        nvcc = find_nvcc()
        if nvcc is None:
            raise BuildError("LLTM_BUILD_CUDA asks for the CUDA library but nvcc was not "
                             "found: set CUDA_HOME or put nvcc on PATH")
        objs, rebuilt = _objects(CUDA_SOURCES + CUDA_ONLY_SOURCES, obj_dir, "cuda", nvcc,
                                 ["-DLLTM_WITH_CUDA"], verbose)
        lib = out / CUDA_LIBRARY
        if _needs_link(lib, objs, rebuilt):
            # The CUDA runtime is linked statically (nvcc's libcudart_static):
            # nothing to find at load time beside torch's own libraries, and
            # kernels still run in the context torch made current (the runtime
            # adopts the current driver context) on torch's streams.
            _run_to([nvcc, "-shared", "-cudart", "static", "-Xcompiler", "-fPIC",
                     *map(str, objs), f"-L{torch_lib}", "-ltorch_cuda", "-ltorch_cpu",
                     "-lc10", "-Xlinker", f"-rpath,{torch_lib}", "-lm"], lib, verbose)
            _record_link(lib, objs)
        built["cuda"] = lib
    if verbose:
        print(f"lltm: native libraries up to date in {out} "
              f"({time.perf_counter() - start:.2f} s)", flush=True)
    return built


def default_cache_dir() -> Path:
    """Where the just-in-time build goes: $LLTM_BUILD_DIR, else a per-torch
    folder under ~/.cache/lltm."""
    env = os.environ.get("LLTM_BUILD_DIR")
    if env:
        return Path(env)
    _, _, torch = _torch_paths()
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "lltm" / f"torch-{torch.__version__}"


def load(verbose: bool = False, build_dir: str | os.PathLike | None = None):
    """Just-in-time route, like torch.utils.cpp_extension.load: compile the
    sources into a cache directory on first use (incrementally afterwards) and
    load the result. Returns the package's native-library handle."""
    from . import _native

    paths = build_libraries(build_dir or default_cache_dir(), verbose=verbose)
    return _native.load_from(paths)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build lltm's native libraries.")
    parser.add_argument("--out", default=None, help="output directory "
                        "(default: the just-in-time cache, or lltm/ with --inplace)")
    parser.add_argument("--inplace", action="store_true",
                        help="build into the package folder, where `import lltm` looks first")
    parser.add_argument("--cuda", choices=("auto", "yes", "no"), default="auto")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    out = args.out or (Path(__file__).parent if args.inplace else default_cache_dir())
    cuda = None if args.cuda == "auto" else args.cuda == "yes"
    start = time.perf_counter()
    paths = build_libraries(out, verbose=args.verbose, cuda=cuda)
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    print(f"built in {time.perf_counter() - start:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
