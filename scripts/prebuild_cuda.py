"""Compile the CUDA sources here (nvcc, no GPU needed) for the GPU machine,
whose build then copies these objects instead of running nvcc (minutes of
its time): lltm/build.py takes an object from $LLTM_PREBUILT_CUDA when the
fingerprint recorded beside it (nvcc version, flags, source, every header)
matches its own, and compiles otherwise.

    python3 scripts/prebuild_cuda.py [--out build/prebuilt-cuda]
    # then on the GPU machine (the folder carried there):
    LLTM_PREBUILT_CUDA=build/prebuilt-cuda python3 lltm/build.py --cuda yes
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from lltm import build  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(build.REPO_ROOT / "build" / "prebuilt-cuda"))
    args = parser.parse_args()
    nvcc = build.find_nvcc()
    if nvcc is None:
        print("nvcc not found", file=sys.stderr)
        return 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.pop("LLTM_PREBUILT_CUDA", None)  # compile, do not copy
    for rel in build.CUDA_ONLY_SOURCES:
        src = build.CSRC / rel
        if src.suffix != ".cu":
            continue
        obj = out / (src.name + ".o")
        record = obj.with_name(obj.name + ".sha256")
        fingerprint = build.cuda_object_fingerprint(nvcc, src)
        if obj.exists() and record.exists() and record.read_text().strip() == fingerprint:
            print(f"{obj}: up to date")
            continue
        start = time.perf_counter()
        build._compile_cu(nvcc, src, obj, verbose=False)
        record.write_text(fingerprint + "\n")
        print(f"{obj}: compiled in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
