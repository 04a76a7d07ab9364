"""The performance map: ``python -m lltm.bench --sweep``.

Over a grid of batch sizes B and state sizes H (I = H/2), in each dtype:

  sequence  lltm.LLTM against torch.nn.LSTM (cuDNN on CUDA) of the same sizes,
            T steps, 1 and 3 layers; ratio = nn.LSTM's time / lltm's time
  cell      lltm's native cell against the Python reference and nn.LSTMCell;
            ratios = their time / the native cell's time, and against the
            faster of the two

A ratio above 1 means lltm is faster. Every implementation of a shape is
checked against the float64 oracle first (the benchmark's check, the oracle
computed on the benchmarked device); a WRONG or ERROR one is reported so and
not timed. Figures per shape and implementation:

  graph_step  CUDA only, the primary figure there: forward + backward captured
              in one CUDA graph, replays timed between CUDA events (GPU time)
  step        eager forward + backward, pipelined, divided by the step count
  infer       eager forward alone under torch.no_grad() (inference), likewise

Sampling adapts to the shape: one calibrated step sizes the samples so that
each implementation gets about ``--sweep-budget-ms`` per figure, in 3 to 5
passes that take turns (2 to 3 with --sweep-quick), one step at the least.
Shapes run from cheapest to dearest; a shape whose estimated memory exceeds
``--sweep-max-gib``, or that would end past ``--sweep-time-limit`` (foreseen
from the last shape of its kind and dtype), is skipped with that note.

nn.LSTM's float32 runs as torch sets it by default: cuDNN on TF32 (its check
then has TF32's tolerance); the machine description records the setting.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from typing import Sequence

import torch

from .cases import Impl, Workload, bar_references, default_impls
from .report import Progress, describe_machine, finite, load_average, median
from .runner import Options, _rotated, check_workload, new_record
from .timing import GraphStepTimer, StepTimer, attempt, reason, summarize

BATCHES = (1, 16, 64, 256, 1024)
SEQUENCE_HIDDEN = (64, 128, 256, 512, 1024, 2048)
CELL_HIDDEN = (128, 512, 1024)
LAYERS = (1, 3)
QUICK_BATCHES = (1, 16, 64)
QUICK_SEQUENCE_HIDDEN = (64, 128, 256)
QUICK_CELL_HIDDEN = (128, 512)
SEQ_LEN = 100
QUICK_SEQ_LEN = 20
TIME_LIMIT_S = 540.0

# What is compared: ours, then the peers (ratio = peer's time / ours).
OURS = {"sequence": "lltm", "cell": "native"}
PEERS = {"sequence": ("lstm",), "cell": ("reference", "lstm_cell")}
BEST = "best"  # the cells' ratio against the faster of the peers
FIGURES = ("graph_step", "step", "infer")


@dataclasses.dataclass
class SweepOptions:
    budget_us: float      # time per implementation, figure and shape
    min_passes: int
    max_passes: int
    time_limit_s: float   # no shape starts after this
    max_bytes: float      # shapes estimated above this are skipped
    graphs: bool
    max_chunk: int = 1000


@dataclasses.dataclass(frozen=True)
class Shape:
    kind: str
    B: int
    H: int
    T: int
    layers: int

    @property
    def I(self) -> int:  # noqa: E743 - the project's name for the input size
        return max(1, self.H // 2)

    def workload(self, device, dtype) -> Workload:
        oracle = device if device.type == "cuda" else torch.device("cpu")
        return Workload(device, dtype, self.kind, self.B, self.I, self.H, self.T,
                        layers=self.layers, oracle_device=oracle)

    def workloads(self, device, dtypes):
        """(dtype, workload) for each dtype; the float64 data and oracle made
        once, by the first, and shared by the others."""
        first = None
        for dtype in dtypes:
            w = self.workload(device, dtype)
            if first is None:
                first = w
            else:
                w.share_data(first)
            yield dtype, w

    def cost(self) -> float:
        """Arithmetic of one forward, up to a constant: the order of the run."""
        return self.T * self.layers * self.B * self.H * (self.I + self.H)


def estimate_bytes(shape: Shape, dtype: torch.dtype) -> float:
    """A generous estimate of the memory a shape needs at its peak: the float64
    oracle (checkpointed: the states), or both implementations with their
    CUDA-graph pools, plus the float64 expectations kept for the check."""
    size = torch.empty((), dtype=dtype).element_size()
    T, B, I, H, L = shape.T, shape.B, shape.I, shape.H, shape.layers
    per_step = T * B * H * L
    weights = 4 * L * H * (I + H) * 8 * 4
    kept = 4 * T * B * (H + I) * 8
    if shape.kind == "cell":
        return 8 * (64 * B * H + 16 * H * (I + H)) + weights
    timed = (10 + 14) * per_step * size   # lltm ~10, cuDNN LSTM ~14 values per state element
    oracle = 4 * per_step * 8
    return max(timed, oracle) + kept + weights


# ----------------------------------------------------------------------------
# Command line.

def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "performance map (--sweep)", "lltm against nn.LSTM / nn.LSTMCell over B x H: see above")
    group.add_argument("--sweep", action="store_true",
                       help="run the B x H map instead of the table (see above)")
    group.add_argument("--sweep-quick", action="store_true",
                       help="a reduced map (B 1,16,64; H 64,128,256 / cells 128,512; T=20; "
                            "shorter budgets); --quick with --sweep does the same")
    group.add_argument("--sweep-batches", type=parse_ints, default=None, metavar="B,...",
                       help=f"B values (default {_ints(BATCHES)})")
    group.add_argument("--sweep-hidden", type=parse_ints, default=None, metavar="H,...",
                       help=f"H values (default {_ints(SEQUENCE_HIDDEN)} for sequences, "
                            f"{_ints(CELL_HIDDEN)} for cells); I = H/2")
    group.add_argument("--sweep-kind", choices=("sequence", "cell", "both"), default="both")
    group.add_argument("--sweep-out", metavar="DIR",
                       help="write the heatmap PNGs (and sweep.json, unless --json) here")
    group.add_argument("--sweep-budget-ms", type=float, default=None, metavar="MS",
                       help="time per implementation, figure and shape (default 100, "
                            "30 with --sweep-quick)")
    group.add_argument("--sweep-time-limit", type=float, default=None, metavar="S",
                       help="no shape starts that would end later than this many seconds "
                            f"into the sweep (default {TIME_LIMIT_S:.0f}; "
                            "--sweep-variants: 400)")
    group.add_argument("--sweep-variants", action="store_true",
                       help="time every route of the CUDA library per shape (each sequence "
                            "plan family and grid layout, the cell's fused and cuBLAS "
                            "products) beside the library's choice, nn.LSTM / nn.LSTMCell "
                            "and the reference: lltm/bench/variants.py; one layer; B "
                            "1..1024 (9 values), extra T 20 and 1000 at a few shapes; JSON "
                            "in DIR/variants.json with --sweep-out DIR")
    group.add_argument("--sweep-max-gib", type=float, default=None, metavar="GIB",
                       help="skip shapes estimated above this many GiB (default: 90%% of "
                            "the GPU's free memory, half the available RAM on CPU)")


SWEEP_ONLY = ("sweep_batches", "sweep_hidden", "sweep_out", "sweep_budget_ms", "sweep_max_gib",
              "sweep_time_limit")


def misused(args: argparse.Namespace) -> list[str]:
    """Sweep options given without --sweep."""
    given = ["--" + a.replace("_", "-") for a in SWEEP_ONLY if getattr(args, a) is not None]
    return given + (["--sweep-variants"] if args.sweep_variants else [])


def _ints(values) -> str:
    return ",".join(str(v) for v in values)


def parse_ints(text: str) -> list[int]:
    fields = [f.strip() for f in text.split(",") if f.strip()]
    if not fields or not all(f.isdigit() and int(f) > 0 for f in fields):
        raise argparse.ArgumentTypeError(f"a comma list of positive integers, got {text!r}")
    return [int(f) for f in fields]


def _default_devices() -> list[torch.device]:
    return [torch.device("cuda" if torch.cuda.is_available() else "cpu")]


def _max_bytes(device: torch.device, gib: float | None) -> float:
    if gib is not None:
        return gib * 2**30
    if device.type == "cuda":
        return 0.9 * torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return 0.5 * int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0.5 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def plan(args: argparse.Namespace, quick: bool) -> list[Shape]:
    """The shapes, cheapest first."""
    batches = args.sweep_batches or (QUICK_BATCHES if quick else BATCHES)
    seq_len = args.seq_len if args.seq_len is not None else (QUICK_SEQ_LEN if quick else SEQ_LEN)
    shapes = []
    if args.sweep_kind in ("sequence", "both") and seq_len > 0:
        hidden = args.sweep_hidden or (QUICK_SEQUENCE_HIDDEN if quick else SEQUENCE_HIDDEN)
        shapes += [Shape("sequence", B, H, seq_len, L) for L in args.layers or LAYERS
                   for B in batches for H in hidden]
    if args.sweep_kind in ("cell", "both"):
        hidden = args.sweep_hidden or (QUICK_CELL_HIDDEN if quick else CELL_HIDDEN)
        shapes += [Shape("cell", B, H, 1, 1) for B in batches for H in hidden]
    return sorted(shapes, key=lambda s: (s.cost(), s.kind))


# ----------------------------------------------------------------------------
# Running.

def impls_for(extra_impls: Sequence[Impl] = ()) -> dict[str, list[Impl]]:
    """kind -> [ours, peers...]; ``extra_impls`` replace those of the same key
    (tests plant wrong ones)."""
    by_key = {i.key: i for i in default_impls()}
    by_key.update({i.key: i for i in extra_impls})
    return {kind: [by_key[OURS[kind]]] + [by_key[p] for p in PEERS[kind]] for kind in OURS}


def run_shape(w: Workload, impls: list[Impl], sopts: SweepOptions,
              progress: Progress) -> list[dict]:
    """Check every implementation of one shape, then time those that passed."""
    opts = Options(reps=0, seq_reps=0, passes=0, warmup=0, graphs=sopts.graphs,
                   compile_on_cpu=False)
    records, cases = check_workload(w, impls, opts, progress, references=bar_references())
    failed: dict[str, str] = {}
    for figure, grad in (("step", True), ("infer", False)):
        steps = {k: StepTimer(c, w.device, grad) for k, c in cases.items() if k not in failed}
        chunks = _timed_passes(steps, sopts, failed)
        for rec in records:
            if rec["impl"] in steps:
                rec[figure] = summarize(steps[rec["impl"]].samples)
                rec[figure + "_chunk"] = chunks.get(rec["impl"])
    if w.device.type == "cuda" and sopts.graphs:
        _time_graphs(w, impls, cases, records, sopts, failed)
    for rec in records:
        if rec["impl"] in failed:
            rec.update(status="ERROR", note=f"failed while timed: {failed[rec['impl']]}",
                       step=None, infer=None, graph_step=None)
    if w.device.type == "cuda":
        torch.cuda.empty_cache()
    return records


def _time_graphs(w, impls, cases, records, sopts, failed) -> None:
    torch.cuda.empty_cache()  # the eager pool's blocks: the graphs' pools need the room
    unroll = {i.key: i.graph_unroll for i in impls}
    graphs, reasons = {}, {}
    for key, case in cases.items():
        if key in failed:
            continue
        timer = GraphStepTimer(case, w.device, unroll[key])
        why = timer.capture()
        if why:
            reasons[key] = why
            timer.release()
        else:
            graphs[key] = timer
    _timed_passes(graphs, sopts, failed)
    for rec in records:
        key = rec["impl"]
        if key in graphs:
            rec["graph_step"] = summarize(graphs[key].samples)
            graphs[key].release()
        elif key in reasons:
            rec["graph_step"] = {"n/a": reasons[key]}


def _timed_passes(timers: dict, sopts: SweepOptions, failed: dict[str, str]) -> dict[str, int]:
    """Calibrate every timer, then sample in passes that take turns; returns
    the steps (or replays) per sample of each."""
    estimates = {}
    for key, timer in timers.items():
        attempt(failed, key, lambda: estimates.__setitem__(key, timer.calibrate()))
    if not estimates:
        return {}
    slowest = max(max(estimates.values()), 1e-3)
    passes = int(min(sopts.max_passes, max(sopts.min_passes, sopts.budget_us // slowest)))
    chunks = {k: int(min(sopts.max_chunk, max(1, round(sopts.budget_us / passes / max(e, 1e-3)))))
              for k, e in estimates.items()}
    for r in range(passes):
        for key, timer in _rotated({k: timers[k] for k in chunks}, r):
            attempt(failed, key, lambda: timer.sample(chunks[key]))
    return chunks


def skipped_records(w: Workload, impls: list[Impl], why: str) -> list[dict]:
    records = [new_record(w, impl) for impl in impls]
    for rec in records:
        rec.update(status="skipped", note=why)
    return records


def run_grid(device: torch.device, dtypes, shapes: list[Shape], extra_impls: Sequence[Impl],
             sopts: SweepOptions, progress: Progress, start: float) -> list[dict]:
    """Every shape in every dtype on one device; the float64 data and oracle of
    a shape are made once for all its dtypes."""
    impls = impls_for(extra_impls)
    records, last = [], {}  # (kind, dtype) -> (cost, seconds) of the last shape run
    for shape in shapes:
        for dtype, w in shape.workloads(device, dtypes):
            began = time.perf_counter()
            why = _why_not(shape, dtype, sopts, began - start, last.get((shape.kind, dtype)))
            if why:
                recs = skipped_records(w, impls[shape.kind], why)
            else:
                recs = _run_guarded(w, impls[shape.kind], sopts, progress)
                last[(shape.kind, dtype)] = (shape.cost(), time.perf_counter() - began)
            records += recs
            progress.update(1 + (len(impls[shape.kind]) if why else 0), f"{w.name}: timed")
    return records


def _why_not(shape: Shape, dtype, sopts: SweepOptions, elapsed: float, last) -> str | None:
    """Why a shape is not run (memory, time), or None. Its time is foreseen
    from the last shape of its kind and dtype, scaled by the arithmetic."""
    need = estimate_bytes(shape, dtype)
    if need > sopts.max_bytes:
        return f"not run: needs ~{need / 2**30:.1f} GiB, over {sopts.max_bytes / 2**30:.1f} GiB"
    foreseen = last[1] * max(1.0, shape.cost() / last[0]) if last else 0.0
    if elapsed + foreseen > sopts.time_limit_s:
        return f"not run: would end past --sweep-time-limit {sopts.time_limit_s:.0f} s " \
               f"(~{foreseen:.0f} s foreseen at {elapsed:.0f} s)"
    return None


def _run_guarded(w, impls, sopts, progress) -> list[dict]:
    try:
        return run_shape(w, impls, sopts, progress)
    except torch.cuda.OutOfMemoryError as error:  # the oracle, outside the checks
        if w.device.type == "cuda":
            torch.cuda.empty_cache()
        recs = skipped_records(w, impls, f"out of memory: {reason(error)}")
        for rec in recs:
            rec["status"] = "ERROR"
        return recs


# ----------------------------------------------------------------------------
# The map: one entry per shape and dtype, with the ratios.

def shape_entries(records: list[dict]) -> list[dict]:
    """One entry per (device, kind, dtype, layers, B, H): the status of ours,
    the medians of every implementation, the ratios peer / ours per figure."""
    groups: dict[tuple, list[dict]] = {}
    for rec in records:
        key = (rec["device"], rec["kind"], rec["dtype"], rec["layers"], rec["B"], rec["H"])
        groups.setdefault(key, []).append(rec)
    return [_entry(key, recs) for key, recs in groups.items()]


def _entry(key: tuple, recs: list[dict]) -> dict:
    device, kind, dtype, layers, B, H = key
    by_impl = {r["impl"]: r for r in recs}
    ours = by_impl[OURS[kind]]
    entry = {"device": device, "kind": kind, "dtype": dtype, "layers": layers, "B": B, "H": H,
             "I": ours["I"], "T": ours["T"], "status": ours["status"], "note": ours["note"],
             "peer_status": {p: by_impl[p]["status"] for p in PEERS[kind] if p in by_impl},
             "times_us": {k: {f: median(r, f) for f in FIGURES} for k, r in by_impl.items()},
             "ratios": {}}
    for figure in FIGURES:
        mine = median(ours, figure)
        theirs = {p: median(by_impl[p], figure) for p in PEERS[kind] if p in by_impl}
        if len(theirs) > 1:
            known = [t for t in theirs.values() if t]
            theirs[BEST] = min(known) if len(known) == len(theirs) else None
        for peer, t in theirs.items():
            if mine and t:
                entry["ratios"].setdefault(peer, {})[figure] = t / mine
    return entry


# ----------------------------------------------------------------------------
# Entry point.

def run(args: argparse.Namespace, parser: argparse.ArgumentParser, argv,
        extra_impls: Sequence[Impl] = ()) -> dict:
    """The sweep: returns {"machine", "config", "results", "map"}, also printed
    as tables, saved as JSON and heatmaps where asked."""
    if args.sweep_variants:
        from . import variants
        return variants.run(args, parser, argv, extra_impls)
    quick = args.sweep_quick or args.quick
    if args.only or args.skip:
        parser.error("--only / --skip do not apply to --sweep (it runs "
                     "lltm / nn.LSTM and the native cell / reference / nn.LSTMCell)")
    devices = args.device or _default_devices()
    dtypes = args.dtype or ([torch.float32, torch.bfloat16]
                            if any(d.type == "cuda" for d in devices) else [torch.float32])
    shapes = plan(args, quick)
    budget_ms = args.sweep_budget_ms or (30.0 if quick else 100.0)
    machine = describe_machine()
    total = sum(len(impls_for(extra_impls)[s.kind]) + 1 for s in shapes) * len(dtypes) \
        * len(devices)
    progress = Progress(total, enabled=not args.no_progress)
    start, records = time.perf_counter(), []
    options = {}
    try:
        for device in devices:
            sopts = SweepOptions(budget_us=budget_ms * 1e3, min_passes=2 if quick else 3,
                                 max_passes=3 if quick else 5,
                                 time_limit_s=(TIME_LIMIT_S if args.sweep_time_limit
                                               is None else args.sweep_time_limit),
                                 max_bytes=_max_bytes(device, args.sweep_max_gib),
                                 graphs=not args.no_graphs)
            options[str(device)] = dataclasses.asdict(sopts)
            records += run_grid(device, dtypes, shapes, extra_impls, sopts, progress, start)
    finally:
        progress.close()
    machine["load_average_end"] = load_average()
    wall = time.perf_counter() - start
    config = {"argv": list(argv) if argv is not None else sys.argv[1:], "quick": quick,
              "devices": [str(d) for d in devices],
              "dtypes": [str(d).replace("torch.", "") for d in dtypes],
              "shapes": [dataclasses.asdict(s) | {"I": s.I} for s in shapes],
              "options": options, "wall_s": wall}
    result = {"machine": machine, "config": config, "results": records,
              "map": shape_entries(records)}
    _report(args, result, wall)
    return result


def _report(args, result: dict, wall: float) -> None:
    from .sweep_report import format_tables, save_heatmaps
    print(format_tables(result))
    print(f"sweep: {len(result['map'])} shapes in {wall:.1f} s")
    _save(args, result, save_heatmaps)


def _save(args, result: dict, save_heatmaps) -> None:
    json_path = args.json or (os.path.join(args.sweep_out, "sweep.json") if args.sweep_out
                              else None)
    if args.sweep_out:
        os.makedirs(args.sweep_out, exist_ok=True)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(finite(result), f, indent=1, default=str)
        print(f"saved {json_path}")
    if args.sweep_out:
        for path in save_heatmaps(result, args.sweep_out):
            print(f"saved {path}")


__all__ = ["BATCHES", "CELL_HIDDEN", "LAYERS", "SEQUENCE_HIDDEN", "Shape", "SweepOptions",
           "add_arguments", "estimate_bytes", "plan", "run", "run_shape", "shape_entries"]
