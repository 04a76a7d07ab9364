"""GPU time (CUDA-graph replay) of one forward+backward step of a packed batch
run as stretches of steps, each over only the rows still running: does a
packed batch get faster than the same batch padded to T once the kernels run
at the batch size that is left?

    python3 dev/timing/packed_segments.py [--shapes B,I,H,T ...] [--overheads 10,30,100]

Rows are sorted longest first (a PackedSequence's order), so the rows running
at step t are a prefix 0 .. n_t - 1. A split of the steps into stretches
[s_j, s_j+1) runs each stretch as one sequence call over rows 0 .. n_(s_j) - 1,
starting from the state the stretch before left; rows that stopped earlier keep
theirs. The split minimizes sum_j L_j * (a + b * n_j) + overhead over the
stretches (a, b: a per-step cost line; overhead: what a call costs beyond its
steps, us); larger overheads give fewer stretches. Each split's outputs and
gradients are checked against the one-call packed run first.
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import lltm  # noqa: E402
import lltm.sequence  # noqa: E402
from directions import graph_us, make_step  # noqa: E402


def split(lengths, overhead, a=3.9, b=0.127):
    """Stretch starts (ascending, first 0, then the end) for rows of these
    lengths, sorted longest first, minimizing the cost line plus overhead."""
    ends = sorted(set(lengths))
    cuts = [0] + [e for e in ends if e < lengths[0]] + [lengths[0]]
    running = [sum(1 for n in lengths if n > s) for s in cuts]
    best = {len(cuts) - 1: (0.0, None)}
    for i in range(len(cuts) - 2, -1, -1):
        best[i] = min((overhead + (cuts[j] - cuts[i]) * (a + b * running[i]) + best[j][0], j)
                      for j in range(i + 1, len(cuts)))
    out, i = [0], 0
    while best[i][1] is not None:
        i = best[i][1]
        out.append(cuts[i])
    return out


def segmented_layer(host_lengths, starts):
    """A replacement of the library's native layer runner that runs the
    stretches of `starts` (rows sorted longest first)."""
    made = {}

    def run(x, weights, bias, h0, c0, lengths=None):
        if lengths is None:
            return lltm.functional.lltm_sequence(x, weights, bias, h0, c0)
        B, H = x.shape[1], h0.shape[1]
        outs, h, c = [], h0, c0
        for s0, s1 in zip(starts[:-1], starts[1:]):
            n = sum(1 for v in host_lengths if v > s0)
            key = (s0, s1, x.device)
            if key not in made:  # made before capture: the first call is a warm-up
                made[key] = torch.tensor([min(v - s0, s1 - s0) for v in host_lengths[:n]],
                                         dtype=torch.int64, device=x.device)
            o, (hn, cn) = lltm.functional.lltm_sequence(
                x[s0:s1, :n], weights, bias, h[:n], c[:n], made[key])
            outs.append(o if n == B else torch.nn.functional.pad(o, (0, 0, 0, B - n)))
            h = hn if n == B else torch.cat([hn, h[n:]])
            c = cn if n == B else torch.cat([cn, c[n:]])
        out = torch.cat(outs)
        if out.shape[0] < x.shape[0]:
            out = torch.nn.functional.pad(out, (0, 0, 0, 0, 0, x.shape[0] - out.shape[0]))
        return out, (h, c)
    return run


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["64,64,256,200", "16,64,256,200",
                                                       "64,64,128,200", "64,64,512,200"])
    parser.add_argument("--overheads", default="10,30,100")
    parser.add_argument("--dtypes", default="float32")
    args = parser.parse_args()
    native = lltm.sequence._LAYERS["native"]
    rows = []
    for shape in args.shapes:
        B, I, H, T = map(int, shape.split(","))
        for dtype in [getattr(torch, d) for d in args.dtypes.split(",")]:
            g = torch.Generator().manual_seed(0)
            lens = torch.randint(T // 2, T + 1, (B,), generator=g)
            lens[0] = T
            host = sorted(lens.tolist(), reverse=True)
            x = torch.randn(T, B, I, generator=g).to("cuda", dtype)
            torch.manual_seed(0)
            module = lltm.LLTM(I, H).to("cuda", dtype)
            step, forward = make_step(module, x, 1, H, lens, packed=True)
            ref = [t.float() for t in step()]
            label = f"B{B} I{I} H{H} T{T} {str(dtype)[6:]}"
            pstep, _ = make_step(module, x, 1, H)
            rows.append((label, "padded to T", 1, graph_us(pstep)))
            rows.append((label, "packed, one call", 1, graph_us(step)))
            for overhead in map(float, args.overheads.split(",")):
                starts = split(host, overhead)
                lltm.sequence._LAYERS["native"] = segmented_layer(host, starts)
                try:
                    got = [t.float() for t in step()]
                    err = max(((u - v).abs().max() / v.abs().max().clamp_min(1e-30)).item()
                              for u, v in zip(got, ref))
                    if err > (1e-4 if dtype == torch.float32 else 3e-2):
                        raise SystemExit(f"{label}: stretches {starts} differ by {err:.1e}")
                    rows.append((label, f"packed, stretches {starts}", len(starts) - 1,
                                 graph_us(step)))
                finally:
                    lltm.sequence._LAYERS["native"] = native
            print(*rows[-2 - len(args.overheads.split(",")):], sep="\n", flush=True)
    print("| shape | run | calls | GPU us (graph) | vs padded |")
    print("|---|---|---|---|---|")
    padded = {}
    for label, run, calls, us in rows:
        padded.setdefault(label, us)
        print(f"| {label} | {run} | {calls} | {us:,.0f} | {padded[label] / us:.2f}x |")


if __name__ == "__main__":
    main()
