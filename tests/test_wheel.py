"""The redistributable wheel (``make wheel``): one file for every CPython 3 and
every torch from 2.11 on. ``make test-wheel`` builds it once and runs this
file with LLTM_TEST_WHEEL naming it: the wheel's tag, its libraries (no run
path, no build-machine path, no torch library needed: only libraries of the
manylinux policy), auditwheel's verdict, then, in a fresh
venv per torch release (LLTM_TEST_WHEEL_TORCH, pip's version specifiers), the
wheel installed from the file and the operator suites run against it:
test_cell.py, test_sequence.py, test_module.py and test_errors.py (forward and
backward against the reference, float64 gradcheck / gradgradcheck,
torch.library.opcheck, torch.compile, error messages), copied away from the
checkout so that the installed package is the one imported."""
import json
import os
import re
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


# manylinux policy libraries (glibc's, libgcc_s, libstdc++)
SYSTEM_LIBRARIES = {"libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1",
                    "libgcc_s.so.1", "libstdc++.so.6", "ld-linux-x86-64.so.2"}


def test_libraries_need_no_torch_library(unpacked):
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
        needed = set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic))
        assert needed and needed <= SYSTEM_LIBRARIES, (lib.name, needed)
    for path in unpacked.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            for build_path in (str(ROOT), "/tmp/pip-"):
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


@pytest.fixture
def fresh_venv(tmp_path):
    """A venv, removed afterwards (a CUDA torch takes gigabytes)."""
    yield _venv_python(tmp_path / "venv")
    shutil.rmtree(tmp_path / "venv", ignore_errors=True)


@pytest.mark.parametrize("torch_spec", TORCH_SPECS)
def test_installed_wheel_passes_the_operator_suites(wheel, torch_spec, tmp_path, fresh_venv):
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "LLTM_BUILD_DIR", "VIRTUAL_ENV")}
    python = fresh_venv
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
    # A CUDA torch loads the CUDA library too (its table of torch's functions
    # filled from that torch's libtorch_cpu.so and libtorch_cuda.so).
    has_cuda_lib = (site / "liblltm_cuda.so").exists()
    assert got["info"]["cuda"] == (has_cuda_lib and got["cuda"] is not None), got
    start = time.perf_counter()
    proc = subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *[f"tests/{name}" for name in SUITES]],
                          cwd=work, env=env, capture_output=True, text=True, timeout=3600)
    print(f"torch {got['torch']}: install {installed:.0f} s, suites "
          f"{time.perf_counter() - start:.0f} s: {proc.stdout.strip().splitlines()[-1]}")
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]


def test_auditwheel_is_clean(wheel):
    """auditwheel (installed by `make wheel`): the wheel is consistent with its
    manylinux tag: no library outside the policy (none of torch's: the
    libraries find torch's functions at load time), and the only versioned
    symbols are system ones, the newest of which sets the tag."""
    pytest.importorskip("auditwheel")
    proc = subprocess.run([sys.executable, "-m", "auditwheel", "show", str(wheel)],
                          capture_output=True, text=True, check=True)
    platform = wheel.name[:-4].split("-")[-1]
    text = " ".join(proc.stdout.split())
    assert f'is consistent with the following platform tag: "{platform}"' in text, proc.stdout
    assert "external shared libraries" not in text and "libtorch" not in text, proc.stdout
