"""Builds the native libraries with lltm/build.py (the project's one build
description) and puts them inside the package.

No torch is needed to build: the libraries have no link-time dependency on
torch's (they find the functions of torch's stable C ABI they call in the torch
the process has imported, when Python loads them), so ``pip install .`` works
in pip's isolated build environment, and so does
``pip install --no-build-isolation .``. The wheel holds no Python extension
module (the libraries are loaded with ctypes): it is tagged py3-none-<platform>,
one wheel for every CPython 3 and every torch from 2.11 on.
"""
import importlib.util
import sys
from pathlib import Path

from setuptools import Command, Extension, setup
from setuptools.command.build_ext import build_ext

try:  # setuptools >= 70.1 has bdist_wheel itself; older ones need the wheel package
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:
    try:
        from wheel.bdist_wheel import bdist_wheel
    except ImportError:
        bdist_wheel = None

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
        build = _build_module()
        built = build.build_libraries(target.parent, verbose=self.verbose > 0,
                                      obj_dir=Path(self.build_temp) / "lltm-obj")
        missing = [p for p in built.values() if not p.exists()]
        if missing:
            raise RuntimeError(f"lltm: build did not produce {missing}")

    def _extra_outputs(self):
        """The CUDA library and the build record, beside liblltm.so in build_lib."""
        build = _build_module()
        folder = Path(self.build_lib) / "lltm"
        return [folder / name for name in (build.CUDA_LIBRARY, build.BUILD_INFO)
                if (folder / name).exists()]

    def get_outputs(self):
        outputs = super().get_outputs()
        if self.inplace:  # the output mapping's keys, extras included
            return outputs
        return outputs + [str(p) for p in self._extra_outputs()]

    def get_output_mapping(self):
        # Where each output goes in the checkout (editable installs, --inplace).
        mapping = dict(super().get_output_mapping())
        for built in self._extra_outputs():
            mapping[str(built)] = str(self._package_dir() / built.name)
        return mapping

    def copy_extensions_to_source(self):
        super().copy_extensions_to_source()
        for built in self._extra_outputs():
            self.copy_file(str(built), str(self._package_dir() / built.name), level=self.verbose)

    def _package_dir(self):
        return Path(self.get_finalized_command("build_py").get_package_dir("lltm"))


cmdclass = {"build_ext": BuildNativeLibraries}

if bdist_wheel is not None:
    class PortableWheel(bdist_wheel):
        """py3-none-<platform>: the libraries are plain shared objects loaded
        with ctypes, for any CPython 3 (no Python ABI in them)."""

        def finalize_options(self):
            super().finalize_options()
            self.root_is_pure = False

        def get_tag(self):
            _, _, platform = super().get_tag()
            return "py3", "none", platform

    cmdclass["bdist_wheel"] = PortableWheel
else:
    class MissingWheelSupport(Command):
        """Old setuptools without the wheel package (pip install
        --no-build-isolation uses the setuptools installed): say what to do."""
        user_options = []

        def initialize_options(self):
            pass

        def finalize_options(self):
            sys.exit("lltm: building needs setuptools>=70.1 or the `wheel` package, and this "
                     "environment has neither (`pip install --no-build-isolation` uses the "
                     "setuptools installed; a fresh venv has an older one, which torch 2.11 "
                     "and 2.12 keep): run `pip install wheel` (or `pip install "
                     "'setuptools>=70.1,<82'`), then the install again.")

        def run(self):
            pass

    cmdclass["bdist_wheel"] = MissingWheelSupport

setup(
    ext_modules=[Extension("lltm.liblltm", sources=[])],
    cmdclass=cmdclass,
)
