"""The plans the chooser picks for an H100's properties, as the markdown table
of docs/cuda-plans.md ("The plans chosen on an H100").

    python3 dev/timing/plan_table.py [--T 100] [--batches 1,4,...] [--hidden 32,128,...]

No GPU needed: the sequence's .cu files are compiled by g++ against the CPU
emulator of the CUDA runtime (tests/cuda_emu, as tests/test_cuda_sequence_emulated.py
does), whose device is an H100 (132 SMs, 227 KB of shared memory a block,
compute capability 9.0) with one resident block of 256 threads of each
persistent kernel per SM, two of 128 (as the H100 runs the library's); on the GPU
the chooser asks the CUDA runtime.
"""
from __future__ import annotations

import argparse
import ctypes
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "csrc" / "core"
EMU = ROOT / "tests" / "cuda_emu"
sys.path.insert(0, str(ROOT / "tests"))

DTYPES = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 3, "float32-tf32": 0}
FAMILIES = {1: "steps", 2: "grid", 3: "cluster", 4: "block"}
EXCHANGES = {2: "bc", 3: "rs", 4: "local"}


def build(out: Path) -> ctypes.CDLL:
    sources = sorted(CORE.glob("lltm_cuda_seq*.cu")) + [CORE / "lltm_cuda_util.cu",
                                                        CORE / "lltm_cuda_rules.c"]
    flags = ["g++", "-std=c++17", "-O1", "-fPIC", "-w", "-x", "c++", "-I", str(EMU),
             "-I", str(CORE)]

    def one(src):
        obj = out / f"{src.stem}.o"
        subprocess.run(flags + ["-c", str(src), "-o", str(obj)], check=True)
        return obj
    with ThreadPoolExecutor(max_workers=2) as pool:
        objs = list(pool.map(one, sources))
    lib = out / "libplans.so"
    subprocess.run(["g++", "-shared", "-o", str(lib)] + [str(o) for o in objs], check=True)
    return ctypes.CDLL(str(lib))


def describe(p) -> str:
    family = FAMILIES.get(p.family, str(p.family))
    f, b = p.forward, p.backward
    if family == "grid":
        return (f"grid {f.lanes}x{f.values}/{f.chunk}{' TF32' if f.tf32 else ''}, "
                f"{f.blocks * f.groups} blocks ({f.groups} groups)")
    if family == "cluster":
        # blocks x units a block: the reduce-scatter's 256 / lanes units
        shape = f"16x{256 // b.lanes}u"
        split = f" x{f.groups}" if f.groups > 1 else ""
        return (f"cluster {shape}: fwd {f.lanes}x{f.values} r{f.rows}/{f.chunk}{split}, "
                f"bwd {EXCHANGES.get(b.exchange, b.exchange)}/{b.chunk}"
                + (f" x{b.groups}" if b.groups > 1 else ""))
    if family == "block":
        return f"block {f.lanes}x{f.values}/{f.chunk}, {f.groups} blocks"
    return family


def main(argv=None):
    from sequence_emu import Device, Options, Plan  # the ctypes structs
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--T", type=int, default=100)
    parser.add_argument("--batches", default="1,4,16,17,32,64,65,128,256,1024")
    parser.add_argument("--hidden", default="32,64,128,129,256,257,512,513,1024,1025,2048")
    parser.add_argument("--dtypes", default="float32,float32-tf32,bfloat16,float64",
                        help="float32-tf32: float32 with torch's TF32 setting on")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        lib = build(Path(tmp))
        i64, p = ctypes.c_int64, ctypes.c_void_p
        lib.lltm_cuda_device_query.argtypes = [ctypes.c_int, p]
        lib.lltm_sequence_plan_cuda.argtypes = [p, ctypes.c_int, i64, i64, i64, i64, p, p]
        dev = Device()
        assert lib.lltm_cuda_device_query(0, ctypes.byref(dev)) == 0
        dtypes = args.dtypes.split(",")
        print("| B | H | " + " | ".join(dtypes) + " |")
        print("|---|---|" + "---|" * len(dtypes))
        for B in map(int, args.batches.split(",")):
            for H in map(int, args.hidden.split(",")):
                cells = []
                for dt in dtypes:
                    dev.tf32 = int(dt.endswith("-tf32"))
                    plan = Plan()
                    status = lib.lltm_sequence_plan_cuda(ctypes.byref(dev), DTYPES[dt], args.T, B,
                                                         max(1, H // 2), H,
                                                         ctypes.byref(Options()),
                                                         ctypes.byref(plan))
                    if status != 0:
                        cells.append(f"error {status}")
                        continue
                    cells.append(describe(plan))
                print(f"| {B} | {H} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
