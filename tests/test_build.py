"""The build (lltm/build.py): builds are addressed by content, so two checkouts
sharing one cache, or an edit in one, never load another build's library; the
nvcc flags and GPU architectures are chosen like PyTorch's extensions; the
libraries need no torch library at link time: they find torch's stable C ABI
in the running process through pointers declared from one list, and a torch
lacking a function gives a clear error."""
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lltm import _archs, _native, build

ROOT = Path(__file__).resolve().parent.parent
MESSAGE = "must be %lld-dimensional %s, got shape %s"
SOURCE = "binding/tensor_args.c"

# Calls the operator with a 1-D input and prints the error (which quotes
# tensor_args.c's message) and where the library came from.
PROBE = textwrap.dedent("""
    import json, torch, lltm
    try:
        torch.ops.lltm.cell_forward(torch.randn(5), torch.randn(12, 9), torch.randn(12),
                                    torch.randn(3, 4), torch.randn(3, 4))
    except RuntimeError as exc:
        print(json.dumps({"error": str(exc), "file": lltm.__file__,
                          "lib": lltm.build_info()["loaded_from"]["cpu"]}))
""")


def _checkout(parent: Path, name: str, with_library: bool = False) -> Path:
    """A copy of what a build reads: csrc/ and lltm/ (no built library unless
    asked: the package then builds just in time)."""
    root = parent / name
    shutil.copytree(ROOT / "csrc", root / "csrc")
    ignore = shutil.ignore_patterns("__pycache__", "*.so", build.BUILD_INFO)
    shutil.copytree(ROOT / "lltm", root / "lltm", ignore=None if with_library else ignore)
    return root


def _edit_message(root: Path, new: str) -> None:
    path = root / "csrc" / SOURCE
    text = path.read_text()
    assert MESSAGE in text, f"{SOURCE} no longer has the message this test edits"
    path.write_text(text.replace(MESSAGE, new))


def _probe(root: Path, cache: Path) -> dict:
    env = {**os.environ, "LLTM_BUILD_DIR": str(cache), "LLTM_BUILD_CUDA": "0"}
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert Path(result["file"]).resolve().parent == (root / "lltm").resolve()
    return result


def test_two_checkouts_sharing_one_cache_each_load_their_own_build(tmp_path):
    cache = tmp_path / "shared-cache"
    a = _checkout(tmp_path, "a")
    b = _checkout(tmp_path, "b")
    _edit_message(b, "has to be %lld-dimensional %s (checkout b), got shape %s")
    for _ in range(2):  # a second round: both builds are in the cache now
        got_a, got_b = _probe(a, cache), _probe(b, cache)
        assert "input must be 2-dimensional [B, I], got shape [5]" in got_a["error"]
        assert "input has to be 2-dimensional [B, I] (checkout b), got shape [5]" in got_b["error"]
        assert got_a["lib"] != got_b["lib"]
        assert Path(got_a["lib"]).parent.parent == cache
    # Only the edited source was compiled twice: the other objects are shared.
    objects = sorted(p.name for p in (cache / "obj").glob("*.o"))
    assert len(objects) == len(build.CPU_SOURCES) + 1, objects
    # Editing b back gives a's build key again: a's library, nothing compiled.
    (b / "csrc" / SOURCE).write_text((a / "csrc" / SOURCE).read_text())
    assert _probe(b, cache)["lib"] == got_a["lib"]


def test_library_in_the_package_folder_is_rebuilt_when_a_source_changes(tmp_path):
    a = _checkout(tmp_path, "a")
    env = {**os.environ, "LLTM_BUILD_CUDA": "0"}
    subprocess.run([sys.executable, "lltm/build.py", "--inplace"], cwd=a, env=env,
                   check=True, capture_output=True, timeout=600)
    info = json.loads((a / "lltm" / build.BUILD_INFO).read_text())
    first = _probe(a, tmp_path / "unused-cache")
    assert first["lib"] == str((a / "lltm" / build.CPU_LIBRARY).resolve())
    assert "must be 2-dimensional" in first["error"]
    # An edit with an older file time than the library: times must not matter.
    _edit_message(a, "is expected %lld-dimensional %s, got shape %s")
    lib_time = (a / "lltm" / build.CPU_LIBRARY).stat().st_mtime
    os.utime(a / "csrc" / SOURCE, (lib_time - 3600, lib_time - 3600))
    second = _probe(a, tmp_path / "unused-cache")
    assert second["lib"] == first["lib"]
    assert "input is expected 2-dimensional [B, I], got shape [5]" in second["error"]
    assert json.loads((a / "lltm" / build.BUILD_INFO).read_text())["build_key"] != \
        info["build_key"]
    assert not (tmp_path / "unused-cache").exists()


def test_build_key_follows_flags_and_compiler(monkeypatch):
    plan = build.Plan(cuda=False)
    assert build.Plan(cuda=False).key == plan.key
    monkeypatch.setattr(build, "C_FLAGS", build.C_FLAGS + ["-DLLTM_SOMETHING"])
    assert build.Plan(cuda=False).key != plan.key
    monkeypatch.setattr(build, "C_FLAGS", build.C_FLAGS[:-1])
    monkeypatch.setattr(build, "tool_identity", lambda tool: "cc: another compiler 1.0")
    assert build.Plan(cuda=False).key != plan.key
    monkeypatch.undo()
    monkeypatch.setenv("LLTM_WERROR", "1")  # checks more, changes no byte
    assert build.Plan(cuda=False).key == plan.key


def _dynamic_section(lib: Path) -> str:
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("needs readelf")
    return subprocess.run([readelf, "-d", str(lib)], capture_output=True, text=True,
                          check=True).stdout


# What a library may need (manylinux policy: glibc's libraries, libgcc_s, libstdc++).
SYSTEM_LIBRARIES = {"libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1",
                    "libgcc_s.so.1", "libstdc++.so.6", "ld-linux-x86-64.so.2"}


def needed(dynamic: str) -> set[str]:
    return set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic))


def test_libraries_need_no_torch_library():
    """No DT_NEEDED names torch (or c10), no run path, no torch symbol left
    undefined: torch's functions are found through the table at load time."""
    for lib in _native._loaded_from.values():
        dynamic = _dynamic_section(lib)
        assert needed(dynamic) and needed(dynamic) <= SYSTEM_LIBRARIES, needed(dynamic)
        assert "RPATH" not in dynamic and "RUNPATH" not in dynamic
        nm = shutil.which("nm")
        if nm is not None:
            undefined = subprocess.run([nm, "-D", "--undefined-only", str(lib)],
                                       capture_output=True, text=True, check=True).stdout
            assert not re.search(r"\b(aoti_torch|torch_)\w*", undefined), undefined
        assert str(ROOT).encode() not in lib.read_bytes()  # sources named csrc/..., no paths


# An entry of the list in torch_stable_abi.h: X(library, need, return type, name, (...
ENTRY = re.compile(r"^\s*X\((CPU|CUDA), (REQUIRED|OPTIONAL), [^,]+, (\w+),", re.M)


def test_the_list_names_every_torch_function_the_binding_calls():
    """Every function the binding calls is in the list of torch_stable_abi.h,
    with its library and need; every required CPU one is defined by the
    installed torch."""
    csrc = ROOT / "csrc"
    entries = ENTRY.findall((csrc / build.TORCH_ABI_HEADER).read_text())
    names = [name for _, _, name in entries]
    assert len(names) == len(set(names))
    cpu = {name for lib, _, name in entries if lib == "CPU"}
    cuda = {name for lib, _, name in entries if lib == "CUDA"}
    assert {"aoti_torch_check", "torch_call_dispatcher", "aoti_torch_empty_strided",
            "torch_library_impl"} <= cpu
    assert cuda == {"aoti_torch_get_current_cuda_stream", "aoti_torch_create_cuda_guard",
                    "aoti_torch_delete_cuda_guard", "aoti_torch_cuda_mm_out"}
    assert {name for _, need, name in entries if need == "OPTIONAL"} == {
        "torch_exception_get_what_without_backtrace", "aoti_torch_cpu_mm_out",
        "aoti_torch_cuda_mm_out"}
    # Every call of the binding goes through the list: no other torch name.
    binding = "".join(p.read_text() for p in (csrc / "binding").glob("*.c"))
    called = set(re.findall(r"\b((?:aoti_torch|torch)_\w+)\s*\(", binding))
    own = set(re.findall(r"^static [\w\s\*]*?\b(\w+)\s*\(", binding, re.M))  # helpers
    assert called - own <= set(names), called - own - set(names)
    import torch
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("needs nm")
    torch_cpu = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    defined = set(subprocess.run([nm, "-D", "--defined-only", str(torch_cpu)],
                                 capture_output=True, text=True).stdout.split())
    missing = [name for lib, need, name in entries
               if lib == "CPU" and need == "REQUIRED" and name not in defined]
    assert not missing, missing


def _declare_in_copy(root: Path, entry: str) -> None:
    """Adds an entry to the list of torch_stable_abi.h in a copied checkout."""
    header = root / "csrc" / build.TORCH_ABI_HEADER
    text = header.read_text()
    anchor = "#define LLTM_TORCH_FUNCTIONS(X)"
    assert anchor in text
    header.write_text(text.replace(anchor, f"{anchor} \\\n    {entry}", 1))


IMPORT_PROBE = textwrap.dedent("""
    import torch, lltm
    h, c = lltm.LLTMCell(3, 4)(torch.randn(2, 3))
    print("ok", tuple(h.shape), lltm.build_info()["loaded_from"]["cpu"])
""")


def test_torch_lacking_a_function_is_a_clear_error(tmp_path):
    """A function the list names but the torch imported lacks: optional,
    the library loads and runs (its pointer is NULL); required, importing lltm
    raises an ImportError naming the function, the library and torch's version."""
    import torch
    root = _checkout(tmp_path, "a")
    env = {**os.environ, "LLTM_BUILD_DIR": str(tmp_path / "cache"), "LLTM_BUILD_CUDA": "0"}
    env.pop("PYTHONPATH", None)
    _declare_in_copy(root, "X(CPU, OPTIONAL, AOTITorchError, aoti_torch_lltm_test_optional, "
                           "(void))")
    proc = subprocess.run([sys.executable, "-c", IMPORT_PROBE], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ok (2, 4)") and str(tmp_path / "cache") in proc.stdout
    _declare_in_copy(root, "X(CPU, REQUIRED, AOTITorchError, aoti_torch_lltm_test_required, "
                           "(int32_t x))")
    proc = subprocess.run([sys.executable, "-c", IMPORT_PROBE], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("lltm._native.NativeLibraryError: lltm: liblltm.so cannot use the "
                           f"torch imported (torch {torch.__version__}, "), last
    assert "libtorch_cpu.so has no function aoti_torch_lltm_test_required" in last
    assert "needs torch >= 2.11" in last and "aoti_torch_lltm_test_optional" not in last
    assert "Traceback" in proc.stderr and "Segmentation" not in proc.stderr


NO_TORCH_PROBE = textwrap.dedent("""
    import ctypes, sys
    lib = ctypes.CDLL(sys.argv[1])  # loads: no torch library is needed to load it
    assert "torch" not in sys.modules
    for entry in ("lltm_resolve_torch", "lltm_register"):
        fn = getattr(lib, entry)
        fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_char_p, ctypes.c_size_t]
        err = ctypes.create_string_buffer(256)
        print(entry, fn(err, len(err)), err.value.decode())
""")


def test_resolving_without_torch_loaded_fails_cleanly():
    lib = _native._loaded_from["cpu"]
    proc = subprocess.run([sys.executable, "-c", NO_TORCH_PROBE, str(lib)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    message = "libtorch_cpu.so is not loaded in this process (import torch first)"
    assert proc.stdout.splitlines() == [f"lltm_resolve_torch -1 {message}",
                                        f"lltm_register -1 {message}"]


@pytest.mark.parametrize("text, archs", [
    ("8.0;8.6;9.0+PTX", ["8.0", "8.6", "9.0+PTX"]),
    ("7.5 8.0", ["7.5", "8.0"]),
    ("9.0a", ["9.0a"]),
    ("Ampere;Hopper", ["8.0", "8.6+PTX", "9.0+PTX"]),
])
def test_arch_list_syntax_like_pytorch(text, archs):
    assert _archs.parse_arch_list(text) == archs


def test_arch_list_errors_and_gencode():
    with pytest.raises(ValueError, match="unknown CUDA architecture 'sm_90'"):
        _archs.parse_arch_list("sm_90")
    assert _archs.gencode_flags(["8.0", "9.0+PTX"]) == [
        "-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90,code=sm_90",
        "-gencode=arch=compute_90,code=compute_90"]


def test_arch_choice_env_then_default(monkeypatch):
    nvcc = build.find_nvcc()
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.6;9.0+PTX")
    assert build.cuda_archs(nvcc) == (["8.6", "9.0+PTX"], "TORCH_CUDA_ARCH_LIST")
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST")
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the build targets it")
    if nvcc is None:
        pytest.skip("needs nvcc")
    archs, source = build.cuda_archs(nvcc)
    wanted = [f"{a}.{b}" for a, b in _archs.nvcc_supported(nvcc)
              if (7, 5) <= (a, b) <= (12, 0)]
    assert source.startswith("the default")
    assert archs[-1].endswith("+PTX") and "7.5" in wanted and "12.0" in wanted
    assert [a.split("+")[0] for a in archs] == wanted


def test_print_nvcc_flags_is_the_build_list(monkeypatch):
    env = {**os.environ, "TORCH_CUDA_ARCH_LIST": "9.0", "LLTM_WERROR": "1"}
    out = subprocess.run([sys.executable, str(ROOT / "lltm" / "build.py"), "--print-nvcc-flags"],
                         env=env, capture_output=True, text=True, check=True).stdout.split()
    assert out == build.nvcc_flags(["9.0"], werror=True)
    assert "-gencode=arch=compute_90,code=sm_90" in out and "all-warnings" in out


@pytest.mark.parametrize("arch, capability, runs", [
    ("8.0", (8, 6), True), ("8.6", (8, 0), False), ("9.0", (10, 0), False),
    ("9.0+PTX", (10, 0), True), ("9.0+PTX", (8, 9), False), ("9.0a", (9, 0), True),
    ("12.0", (12, 1), True), ("7.5", (8, 0), False),
])
def test_which_gpus_built_code_runs_on(arch, capability, runs):
    assert _archs.runs_on(arch, capability) is runs


def test_unsupported_gpu_message_names_gpu_archs_and_rebuild():
    assert _archs.unsupported_gpu_message(0, "H100", (9, 0), ["8.0", "9.0"]) is None
    msg = _archs.unsupported_gpu_message(1, "NVIDIA B200", (10, 0), ["8.0", "9.0"])
    for part in ("cuda:1", "NVIDIA B200", "sm_100", "8.0, 9.0",
                 'TORCH_CUDA_ARCH_LIST="10.0" pip install .'):
        assert part in msg


def test_build_info():
    import lltm
    info = lltm.build_info()
    assert info["cpu"] is True and info["cuda"] == _native.has_cuda_kernels()
    assert info["torch"].startswith(">=2.11")
    assert "-O3" in info["c_flags"] and info["c_compiler"]
    assert isinstance(info["cuda_archs"], list)
    assert len(info["build_key"]) == 64


# The decision taken when CUDA initialises, with torch.cuda's answers faked:
# prints what was registered for the CUDA key and the warnings.
REGISTRATION_PROBE = textwrap.dedent("""
    import json, sys, warnings, torch, lltm
    from lltm import _native
    caps = json.loads(sys.argv[1])
    torch.cuda._lazy_call = lambda fn: fn()
    torch.cuda.device_count = lambda: len(caps)
    torch.cuda.get_device_capability = lambda i: tuple(caps[i])
    torch.cuda.get_device_name = lambda i: f"GPU{i}"
    calls = []
    _native._register = lambda lib, symbol: calls.append(symbol)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _native._register_cuda_kernels(None, ["8.0", "9.0"])
    each = [torch._C._dispatch_has_kernel_for_dispatch_key("lltm::" + name, "CUDA")
            for name in _native.operator_names()]
    has = each[0] if len(set(each)) == 1 else None  # (on some operators only: a failure)
    error = None
    if has:  # call the CUDA kernel itself (with CPU tensors: there is no GPU)
        args = [torch.randn(3, 5), torch.randn(12, 9), torch.randn(12), torch.randn(3, 4),
                torch.randn(3, 4)]
        try:
            torch.ops.lltm.cell_forward.default.redispatch(torch._C.DispatchKeySet("CUDA"), *args)
        except RuntimeError as exc:
            error = str(exc)
    listed = sorted("lltm::" + name for name in _native.operator_names())
    schemas = sorted(n for n in torch._C._dispatch_get_all_op_names() if n.startswith("lltm::"))
    print(json.dumps({"c_kernels": calls, "python_cuda_kernel": has, "all_listed": listed == schemas,
                      "error": error,
                      "warnings": [str(w.message) for w in caught]}))
""")


@pytest.mark.parametrize("caps, c_kernels, refusing, warned", [
    ([[9, 0]], True, False, 0),            # built for it
    ([[8, 6], [9, 0]], True, False, 0),    # sm_80 code runs on 8.6
    ([[10, 0]], False, True, 0),           # no code: every op raises the clear error
    ([[9, 0], [7, 5]], True, False, 1),    # one of two: kernels plus a warning
])
def test_cuda_kernels_registered_only_for_gpus_with_code(caps, c_kernels, refusing, warned):
    proc = subprocess.run([sys.executable, "-c", REGISTRATION_PROBE, json.dumps(caps)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (got["c_kernels"] == ["lltm_cuda_register"]) is c_kernels
    assert got["python_cuda_kernel"] is refusing  # on every operator, or on none
    assert got["all_listed"]
    assert len(got["warnings"]) == warned
    if warned:
        assert "sm_75" in got["warnings"][0] and "8.0, 9.0" in got["warnings"][0]
    if refusing:
        assert "cuda:0 (GPU0) is sm_100" in got["error"] and "built for 8.0, 9.0 only" in \
            got["error"] and 'TORCH_CUDA_ARCH_LIST="10.0"' in got["error"]


def test_object_keys_follow_the_headers_each_source_includes(tmp_path, monkeypatch):
    csrc = tmp_path / "csrc"
    (csrc / "core").mkdir(parents=True)
    (csrc / "core" / "a.c").write_text('#include "x.h"\n#include <stdio.h>\n')
    (csrc / "core" / "b.c").write_text('#include <stdio.h>\nint b;\n')
    (csrc / "core" / "m.c").write_text('#define H "y.h"\n#include H\n')
    (csrc / "core" / "x.h").write_text('#if 0\n#include "../binding/y.h"\n#endif\n')
    (csrc / "binding").mkdir()
    (csrc / "binding" / "y.h").write_text("int y;\n")
    monkeypatch.setattr(build, "CSRC", csrc)
    before = {rel: build._source_digest(rel) for rel in ("core/a.c", "core/b.c", "core/m.c")}
    (csrc / "binding" / "y.h").write_text("int y, z;\n")  # included by a.c through x.h
    after = {rel: build._source_digest(rel) for rel in before}
    assert after["core/a.c"] != before["core/a.c"]
    assert after["core/b.c"] == before["core/b.c"]
    assert after["core/m.c"] != before["core/m.c"]  # a macro include: every header counts
