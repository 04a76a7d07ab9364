"""The bidirectional and variable-length rows (``python -m lltm.bench --rows
bidirectional,packed``): lltm.LLTM against cuDNN's nn.LSTM where each row of
a batch has its own length or both directions run.

  bidirectional  B16 I32 H128 T100: lltm.LLTM(bidirectional=True) against
                 nn.LSTM(bidirectional=True), and against lltm.LLTM's one
                 direction (what the second direction costs)
  packed         B64 I64 H256 T200, lengths uniform in [T/2, T] (seed
                 --rows-seed), packed with enforce_sorted=False: lltm.LLTM on
                 the PackedSequence against nn.LSTM on it, and against
                 lltm.LLTM on the same batch padded to T (every row all T
                 steps: what stopping rows inside the kernels saves)

Each implementation is first checked against a float64 oracle on the CPU
(lltm: the module with impl="reference", a loop of reference cells;
nn.LSTM: ATen's float64 LSTM) on its outputs and every gradient, then timed:
the eager step (forward + backward pipelined, microseconds a step, median of
passes) and, on CUDA, the GPU time of one step from CUDA-graph replay.
The bar: float64 1e-9; below it the larger of the runner's tolerance and
twice the error of the same oracle computed in the dtype on the device
(cuDNN in float32 on TF32: 1e-2)."""
from __future__ import annotations

import argparse
import statistics

import torch
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence

import lltm

from .cases import TF32_TOLERANCE, TOLERANCE, Case, check, synchronize, uses_tf32
from .report import describe_machine, load_average
from .timing import GraphTimer, Timer, reason

ROWS = {
    "bidirectional": dict(B=16, I=32, H=128, T=100),
    "packed": dict(B=64, I=64, H=256, T=200),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "bidirectional and variable-length rows (--rows)",
        "lltm.LLTM against cuDNN's nn.LSTM, both directions and packed batches")
    group.add_argument("--rows", type=_parse_rows, default=None, metavar="ROW,...",
                       help="run these rows instead of the table: bidirectional, packed, "
                            "or all")
    group.add_argument("--rows-seed", type=int, default=0,
                       help="seed of the data and of the packed row's lengths (default 0)")
    group.add_argument("--rows-passes", type=int, default=None,
                       help="timed passes per implementation (default 10, 2 with --quick)")


def _parse_rows(text: str) -> list[str]:
    rows = [r.strip() for r in text.split(",") if r.strip()]
    if rows == ["all"]:
        return list(ROWS)
    unknown = [r for r in rows if r not in ROWS]
    if unknown or not rows:
        raise argparse.ArgumentTypeError(f"unknown row(s) {unknown}; known: {list(ROWS)}, all")
    return rows


# ----------------------------------------------------------------------------
# Data and modules.

def _lengths(B: int, T: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(T // 2, T + 1, (B,), generator=g).tolist()


def _data(row: str, seed: int, s: dict) -> dict:
    B, I, H, T = s["B"], s["I"], s["H"], s["T"]
    g = torch.Generator().manual_seed(seed + 7919 * len(row))
    D = 2 if row == "bidirectional" else 1

    def randn(*shape, scale=1.0):
        return torch.randn(*shape, generator=g, dtype=torch.float64) * scale
    data = {"x": randn(T, B, I), "h": randn(D, B, H, scale=0.5), "c": randn(D, B, H, scale=0.5),
            "grad_out": randn(T, B, D * H), "grad_h": randn(D, B, H), "grad_c": randn(D, B, H),
            "lengths": _lengths(B, T, seed) if row == "packed" else None}
    return data


def _modules(I, H, bidirectional, seed):
    """An lltm.LLTM and an nn.LSTM (float64, CPU), seeded."""
    torch.manual_seed(seed)
    return (lltm.LLTM(I, H, bidirectional=bidirectional, dtype=torch.float64),
            torch.nn.LSTM(I, H, bidirectional=bidirectional, dtype=torch.float64))


def _clone(module, device, dtype, **changes):
    """module's parameters in a new module of the same kind on device/dtype."""
    if isinstance(module, lltm.LLTM):
        new = lltm.LLTM(module.input_size, module.hidden_size, bidirectional=module.bidirectional,
                        device=device, dtype=dtype, **changes)
    else:
        new = torch.nn.LSTM(module.input_size, module.hidden_size,
                            bidirectional=module.bidirectional, device=device, dtype=dtype)
    new.load_state_dict({k: v.to(device=device, dtype=dtype)
                         for k, v in module.state_dict().items()})
    return new


def _packed(x: torch.Tensor, lengths, requires_grad: bool) -> PackedSequence:
    p = pack_padded_sequence(x, lengths, enforce_sorted=False)
    data = p.data.detach().requires_grad_(requires_grad)
    return PackedSequence(data, p.batch_sizes, p.sorted_indices, p.unsorted_indices)


def _build(module, data, device, dtype, packed: bool, directions: int, need_grads=True):
    """(forward, leaves, grad_outputs) of module on the row's data. Every
    tensor is a fresh copy: the leaves are leaves of their own (a copy made
    by ``to`` from data another build made a leaf would be an autograd node
    created on the stream current then, the legacy one, and its input buffer
    would make a CUDA-graph capture of the backward wait on that stream)."""
    def copy(t):
        return t.detach().to(device=device, dtype=dtype, copy=True)
    x = copy(data["x"])
    H = module.hidden_size
    h = copy(data["h"][:directions]).requires_grad_()
    c = copy(data["c"][:directions]).requires_grad_()
    grad_out = copy(data["grad_out"][..., :directions * H])
    grads = [copy(data[n][:directions]) for n in ("grad_h", "grad_c")]
    if packed:
        inp = _packed(x, data["lengths"], True)
        leaf = inp.data
        grad_out = _packed(grad_out, data["lengths"], False).data
    else:
        inp = leaf = x.requires_grad_()
    leaves = [leaf, h, c, *module.parameters()]

    def forward():
        out, (h_n, c_n) = module(inp, (h, c))
        return (out.data if packed else out), h_n, c_n
    return forward, leaves, (grad_out, *grads)


def _oracle(forward, leaves, grad_outputs):
    outputs = forward()
    grads = torch.autograd.grad(outputs, leaves, grad_outputs)
    return tuple(o.detach() for o in outputs), tuple(g.detach() for g in grads)


def cases(row: str, device: torch.device, dtype: torch.dtype, seed: int,
          sizes: dict | None = None) -> dict:
    """key -> (label, Case, the same oracle computed in dtype on device) of
    one row; each Case's expected is its float64 CPU oracle. sizes: B, I, H,
    T instead of the row's (tests)."""
    s = sizes or ROWS[row]
    I, H = s["I"], s["H"]
    data = _data(row, seed, s)
    cpu, f64 = torch.device("cpu"), torch.float64
    result = {}
    if row == "bidirectional":
        lltm2, lstm2 = _modules(I, H, True, seed)
        lltm1, _ = _modules(I, H, False, seed)
        specs = [("lltm_bidirectional", "lltm.LLTM bidirectional", lltm2, False, 2),
                 ("lstm_bidirectional", "nn.LSTM bidirectional", lstm2, False, 2),
                 ("lltm_one_direction", "lltm.LLTM one direction", lltm1, False, 1)]
    else:
        lltm1, lstm1 = _modules(I, H, False, seed)
        specs = [("lltm_packed", "lltm.LLTM on the PackedSequence", lltm1, True, 1),
                 ("lstm_packed", "nn.LSTM on the PackedSequence", lstm1, True, 1),
                 ("lltm_padded", "lltm.LLTM padded to T (all rows T steps)", lltm1, False, 1)]
    for key, label, module, packed, D in specs:
        is_lltm = isinstance(module, lltm.LLTM)
        ref = _clone(module, cpu, f64, **({"impl": "reference"} if is_lltm else {}))
        expected = _oracle(*_build(ref, data, cpu, f64, packed, D))
        timed = _clone(module, device, dtype)
        forward, leaves, grad_outputs = _build(timed, data, device, dtype, packed, D)
        case = Case(forward, leaves, grad_outputs, expected, family="lltm" if is_lltm else "lstm",
                    uses_cudnn=not is_lltm and device.type == "cuda")
        # the same oracle in the dtype, on the device: the bar below float64
        same = _clone(module, device, dtype, **({"impl": "reference"} if is_lltm else {}))
        bar_case = Case(*_build(same, data, device, dtype, packed, D), expected)
        result[key] = (label, case, bar_case)
    return result


def bar(case: Case, bar_case: Case, dtype: torch.dtype, device: torch.device) -> float:
    if dtype == torch.float64:
        return TOLERANCE[dtype]
    floor = TF32_TOLERANCE if uses_tf32(dtype, device, case) else TOLERANCE[dtype]
    if floor == TF32_TOLERANCE and case.uses_cudnn:
        return floor
    try:
        own = check(bar_case, floor == TF32_TOLERANCE)[0]
    except Exception:  # noqa: BLE001 - then the fixed tolerance
        own = 0.0
    return max(floor, 2 * own)


# ----------------------------------------------------------------------------
# Running.

def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[dict]:
    devices = args.device or [torch.device("cuda") if torch.cuda.is_available()
                              else torch.device("cpu")]
    dtype = (args.dtype or [torch.float32])[0]
    passes = args.rows_passes or (2 if args.quick else 10)
    records = []
    for device in devices:
        for row in args.rows:
            records += run_row(row, device, dtype, args.rows_seed, passes,
                               graphs=device.type == "cuda" and not args.no_graphs)
    machine = describe_machine()
    machine["load_average_end"] = load_average()
    print(format_rows(records, machine))
    if args.json:
        import json
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "rows": records}, f, indent=1, default=str)
        print(f"saved {args.json}")
    return records


def run_row(row: str, device: torch.device, dtype: torch.dtype, seed: int, passes: int,
            graphs: bool, sizes: dict | None = None) -> list[dict]:
    """Check, then time, the implementations of one row: one record each."""
    built = cases(row, device, dtype, seed, sizes)
    records, timers = [], {}
    for key, (label, case, bar_case) in built.items():
        s = sizes or ROWS[row]
        rec = {"row": row, "impl": key, "label": label, "device": str(device),
               "dtype": str(dtype).replace("torch.", ""), **s, "status": "ok", "error": None,
               "bar": None, "step_us": None, "graph_step_us": None, "note": ""}
        if row == "packed":
            rec["lengths_mean"] = statistics.mean(_lengths(s["B"], s["T"], seed))
        if key.startswith("lstm") and device.type == "cuda":
            rec["label"] += " (cuDNN)"
        records.append(rec)
        try:
            err, where = check(case)
            tol = bar(case, bar_case, dtype, device)
            rec.update(error=err, bar=tol)
            if not err <= tol:
                rec.update(status="WRONG", note=f"worst at {where}")
                continue
            timers[key] = Timer(case, device)
            timers[key].warm_up(3)
        except Exception as error:  # noqa: BLE001
            rec.update(status="ERROR", note=reason(error))
    by_key = {r["impl"]: r for r in records}
    for _ in range(passes):  # interleaved: each pass times every implementation once
        for key, timer in timers.items():
            timer.run_pass(2)
    for key, timer in timers.items():
        by_key[key]["step_us"] = statistics.median(timer.samples["step"])
    if graphs:
        for key, timer in timers.items():
            graph = GraphTimer(timer.case, device, unroll=1)
            graph.capture(("graph_step",))
            if "graph_step" in graph.reasons:
                by_key[key]["note"] = "graph: " + graph.reasons["graph_step"]
                continue
            for _ in range(passes):
                graph.run_pass(5)
            by_key[key]["graph_step_us"] = statistics.median(graph.samples["graph_step"])
            graph.release()
    synchronize(device)
    return records


def format_rows(records: list[dict], machine: dict) -> str:
    def us(v):
        return "-" if v is None else f"{v:,.0f}"

    where = ", ".join(machine.get("gpus") or []) or machine.get("cpu", "")
    lines = [f"# python -m lltm.bench --rows: {where}, torch {machine.get('torch')}, "
             f"lltm {machine.get('lltm_git')}, {machine.get('date')}",
             "| row | implementation | error / bar | eager step us | GPU step us (graph) "
             "| nn.LSTM / this (eager) | nn.LSTM / this (graph) | note |",
             "|---|---|---|---|---|---|---|---|"]
    for row in dict.fromkeys(r["row"] for r in records):
        group = [r for r in records if r["row"] == row]
        peer = next((r for r in group if r["impl"].startswith("lstm")), None)
        for r in group:
            def ratio(metric):
                if peer is None or not peer[metric] or not r[metric]:
                    return "-"
                return f"{peer[metric] / r[metric]:.2f}x"
            err = "-" if r["error"] is None else f"{r['error']:.1e} / {r['bar']:.0e}"
            size = f"B{r['B']} I{r['I']} H{r['H']} T{r['T']}"
            if row == "packed":
                size += f" (mean length {r['lengths_mean']:.0f})"
            lines.append(f"| {row} {size} | {r['label']} | {err} {r['status']} | "
                         f"{us(r['step_us'])} | {us(r['graph_step_us'])} | {ratio('step_us')} | "
                         f"{ratio('graph_step_us')} | {r['note']} |")
    return "\n".join(lines)
