"""The redistributable wheel (``make wheel``): one file for every CPython 3 and
every torch from 2.11 on. ``make test-wheel`` builds it once and runs this
file with LLTM_TEST_WHEEL naming it: the wheel's tag, its libraries (no run
path, no build-machine path, torch named without a path), then, in a fresh
venv per torch release (LLTM_TEST_WHEEL_TORCH, pip's version specifiers), the
wheel installed from the file and the operator suites run against it:
test_cell.py, test_sequence.py, test_module.py and test_errors.py (forward and
backward against the reference, float64 gradcheck / gradgradcheck,
torch.library.opcheck, torch.compile, error messages), copied away from the
checkout so that the installed package is the one imported."""
import json
import os
import shutil
import subprocess
import sys
import time
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WHEEL = os.environ.get("LLTM_TEST_WHEEL", "")
TORCH_SPECS = os.environ.get("LLTM_TEST_WHEEL_TORCH", "2.11.* 2.12.* 2.13.* 2.14.*").split()
SUITES = ["test_cell.py", "test_sequence.py", "test_module.py", "test_errors.py"]
HELPERS = ["conftest.py", "guarded.py"]

pytestmark = pytest.mark.skipif(
    not WHEEL, reason="builds a wheel and venvs with several torch releases (minutes): "
    "run through `make test-wheel` (part of `make test`)")


@pytest.fixture(scope="module")
def wheel() -> Path:
    path = Path(WHEEL)
    assert path.is_file(), f"LLTM_TEST_WHEEL={WHEEL} is not a file"
    return path


@pytest.fixture(scope="module")
def unpacked(wheel, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("wheel")
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(folder)
    return folder


def test_tag_is_any_cpython_3_and_manylinux(wheel, unpacked):
    name, version, python, abi, platform = wheel.name[:-4].split("-")
    assert (name, python, abi) == ("lltm", "py3", "none")
    assert platform.startswith("manylinux_") and platform.endswith("_x86_64")
    meta = (unpacked / f"lltm-{version}.dist-info" / "WHEEL").read_text()
    assert f"Tag: py3-none-{platform}" in meta and "Root-Is-Purelib: false" in meta


def test_libraries_name_torch_without_paths(unpacked):
    libs = sorted((unpacked / "lltm").glob("*.so"))
    names = [p.name for p in libs]
    assert "liblltm.so" in names
    # make test-wheel says whether the CUDA library was built (nvcc found)
    cuda_wanted = os.environ.get("LLTM_TEST_WHEEL_CUDA")
    if cuda_wanted is not None:
        assert ("liblltm_cuda.so" in names) == (cuda_wanted == "1"), names
    assert not list(unpacked.rglob("*.objects")), "link records do not belong in a wheel"
    for lib in libs:
        dynamic = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True,
                                 check=True).stdout
        assert "RPATH" not in dynamic and "RUNPATH" not in dynamic, dynamic
        assert "[libtorch_cpu.so]" in dynamic
    for path in unpacked.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            for build_path in (str(ROOT), "/tmp/lltm-torch-stubs", "/tmp/pip-"):
                assert build_path.encode() not in data, f"{path.name} holds {build_path}"


def test_build_record(unpacked):
    info = json.loads((unpacked / "lltm" / "lltm_build.json").read_text())
    assert info["torch"].startswith(">=2.11")
    assert info["libraries"]["cpu"] == "liblltm.so"
    if "cuda" in info["libraries"]:
        assert info["cuda_archs"] and info["nvcc_flags"]


def _venv_python(folder: Path) -> Path:
    venv.EnvBuilder(with_pip=True, clear=True).create(folder)
    return folder / "bin" / "python"


@pytest.mark.parametrize("torch_spec", TORCH_SPECS)
def test_installed_wheel_passes_the_operator_suites(wheel, torch_spec, tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "LLTM_BUILD_DIR", "VIRTUAL_ENV")}
    python = _venv_python(tmp_path / "venv")
    start = time.perf_counter()
    subprocess.run([str(python), "-m", "pip", "install", "-q", f"torch=={torch_spec}",
                    "numpy", "pytest", str(wheel)], env=env, check=True, timeout=1800)
    installed = time.perf_counter() - start
    work = tmp_path / "work"  # no lltm/ here: the installed package is imported
    (work / "tests").mkdir(parents=True)
    for name in SUITES + HELPERS:
        shutil.copy(ROOT / "tests" / name, work / "tests" / name)
    probe = subprocess.run(
        [str(python), "-c", "import json, torch, lltm; print(json.dumps({'torch': "
         "torch.__version__, 'cuda': torch.version.cuda, 'file': lltm.__file__, "
         "'info': lltm.build_info()}))"],
        cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert probe.returncode == 0, probe.stderr
    got = json.loads(probe.stdout.strip().splitlines()[-1])
    site = Path(got["file"]).resolve().parent
    assert "site-packages" in site.parts and ROOT not in site.parents
    assert Path(got["info"]["loaded_from"]["cpu"]).parent == site
    # A CUDA torch loads the CUDA library too (its symbols resolve against
    # that torch's libtorch_cuda.so at load time).
    has_cuda_lib = (site / "liblltm_cuda.so").exists()
    assert got["info"]["cuda"] == (has_cuda_lib and got["cuda"] is not None), got
    start = time.perf_counter()
    proc = subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *[f"tests/{name}" for name in SUITES]],
                          cwd=work, env=env, capture_output=True, text=True, timeout=3600)
    print(f"torch {got['torch']}: install {installed:.0f} s, suites "
          f"{time.perf_counter() - start:.0f} s: {proc.stdout.strip().splitlines()[-1]}")
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]


def test_auditwheel_finds_only_glibc_and_torch(wheel):
    """auditwheel (installed by `make wheel`): the only versioned symbols are
    system ones (which set the manylinux tag); the only libraries it cannot
    place are torch's, which the installed torch provides (its overall verdict
    stays linux_x86_64 for that reason alone, as for any torch extension)."""
    pytest.importorskip("auditwheel")
    proc = subprocess.run([sys.executable, "-m", "auditwheel", "show", "--json", str(wheel)],
                          capture_output=True, text=True, check=True)
    report = json.loads(proc.stdout)
    platform = wheel.name[:-4].split("-")[-1]
    assert report["sym_tag"] == platform
    assert set(report["external_libs"]) <= {"libtorch_cpu.so", "libtorch_cuda.so"}
    assert set(report["versioned_symbols"]) <= {"libc.so.6", "libm.so.6", "libgcc_s.so.1",
                                                 "libstdc++.so.6", "ld-linux-x86-64.so.2",
                                                 "libpthread.so.0", "libdl.so.2", "librt.so.1"}
