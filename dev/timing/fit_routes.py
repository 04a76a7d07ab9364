"""Fits the coefficients of the CUDA routes' cost model (csrc/core/lltm_cuda_cost.c)
to the times of ``python -m lltm.bench --sweep --sweep-variants`` (variants.json),
and says how well the model then chooses.

    python3 dev/timing/fit_routes.py variants.json [more.json ...] [--steps-from K]
        [--write-data PATH] [--only TERM,...]

Several runs may be given (later files replace a shape's times of earlier
ones, implementation by implementation; each run's float32 products on TF32
or not as its machine record says: a run with torch's allow_tf32 on fits the
TF32 rate); ``--steps-from K``: the per-step family's times only from the
K-th file on (0-based; earlier runs timed an older per-step kernel).
``--only TERM,...``: fit these sequence terms alone (e.g. a new family's
``block_step,block_work,block_stage`` from a run that timed only the shapes
it can run), every other coefficient as csrc/core/lltm_cuda_cost.c has it.

The model is linear in its coefficients (each a time per unit of a feature),
so they are fitted by least squares on relative errors, all of them >= 0.
The features are the ones lltm_cuda_cost.c computes, from the shape and the
plan the library ran (recorded with every time), for the H100's 132 SMs.
Prints the coefficients as C, each prediction against its measurement, and
per shape whether the cheapest prediction is the fastest measured (or within
the tolerance of it). ``--write-data PATH`` writes the measured medians with
their plans to PATH.
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

NT, BC = 256, 16
ELEM = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}
HALF = ("bfloat16", "float16")


def ceil_div(a, b):
    return -(-a // b)


# ----------------------------------------------------------------------------
# Sequence: features of one record (one layer, forward + backward, T steps).

SEQ_TERMS = ("call", "seq_flop_ffma", "seq_flop_tensor", "seq_flop_tf32", "seq_byte",
             "steps_step", "steps_step_ffma", "grid_step", "grid_work",
             "grid_stage", "cluster_step", "cluster_work", "cluster_stage", "block_step",
             "block_work", "block_stage", "persistent_byte")
SEQ_PRODUCTS = {"flop_ffma": "seq_flop_ffma", "flop_tensor": "seq_flop_tensor",
                "flop_tf32": "seq_flop_tf32", "byte": "seq_byte"}
STEPS_POINTWISE_ELEMS = 23  # lltm_cuda_cost.c: elements the two pointwise kernels move


def gemm_features(M, N, K, dtype, f, tf32=False):
    """One matrix product through cuBLAS: its flops (tensor cores for the half
    types, TF32 for float32 where allowed, FFMA otherwise) and the bytes it
    reads and writes."""
    rate = "flop_tensor" if dtype in HALF else "flop_tf32" if (tf32 and dtype == "float32") \
        else "flop_ffma"
    f[rate] += 2.0 * M * N * K
    f["byte"] += float(M * K + K * N + M * N) * ELEM[dtype]


def launch_passes(launch, B):
    """The passes of a step over a batch group's chunks."""
    return ceil_div(ceil_div(B, launch["chunk"]), launch["groups"])


def launch_work(launch, B):
    """Per-thread multiply-adds (per gate) of a step of one direction, and the
    state values a block stages: passes over its chunks x rows x values."""
    passes = ceil_div(ceil_div(B, launch["chunk"]), launch["groups"])
    return passes * launch["rows"] * launch["values"], passes * launch["chunk"]


def sequence_features(rec):
    """The sequence's products have rates of their own (seq_*): its large
    products over T * B rows and its per-step ones are not the cell's."""
    T, B, I, H, dtype = rec["T"], rec["B"], rec["I"], rec["H"], rec["dtype"]
    plan, tf32 = rec["plan"], rec.get("tf32", False)
    f = dict.fromkeys(SEQ_TERMS + tuple(SEQ_PRODUCTS), 0.0)
    f["call"] = 1.0
    # the products of every plan: x W_x^T for all steps, then dW and dx
    gemm_features(T * B, 3 * H, I, dtype, f, tf32)
    gemm_features(3 * H, H + I, T * B, dtype, f, tf32)
    gemm_features(T * B, I, 3 * H, dtype, f, tf32)
    family = plan["family"]
    if family == "steps":
        f["steps_step"] = T
        f["steps_step_ffma"] = T if dtype not in HALF else 0.0  # split-K products (FFMA, TF32)
        sub = dict.fromkeys(SEQ_PRODUCTS, 0.0)
        gemm_features(B, 3 * H, H, dtype, sub, tf32)   # h W_h^T
        gemm_features(B, H, 3 * H, dtype, sub, tf32)   # dG W_h
        sub["byte"] += STEPS_POINTWISE_ELEMS * B * H * ELEM[dtype]  # the pointwise kernels
        for k in SEQ_PRODUCTS:
            f[k] += T * sub[k]
    else:
        work = stage = 0.0
        for d in ("forward", "backward"):
            w, s = launch_work(plan[d], B)
            work += w
            stage += s * H
        # the block family's step is one thread's chain of math a pass over
        # its chunks: its latency counts once a pass, not once a step
        f[f"{family}_step"] = T * (launch_passes(plan["forward"], B) if family == "block" else 1)
        f[f"{family}_work"] = T * work
        f[f"{family}_stage"] = T * stage
        # what a step reads and writes of the gates and states in memory (as
        # the per-step kernels' pointwise passes do)
        f["persistent_byte"] = T * STEPS_POINTWISE_ELEMS * B * H * ELEM[dtype]
    for k, name in SEQ_PRODUCTS.items():
        f[name] = f.pop(k)
    return f


# ----------------------------------------------------------------------------
# Cell: features of one step (forward + backward) on each route.

CELL_TERMS = ("fused_call", "fused_flop_small", "fused_flop_medium", "fused_flop_large",
              "fused_flop_small_half", "fused_flop_medium_half", "fused_flop_large_half",
              "fused_rows", "fused_k", "fused_byte", "cublas_call", "cublas_call_ffma", "flop_ffma",
              "flop_tensor", "byte")
# csrc/core/lltm_cuda_cell_tiles.h: which tiles a fused kernel takes
LARGE_TILE_MIN_BLOCKS, MEDIUM_TILE_MIN_BLOCKS, MEDIUM_TILE_MIN_ROWS, MAX_GRID_Y = 120, 192, 9, 65535


def _tiles(large_blocks, small_blocks, rows_ok):
    if large_blocks >= LARGE_TILE_MIN_BLOCKS:
        return "large"
    return "medium" if small_blocks >= MEDIUM_TILE_MIN_BLOCKS and rows_ok else "small"


def fused_tiles(B, I, H):
    """The tiles ("small", "medium", "large") of the fused kernels (forward,
    weight gradient, input gradient): lltm_cuda_cell_tiles.h."""
    K = I + H
    rows_ok = B >= MEDIUM_TILE_MIN_ROWS
    forward = _tiles(ceil_div(B, 64) * ceil_div(H, 32), ceil_div(B, 8) * ceil_div(H, 2), rows_ok)
    weights = _tiles(ceil_div(H, 32) * ceil_div(K, 128), ceil_div(H, 8) * ceil_div(K, 16), True)
    if ceil_div(K, 8) > MAX_GRID_Y:
        inputs = "large"
    else:
        inputs = _tiles(ceil_div(B, 32) * ceil_div(K, 64), ceil_div(B, 8) * ceil_div(K, 4), rows_ok)
        if inputs == "small" and ceil_div(K, 4) > MAX_GRID_Y:
            inputs = "medium"
    return forward, weights, inputs


def cell_features(rec):
    B, I, H, dtype = rec["B"], rec["I"], rec["H"], rec["dtype"]
    K = I + H
    route = rec["route"]
    f = dict.fromkeys(CELL_TERMS, 0.0)
    flops = 3 * 2.0 * B * 3 * H * K  # the three products: gates, dW, dX
    if route == "fused":
        f["fused_call"] = 1.0
        half = "_half" if dtype in HALF else ""  # the half types convert every load
        tiles = fused_tiles(B, I, H)
        for t in tiles:  # each kernel a third of the flops
            f[f"fused_flop_{t}{half}"] += flops / 3
        # W read by the forward and by dX, dW written: what bounds a small batch
        f["fused_byte"] = 3.0 * 3 * H * K * ELEM[dtype]
        # the reductions one thread runs alone: over the B rows (the weight
        # gradient's sums) and over K = I + H (a gate's sum, dX's sums: the
        # small tiles', split fewest ways for their work; half a term each)
        f["fused_rows"] = float(B)
        f["fused_k"] = float(K) * ((tiles[0] == "small") + (tiles[2] == "small")) / 2
    else:
        f["cublas_call"] = 1.0
        f["cublas_call_ffma"] = 0.0 if dtype in HALF else 1.0  # FFMA products' own latency
        for M, N, KK in ((B, 3 * H, K), (3 * H, K, B), (B, H, 3 * H), (B, I, 3 * H)):
            gemm_features(M, N, KK, dtype, f)
    return f


# ----------------------------------------------------------------------------
# Fitting.

def fit(rows, terms, fixed=None):
    """Non-negative least squares on relative errors: coefficients per term;
    ``fixed``: terms whose coefficients are given (their part is taken off
    the times first)."""
    fixed = fixed or {}
    free = [t for t in terms if t not in fixed]
    X = np.array([[r["features"][t] for t in free] for r in rows], dtype=float)
    y = np.array([r["us"] for r in rows], dtype=float)
    known = np.array([sum(fixed[t] * r["features"][t] for t in fixed) for r in rows])
    Xw, yw = X / y[:, None], (y - known) / y
    used = [j for j in range(len(free)) if X[:, j].any()]
    coef = np.zeros(len(free))
    coef[used] = _nnls(Xw[:, used], yw)
    return {t: fixed[t] if t in fixed else coef[free.index(t)] for t in terms}


def _nnls(A, b, iters=20000):
    """Projected gradient with column scaling (no SciPy needed)."""
    scale = np.linalg.norm(A, axis=0)
    scale[scale == 0] = 1.0
    As = A / scale
    x = np.maximum(np.linalg.lstsq(As, b, rcond=None)[0], 0.0)
    L = np.linalg.norm(As, 2) ** 2
    for _ in range(iters):
        x_new = np.maximum(x - As.T @ (As @ x - b) / L, 0.0)
        if np.allclose(x_new, x, rtol=1e-12, atol=1e-15):
            break
        x = x_new
    return x / scale


def predict(coef, features):
    return sum(coef[t] * v for t, v in features.items())


# ----------------------------------------------------------------------------

def load(path):
    with open(path) as f:
        return json.load(f)


def timed(rec):
    stat = rec.get(rec.get("figure") or "graph_step")
    return stat.get("median_us") if isinstance(stat, dict) else None


def sequence_rows(results):
    """The forced plans' times, and the library's choice where it ran a plan
    no forced one was timed in (H = 2048: the per-step kernels, the only
    plan there)."""
    forced = {(r["dtype"], r["tf32"], r["T"], r["B"], r["H"], r["plan"]["family"])
              for r in results
              if r["kind"] == "sequence" and r["impl"].startswith("lltm[")
              and r["status"] == "ok" and isinstance(r.get("plan"), dict)
              and "family" in r["plan"] and timed(r)}
    rows = []
    for rec in results:
        if rec["kind"] != "sequence" or not rec["impl"].startswith("lltm") \
                or rec["status"] != "ok" or not isinstance(rec.get("plan"), dict) \
                or "family" not in rec["plan"]:
            continue
        if rec["impl"] == "lltm" and (rec["dtype"], rec["tf32"], rec["T"], rec["B"], rec["H"],
                                      rec["plan"]["family"]) in forced:
            continue
        us = timed(rec)
        if us:
            rows.append({"rec": rec, "us": us, "features": sequence_features(rec)})
    return rows


def cell_rows(results):
    rows = []
    for rec in results:
        if rec["kind"] != "cell" or not rec["impl"].startswith("native[") \
                or rec["status"] != "ok" or rec.get("plan") not in ("fused", "cublas"):
            continue
        us = timed(rec)
        if us:
            rec = dict(rec, route=rec["plan"])
            rows.append({"rec": rec, "us": us, "features": cell_features(rec)})
    return rows


def report(rows, coef, name, tolerance):
    print(f"\n== {name}: coefficients (us per unit)")
    for t, c in coef.items():
        print(f"  {t:>16} {c:.6g}")
    errs = [predict(coef, r["features"]) / r["us"] - 1 for r in rows]
    print(f"  {len(rows)} times; relative error median {np.median(np.abs(errs)):.1%}, "
          f"max {np.max(np.abs(errs)):.1%}")
    shapes = {}
    for r in rows:
        rec = r["rec"]
        key = (rec["dtype"] + (" tf32" if rec.get("tf32") else ""), rec["T"], rec["B"], rec["H"])
        shapes.setdefault(key, []).append(r)
    agree = 0
    for key, rs in sorted(shapes.items()):
        fastest = min(rs, key=lambda r: r["us"])
        chosen = min(rs, key=lambda r: predict(coef, r["features"]))
        ok = chosen["us"] <= (1 + tolerance) * fastest["us"]
        agree += ok
        if not ok:
            print(f"  {key}: model picks {chosen['rec']['impl']} ({chosen['us']:.0f} us), "
                  f"fastest {fastest['rec']['impl']} ({fastest['us']:.0f} us)")
    print(f"  {agree}/{len(shapes)} shapes: the model's pick within {tolerance:.0%} of the "
          "fastest")


C_NAMES = {"call": "C_CALL", "flop_ffma": "C_FLOP_FFMA", "flop_tensor": "C_FLOP_TENSOR",
           "byte": "C_BYTE", "steps_step": "C_STEPS_STEP", "grid_step": "C_GRID_STEP",
           "grid_work": "C_GRID_WORK", "grid_stage": "C_GRID_STAGE",
           "cluster_step": "C_CLUSTER_STEP", "cluster_work": "C_CLUSTER_WORK",
           "cluster_stage": "C_CLUSTER_STAGE", "block_step": "C_BLOCK_PASS",
           "block_work": "C_BLOCK_WORK", "block_stage": "C_BLOCK_STAGE",
           "fused_call": "C_FUSED_CALL",
           "fused_flop_small": "C_FUSED_FLOP_SMALL", "fused_flop_large": "C_FUSED_FLOP_LARGE",
           "fused_flop_small_half": "C_FUSED_FLOP_SMALL_HALF",
           "fused_flop_large_half": "C_FUSED_FLOP_LARGE_HALF",
           "fused_flop_medium": "C_FUSED_FLOP_MEDIUM",
           "fused_flop_medium_half": "C_FUSED_FLOP_MEDIUM_HALF",
           "fused_rows": "C_FUSED_ROWS", "fused_k": "C_FUSED_K", "fused_byte": "C_FUSED_BYTE",
           "flop_tf32": "C_FLOP_TF32",
           "cublas_call": "C_CUBLAS_CALL", "cublas_call_ffma": "C_CUBLAS_CALL_FFMA",
           "steps_step_ffma": "C_STEPS_STEP_FFMA",
           "seq_flop_ffma": "C_SEQ_FLOP_FFMA", "seq_flop_tensor": "C_SEQ_FLOP_TENSOR",
           "seq_flop_tf32": "C_SEQ_FLOP_TF32", "seq_byte": "C_SEQ_BYTE",
           "persistent_byte": "C_PERSISTENT_BYTE"}


def compact_plan(plan) -> str:
    """A plan as one short string: the family, and a persistent plan's layout
    and batch groups (as the GPU ran it)."""
    if isinstance(plan, str):
        return plan
    family = plan["family"]
    if family == "steps":
        return family
    f = plan["forward"]
    return f"{family} {f['lanes']}x{f['values']} r{f['rows']}/{f['chunk']} g{f['groups']} " \
           f"b{f['blocks']}; bwd {plan['backward']['exchange']} g{plan['backward']['groups']}"


def print_c(coef, rows=()):
    """The coefficients as C; a term no record has (e.g. TF32 where no run
    timed it) is marked, not given as 0."""
    seen = {t for r in rows for t, v in r["features"].items() if v}
    for term, value in coef.items():
        if rows and term not in seen:
            print(f"/* {C_NAMES[term]}: not in the data */")
        else:
            print(f"#define {C_NAMES[term]} {value:.4g}")


def shipped_coefficients(terms):
    """The coefficients of `terms` as csrc/core/lltm_cuda_cost.c defines them."""
    import re
    from pathlib import Path
    text = (Path(__file__).resolve().parents[2] / "csrc" / "core" / "lltm_cuda_cost.c").read_text()
    values = dict(re.findall(r"^#define (C_\w+) ([-+.eE0-9]+)\s*$", text, re.M))
    seq_names = {"seq_flop_ffma": "C_SEQ_FLOP_FFMA", "seq_flop_tensor": "C_SEQ_FLOP_TENSOR",
                 "seq_flop_tf32": "C_SEQ_FLOP_TF32", "seq_byte": "C_SEQ_BYTE",
                 "steps_step_ffma": "C_STEPS_STEP_FFMA",
                 "persistent_byte": "C_PERSISTENT_BYTE"}
    return {t: float(values[seq_names.get(t) or C_NAMES[t]]) for t in terms}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", nargs="+")
    parser.add_argument("--steps-from", type=int, default=0, metavar="K")
    parser.add_argument("--tolerance", type=float, default=0.15)
    parser.add_argument("--write-data", metavar="PATH")
    parser.add_argument("--only", metavar="TERM,...")
    args = parser.parse_args(argv)
    merged = {}
    for index, path in enumerate(args.json):
        data = load(path)
        tf32 = bool((data["machine"].get("tf32") or {}).get("matmul"))
        for rec in data["results"]:
            plan = rec.get("plan")
            if index < args.steps_from and isinstance(plan, dict) \
                    and plan.get("family") == "steps":
                continue
            rec = dict(rec, tf32=tf32 and rec["dtype"] == "float32")
            merged[(rec["kind"], rec["dtype"], rec["tf32"], rec["T"], rec["B"], rec["H"],
                    rec["impl"])] = rec
    results = list(merged.values())
    seq, cell = sequence_rows(results), cell_rows(results)
    if not seq and not cell:
        sys.exit("no CUDA times with plans in " + " ".join(args.json))
    if cell:
        coef = fit(cell, CELL_TERMS)
        report(cell, coef, "cell", args.tolerance)
        print_c(coef, cell)
    if seq:
        only = args.only.split(",") if args.only else []
        fixed = shipped_coefficients([t for t in SEQ_TERMS if t not in only]) if only else None
        coef = fit(seq, SEQ_TERMS, fixed)
        report(seq, coef, "sequence", args.tolerance)
        print_c(coef, seq)
    if args.write_data:
        keep = []
        for r in seq + cell:
            rec = r["rec"]
            keep.append({k: rec[k] for k in ("kind", "dtype", "T", "B", "I", "H", "impl")}
                        | ({"tf32": True} if rec["tf32"] else {})
                        | {"plan": compact_plan(rec["plan"]), "us": round(r["us"], 2)})
        with open(args.write_data, "w") as f:
            f.write('{"machine": ' + json.dumps({k: data["machine"].get(k) for k in
                                                  ("date", "gpus", "torch", "git")}))
            f.write(',\n "source": "python -m lltm.bench --sweep --sweep-variants; '
                    'dev/timing/fit_routes.py --write-data",\n "times": [\n')
            f.write(",\n".join(json.dumps(t) for t in keep) + "]}\n")
        print(f"saved {args.write_data}")


if __name__ == "__main__":
    main()
