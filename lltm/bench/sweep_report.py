"""The performance map's tables and heatmaps (``python -m lltm.bench --sweep``)."""
from __future__ import annotations

import math
import os

from .report import machine_text, tf32_text
from .sweep import BEST, OURS, PEERS

NAMES = {"lltm": "lltm.LLTM", "lstm": "nn.LSTM", "native": "lltm.LLTMCell (native)",
         "reference": "reference", "lstm_cell": "nn.LSTMCell",
         BEST: "min(reference, nn.LSTMCell)"}
FIGURE_NAMES = {"graph_step": "CUDA-graph replay (GPU time of forward+backward)",
                "step": "eager step (forward+backward, pipelined)",
                "infer": "inference (forward under no_grad, pipelined)"}
SHORT_STATUS = {"WRONG": "WRONG", "ERROR": "ERROR", "skipped": "skip"}


def blocks(entries: list[dict]) -> dict[tuple, list[dict]]:
    """(device, kind, dtype, layers) -> its entries, in the order met."""
    out: dict[tuple, list[dict]] = {}
    for e in entries:
        out.setdefault((e["device"], e["kind"], e["dtype"], e["layers"]), []).append(e)
    return out


def figures_of(entries: list[dict]) -> list[str]:
    """The figures of a block's ratios (else of its times), the primary first:
    graph replay where there is one."""
    found = {f for e in entries for ratios in e["ratios"].values() for f in ratios}
    if not found:
        found = {f for e in entries for t in e["times_us"].values() for f, v in t.items() if v}
    return [f for f in ("graph_step", "step", "infer") if f in found]


def comparisons(kind: str) -> tuple[str, ...]:
    """The peers a block's ratios are taken against, the headline first."""
    return (BEST,) + PEERS[kind] if len(PEERS[kind]) > 1 else PEERS[kind]


def cell_text(entry: dict | None, peer: str, figure: str) -> str:
    if entry is None:
        return ""
    if entry["status"] != "ok":
        return SHORT_STATUS.get(entry["status"], entry["status"])
    ratio = entry["ratios"].get(peer, {}).get(figure)
    return "-" if ratio is None else _fmt_ratio(ratio)


def _fmt_ratio(ratio: float) -> str:
    return f"{ratio:.0f}" if ratio >= 100 else f"{ratio:.2f}" if ratio < 10 else f"{ratio:.1f}"


def _fmt_us(value: float | None) -> str:
    if not value:
        return "-"
    return f"{value / 1e3:.1f}ms" if value >= 1e4 else f"{value:.0f}" if value >= 10 else \
        f"{value:.1f}"


def _grid(entries: list[dict], text) -> list[str]:
    """Rows B, columns H; ``text(entry)`` fills a cell."""
    Bs = sorted({e["B"] for e in entries})
    Hs = sorted({e["H"] for e in entries})
    at = {(e["B"], e["H"]): e for e in entries}
    rows = [["B \\ H"] + [str(H) for H in Hs]]
    rows += [[str(B)] + [text(at.get((B, H))) for H in Hs] for B in Bs]
    width = max(6, max(len(c) for row in rows for c in row))
    return ["    " + "".join(c.rjust(width + 1) for c in row) for row in rows]


def _header(key: tuple, entries: list[dict]) -> str:
    device, kind, dtype, layers = key
    e = entries[0]
    size = f"T={e['T']}, {layers} layer{'s' if layers > 1 else ''}, " if kind == "sequence" \
        else ""
    return f"== {device} | {kind} | {dtype} | {size}I=H/2"


def _notes(records: list[dict], key: tuple) -> list[str]:
    """Every implementation of the block that is not ok, and why; one line per
    shape and reason."""
    reasons: dict[tuple, list[str]] = {}
    for rec in records:
        if (rec["device"], rec["kind"], rec["dtype"], rec["layers"]) != key \
                or rec["status"] == "ok":
            continue
        what = rec["note"] or ""
        if rec["status"] == "WRONG":
            what = f"error {rec['error']:.2e} in {rec['where']} > tolerance " \
                   f"{rec['tolerance']:.0e}, not timed"
        reasons.setdefault((rec["B"], rec["H"], rec["status"], what), []).append(rec["impl"])
    return [f"  - B={B} H={H}: {', '.join(impls)} {status}: {what}"
            for (B, H, status, what), impls in reasons.items()]


def format_block(key: tuple, entries: list[dict], records: list[dict]) -> list[str]:
    kind = key[1]
    ours = OURS[kind]
    lines = [_header(key, entries)]
    figures = figures_of(entries)
    for figure in figures:
        for peer in comparisons(kind):
            lines.append(f"  {NAMES[peer]} time / {NAMES[ours]} time, {FIGURE_NAMES[figure]}; "
                         f">1: {ours} faster")
            lines += _grid(entries, lambda e, p=peer, f=figure: cell_text(e, p, f))
    if figures:
        primary = figures[0]
        lines.append(f"  {NAMES[ours]}, microseconds per forward+backward, "
                     f"{FIGURE_NAMES[primary]}")
        lines += _grid(entries, lambda e: "" if e is None else
                       _fmt_us(e["times_us"].get(ours, {}).get(primary)))
    lines += _notes(records, key)
    na = sorted({f"{r['impl']}: {r['graph_step']['n/a']}" for r in records
                 if (r["device"], r["kind"], r["dtype"], r["layers"]) == key
                 and isinstance(r.get("graph_step"), dict) and "n/a" in r["graph_step"]})
    lines += [f"  - graph n/a, {text}" for text in na]
    return lines + [""]


def format_tables(result: dict) -> str:
    machine = result["machine"]
    lines = [f"lltm performance map, {machine['date']}: {machine_text(machine)}",
             "ratio = the peer's median time / lltm's median time (>1: lltm faster); "
             "every implementation checked against float64 first;",
             "WRONG / ERROR: lltm failed its check or raised (not timed); skip: not run "
             "(memory or time limit); -: the peer is not timed (see notes).", ""]
    for key, entries in blocks(result["map"]).items():
        lines += format_block(key, entries, result["results"])
    return "\n".join(lines)


# ----------------------------------------------------------------------------
# Heatmaps.

def heatmap_name(key: tuple) -> str:
    device, kind, dtype, layers = key
    depth = f"-L{layers}" if kind == "sequence" else ""
    return f"sweep-{device.replace(':', '')}-{kind}-{dtype}{depth}.png"


def save_heatmaps(result: dict, out_dir: str) -> list[str]:
    """One PNG per (device, kind, dtype, layers): the headline ratio (against
    nn.LSTM; the cells against the faster of reference and nn.LSTMCell) per
    B x H, on the primary figure; a diverging colour map centred at 1, its
    title ending in :func:`heatmap_caption`."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for key, entries in blocks(result["map"]).items():
        figures = figures_of(entries)
        figure = figures[0] if figures else "step"
        peer = comparisons(key[1])[0]
        fig = _heatmap(plt, key, entries, peer, figure, heatmap_caption(result["machine"], key))
        path = os.path.join(out_dir, heatmap_name(key))
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def heatmap_caption(machine: dict, key: tuple) -> str:
    """Where and when a heatmap was measured, for its title: the GPU (or
    CPU) of its device, the run's date, lltm's commit and, for float32 on
    CUDA, the TF32 flags; a picture copied away from its run still says it."""
    device, _, dtype, _ = key
    gpus = machine.get("gpus") or []
    where = gpus[0] if device.startswith("cuda") and gpus else machine.get("cpu", device)
    text = f"{where}, {str(machine.get('date', ''))[:10]}, lltm {machine.get('lltm_git')}"
    if device.startswith("cuda") and dtype == "float32":
        text += tf32_text(machine).replace(";", ",")
    return text


def _heatmap(plt, key: tuple, entries: list[dict], peer: str, figure: str, caption: str = ""):
    import numpy as np
    from matplotlib.colors import TwoSlopeNorm

    device, kind, dtype, layers = key
    Bs = sorted({e["B"] for e in entries})
    Hs = sorted({e["H"] for e in entries})
    at = {(e["B"], e["H"]): e for e in entries}
    values = np.full((len(Bs), len(Hs)), np.nan)
    for i, B in enumerate(Bs):
        for j, H in enumerate(Hs):
            e = at.get((B, H))
            ratio = e and e["status"] == "ok" and e["ratios"].get(peer, {}).get(figure)
            if ratio:
                values[i, j] = math.log2(ratio)
    finite = values[np.isfinite(values)]
    span = max(1.0, float(np.abs(finite).max()) if finite.size else 1.0)
    cmap = plt.get_cmap("RdBu").copy()
    cmap.set_bad("#d9d9d9")
    fig, ax = plt.subplots(figsize=(max(6.4, 1.2 * len(Hs) + 2.6), 0.75 * len(Bs) + 2.4))
    image = ax.imshow(np.ma.masked_invalid(values), cmap=cmap,
                      norm=TwoSlopeNorm(vcenter=0.0, vmin=-span, vmax=span), aspect="auto")
    for i, B in enumerate(Bs):
        for j, H in enumerate(Hs):
            text = cell_text(at.get((B, H)), peer, figure)
            dark = np.isfinite(values[i, j]) and abs(values[i, j]) > 0.6 * span
            ax.text(j, i, text, ha="center", va="center", fontsize=9,
                    color="white" if dark else "black")
    ax.set_xticks(range(len(Hs)), [str(H) for H in Hs])
    ax.set_yticks(range(len(Bs)), [str(B) for B in Bs])
    ax.set_xlabel("H (state size; I = H/2)")
    ax.set_ylabel("B (batch)")
    step = max(1, math.ceil(span / 4))  # at most 9 ticks: powers of 2 around 1
    ticks = list(range(-(int(span) // step) * step, int(span) + 1, step))
    bar = fig.colorbar(image, ax=ax, ticks=ticks)
    bar.ax.set_yticklabels([_fmt_ratio(2.0 ** t) for t in ticks])
    bar.set_label("ratio (>1: lltm faster)")
    depth = f", T={entries[0]['T']}, {layers} layer{'s' if layers > 1 else ''}" \
        if kind == "sequence" else ""
    ax.set_title(f"{device} {dtype} {kind}{depth}, {FIGURE_NAMES[figure].split(' (')[0]}\n"
                 f"{NAMES[peer]} time / {NAMES[OURS[kind]]} time"
                 + (f"\n{caption}" if caption else ""), fontsize=9)
    fig.tight_layout()
    return fig
