"""Compile the CUDA sources here (nvcc, no GPU needed) for the GPU machine,
whose build then copies these objects instead of running nvcc (minutes of
its time): lltm/build.py takes an object from $LLTM_PREBUILT_CUDA when its
name carries the key of its own (nvcc version, flags and architectures,
source, every header; not the host compiler), and compiles otherwise.

    python3 scripts/prebuild_cuda.py [--out build/prebuilt-cuda] [--archs 9.0]
    # then on the GPU machine (the folder carried there):
    LLTM_PREBUILT_CUDA=build/prebuilt-cuda python3 lltm/build.py --cuda yes

The architectures must be the ones the GPU machine's build picks: its
TORCH_CUDA_ARCH_LIST where set (CUDA containers often set one, such as 9.0a:
`echo $TORCH_CUDA_ARCH_LIST` there), else its GPUs (an H100: 9.0). Every later
`import lltm` from a checkout with an in-place build compiles for the same
list, so it must not differ between the build and the run either.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from pathlib import Path

# lltm/build.py by path: no torch, no native library needed here.
_spec = importlib.util.spec_from_file_location(
    "lltm_build", Path(__file__).resolve().parent.parent / "lltm" / "build.py")
build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(build.REPO_ROOT / "build" / "prebuilt-cuda"))
    parser.add_argument("--archs", default=os.environ.get("TORCH_CUDA_ARCH_LIST", "9.0"),
                        help="TORCH_CUDA_ARCH_LIST syntax (default: $TORCH_CUDA_ARCH_LIST, "
                        "else 9.0)")
    args = parser.parse_args()
    nvcc = build.find_nvcc()
    if nvcc is None:
        print("nvcc not found", file=sys.stderr)
        return 1
    archs = build._archs.parse_arch_list(args.archs)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.pop("LLTM_PREBUILT_CUDA", None)  # compile, do not copy
    for rel in build.CUDA_ONLY_SOURCES:
        if not rel.endswith(".cu"):
            continue
        obj = out / build.prebuilt_name(rel, build.portable_cuda_key(rel, nvcc, archs))
        if obj.exists():
            print(f"{obj}: up to date")
            continue
        start = time.perf_counter()
        build.compile_object(build.CSRC / rel, obj, nvcc=nvcc, archs=archs)
        print(f"{obj}: compiled in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
