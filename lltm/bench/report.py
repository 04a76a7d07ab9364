"""Reporting: progress bar, machine description, the table, the plot."""
from __future__ import annotations

import datetime
import math
import os
import platform
import shutil
import subprocess
import sys

import torch

import lltm
from lltm import _native

from .cases import CELL_BASELINES, SEQUENCE_BASELINES
from .timing import GRAPH_METRICS, METRICS


class Progress:
    """A progress bar on a terminal, nothing otherwise.

    Draws only when ``enabled`` and the stream is a terminal: a log file or a
    pipe gets no carriage-return lines. The name of what runs is shown whole:
    where bar and name do not fit the terminal's width together, the name is
    written on a line of its own and the bar below it.
    """

    BAR = 20

    def __init__(self, total: int, enabled: bool, stream=None):
        self.stream = sys.stderr if stream is None else stream
        self.total, self.done = total, 0
        self.enabled = enabled and _is_terminal(self.stream)

    def update(self, n: int, what: str) -> None:
        self.done += n
        if not self.enabled:
            return
        fraction = min(self.done / max(self.total, 1), 1.0)
        filled = int(self.BAR * fraction)
        bar = f"[{'#' * filled}{'.' * (self.BAR - filled)}] {100 * fraction:3.0f}% "
        columns = shutil.get_terminal_size((80, 24)).columns
        if len(bar) + len(what) < columns:
            self.stream.write(f"\r\x1b[K{bar}{what}")
        else:  # the name whole on its own line, the bar below it
            self.stream.write(f"\r\x1b[K{what}\n{bar}")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def median(rec: dict, metric: str) -> float | None:
    value = rec.get(metric)
    return value.get("median_us") if isinstance(value, dict) else None


def describe_machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu": cpu, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(), "platform": platform.platform(),
        "torch": torch.__version__, "torch_cuda": torch.version.cuda,
        "lltm": getattr(lltm, "__version__", None), "lltm_git": _git_revision(),
        "gpus": [], "tf32": None, "load_average": load_average(),
        "lltm_autotune": lltm.backends.cuda.benchmark,
        "cpu_isa": _native.cpu_isa(), "cpu_flags": _cpu_flags(),
    }
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        info["cudnn"] = torch.backends.cudnn.version()
        info["tf32"] = {"matmul": torch.backends.cuda.matmul.allow_tf32,
                        "cudnn": torch.backends.cudnn.allow_tf32}
    return info


def _cpu_flags() -> list[str]:
    """The vector extensions /proc/cpuinfo lists (the ISA the figures were
    measured on)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next(line for line in f if line.startswith("flags")).split(":")[1].split()
    except (OSError, StopIteration, IndexError):
        return []
    return sorted(f for f in flags if f.startswith(("avx", "fma", "amx")))


def load_average() -> float | None:
    """The 1-minute load average: other work on the machine shows here (and
    in wide p10-p90 spreads)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


def _git_revision() -> str | None:
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=7"], capture_output=True,
                             text=True, timeout=5,
                             cwd=os.path.dirname(os.path.abspath(lltm.__file__)))
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def _fmt_us(value: float) -> str:
    if value >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}" if value >= 1 else f"{value:.2g}"


def _fmt_cell(stat) -> str:
    if stat is None:
        return "-"
    if "n/a" in stat:
        return "n/a"
    return f"{_fmt_us(stat['median_us'])} [{_fmt_us(stat['p10_us'])}-{_fmt_us(stat['p90_us'])}]"


def _fmt_speedup(ratio: float | None) -> str:
    if ratio is None:
        return "-"
    if ratio >= 1:
        return f"x{ratio:.2f} faster"
    return f"x{1 / ratio:.2f} slower"


def _fmt_status(rec: dict) -> str:
    if rec["status"] == "ok":
        return f"ok {rec['error']:.0e}"
    if rec["status"] == "WRONG":
        return f"WRONG {rec['error']:.1e}"
    return rec["status"]


def tf32_text(machine: dict) -> str:
    """The TF32 flags of a CUDA run, for a table's first line ('' without)."""
    flags = machine.get("tf32")
    if not flags:
        return ""
    state = {True: "on", False: "off"}
    return (f"; float32 on TF32: aten::mm {state[bool(flags['matmul'])]}, "
            f"cuDNN {state[bool(flags['cudnn'])]}")


def machine_text(machine: dict) -> str:
    """torch, the CPU, the GPUs and the TF32 flags of a run, for the first
    line of its tables."""
    return (f"torch {machine['torch']}, CPU {machine['cpu']} "
            f"({machine['torch_threads']} torch threads, lltm's products on "
            f"{machine.get('cpu_isa')})"
            + (f", GPU {', '.join(machine['gpus'])}" if machine["gpus"] else "")
            + tf32_text(machine)
            + ("; lltm.backends.cuda.benchmark on" if machine.get("lltm_autotune") else ""))


def format_table(records: list[dict], machine: dict) -> str:
    lines = [f"lltm benchmark, {machine['date']}: {machine_text(machine)}",
             "times in microseconds per call: median [p10-p90]; check = largest "
             "max|err|/max|ref| of outputs and gradients against float64;",
             "x faster/slower = the baseline's median / this median, for the pipelined step.",
             f"load average (1 min) at start {machine['load_average']}, at end "
             f"{machine.get('load_average_end')} on {machine['cpu_count']} CPUs", ""]
    for (device, dtype, kind, B, I, H, T, L), recs in _groups(records).items():
        graphs = any(isinstance(r.get("graph_step"), dict) for r in recs)
        metrics = METRICS + (GRAPH_METRICS if graphs else ())
        baselines = CELL_BASELINES if kind == "cell" else SEQUENCE_BASELINES
        no_input_grad = " | input and state need no grad" if any(
            r.get("input_grad") is False for r in recs) else ""
        lines.append(f"== {device} | {dtype} | {kind} {_size(kind, B, I, H, T, L)}"
                     f"{no_input_grad}")
        header = ["implementation", "check"] + [m.replace("graph_", "graph ") for m in metrics] \
            + [f"step vs {b}" for b in baselines]
        rows = [header]
        for rec in recs:
            rows.append([rec["label"], _fmt_status(rec)] + [_fmt_cell(rec[m]) for m in metrics]
                        + ["baseline" if rec["impl"] == b else
                           _fmt_speedup(rec.get("speedup", {}).get(b, {}).get("step"))
                           for b in baselines])
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        for i, row in enumerate(rows):
            lines.append("  " + "  ".join(cell.ljust(widths[j]) if j < 2 else cell.rjust(widths[j])
                                          for j, cell in enumerate(row)).rstrip())
        for rec in recs:
            notes = [rec["note"]] if rec["note"] else []
            for metric in GRAPH_METRICS:
                stat = rec.get(metric)
                if isinstance(stat, dict) and stat.get("n/a"):
                    notes.append(f"{metric}: n/a ({stat['n/a']})")
            if rec["status"] == "WRONG":
                notes.append(f"not timed: error {rec['error']:.2e} in {rec['where']} "
                             f"> tolerance {rec['tolerance']:.0e}")
            if notes:
                lines.append(f"  - {rec['impl']}: " + "; ".join(notes))
        ours = [r for r in recs if r["impl"] in ("native", "lltm") and median(r, "step")]
        for mine in ours:
            parts = [f"{_fmt_speedup(median(p, 'step') / median(mine, 'step'))} than {p['impl']}"
                     for p in recs if p is not mine and median(p, "step")]
            if parts:
                lines.append(f"  {mine['impl']} step: " + ", ".join(parts))
        lines.append("")
    return "\n".join(lines)


def _groups(records: list[dict]) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = {}
    for rec in records:
        groups.setdefault((rec["device"], rec["dtype"], rec["kind"], rec["B"], rec["I"],
                           rec["H"], rec["T"], rec.get("layers", 1)), []).append(rec)
    return groups


def _size(kind: str, B: int, I: int, H: int, T: int, L: int) -> str:
    size = f"B={B} I={I} H={H}"
    if kind == "sequence":
        size += f" T={T}" + (f" L={L}" if L > 1 else "")
    return size


def save_plot(records: list[dict], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator

    groups = _groups(records)
    ncols = 2 if len(groups) > 1 else 1
    nrows = math.ceil(len(groups) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(8 * ncols, 4.5 * nrows), squeeze=False)
    colors = {"forward": "#4c72b0", "backward": "#dd8452", "step": "#55a868",
              "graph_forward": "#8fa9d6", "graph_backward": "#f0b48a", "graph_step": "#a3d4ad"}
    for ax, ((device, dtype, kind, B, I, H, T, L), recs) in zip(axes.flat, groups.items()):
        metrics = [m for m in METRICS + GRAPH_METRICS
                   if any(median(r, m) for r in recs)]
        width = 0.8 / max(len(metrics), 1)
        for j, metric in enumerate(metrics):
            xs, ys, lo, hi = [], [], [], []
            for i, rec in enumerate(recs):
                med = median(rec, metric)
                if med:
                    xs.append(i + (j - (len(metrics) - 1) / 2) * width)
                    ys.append(med)
                    lo.append(med - rec[metric]["p10_us"])
                    hi.append(rec[metric]["p90_us"] - med)
            ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, label=metric.replace("_", " "),
                   color=colors[metric])
        labels = [r["label"] + ("" if r["status"] == "ok" else f"\n({r['status']})") for r in recs]
        ax.set_xticks(range(len(recs)))
        ax.set_xticklabels(labels, rotation=25, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
        ax.set_ylabel("microseconds (median, p10-p90)")
        ax.set_title(f"{device} {dtype} {kind} {_size(kind, B, I, H, T, L)}", fontsize=10)
        ax.grid(axis="y", which="both", alpha=0.3)
        if metrics:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "nothing timed", transform=ax.transAxes, ha="center")
    for ax in list(axes.flat)[len(groups):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def finite(value):
    """JSON has no inf / nan: write them as strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value
