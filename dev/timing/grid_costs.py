"""The grid family's tensor-core pass terms (GRID_MMA_PASS, GRID_TF32_PASS of
csrc/core/lltm_cuda_cost.c) against times of forced plans: re-time the plans
of record files (JSON, "times": one layer's grid plan as lltm.overrides gives
it, T, B, I, H, dtype, us), and fit the terms to them.

    # on the GPU machine: every record's plan forced again, timed, written out
    python3 dev/timing/grid_costs.py time RECORDS.json ... --out DIR
    # anywhere (g++, no GPU): each kernel's pass term fitted to the times
    python3 dev/timing/grid_costs.py fit DIR/RECORDS.json ...

`time`: each record's plan (layout, chunk rows, batch groups; float32's
build, TF32 or FFMA) forced through lltm.overrides.sequence_plan, the plan
in force checked against the record's (else the record is dropped and
named), one layer's forward + backward timed by CUDA-graph replay
(wavefront_timing.graph_time: median of 5 timings of 5 replays), T, B, I, H
of the record; the outputs and gradients compared with the library's own
plan first (each tensor's largest difference within 3e-2 of its largest
value in the half types, 2e-2 in float32 on TF32; beyond that, both against
the float64 operator, and the forced plan must be within twice the library's
own plan's error: a check against a plan gone wrong, the tests hold the
accuracy bars). float32 records run with torch's TF32 on, as they were taken.

`fit`: the model's cost of each record on the emulated H100 (the .cu files
compiled by g++ against tests/cuda_emu, as plan_table.py does); a pass term
enters a plan's cost as T x (forward + backward passes) x term, so each
kernel's term (layout x chunk rows, half types or TF32) is moved by the
least squares of the relative errors of its records, the other terms held.
Prints the terms as the C arrays hold them, and the errors before and after.
"""
from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import re
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

# the grid layouts in the order the C arrays index them (lltm_cuda_grid_layouts.h)
LAYOUTS = tuple(f"{lanes}x{values}" for lanes, values in re.findall(
    r"\{(\d+), (\d+)\}", (ROOT / "csrc" / "core" / "lltm_cuda_grid_layouts.h").read_text()))
FIELDS = ("lanes", "values", "rows", "chunk", "blocks", "groups")


def plan_name(f: dict, b: dict) -> str:
    tf32 = " tf32" if f.get("tf32") else ""
    return (f"grid {f['lanes']}x{f['values']} r{f['rows']}/{f['chunk']} g{f['groups']} "
            f"b{f['blocks']}; bwd g{b['groups']} b{b['blocks']}{tf32}")


def time_records(paths, out_dir: Path) -> None:
    import torch

    import lltm
    from wavefront_timing import graph_time, lltm_case
    torch.backends.cudnn.allow_tf32 = True
    out_dir.mkdir(parents=True, exist_ok=True)
    for path in paths:
        data = json.loads(Path(path).read_text())
        kept, dropped = [], []
        for t in data["times"]:
            f = t["forward"]
            dtype = getattr(torch, t["dtype"])
            tf32 = dtype == torch.float32
            torch.backends.cuda.matmul.allow_tf32 = tf32
            constraints = dict(family="grid", grid_shape=f"{f['lanes']}x{f['values']}",
                               grid_chunk=f["chunk"], grid_groups=f["groups"])
            if tf32:
                constraints["grid_tf32"] = bool(f.get("tf32"))
            T, B, I, H = t["T"], t["B"], t["I"], t["H"]
            with lltm.overrides.sequence_plan(**constraints):
                plan = lltm.overrides.sequence_plan_in_force(dtype, T, B, I, H)
            same = plan is not None and all(
                plan[d][k] == t[d][k] for d in ("forward", "backward") for k in FIELDS)
            if not same:
                dropped.append(t["plan"])
                continue
            if I != H // 2:
                raise SystemExit(f"{t['plan']}: I = {I}, not H/2 as lltm_case makes it")
            step, outputs, oracle = lltm_case(B, H, T, 1, dtype)
            want = outputs()
            with lltm.overrides.sequence_plan(**constraints):
                got = outputs()
            if not close(got, want, dtype):  # both against the float64 operator's
                exact = oracle()
                forced, own = relative_error(got, exact), relative_error(want, exact)
                print(f"  {t['plan']}: error against float64 {forced:.2e}, the library's own "
                      f"plan {own:.2e}")
                if forced > 2 * own + 1e-3:
                    raise SystemExit(f"{t['plan']} B{B}/H{H}: error {forced:.2e} against "
                                     f"float64, the library's plan {own:.2e}")
            with lltm.overrides.sequence_plan(**constraints):
                us = graph_time(step, 5, 5)
            record = dict(t, forward=plan["forward"], backward=plan["backward"],
                          plan=plan_name(plan["forward"], plan["backward"]), us=round(us, 2))
            kept.append(record)
            print(f"{Path(path).name}: B{B}/H{H} {record['plan']}: {us:.1f} us "
                  f"(was {t['us']})", flush=True)
        data["machine"] = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                           "date": datetime.datetime.now(datetime.timezone.utc)
                           .isoformat(timespec="seconds"), "code": "(set by the caller)"}
        data["times"] = kept
        (out_dir / Path(path).name).write_text(
            "{" + ",\n ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in data.items()
                              if k != "times")
            + ',\n "times": [\n  ' + ",\n  ".join(json.dumps(r) for r in kept) + "\n ]}\n")
        print(f"{path}: {len(kept)} timed, {len(dropped)} dropped (plan not in force: "
              f"{', '.join(dropped) or '-'})")


def relative_error(got, want) -> float:
    """The largest difference of a tensor of `got` from `want`'s, over that
    tensor's largest value."""
    return max(((g.double() - w.double()).abs().max() / w.double().abs().max()).item()
               for g, w in zip(got, want))


def close(got, want, dtype) -> bool:
    import torch
    return relative_error(got, want) < (2e-2 if dtype == torch.float32 else 3e-2)


def kernel_of(t: dict) -> tuple[str, int, int] | None:
    """(build, chunk rows, layout index) of a record's tensor-core kernel,
    None for float32's FFMA build."""
    f = t["forward"]
    if t["dtype"] == "float32" and not f.get("tf32"):
        return None
    return ("tf32" if t["dtype"] == "float32" else "half", f["chunk"],
            LAYOUTS.index(f"{f['lanes']}x{f['values']}"))


def passes(t: dict) -> float:
    """T x the forward's and backward's passes a step (launch_passes)."""
    def one(launch):
        chunks = -(-t["B"] // launch["chunk"])
        return -(-chunks // launch["groups"])
    return t["T"] * (one(t["forward"]) + one(t["backward"]))


def model_costs(records, lib) -> list[float]:
    """The model's cost (lltm_sequence_plan_cost_cuda) of each record's grid
    plan, its launches as lltm.overrides gives them, on the emulated H100 (its
    TF32 setting on for float32, as the records were taken)."""
    import torch
    from sequence_emu import DTYPE_CODES, EXCHANGE_GLOBAL, GRID, Plan, device
    lib.lltm_sequence_plan_cost_cuda.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 4
    lib.lltm_sequence_plan_cost_cuda.restype = ctypes.c_double
    costs = []
    for t in records:
        plan = Plan(family=GRID, B=t["B"], H=t["H"],
                    dtype=DTYPE_CODES[getattr(torch, t["dtype"])])
        for name in ("forward", "backward"):
            for field, value in t[name].items():
                value = EXCHANGE_GLOBAL if field == "exchange" else value
                setattr(getattr(plan, name), field, value)
        dev = device(lib, tf32=int(t["dtype"] == "float32"))
        costs.append(lib.lltm_sequence_plan_cost_cuda(ctypes.byref(dev), ctypes.byref(plan),
                                                      t["T"], t["B"], t["I"], t["H"]))
    return costs


def fit(paths) -> None:
    from plan_table import build
    records = [t for p in paths for t in json.loads(Path(p).read_text())["times"]]
    with tempfile.TemporaryDirectory() as tmp:
        lib = build(Path(tmp))
        lib.lltm_cuda_device_query.argtypes = [ctypes.c_int, ctypes.c_void_p]
        costs = model_costs(records, lib)
    by_kernel: dict = {}
    for t, cost in zip(records, costs):
        key = kernel_of(t)
        if key is not None:
            by_kernel.setdefault(key, []).append((t, cost))
    print(f"{len(records)} records, {sum(len(v) for v in by_kernel.values())} on tensor cores")
    print("build chunk layout  n  delta_us  median_err before -> after  p90 before -> after")
    deltas, all_before, all_after = {}, [], []
    for key in sorted(by_kernel):
        rows = by_kernel[key]
        # minimize sum(((y - c - n d) / y)^2) over d
        num = sum(passes(t) * (t["us"] - c) / t["us"] ** 2 for t, c in rows)
        den = sum((passes(t) / t["us"]) ** 2 for t, c in rows)
        d = num / den
        deltas[key] = d
        before = sorted(abs(c - t["us"]) / t["us"] for t, c in rows)
        after = sorted(abs(c + passes(t) * d - t["us"]) / t["us"] for t, c in rows)
        all_before += before
        all_after += after
        print(f"{key[0]:5} {key[1]:5} {LAYOUTS[key[2]]:6} {len(rows):3} {d:+8.4f}  "
              f"{statistics.median(before):6.1%} -> {statistics.median(after):6.1%}  "
              f"{before[len(before) * 9 // 10]:6.1%} -> {after[len(after) * 9 // 10]:6.1%}")
    all_before.sort()
    all_after.sort()
    print(f"all: median {statistics.median(all_before):.1%} -> {statistics.median(all_after):.1%}"
          f", p90 {all_before[len(all_before) * 9 // 10]:.1%} -> "
          f"{all_after[len(all_after) * 9 // 10]:.1%}")
    half, tf32 = c_terms()
    for key, d in deltas.items():
        if key[0] == "half":
            half[key[1] == 4][key[2]] += d
        elif key[1] == 16:
            tf32[key[2]] += d
    rows = ",\n    ".join("{" + ", ".join(f"{v:.4f}" for v in row) + "}" for row in half)
    print(f"GRID_MMA_PASS[LLTM_GRID_CHUNK_COUNT][LLTM_GRID_LAYOUT_COUNT] = {{{rows}}};")
    print("GRID_TF32_PASS[4] = {" + ", ".join(f"{v:.4f}" for v in tf32) + "};")


def c_terms() -> tuple[list, list]:
    """GRID_MMA_PASS and GRID_TF32_PASS as lltm_cuda_cost.c has them."""
    text = (ROOT / "csrc" / "core" / "lltm_cuda_cost.c").read_text()

    def numbers(name):
        body = re.search(name + r"\[[^=]*=\s*(\{.*?\});", text, re.S).group(1)
        return [float(v) for v in re.findall(r"[-+]?\d+\.\d*(?:[eE][-+]?\d+)?", body)]
    half = numbers("GRID_MMA_PASS")
    return [half[:6], half[6:]], numbers("GRID_TF32_PASS")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    timing = sub.add_parser("time", help="re-time the records' plans (GPU)")
    timing.add_argument("files", nargs="+")
    timing.add_argument("--out", type=Path, required=True)
    fitting = sub.add_parser("fit", help="fit the pass terms to the times (no GPU)")
    fitting.add_argument("files", nargs="+")
    args = parser.parse_args(argv)
    if args.command == "time":
        time_records(args.files, args.out)
    else:
        fit(args.files)


if __name__ == "__main__":
    main()
