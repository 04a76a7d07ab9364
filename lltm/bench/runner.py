"""The command line: ``python -m lltm.bench``; runs every workload: check, then
time, each implementation, interleaved."""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import sys
from typing import Sequence

import torch

import lltm

from .cases import (CELL_BASELINES, DTYPES, REFERENCE_SETS_BAR, SEQUENCE_BASELINES, Case, Impl,
                    Workload, check, default_impls, lstm_loop_impl, tolerance, uses_tf32)
from .report import (Progress, describe_machine, finite, format_table, load_average, median,
                     save_plot)
from .timing import GRAPH_METRICS, METRICS, GraphTimer, Timer, attempt, reason, summarize

DEFAULT_SIZES = "16,32,128;64,256,512"
REFERENCES = ("reference", "reference_loop", "lstm_loop")  # the families' references


@dataclasses.dataclass
class Options:
    reps: int            # timed iterations per metric (cells)
    seq_reps: int        # timed iterations per metric (sequences)
    passes: int
    warmup: int
    graphs: bool
    compile_on_cpu: bool


def untimed_reference_errors(w: Workload, impls: list[Impl],
                             references: list[Impl]) -> dict[str, float]:
    """family -> error of its reference in w's dtype, for the references the
    run does not time (``--only lltm``): below float64 they still set the bar,
    so they are built and checked once, not timed."""
    errors: dict[str, float] = {}
    if w.dtype not in REFERENCE_SETS_BAR:
        return errors
    chosen = {impl.key for impl in impls}
    for ref in references:
        if ref.kind == w.kind and ref.key in REFERENCES and ref.key not in chosen \
                and ref.available(w) is None:
            try:
                case = ref.build(w)
                errors[case.family] = check(case, uses_tf32(w.dtype, w.device, case))[0]
            except Exception:  # noqa: BLE001 - then the fixed tolerance applies (stricter)
                continue
    return errors


def new_record(w: Workload, impl: Impl) -> dict:
    """The record of one implementation on one workload, before its check."""
    return {"device": str(w.device), "dtype": str(w.dtype).replace("torch.", ""),
            "kind": w.kind, "B": w.B, "I": w.I, "H": w.H, "T": w.T, "layers": w.layers,
            "input_grad": w.input_grad,
            "impl": impl.key, "label": impl.label, "status": "ok", "error": None,
            "tolerance": None, "where": None, "note": impl.note, "setup_s": None,
            "infer": None, **{m: None for m in METRICS + GRAPH_METRICS}}


def check_workload(w: Workload, impls: list[Impl], opts: Options, progress: Progress,
                   references: list[Impl] = ()) -> tuple[list[dict], dict[str, Case]]:
    """Check every implementation of one workload against the float64 oracle:
    one record each, and the cases that passed (those may be timed).
    ``references``: where to find the family references that set the check's
    bar when ``impls`` leaves them out."""
    records, cases = [], {}
    untimed = untimed_reference_errors(w, impls, list(references))
    reference_errors: dict[str, float] = dict(untimed)  # family -> its reference's error
    for impl in impls:
        rec = new_record(w, impl)
        records.append(rec)
        skip = impl.available(w)
        if skip is None and impl.key == "compile" and w.device.type == "cpu" \
                and not opts.compile_on_cpu:
            skip = "skipped on CPU by --quick (inductor compiles C++: seconds per size)"
        if skip:
            rec.update(status="skipped", note=skip)
            progress.update(1, f"{w.name}: {impl.key}")
            continue
        try:
            case = impl.build(w)
            rec["setup_s"] = case.setup_s
            if case.note:
                rec["note"] = "; ".join(filter(None, [rec["note"], case.note]))
            sets_bar = impl.key in REFERENCES and w.dtype in REFERENCE_SETS_BAR
            err, where = check(case, sets_bar and uses_tf32(w.dtype, w.device, case))
            if sets_bar:
                # The reference sets the bar below float64 (see REFERENCE_SETS_BAR).
                reference_errors[case.family] = err
                rec["note"] = "; ".join(filter(None, [rec["note"], "sets the bar in this dtype"]))
            tol = tolerance(w, case, reference_errors.get(case.family))
            if case.family in untimed and impl.key not in REFERENCES:
                rec["note"] = "; ".join(filter(None, [
                    rec["note"], f"bar from the reference's own error {untimed[case.family]:.1e} "
                    "(checked, not timed)"]))
            rec.update(error=err, tolerance=tol, where=where)
            if not err <= tol:
                rec["status"] = "WRONG"
            else:
                cases[impl.key] = case
        except Exception as error:  # noqa: BLE001
            rec.update(status="ERROR", note=reason(error))
        progress.update(1, f"{w.name}: check {impl.key}")
    return records, cases


def run_workload(w: Workload, impls: list[Impl], opts: Options, progress: Progress,
                 references: list[Impl] = ()) -> list[dict]:
    """Check, then time, every implementation of one workload; one record each.
    ``references``: see :func:`check_workload`."""
    records, cases = check_workload(w, impls, opts, progress, references)
    timers = {key: Timer(case, w.device) for key, case in cases.items()}
    graph_timers = {}

    reps = opts.reps if w.kind == "cell" else opts.seq_reps
    per_pass = max(1, math.ceil(reps / opts.passes))
    failed: dict[str, str] = {}  # implementations that raised while timed

    for key, timer in timers.items():
        attempt(failed, key, lambda: timer.warm_up(opts.warmup))
    for r in range(opts.passes):
        for key, timer in _rotated(timers, r):
            attempt(failed, key, lambda: timer.run_pass(per_pass))
        progress.update(len(impls), f"{w.name}: pass {r + 1}/{opts.passes}")

    if w.device.type == "cuda" and opts.graphs:
        unroll = {impl.key: impl.graph_unroll for impl in impls}
        for key, timer in timers.items():
            if key not in failed:
                graph_timers[key] = GraphTimer(timer.case, w.device, unroll[key])
                graph_timers[key].capture()  # failures become "n/a" with the reason
        for r in range(opts.passes):
            for key, gt in _rotated(graph_timers, r):
                attempt(failed, key, lambda: gt.run_pass(per_pass))
        progress.update(len(impls), f"{w.name}: CUDA graphs")

    for rec in records:
        timer = timers.get(rec["impl"])
        if timer is None:
            continue
        if rec["impl"] in failed:
            rec.update(status="ERROR", note=f"failed while timed: {failed[rec['impl']]}")
            continue
        for metric in METRICS:
            rec[metric] = summarize(timer.samples[metric])
        gt = graph_timers.get(rec["impl"])
        if gt is not None:
            for metric in GRAPH_METRICS:
                rec[metric] = summarize(gt.samples[metric]) or {"n/a": gt.reasons.get(metric, "")}
            gt.release()
    if w.device.type == "cuda":
        torch.cuda.empty_cache()
    _add_ratios(records, CELL_BASELINES if w.kind == "cell" else SEQUENCE_BASELINES)
    return records


def _rotated(items: dict, r: int) -> list[tuple]:
    """The items in turn, starting from the r-th: each pass another goes first."""
    pairs = list(items.items())
    k = r % len(pairs) if pairs else 0
    return pairs[k:] + pairs[:k]


def _add_ratios(records: list[dict], baselines: Sequence[str]) -> None:
    """speedup[baseline][metric] = baseline's median / this median (> 1: faster)."""
    by_key = {r["impl"]: r for r in records}
    for rec in records:
        rec["speedup"] = {}
        for base in baselines:
            if base not in by_key:
                continue
            ratios = {}
            for metric in METRICS + GRAPH_METRICS:
                mine, theirs = median(rec, metric), median(by_key[base], metric)
                if mine and theirs:
                    ratios[metric] = theirs / mine
            if ratios:
                rec["speedup"][base] = ratios


def _parse_sizes(text: str) -> list[tuple[int, int, int]]:
    sizes = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        fields = [f.strip() for f in part.split(",")]
        if len(fields) != 3 or not all(f.isdigit() and int(f) > 0 for f in fields):
            raise argparse.ArgumentTypeError(
                f"a size is B,I,H with three positive integers, got {part!r}")
        sizes.append(tuple(int(f) for f in fields))
    if not sizes:
        raise argparse.ArgumentTypeError("no sizes given")
    return sizes


def _parse_devices(text: str) -> list[torch.device]:
    devices = []
    for name in text.split(","):
        name = name.strip()
        if name == "all":
            devices.append(torch.device("cpu"))
            if torch.cuda.is_available():
                devices.append(torch.device("cuda"))
            continue
        device = torch.device(name)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise argparse.ArgumentTypeError("--device cuda: CUDA is not available here")
        if device.type not in ("cpu", "cuda"):
            raise argparse.ArgumentTypeError(f"--device: cpu, cuda or all, got {name!r}")
        devices.append(device)
    return devices


def _parse_dtypes(text: str) -> list[torch.dtype]:
    try:
        return [DTYPES[name.strip()] for name in text.split(",")]
    except KeyError as error:
        raise argparse.ArgumentTypeError(
            f"--dtype: one or more of {', '.join(DTYPES)}, got {error.args[0]!r}") from None


def _parse_keys(text: str) -> list[str]:
    return [k.strip() for k in text.split(",") if k.strip()]


def build_parser() -> argparse.ArgumentParser:
    from . import rows, sweep
    parser = argparse.ArgumentParser(
        prog="python -m lltm.bench", description=sys.modules[__package__].__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Implementations: " + ", ".join(i.key for i in default_impls()) + ".")
    parser.add_argument("--device", type=_parse_devices, default=None,
                        help="cpu, cuda (or cuda:N), all, or a comma list (default: all "
                             "available; --sweep: cuda where present, else cpu)")
    parser.add_argument("--sizes", type=_parse_sizes, default=DEFAULT_SIZES,
                        help=f"B,I,H[;B,I,H...] (default: {DEFAULT_SIZES})")
    parser.add_argument("--seq-len", type=int, default=None,
                        help="T of the sequence benchmarks (default 100, 10 with --quick; "
                             "0 skips them)")
    parser.add_argument("--layers", type=sweep.parse_ints, default=None, metavar="L,...",
                        help="layer counts of the sequences (default 1; --sweep: "
                             f"{','.join(map(str, sweep.LAYERS))})")
    parser.add_argument("--dtype", type=_parse_dtypes, default=None,
                        help="float32 (default), float64, bfloat16, float16, or a comma list "
                             "(--sweep on CUDA: float32,bfloat16)")
    parser.add_argument("--reps", type=int, default=None,
                        help="timed iterations per metric and cell implementation "
                             "(default 200, 20 with --quick); sequences get a tenth")
    parser.add_argument("--passes", type=int, default=None,
                        help="interleaved passes the reps are split into "
                             "(default 10, 2 with --quick)")
    parser.add_argument("--only", type=_parse_keys, default=None,
                        help="comma list of implementations to run (default: all)")
    parser.add_argument("--skip", type=_parse_keys, default=[],
                        help="comma list of implementations to leave out")
    parser.add_argument("--no-graphs", action="store_true", help="no CUDA-graph timings")
    parser.add_argument("--no-input-grad", action="store_true",
                        help="the input and the initial state need no gradient (only the "
                             "parameters'): a first layer fed data, as in training")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch.set_num_threads for the CPU runs (default: torch's choice)")
    parser.add_argument("--json", metavar="PATH", help="save every number and the machine here")
    parser.add_argument("--plot", metavar="PATH", help="save a PNG bar chart here (matplotlib)")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: few reps, T=10, no torch.compile on CPU")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bar (none is drawn where stderr is not a terminal)")
    parser.add_argument("--tf32", choices=TF32_SETTINGS, default="default",
                        help="float32 products on TF32 tensor cores for the run: default "
                             "leaves torch's settings (cuDNN's RNNs on TF32, aten::mm not); "
                             "off: neither (float32 at full precision everywhere, nn.LSTM "
                             "too); on: both (lltm's float32 products through aten::mm too). "
                             "The machine record has the setting")
    parser.add_argument("--autotune", action="store_true",
                        help="lltm.backends.cuda.benchmark on: each lltm sequence layer on CUDA "
                             "runs the plan measured fastest for its shape (measured at its "
                             "first call, in the check before the timings)")
    parser.add_argument("--cpu-isa", choices=("auto", "avx512", "avx2", "baseline"),
                        default="auto",
                        help="the instruction set of lltm's own float32 CPU products for the "
                             "run (default: the best this CPU has); the machine record has it")
    sweep.add_arguments(parser)
    rows.add_arguments(parser)
    return parser


TF32_SETTINGS = ("default", "off", "on")


@contextlib.contextmanager
def tf32_setting(setting: str):
    """torch's two TF32 flags (aten::mm's and cuDNN's) both off or both on
    inside the block (``default``: as they are), restored after it."""
    if setting not in TF32_SETTINGS:
        raise ValueError(f"tf32 setting must be one of {TF32_SETTINGS}, got {setting!r}")
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    before = (matmul.allow_tf32, cudnn.allow_tf32)
    if setting != "default":
        matmul.allow_tf32 = cudnn.allow_tf32 = setting == "on"
    try:
        yield
    finally:
        if (matmul.allow_tf32, cudnn.allow_tf32) != before:
            matmul.allow_tf32, cudnn.allow_tf32 = before


def main(argv: Sequence[str] | None = None, extra_impls: Sequence[Impl] = ()):
    """Run the benchmark; returns the records (also printed, and saved with
    --json). ``extra_impls`` adds implementations (tests use it); with
    ``--sweep``, the map's result (see :func:`lltm.bench.sweep.run`), where
    ``extra_impls`` replace the implementations of the same key."""
    parser = build_parser()
    args = parser.parse_args(argv)
    from .._native import cpu_isa
    try:
        cpu_isa(args.cpu_isa)
    except ValueError as error:
        parser.error(str(error))
    before = lltm.backends.cuda.benchmark
    lltm.backends.cuda.benchmark = args.autotune or before
    try:
        with tf32_setting(args.tf32):
            return _run(args, parser, argv, extra_impls)
    finally:
        lltm.backends.cuda.benchmark = before
        cpu_isa("auto")


def _run(args, parser, argv, extra_impls):
    from . import sweep
    if args.plot or args.sweep_out:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            parser.error("--plot and --sweep-out need matplotlib (pip install matplotlib)")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.sweep or args.sweep_quick:
        return sweep.run(args, parser, argv, extra_impls)
    if args.rows:
        from . import rows
        return rows.run(args, parser)
    misused = sweep.misused(args)
    if misused:
        parser.error(f"{', '.join(misused)}: only with --sweep")
    args.device = args.device or _parse_devices("all")
    args.dtype = args.dtype or [torch.float32]
    layers = args.layers or [1]
    seq_len = args.seq_len if args.seq_len is not None else (10 if args.quick else 100)
    reps = args.reps or (20 if args.quick else 200)
    opts = Options(reps=reps, seq_reps=max(2, reps // 10),
                   passes=args.passes or (2 if args.quick else 10),
                   warmup=2 if args.quick else 5, graphs=not args.no_graphs,
                   compile_on_cpu=not args.quick)
    opts.passes = max(1, min(opts.passes, opts.seq_reps))

    impls = all_impls = default_impls() + list(extra_impls)
    known = {i.key for i in impls}
    unknown = [k for k in (args.only or []) + args.skip if k not in known]
    if unknown:
        parser.error(f"unknown implementation(s) {unknown}; known: {sorted(known)}")
    impls = [i for i in impls if (args.only is None or i.key in args.only)
             and i.key not in args.skip]

    workloads = []
    for device in args.device:
        for dtype in args.dtype:
            for B, I, H in args.sizes:
                workloads.append(Workload(device, dtype, "cell", B, I, H,
                                          input_grad=not args.no_input_grad))
            if seq_len > 0:
                for L in layers:
                    for B, I, H in args.sizes:
                        workloads.append(Workload(device, dtype, "sequence", B, I, H, seq_len,
                                                  layers=L, input_grad=not args.no_input_grad))
    plan = [(w, [i for i in impls if i.kind == w.kind]) for w in workloads]
    plan = [(w, ws) for w, ws in plan if ws]
    total = sum(len(ws) * (1 + opts.passes + (w.device.type == "cuda" and opts.graphs))
                for w, ws in plan)

    machine = describe_machine()
    progress = Progress(total, enabled=not args.no_progress)
    records = []
    try:
        for w, ws in plan:
            records += run_workload(w, ws, opts, progress,
                                    references=all_impls + [lstm_loop_impl()])
    finally:
        progress.close()
    machine["load_average_end"] = load_average()

    print(format_table(records, machine))
    if args.json:
        config = {"argv": list(argv) if argv is not None else sys.argv[1:],
                  "sizes": args.sizes, "seq_len": seq_len, "layers": layers,
                  "dtypes": [str(d) for d in args.dtype],
                  "devices": [str(d) for d in args.device], **dataclasses.asdict(opts)}
        with open(args.json, "w") as f:
            json.dump(finite({"machine": machine, "config": config, "results": records}), f,
                      indent=1, default=str)
        print(f"saved {args.json}")
    if args.plot:
        save_plot(records, args.plot)
        print(f"saved {args.plot}")
    return records


if __name__ == "__main__":
    main()
