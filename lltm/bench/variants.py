"""Every route of the CUDA library timed per shape:
``python -m lltm.bench --sweep --sweep-variants``.

The data behind the library's own choice of kernels (docs/cuda-plans.md). Per
shape (B, H, I = H/2, T, one layer) and dtype:

  sequence  lltm.LLTM with each plan forced through lltm.overrides: the cluster
            family (clusters of 16 blocks), the grid family in each layout
            that holds H (16x8, 16x32, 32x16, 32x32; the half types also
            8x64, 16x64), the block family in 1- and 4-row chunks (H <= 64), the
            per-step kernels; the library's own choice
            ("lltm"); cuDNN's nn.LSTM; the loop of reference cells
  cell      the native cell on each matrix-product route (fused, cuBLAS) and
            on the library's choice ("native"); the reference; nn.LSTMCell

Each implementation is checked against the float64 oracle first, as the
benchmark does (a WRONG or ERROR one is not timed; a forced plan that does not
fit the shape on the device is ERROR with the chooser's reason). The figure is
the GPU time of one forward + backward by CUDA-graph replay (on the CPU, where
the library has one plan and the overrides nothing to act on: the eager
pipelined step, so that the bookkeeping runs anywhere). Each record carries
the plan (or route) the library ran, as lltm.overrides reports it.

Adaptive: shapes run cheapest first; at each shape the library's choice is
timed first, and another implementation is not timed (its check still runs)
where its time foreseen from the same implementation at the last smaller
shape (scaled by the arithmetic) is above ``SLOW_FACTOR`` times the choice's
and above ``SLOW_FLOOR_US``; no shape starts that would end past
``--sweep-time-limit``. Implementations are timed one after the other (one
CUDA graph alive at a time), each in 3 to 5 samples filling
``--sweep-budget-ms``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import time
from typing import Sequence

import torch

from .. import overrides
from .cases import Impl, Workload, bar_references, default_impls
from .report import Progress, describe_machine, finite, load_average
from .runner import Options, check_workload, new_record
from .sweep import Shape, SweepOptions, _max_bytes, _timed_passes, _why_not, estimate_bytes
from .timing import GraphStepTimer, StepTimer, reason, summarize

BATCHES = (1, 4, 16, 32, 64, 128, 256, 512, 1024)
SEQUENCE_HIDDEN = (64, 128, 256, 512, 1024, 2048)
CELL_HIDDEN = (128, 512, 1024)
SEQ_LEN = 100
# more sequence lengths, at a few (B, H): how the time grows with T
EXTRA_SEQ_LENS = (20, 1000)
EXTRA_BATCHES = (16, 256)
EXTRA_HIDDEN = (128, 1024)
QUICK_BATCHES = (1, 16, 64)
QUICK_SEQUENCE_HIDDEN = (64, 128, 256)
QUICK_CELL_HIDDEN = (128, 512)
QUICK_SEQ_LEN = 20

SLOW_FACTOR = 8.0         # not timed when foreseen above this many times the choice's time
SLOW_FLOOR_US = 30_000.0  # ... and above this (a step, forward + backward)
DEFAULT_BUDGET_MS = 20.0
QUICK_BUDGET_MS = 10.0
DEFAULT_TIME_LIMIT_S = 400.0

GRID_SHAPES = overrides.GRID_SHAPES
# the op's error where a forced plan does not fit (csrc/binding/sequence_cuda.c)
UNFIT_ERROR = "no plan of the forced kernel family"


@dataclasses.dataclass(frozen=True)
class Variant:
    """One route of ours: the implementation it forces (``base``) and how."""
    key: str
    base: str                   # "lltm" (sequence) or "native" (cell)
    plan: dict                  # lltm.overrides.sequence_plan(**plan), or
    matmul: str | None = None   # lltm.overrides.matmul(matmul)

    def scope(self) -> contextlib.AbstractContextManager:
        if self.matmul is not None:
            return overrides.matmul(self.matmul)
        if self.plan:
            return overrides.sequence_plan(**self.plan)
        return contextlib.nullcontext()

    def fits(self, B: int, H: int, dtype: torch.dtype) -> str | None:
        """Why the forced plan cannot hold the shape (by the plans' documented
        limits, lltm.h), or None; the chooser has the last word."""
        family = self.plan.get("family")
        if family == "cluster":
            rows = 32 if dtype == torch.float64 else 64
            # past H = 128 the 16-block clusters of 16 units a block, in 4-
            # or 8-row clusters (all of them at once: B <= 56 on an H100)
            most = 256 if self.plan.get("cluster_chunk") != 16 and \
                dtype != torch.float64 else 128
            if H > most or B > rows:
                return f"cluster plans hold H <= {most} and B <= {rows}"
        if family == "grid" and "grid_shape" not in self.plan:  # the cheapest layout
            most = 512 if dtype == torch.float64 else 1024
            return f"grid layouts hold H <= {most}" if H > most else None
        if family == "block" and H > overrides.BLOCK_UNITS:
            return f"block plans hold H <= {overrides.BLOCK_UNITS}"
        if family == "grid":
            lanes, values = map(int, self.plan["grid_shape"].split("x"))
            if H > lanes * values:
                return f"grid {lanes}x{values} holds H <= {lanes * values}"
            if dtype == torch.float64 and values == 32:
                return "no 32-value grid layouts in float64"
            if values == 64 and dtype not in (torch.float16, torch.bfloat16):
                return "64-value grid layouts in the half types only"
        return None


AUTO = {"sequence": "lltm", "cell": "native"}
SEQUENCE_VARIANTS = (
    Variant("lltm[cluster 16]", "lltm", {"family": "cluster", "cluster_blocks": 16}),
    *(Variant(f"lltm[grid {g}]", "lltm", {"family": "grid", "grid_shape": g, "grid_chunk": 16})
      for g in GRID_SHAPES),
    # the rules' grid layout in 4-row chunks (they weigh them against
    # 16-row ones by B and H)
    Variant("lltm[grid, 4-row chunks]", "lltm", {"family": "grid", "grid_chunk": 4}),
    *(Variant(f"lltm[block, {c}-row chunks]", "lltm", {"family": "block", "block_chunk": c})
      for c in overrides.BLOCK_CHUNKS),
    Variant("lltm[steps]", "lltm", {"family": "steps"}),
)
CELL_VARIANTS = (Variant("native[fused]", "native", {}, "fused"),
                 Variant("native[cublas]", "native", {}, "cublas"))
# the peers, timed beside ours; the reference first: below float64 its error
# sets the bar of the LLTM implementations checked after it
PEERS = {"sequence": ("reference_loop", "lstm"), "cell": ("reference", "lstm_cell")}


def variant_impl(base: Impl, variant: Variant) -> Impl:
    """``base`` run under ``variant``'s override, at every call."""
    def build(w: Workload):
        with variant.scope():
            case = base.build(w)
        case.scope = variant.scope
        return case
    return Impl(variant.key, f"{base.label} {variant.key[len(variant.base):]}", base.kind,
                build, available=base.available, note=base.note,
                graph_unroll=base.graph_unroll)


def implementations(kind: str,
                    extra_impls: Sequence[Impl] = ()) -> list[tuple[Impl, Variant | None]]:
    """(implementation, its variant or None) of one kind, in checking order:
    the reference, the library's choice, the forced variants, the other peer.
    ``extra_impls`` replace the implementations of the same key (tests)."""
    by_key = {i.key: i for i in default_impls()}
    by_key.update({i.key: i for i in extra_impls})
    reference, peer = PEERS[kind]
    variants = SEQUENCE_VARIANTS if kind == "sequence" else CELL_VARIANTS
    ours = by_key[AUTO[kind]]
    out = [(by_key[reference], None), (ours, None)]
    out += [(by_key.get(v.key) or variant_impl(ours, v), v) for v in variants]
    return out + [(by_key[peer], None)]


# ----------------------------------------------------------------------------
# The shapes.

def shapes(args, quick: bool) -> list[Shape]:
    """Cheapest first. --sweep-batches / --sweep-hidden / --seq-len replace
    the defaults (a given --seq-len: that T only)."""
    batches = args.sweep_batches or (QUICK_BATCHES if quick else BATCHES)
    given_t = args.seq_len
    out = []
    if args.sweep_kind in ("sequence", "both") and (given_t is None or given_t > 0):
        hidden = args.sweep_hidden or (QUICK_SEQUENCE_HIDDEN if quick else SEQUENCE_HIDDEN)
        T = given_t if given_t is not None else (QUICK_SEQ_LEN if quick else SEQ_LEN)
        out += [Shape("sequence", B, H, T, 1) for B in batches for H in hidden]
        if given_t is None and not quick and not args.sweep_batches and not args.sweep_hidden:
            out += [Shape("sequence", B, H, t, 1) for t in EXTRA_SEQ_LENS
                    for B in EXTRA_BATCHES for H in EXTRA_HIDDEN]
    if args.sweep_kind in ("cell", "both"):
        hidden = args.sweep_hidden or (QUICK_CELL_HIDDEN if quick else CELL_HIDDEN)
        out += [Shape("cell", B, H, 1, 1) for B in batches for H in hidden]
    return sorted(set(out), key=lambda s: (s.cost(), s.kind, s.B, s.H, s.T))


# ----------------------------------------------------------------------------
# Running one shape.

@dataclasses.dataclass
class History:
    """The last time measured per (kind, dtype, implementation): (cost, us)."""
    times: dict = dataclasses.field(default_factory=dict)

    def foresee(self, shape: Shape, dtype, key: str) -> float | None:
        last = self.times.get((shape.kind, str(dtype), key))
        if last is None:
            return None
        cost, us = last
        return us * max(1.0, shape.cost() / cost)

    def record(self, shape: Shape, dtype, key: str, us: float) -> None:
        self.times[(shape.kind, str(dtype), key)] = (shape.cost(), us)


def plan_in_force(variant: Variant | None, w: Workload) -> dict | str | None:
    """What the library runs for ``w`` under ``variant`` (None: its choice)."""
    if w.device.type != "cuda":
        return None
    with (variant.scope() if variant else contextlib.nullcontext()):
        if w.kind == "sequence":
            return overrides.sequence_plan_in_force(w.dtype, w.T, w.B, w.I, w.H,
                                                    device=w.device.index)
        return overrides.cell_route_in_force(w.dtype, w.B, w.I, w.H, device=w.device.index)


def run_shape(shape: Shape, w: Workload, impls: list[tuple[Impl, Variant | None]],
              sopts: SweepOptions, history: History, progress: Progress) -> list[dict]:
    """Check every implementation of one shape, then time those that passed,
    the library's choice first."""
    records: list[dict] = []
    runnable = []
    for impl, variant in impls:
        why = variant.fits(w.B, w.H, w.dtype) if variant else None
        if impl.key == PEERS[w.kind][0] and w.kind == "sequence" and \
                2 * estimate_bytes(shape, w.dtype) > sopts.max_bytes:
            # the loop keeps every step's tensors (the check's bar then comes
            # from the checkpointed loop, which is not timed)
            why = f"not run: would need about {2 * estimate_bytes(shape, w.dtype) / 2**30:.0f} GiB"
        if why:
            rec = new_record(w, impl)
            rec.update(status="unfit" if variant else "skipped", note=why,
                       variant=dataclasses.asdict(variant) if variant else None)
            records.append(rec)
            progress.update(1, f"{w.name}: {impl.key} does not fit")
        else:
            runnable.append((impl, variant))
    opts = Options(reps=0, seq_reps=0, passes=0, warmup=0, graphs=sopts.graphs,
                   compile_on_cpu=False)
    checked, cases = check_workload(w, [i for i, _ in runnable], opts, progress,
                                    references=bar_references())
    variants = {impl.key: variant for impl, variant in runnable}
    unroll = {impl.key: impl.graph_unroll for impl, _ in runnable}
    for rec in checked:
        variant = variants[rec["impl"]]
        rec["variant"] = dataclasses.asdict(variant) if variant else None
        if variant and rec["status"] == "ERROR" and UNFIT_ERROR in (rec["note"] or ""):
            rec["status"] = "unfit"  # the chooser's word: the forced plan does not fit
        if rec["impl"] == AUTO[w.kind] or variant is not None:
            try:
                rec["plan"] = plan_in_force(variant, w)
            except Exception as error:  # noqa: BLE001
                rec["plan"] = {"n/a": reason(error)}
    records += checked
    by_key = {r["impl"]: r for r in records}
    auto = AUTO[w.kind]
    order = sorted(cases, key=lambda k: k != auto)  # the library's choice first
    figure = "graph_step" if w.device.type == "cuda" and sopts.graphs else "step"
    for key in order:
        rec = by_key[key]
        rec["figure"] = figure
        foreseen = history.foresee(shape, w.dtype, key)
        chosen = _median(by_key.get(auto), figure)
        if key != auto and foreseen is not None and chosen is not None and \
                foreseen > max(SLOW_FACTOR * chosen, SLOW_FLOOR_US):
            rec[figure] = {"n/a": f"not timed: foreseen ~{foreseen / 1e3:.0f} ms a step, over "
                                  f"{SLOW_FACTOR:g}x the library's choice ({chosen / 1e3:.1f} ms)"}
            rec["foreseen_us"] = foreseen
            progress.update(1, f"{w.name}: {key} not timed")
            continue
        rec[figure] = _time_one(w, cases[key], unroll[key], sopts, figure)
        us = _median(rec, figure)
        if us is not None:
            history.record(shape, w.dtype, key, us)
        progress.update(1, f"{w.name}: timed {key}")
    del cases
    if w.device.type == "cuda":
        torch.cuda.empty_cache()
    return records


def _time_one(w: Workload, case, unroll: int, sopts: SweepOptions, figure: str) -> dict | None:
    """Samples of one implementation (``figure``): its summary, or {"n/a": why}."""
    failed: dict[str, str] = {}
    if figure == "graph_step":
        timer = GraphStepTimer(case, w.device, unroll)
        why = timer.capture()
        if why:
            timer.release()
            return {"n/a": why}
    else:
        timer = StepTimer(case, w.device)
    try:
        _timed_passes({"one": timer}, sopts, failed)
    finally:
        if figure == "graph_step":
            timer.release()
    if failed:
        return {"n/a": f"failed while timed: {failed['one']}"}
    return summarize(timer.samples)


def _median(rec: dict | None, figure: str) -> float | None:
    stat = rec.get(figure) if rec else None
    return stat.get("median_us") if isinstance(stat, dict) else None


# ----------------------------------------------------------------------------
# The summary: per shape, the times of every implementation and the fastest.

def summary(records: list[dict]) -> list[dict]:
    """One entry per (device, kind, dtype, T, B, H): each implementation's
    median (us), the fastest of ours and its time against the library's
    choice (auto / fastest: 1 when the choice is the fastest)."""
    groups: dict[tuple, list[dict]] = {}
    for rec in records:
        key = (rec["device"], rec["kind"], rec["dtype"], rec["T"], rec["B"], rec["H"])
        groups.setdefault(key, []).append(rec)
    out = []
    for (device, kind, dtype, T, B, H), recs in groups.items():
        times = {r["impl"]: _median(r, r.get("figure") or "graph_step") for r in recs}
        times = {k: v for k, v in times.items() if v is not None}
        auto = AUTO[kind]
        ours = {k: v for k, v in times.items() if k.startswith(auto)}
        best = min(ours, key=ours.get) if ours else None
        entry = {"device": device, "kind": kind, "dtype": dtype, "T": T, "B": B, "H": H,
                 "I": recs[0]["I"], "times_us": times, "fastest": best,
                 "auto_plan": next((r.get("plan") for r in recs if r["impl"] == auto), None)}
        if best and auto in times:
            entry["auto_over_fastest"] = times[auto] / times[best]
        out.append(entry)
    return out


def format_summary(entries: list[dict]) -> str:
    lines = []
    blocks: dict[tuple, list[dict]] = {}
    for e in entries:
        blocks.setdefault((e["device"], e["kind"], e["dtype"], e["T"]), []).append(e)
    for (device, kind, dtype, T), es in blocks.items():
        keys = []
        for e in es:
            keys += [k for k in e["times_us"] if k not in keys]
        lines.append(f"== {device} | {kind} | {dtype}" + (f" | T={T}" if kind == "sequence"
                                                          else "") + " | I=H/2")
        lines.append("  microseconds per forward+backward; * the fastest of ours; "
                     "auto/fastest: the library's choice against it")
        lines.append("  " + " ".join(f"{k:>18}" for k in ["B, H"] + keys + ["auto/fastest"]))
        for e in sorted(es, key=lambda e: (e["B"], e["H"])):
            cells = []
            for k in keys:
                t = e["times_us"].get(k)
                cells.append("-" if t is None else f"{t:,.1f}" + ("*" if k == e["fastest"]
                                                                  else ""))
            ratio = e.get("auto_over_fastest")
            cells.append("-" if ratio is None else f"{ratio:.2f}")
            lines.append("  " + " ".join(f"{c:>18}" for c in [f"{e['B']}, {e['H']}"] + cells))
        lines.append("")
    return "\n".join(lines)


# ----------------------------------------------------------------------------
# Entry point (from lltm.bench.sweep.run).

def run(args, parser, argv, extra_impls: Sequence[Impl] = ()) -> dict:
    """Every route per shape: returns {"machine", "config", "results",
    "summary"}, printed as tables and saved as JSON where asked (--json, or
    DIR/variants.json with --sweep-out DIR)."""
    quick = args.sweep_quick or args.quick
    if args.only or args.skip:
        parser.error("--only / --skip do not apply to --sweep-variants")
    if args.layers and list(args.layers) != [1]:
        parser.error("--sweep-variants times one layer (--layers 1)")
    devices = args.device or [torch.device("cuda" if torch.cuda.is_available() else "cpu")]
    dtypes = args.dtype or ([torch.float32, torch.bfloat16]
                            if any(d.type == "cuda" for d in devices) else [torch.float32])
    plan = shapes(args, quick)
    budget_ms = args.sweep_budget_ms or (QUICK_BUDGET_MS if quick else DEFAULT_BUDGET_MS)
    time_limit = args.sweep_time_limit
    if time_limit is None:
        time_limit = DEFAULT_TIME_LIMIT_S
    impls = {kind: implementations(kind, extra_impls) for kind in ("sequence", "cell")}
    total = sum(2 * len(impls[s.kind]) for s in plan) * len(dtypes) * len(devices)
    progress = Progress(total, enabled=not args.no_progress)
    machine = describe_machine()
    start, records, options = time.perf_counter(), [], {}
    try:
        for device in devices:
            sopts = SweepOptions(budget_us=budget_ms * 1e3, min_passes=3, max_passes=5,
                                 time_limit_s=time_limit,
                                 max_bytes=_max_bytes(device, args.sweep_max_gib),
                                 graphs=not args.no_graphs)
            options[str(device)] = dataclasses.asdict(sopts)
            records += _run_device(device, dtypes, plan, impls, sopts, progress, start,
                                   lambda recs: _save_partial(args, argv, records + recs))
    finally:
        progress.close()
    machine["load_average_end"] = load_average()
    wall = time.perf_counter() - start
    config = {"argv": list(argv) if argv is not None else sys.argv[1:], "quick": quick,
              "variants": True, "devices": [str(d) for d in devices],
              "dtypes": [str(d).replace("torch.", "") for d in dtypes],
              "shapes": [dataclasses.asdict(s) | {"I": s.I} for s in plan],
              "options": options, "slow_factor": SLOW_FACTOR, "slow_floor_us": SLOW_FLOOR_US,
              "wall_s": wall}
    result = {"machine": machine, "config": config, "results": records,
              "summary": summary(records)}
    print(format_summary(result["summary"]))
    print(f"sweep variants: {len(result['summary'])} shapes in {wall:.1f} s")
    _save(args, result)
    return result


def _run_device(device, dtypes, plan, impls, sopts, progress, start,
                checkpoint=lambda records: None) -> list[dict]:
    """Every shape on one device; ``checkpoint(records so far)`` after each
    shape (the partial JSON: a run cut short keeps what it measured)."""
    history, records, last = History(), [], {}
    for shape in plan:
        for dtype, w in shape.workloads(device, dtypes):
            began = time.perf_counter()
            why = _why_not(shape, dtype, sopts, began - start, last.get((shape.kind, dtype)))
            if why:
                for impl, variant in impls[shape.kind]:
                    rec = new_record(w, impl)
                    rec.update(status="skipped", note=why,
                               variant=dataclasses.asdict(variant) if variant else None)
                    records.append(rec)
                progress.update(2 * len(impls[shape.kind]), f"{w.name}: skipped")
                continue
            try:
                records += run_shape(shape, w, impls[shape.kind], sopts, history, progress)
            except torch.cuda.OutOfMemoryError as error:
                torch.cuda.empty_cache()
                for impl, _ in impls[shape.kind]:
                    rec = new_record(w, impl)
                    rec.update(status="ERROR", note=f"out of memory: {reason(error)}")
                    records.append(rec)
            last[(shape.kind, dtype)] = (shape.cost(), time.perf_counter() - began)
            print(f"[{time.perf_counter() - start:6.1f} s] {w.name}: "
                  f"{time.perf_counter() - began:.1f} s", flush=True)
            checkpoint(records)
    return records


def _json_path(args) -> str | None:
    return args.json or (os.path.join(args.sweep_out, "variants.json") if args.sweep_out
                         else None)


def _save_partial(args, argv, records: list[dict]) -> None:
    path = _json_path(args)
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path + ".partial", "w") as f:
            json.dump(finite({"argv": list(argv) if argv is not None else sys.argv[1:],
                              "results": records, "summary": summary(records)}), f,
                      default=str)


def _save(args, result: dict) -> None:
    path = _json_path(args)
    if not path:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(finite(result), f, indent=1, default=str)
    if os.path.exists(path + ".partial"):
        os.remove(path + ".partial")
    print(f"saved {path}")


__all__ = ["BATCHES", "CELL_VARIANTS", "SEQUENCE_VARIANTS", "History", "Variant",
           "format_summary", "implementations", "run", "run_shape", "shapes", "summary",
           "variant_impl"]
