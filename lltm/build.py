"""Building the native libraries: the one build description of the project.

``pip install .`` (setup.py), the just-in-time route ``lltm.build.load()`` and
``python lltm/build.py`` all call :func:`build_libraries`: the C core and its
C binding into ``liblltm.so``, and where wanted (torch has CUDA, or no torch
is importable, and ``nvcc`` is found) the CUDA kernels and their binding into
``liblltm_cuda.so``. No torch file is used: the libraries call torch's stable
C ABI through pointers filled at load time (csrc/binding/torch_abi_loader.c).

Everything is addressed by content: an object's name carries a hash of its
source, the csrc/ headers it includes, the compiler's identity and the flags;
a library's build key hashes its objects' keys and the link. The cache keeps
a folder per build key; a folder built into (the package folder, ``--out``)
records its key in ``lltm_build.json`` and is rebuilt when the key differs.

This module imports without torch and without the package (setup.py loads it
by path, possibly in an isolated build environment).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import functools
import hashlib
import importlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
CSRC = REPO_ROOT / "csrc"
PACKAGE_DIR = Path(__file__).resolve().parent

CPU_LIBRARY = "liblltm.so"
CUDA_LIBRARY = "liblltm_cuda.so"
LIBRARIES = {"cpu": CPU_LIBRARY, "cuda": CUDA_LIBRARY}
BUILD_INFO = "lltm_build.json"  # beside the libraries: build key, archs, flags

CPU_SOURCES = [
    "binding/torch_abi_loader.c",
    "core/lltm_cpu.c",
    "core/lltm_cpu_gemm.c",
    "core/lltm_cpu_step.c",
    "binding/tensor_args.c",
    "binding/ops.c",
    "binding/call_settings.c",
    "binding/cell_cpu.c",
    "core/lltm_sequence_cpu.c",
    "core/lltm_sequence_cpu_steps.c",
    "binding/layers.c",
    "binding/sequence_cpu.c",
    "binding/register.c",
]
# The CUDA library: kernels (.cu, C launchers) plus its own C binding.
CUDA_SOURCES = [
    "binding/torch_abi_loader.c",  # its own pointers: CPU and CUDA functions
    "core/lltm_cpu.c",  # lltm_status_string, lltm_dtype_size
    "binding/tensor_args.c",
    "binding/ops.c",
    "binding/call_settings.c",
    "binding/layers.c",
]
CUDA_ONLY_SOURCES = [
    "core/lltm_cuda_cell_forward.cu",
    "core/lltm_cuda_cell_backward.cu",
    "core/lltm_cuda_cell_pointwise.cu",
    "binding/cell_cuda.c",
    "binding/cublas_gemm.c",
    "core/lltm_cuda_sequence.cu",
    "core/lltm_cuda_sequence_plan.cu",
    "core/lltm_cuda_sequence_plan_cluster.cu",
    "core/lltm_cuda_rules.c",
    "core/lltm_cuda_sequence_steps.cu",
    *(f"core/lltm_cuda_seq_{family}_{dtype}.cu"  # a unit a kernel family and dtype
      for family in ("grid", "cfwd", "cbwd", "block") for dtype in ("f32", "f64", "f16", "bf16")),
    "core/lltm_cuda_seq_stack.cu",  # stacked layers: no float64 (lltm_stack.h)
    *(f"core/lltm_cuda_seq_stack_{dtype}.cu" for dtype in ("f32", "f16", "bf16")),
    "core/lltm_cuda_util.cu",
    "binding/sequence_cuda.c",
    "binding/register.c",
]

# Our declarations of torch's stable C ABI (part of the libraries' build key).
TORCH_ABI_HEADER = "binding/torch_stable_abi.h"
# The oldest torch the stable-ABI target of torch_stable_abi.h loads on.
TORCH_MIN_VERSION = "2.11"

# -fno-trapping-math / -fno-math-errno let the pointwise loops vectorise
# (branch-free selects, no errno side effects); IEEE results are unchanged.
C_FLAGS = ["-std=c11", "-O3", "-fPIC", "-fexceptions", "-fvisibility=hidden",
           "-fno-trapping-math", "-fno-math-errno", "-Wall", "-Wextra"]
NVCC_FLAGS = ["-std=c++17", "-O3", "-Xcompiler", "-fPIC,-fvisibility=hidden",
              "--expt-relaxed-constexpr", "-Xcompiler", "-Wall,-Wextra"]


class BuildError(RuntimeError):
    """The native library could not be built."""


def _sibling(name: str):
    """A module of this folder, also when this file is loaded by path
    (setup.py, ``python lltm/build.py``) rather than as ``lltm.build``."""
    if __package__:
        return importlib.import_module(f"{__package__}.{name}")
    module_name = f"_lltm_build_{name}"
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_name, PACKAGE_DIR / f"{name}.py")
        sys.modules[module_name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[module_name])
    return sys.modules[module_name]


_archs = _sibling("_archs")


def _torch():
    """torch when importable (it is not in an isolated ``pip install .``)."""
    try:
        import torch
    except ImportError:
        return None
    return torch


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


def _cc() -> str:
    return os.environ.get("CC") or (sysconfig.get_config_var("CC") or "cc").split()[0] or "cc"


def tool_identity(tool: str) -> str:
    """A compiler's version line, remembered per binary (path, size, time)."""
    path = shutil.which(tool) or tool
    try:
        st = os.stat(path)
    except OSError as exc:
        raise BuildError(f"the compiler {tool!r} was not found") from exc
    return _version_line(tool, path, os.path.realpath(path), st.st_size, st.st_mtime_ns)


@functools.cache
def _version_line(tool: str, path: str, real: str, *_stat) -> str:
    proc = subprocess.run([path, "--version"], capture_output=True, text=True)
    lines = [ln.strip() for ln in proc.stdout.splitlines() if ln.strip()]
    if proc.returncode != 0 or not lines:
        raise BuildError(f"`{tool} --version` failed: {proc.stderr.strip()}")
    name = "nvcc" if "nvcc" in Path(path).name else Path(real).name
    return f"{name}: " + (lines[-1] if name == "nvcc" else lines[0])


def _host_cxx() -> str:
    """The host compiler nvcc runs (its default: c++ on PATH)."""
    return os.environ.get("NVCC_CCBIN") or shutil.which("c++") or "g++"


# ---------------------------------------------------------------- GPU architectures

def cuda_archs(nvcc: str | None) -> tuple[list[str], str]:
    """(archs, where they came from): TORCH_CUDA_ARCH_LIST, else the GPUs
    visible now, else the fat default, as PyTorch's extensions do."""
    try:
        env = os.environ.get(_archs.ENVIRONMENT)
        if env:
            return _archs.parse_arch_list(env), _archs.ENVIRONMENT
        torch = _torch()
        if torch is not None and torch.version.cuda is not None and torch.cuda.is_available():
            caps = sorted({torch.cuda.get_device_capability(i)
                           for i in range(torch.cuda.device_count())})
            if caps:
                return [f"{a}.{b}" for a, b in caps], _archs.VISIBLE_GPUS
        if nvcc is None:
            return [], "none (no nvcc)"
        return _archs.fat_default(nvcc), _archs.DEFAULT
    except ValueError as exc:
        raise BuildError(str(exc)) from exc


def _werror() -> bool:
    return bool(os.environ.get("LLTM_WERROR"))


def nvcc_flags(archs: list[str], werror: bool | None = None) -> list[str]:
    """The one nvcc flag list: the build, `make cuda-compile-check` and
    scripts/prebuild_cuda.py all use it (``build.py --print-nvcc-flags``)."""
    werror = _werror() if werror is None else werror
    return [*NVCC_FLAGS, *(["-Werror", "all-warnings", "-Xcompiler", "-Werror"] if werror else []),
            *_archs.gencode_flags(archs)]


def c_flags(werror: bool | None = None) -> list[str]:
    werror = _werror() if werror is None else werror
    return [*C_FLAGS, *(["-Werror"] if werror else [])]


# ---------------------------------------------------------------- content keys

def _digest(*parts) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(repr(part).encode())
        h.update(b"\0")
    return h.hexdigest()


def _file_digest(path: Path) -> str:
    st = path.stat()
    return _bytes_digest(str(path), st.st_size, st.st_mtime_ns, st.st_ino)


@functools.cache
def _bytes_digest(path: str, *_stat) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


_INCLUDE = re.compile(r'^\s*#\s*include\s*(\S)([^">]*)', re.M)


def _local_headers(src: Path) -> list[Path] | None:
    """The csrc/ headers ``src`` includes with quotes, transitively, whatever
    #if surrounds them; None where an include is a macro (every header counts)."""
    found, todo = set(), [src]
    while todo:
        path = todo.pop()
        for match in _INCLUDE.finditer(path.read_text(errors="replace")):
            quote, name = match.groups()
            if quote == "<":
                continue
            if quote != '"':
                return None
            header = (path.parent / name).resolve()
            if header.is_file() and CSRC.resolve() in header.parents and header not in found:
                found.add(header)
                todo.append(header)
    return sorted(found)


def _source_digest(rel: str) -> str:
    """Names and bytes of the source and of the headers of csrc/ it includes."""
    headers = _local_headers(CSRC / rel)
    if headers is None:
        headers = sorted(p for pattern in ("*.h", "*.cuh") for p in CSRC.rglob(pattern))
    root = CSRC.resolve()
    return _digest(*[(str(p.resolve().relative_to(root)), _file_digest(p))
                     for p in (CSRC / rel, *headers)])


def object_key(rel: str, kind: str, archs: list[str], nvcc: str | None) -> str:
    """A hash of the source with its headers, the compilers' versions (nvcc's
    host compiler too) and the flags but -Werror (which changes no code)."""
    if rel.endswith(".cu"):
        tools = (tool_identity(nvcc), tool_identity(_host_cxx()))
        flags = nvcc_flags(archs, werror=False)
    else:
        tools = (tool_identity(_cc()),)
        flags = c_flags(werror=False) + (["-DLLTM_WITH_CUDA"] if kind == "cuda" else [])
    return _digest("object", kind, tools, flags, _source_digest(rel))


def portable_cuda_key(rel: str, nvcc: str, archs: list[str]) -> str:
    """The key of scripts/prebuild_cuda.py's objects: object_key without the
    host compiler (that machine may have another gcc; using them is the
    user's explicit choice)."""
    return _digest("prebuilt", tool_identity(nvcc), nvcc_flags(archs, werror=False),
                   _source_digest(rel))


# ---------------------------------------------------------------- compiling

def _run(cmd: list[str], verbose: bool) -> str:
    """Runs cmd; returns its output (the compiler's warnings)."""
    if verbose:
        print(" ".join(cmd), flush=True)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.stdout and (verbose or proc.returncode != 0):
        print(proc.stdout, end="", file=sys.stderr, flush=True)
    if proc.returncode != 0:
        raise BuildError(f"command failed ({proc.returncode}): {' '.join(cmd)}")
    return proc.stdout


@contextlib.contextmanager
def _writing(target: Path):
    """A temporary name beside ``target``, renamed into place when the block
    ends without error: concurrent builds never see a half-written file."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        yield tmp
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def _run_to(cmd_without_output: list[str], target: Path, verbose: bool) -> str:
    with _writing(target) as tmp:
        return _run([*cmd_without_output, "-o", str(tmp)], verbose)


def _warnings_record(obj: Path) -> Path:
    return obj.with_name(obj.name + ".warnings")


def compile_object(src: Path, obj: Path, nvcc: str | None = None, archs: list[str] = (),
                   extra: list[str] = (), verbose: bool = False,
                   prebuilt: Path | None = None) -> None:
    """Compile one source (C or CUDA) with the build's flags (or copy the
    ``prebuilt`` object), recording the compiler's warnings beside it."""
    if prebuilt is not None:
        with _writing(obj) as tmp:
            shutil.copyfile(prebuilt, tmp)
        return
    # Sources named relative to the checkout in the binary (__FILE__, debug
    # info): no build-machine path inside, the same bytes from any folder.
    prefix_map = f"-ffile-prefix-map={CSRC}=csrc"
    if src.suffix == ".cu":
        cmd = [nvcc, *nvcc_flags(list(archs)), f"-Xcompiler={prefix_map}"]
    else:
        cmd = [_cc(), *c_flags(), prefix_map, *extra]
    output = _run_to([*cmd, "-c", str(src)], obj, verbose)
    record = _warnings_record(obj)
    if "warning" in output:
        record.write_text(output)
    else:
        record.unlink(missing_ok=True)


def _objects(sources: list[str], obj_dir: Path, kind: str, nvcc: str | None,
             archs: list[str], verbose: bool) -> tuple[list[Path], list[str]]:
    """(objects, keys) of ``sources``, compiled where no object of the same
    key exists ($MAX_JOBS at a time, default a CPU each)."""
    objs, keys, todo = [], [], []
    for rel in sources:
        key = object_key(rel, kind, archs, nvcc)
        obj = object_path(obj_dir, rel, kind, key)
        objs.append(obj)
        keys.append(key)
        if not obj.exists() or (_werror() and _warnings_record(obj).exists()):
            prebuilt = _prebuilt_cuda_object(nvcc, rel, archs) if rel.endswith(".cu") else None
            todo.append((CSRC / rel, obj, prebuilt))
    if not todo:
        return objs, keys
    slow = [src for src, _, prebuilt in todo if src.suffix == ".cu" and prebuilt is None]
    jobs = max(1, min(int(os.environ.get("MAX_JOBS") or os.cpu_count() or 1), len(todo)))
    extra = ["-DLLTM_WITH_CUDA"] if kind == "cuda" else []
    if slow:
        print(f"lltm: compiling {len(slow)} CUDA file(s) for {', '.join(archs)} "
              f"({jobs} at a time; a minute or more each)", file=sys.stderr, flush=True)
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(compile_object, src, obj, nvcc, archs, extra, verbose,
                               prebuilt): src for src, obj, prebuilt in todo}
        for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
            future.result()  # raises the first failure
            if futures[future] in slow or verbose:
                print(f"lltm: [{done}/{len(todo)}] {futures[future].name} "
                      f"({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)
    return objs, keys


def object_path(obj_dir: Path, rel: str, kind: str, key: str) -> Path:
    return obj_dir / f"{rel.replace('/', '_')}.{kind}.{key[:20]}.o"


def _prebuilt_cuda_object(nvcc: str, rel: str, archs: list[str]) -> Path | None:
    """An object of ``rel`` in $LLTM_PREBUILT_CUDA (scripts/prebuild_cuda.py)
    whose portable key matches this build's: a GPU machine then links objects
    compiled beforehand instead of spending minutes in nvcc."""
    folder = os.environ.get("LLTM_PREBUILT_CUDA")
    if not folder:
        return None
    obj = Path(folder) / prebuilt_name(rel, portable_cuda_key(rel, nvcc, archs))
    return obj if obj.exists() else None


def prebuilt_name(rel: str, key: str) -> str:
    return f"{Path(rel).name}.{key[:20]}.o"


# ---------------------------------------------------------------- linking

# No torch library on the link lines (its functions are found at load time:
# -ldl before glibc 2.34). The CUDA runtime is linked statically: it adopts
# the driver context torch made current. No device link: it would record its
# command line, with build-machine paths, in the library.
def _link(kind: str, nvcc: str | None, objs: list[Path], lib: Path, verbose: bool) -> None:
    tool = ([_cc(), "-shared"] if kind == "cpu" else
            [nvcc, "-shared", "-nodlink", "-cudart", "static", "-Xcompiler", "-fPIC"])
    _run_to([*tool, *map(str, objs), "-lm", "-ldl"], lib, verbose)


LINK_RECIPE = ("cc -shared -lm -ldl", "nvcc -shared -nodlink -cudart static -lm -ldl")


# ---------------------------------------------------------------- the build

def _torch_has_cuda() -> bool | None:
    """Has the torch this build is for CUDA? None: no torch found. In pip's
    isolated build the interpreter is asked without the isolation, which
    finds the torch of the environment being installed into."""
    torch = _torch()
    if torch is not None:
        return torch.version.cuda is not None
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE")}
    try:
        proc = subprocess.run([sys.executable, "-c", "import torch; print(torch.version.cuda)"],
                              env=env, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0 or not proc.stdout.strip():
        return None
    return proc.stdout.strip().splitlines()[-1] != "None"


def cuda_wanted() -> bool:
    """Build the CUDA library? LLTM_BUILD_CUDA=0/1, else: nvcc is found and
    the torch installed has CUDA (or no torch is found)."""
    flag = os.environ.get("LLTM_BUILD_CUDA")
    if flag is not None:
        return flag not in ("0", "", "false", "no")
    return find_nvcc() is not None and _torch_has_cuda() is not False


class Plan:
    """What a build would make: sources, keys, flags; computed without compiling."""

    def __init__(self, cuda: bool | None = None, reuse_archs_of: Path | None = None):
        if not CSRC.is_dir():
            raise BuildError(f"the C sources are not at {CSRC}: build from a source checkout")
        self.cuda = cuda_wanted() if cuda is None else cuda
        self.nvcc = find_nvcc() if self.cuda else None
        if self.cuda and self.nvcc is None:
            raise BuildError("the CUDA library was asked for but nvcc was not found: "
                             "set CUDA_HOME or put nvcc on PATH")
        self.archs, self.arch_source = [], ""
        # A folder whose archs came from the GPUs visible then keeps them
        # (asking torch.cuda would initialise CUDA in every importing process).
        info = (read_build_info(reuse_archs_of) if reuse_archs_of is not None else None) or {}
        if (self.cuda and not os.environ.get(_archs.ENVIRONMENT) and info.get("cuda_archs")
                and info.get("cuda_archs_from") == _archs.VISIBLE_GPUS):
            self.archs, self.arch_source = list(info["cuda_archs"]), _archs.VISIBLE_GPUS
        elif self.cuda:
            self.archs, self.arch_source = cuda_archs(self.nvcc)
        # the sources of each library ("cpu", "cuda"), compiled as that kind
        self.libraries = {"cpu": CPU_SOURCES}
        if self.cuda:
            self.libraries["cuda"] = CUDA_SOURCES + CUDA_ONLY_SOURCES
        self.object_keys = {
            kind: [object_key(rel, kind, self.archs, self.nvcc) for rel in sources]
            for kind, sources in self.libraries.items()}
        abi = _file_digest(CSRC / TORCH_ABI_HEADER)
        self.key = _digest("libraries", self.object_keys, LINK_RECIPE, abi,
                           tool_identity(_cc()))

    def info(self) -> dict:
        """The record written beside the libraries (no build-machine paths)."""
        info = {
            "build_key": self.key,
            "libraries": {kind: LIBRARIES[kind] for kind in self.libraries},
            "torch": f">={TORCH_MIN_VERSION} (stable C ABI, any torch that imports first)",
            "c_compiler": tool_identity(_cc()),
            "c_flags": c_flags(werror=False),
        }
        if self.cuda:
            info.update({"cuda_archs": self.archs, "cuda_archs_from": self.arch_source,
                         "nvcc": tool_identity(self.nvcc),
                         "nvcc_host_compiler": tool_identity(_host_cxx()),
                         "nvcc_flags": nvcc_flags(self.archs, werror=False)})
        return info


def read_build_info(folder: str | os.PathLike) -> dict | None:
    try:
        return json.loads((Path(folder) / BUILD_INFO).read_text())
    except (OSError, ValueError):
        return None


def build_libraries(out_dir: str | os.PathLike, verbose: bool = False,
                    cuda: bool | None = None, obj_dir: str | os.PathLike | None = None,
                    plan: Plan | None = None) -> dict[str, Path]:
    """Build the native libraries into ``out_dir`` unless the ones there carry
    the wanted build key; objects go to ``obj_dir`` (default: ``out_dir/obj``,
    the checkout's ``build/obj`` for the package folder). Returns
    {"cpu": path, "cuda": path (only when built)}."""
    out = Path(out_dir)
    plan = plan or Plan(cuda, reuse_archs_of=out)
    paths = {kind: out / LIBRARIES[kind] for kind in plan.libraries}
    if obj_dir is None:
        in_package = out.resolve() == PACKAGE_DIR
        obj_dir = REPO_ROOT / "build" / "obj" if in_package else out / "obj"
    obj_dir = Path(obj_dir)
    built = ((read_build_info(out) or {}).get("build_key") == plan.key
             and all(p.exists() for p in paths.values()))
    # With LLTM_WERROR, an up-to-date library whose objects had warnings is
    # rebuilt (which then fails on them).
    if built and not (_werror() and any(
            _warnings_record(object_path(obj_dir, rel, kind, key)).exists()
            for kind, sources in plan.libraries.items()
            for rel, key in zip(sources, plan.object_keys[kind]))):
        if verbose:
            print(f"lltm: native libraries up to date in {out}", flush=True)
        return paths
    start = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    obj_dir.mkdir(parents=True, exist_ok=True)
    (out / BUILD_INFO).unlink(missing_ok=True)  # no key while libraries change
    for kind, sources in plan.libraries.items():
        objs, keys = _objects(sources, obj_dir, kind, plan.nvcc, plan.archs, verbose)
        if keys != plan.object_keys[kind]:
            raise BuildError("the sources changed during the build: build again")
        _link(kind, plan.nvcc, objs, paths[kind], verbose)
    if not plan.cuda:
        (out / CUDA_LIBRARY).unlink(missing_ok=True)  # not one of this build's
    with _writing(out / BUILD_INFO) as tmp:
        tmp.write_text(json.dumps(plan.info(), indent=1) + "\n")
    if verbose:
        print(f"lltm: native libraries built in {out} "
              f"({time.perf_counter() - start:.2f} s)", flush=True)
    return paths


def cache_build(cache_dir: str | os.PathLike | None = None, verbose: bool = False,
                cuda: bool | None = None) -> dict[str, Path]:
    """Build into ``cache_dir/<build key>/`` (default $LLTM_BUILD_DIR, else
    ~/.cache/lltm), objects shared in ``cache_dir/obj``."""
    cache = Path(cache_dir or os.environ.get("LLTM_BUILD_DIR")
                 or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lltm")
    plan = Plan(cuda)
    return build_libraries(cache / plan.key[:24], verbose=verbose, obj_dir=cache / "obj",
                           plan=plan)


def load(verbose: bool = False, build_dir: str | os.PathLike | None = None):
    """The just-in-time route, like torch.utils.cpp_extension.load: build into
    the cache and load the result (the native-library handle)."""
    from . import _native

    return _native.load_from(cache_build(build_dir, verbose=verbose))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build lltm's native libraries.")
    parser.add_argument("--out", default=None, help="output directory "
                        "(default: a folder per build key in the just-in-time cache, "
                        "or lltm/ with --inplace)")
    parser.add_argument("--inplace", action="store_true",
                        help="build into the package folder, where `import lltm` looks first")
    parser.add_argument("--cuda", choices=("auto", "yes", "no"), default="auto")
    parser.add_argument("--print-nvcc-flags", action="store_true",
                        help="print the nvcc flags of the CUDA objects (TORCH_CUDA_ARCH_LIST, "
                        "else the visible GPUs, else the default archs; LLTM_WERROR) and exit")
    parser.add_argument("--print-cuda-sources", action="store_true",
                        help="print the .cu sources (relative to the checkout) and exit")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    if args.print_cuda_sources:
        print(" ".join(f"csrc/{rel}" for rel in CUDA_ONLY_SOURCES if rel.endswith(".cu")))
        return 0
    if args.print_nvcc_flags:
        archs, _ = cuda_archs(find_nvcc())
        print(" ".join(nvcc_flags(archs)))
        return 0
    cuda = None if args.cuda == "auto" else args.cuda == "yes"
    start = time.perf_counter()
    if args.out or args.inplace:
        paths = build_libraries(args.out or PACKAGE_DIR, verbose=args.verbose, cuda=cuda)
    else:
        paths = cache_build(verbose=args.verbose, cuda=cuda)
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    print(f"built in {time.perf_counter() - start:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
