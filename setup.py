"""Builds the native libraries with lltm/build.py (the project's one build
description) and puts them inside the package. Install with
``pip install --no-build-isolation .`` so the torch already installed is used."""
import importlib.util
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def _build_module():
    spec = importlib.util.spec_from_file_location("lltm_build", ROOT / "lltm" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildNativeLibraries(build_ext):
    """Compile with lltm.build instead of setuptools' C++-minded compiler driver.
    The libraries are plain shared objects (no Python module init), loaded with
    ctypes, so one binary serves every CPython."""

    def get_ext_filename(self, ext_name):
        return str(Path(*ext_name.split("."))) + ".so"

    def build_extension(self, ext):
        target = Path(self.get_ext_fullpath(ext.name))
        built = _build_module().build_libraries(target.parent, verbose=self.verbose > 0,
                                                 obj_dir=Path(self.build_temp) / "lltm-obj")
        missing = [p for p in built.values() if not p.exists()]
        if missing:
            raise RuntimeError(f"lltm: build did not produce {missing}")


setup(
    ext_modules=[Extension("lltm.liblltm", sources=[])],
    cmdclass={"build_ext": BuildNativeLibraries},
)
