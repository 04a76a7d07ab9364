"""Side-by-side GPU timing of one LLTM layer over a whole sequence: lltm.LLTM
(the library's own plan choice) against cuDNN nn.LSTM (the peer
a user would pick; NOT an LLTM: 4 gates) and a Python loop of reference
cells, float32, one process, implementations interleaved pass by pass.

    python3 dev/timing/sequence_timing.py [--json PATH] [--quick] [--configs B,I,H,T ...]

What is timed (CUDA events, median of the samples, after warm-up):
  fwd       one forward call with autograd recording (parameters require grad)
  fwd+bwd   forward, then torch.autograd.backward with fixed random gradients
            of output, h_n and c_n, back to back; events around both
  fwd/step  fwd divided by T (microseconds)
  graph fwd/step  a forward without autograd captured in a CUDA graph, its
            replays (no host time) divided by T (lltm and cuDNN only)
Before timing, every LLTM implementation's outputs and gradients are compared
with the float64 CPU op on the first 100 steps (max relative error, printed;
"WRONG" in the table above 1e-4).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import lltm  # noqa: E402

CONFIGS = [(16, 32, 128, 100), (16, 32, 128, 1000), (64, 256, 512, 100)]


class Case:
    """One implementation at one size: run(grad) does a forward, and a
    backward too when grad is true."""

    def __init__(self, name, module, x):
        self.name, self.module, self.x = name, module, x
        out, (h, c) = self._forward()
        g = torch.Generator(device="cuda").manual_seed(0)
        self.grads = [torch.randn(t.shape, device="cuda", generator=g) for t in (out, h, c)]

    def _forward(self):
        return self.module(self.x)

    def run(self, backward):
        out, (h, c) = self._forward()
        if backward:
            torch.autograd.backward([out, h, c], self.grads)
        return out, h, c

    def results(self):
        for p in self.module.parameters():
            p.grad = None
        self.x.grad = None
        out, h, c = self.run(True)
        return [out, h, c, self.x.grad] + [p.grad for p in self.module.parameters()]


def time_ms(case, backward, reps):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(reps):
        torch.cuda.synchronize()
        start.record()
        case.run(backward)
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return samples


def graph_fwd_ms(case, reps):
    """Replays of a CUDA graph of one forward (no autograd)."""
    x = case.x.detach().clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad():
        with torch.cuda.stream(side):
            for _ in range(2):
                case.module(x)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            case.module(x)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(reps):
        torch.cuda.synchronize()
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return samples


def build_cases(B, I, H, T, with_reference):
    torch.manual_seed(0)
    x = torch.randn(T, B, I, device="cuda", requires_grad=True)
    base = lltm.LLTM(I, H).cuda()
    cases = [Case("lltm.LLTM", base, x)]
    lstm = torch.nn.LSTM(I, H).cuda()
    cases.append(Case("cuDNN nn.LSTM", lstm, x))
    if with_reference:
        ref = lltm.LLTM(I, H, impl="reference").cuda()
        ref.load_state_dict(base.state_dict())
        cases.append(Case("loop of reference cells", ref, x))
    return cases


def check(cases, B, I, H, steps=100):
    """Every LLTM implementation against the float64 CPU op (itself tested
    against the reference loop) on the first `steps` steps, where float32
    rounding is not yet amplified by the recurrence (c grows without bound in
    an LLTM: over 1000 steps float32 and float64 drift apart by ~1e-3 even on
    the CPU). Returns {name: max relative error over outputs and gradients}."""
    torch.manual_seed(1)
    T = min(steps, cases[0].x.shape[0])
    x64 = cases[0].x.detach()[:T].double().cpu().requires_grad_()
    ref = lltm.LLTM(I, H, dtype=torch.float64)
    ref.load_state_dict({k: v.double().cpu() for k, v in cases[0].module.state_dict().items()})
    out, (h, c) = ref(x64)
    ups = [torch.randn_like(t) for t in (out, h, c)]
    torch.autograd.backward([out, h, c], ups)
    want = [out, h, c, x64.grad] + [p.grad for p in ref.parameters()]
    errors = {}
    for case in cases:
        if "LSTM" in case.name:
            continue
        xg = x64.detach().float().cuda().requires_grad_()
        for p in case.module.parameters():
            p.grad = None
        o, (hh, cc) = case.module(xg)
        torch.autograd.backward([o, hh, cc], [u.float().cuda() for u in ups])
        got = [o, hh, cc, xg.grad] + [p.grad for p in case.module.parameters()]
        errs = [((a.double().cpu() - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()
                for a, b in zip(got, want)]
        errors[case.name] = errs
        names = ["output", "h_n", "c_n", "grad x"] + [f"grad {n}" for n, _ in
                                                      case.module.named_parameters()]
        print(f"check B={B} I={I} H={H} T={T} {case.name}: max rel error "
              + ", ".join(f"{n} {e:.1e}" for n, e in zip(names, errs)), flush=True)
    return {k: max(v) for k, v in errors.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="save every sample here")
    parser.add_argument("--quick", action="store_true", help="few repetitions")
    parser.add_argument("--configs", nargs="*", metavar="B,I,H,T",
                        help="sizes to time (default: %s)" % " ".join(
                            ",".join(map(str, c)) for c in CONFIGS))
    parser.add_argument("--no-reference", action="store_true",
                        help="leave out the loop of reference cells")
    args = parser.parse_args(argv)
    assert torch.cuda.is_available(), "needs a GPU"
    passes = 3 if args.quick else 5
    configs = ([tuple(int(v) for v in c.split(",")) for c in args.configs] if args.configs
               else CONFIGS)
    records = []
    for B, I, H, T in configs:
        cases = build_cases(B, I, H, T, with_reference=(T == 100 and H == 128 and
                                                        not args.no_reference))
        errors = check(cases, B, I, H)
        samples = {(c.name, k): [] for c in cases for k in ("fwd", "fwd+bwd")}
        for c in cases:  # warm-up: plans, cuBLAS handles, cuDNN algorithms
            for _ in range(3):
                c.run(True)
        for r in range(passes):
            for c in cases[r % len(cases):] + cases[:r % len(cases)]:
                slow = "reference" in c.name
                reps = 1 if slow else (4 if T >= 1000 else 10)
                samples[(c.name, "fwd")] += time_ms(c, False, reps)
                samples[(c.name, "fwd+bwd")] += time_ms(c, True, reps)
        graph_us = {}
        for c in cases:
            if c.name == "lltm.LLTM" or "LSTM" in c.name:
                reps = 10 if T >= 1000 else 30
                graph_us[c.name] = 1000 * statistics.median(graph_fwd_ms(c, reps)) / T
        med = {k: statistics.median(v) for k, v in samples.items()}
        lstm = med[("cuDNN nn.LSTM", "fwd+bwd")]
        for c in cases:
            fwd, step = med[(c.name, "fwd")], med[(c.name, "fwd+bwd")]
            records.append({"B": B, "I": I, "H": H, "T": T, "impl": c.name,
                            "max_rel_error": errors.get(c.name), "fwd_ms": fwd,
                            "fwd_us_per_step": 1000 * fwd / T, "fwd_bwd_ms": step,
                            "graph_fwd_us_per_step": graph_us.get(c.name),
                            "cudnn_over_this": lstm / step,
                            "samples": {k[1]: samples[k] for k in samples if k[0] == c.name}})
    print("| B, I, H, T | implementation | fwd ms | fwd us/step | graph fwd us/step | "
          "fwd+bwd ms | cuDNN fwd+bwd / this | check |")
    print("|---|---|---|---|---|---|---|---|")
    for r in records:
        e = r["max_rel_error"]
        verdict = "peer" if e is None else (f"ok {e:.0e}" if e <= 1e-4 else f"WRONG {e:.0e}")
        graph = r["graph_fwd_us_per_step"]
        graph = "" if graph is None else f"{graph:.2f}"
        print(f"| {r['B']}, {r['I']}, {r['H']}, {r['T']} | {r['impl']} | {r['fwd_ms']:.3f} | "
              f"{r['fwd_us_per_step']:.2f} | {graph} | {r['fwd_bwd_ms']:.3f} | "
              f"{r['cudnn_over_this']:.2f} | {verdict} |")
    ref = [r for r in records if "reference" in r["impl"]]
    for r in ref:
        mine = next(x for x in records if x["impl"] == "lltm.LLTM" and
                    (x["B"], x["H"], x["T"]) == (r["B"], r["H"], r["T"]))
        print(f"loop of reference cells / lltm.LLTM, fwd+bwd, B={r['B']} H={r['H']} "
              f"T={r['T']}: {r['fwd_bwd_ms'] / mine['fwd_bwd_ms']:.1f}x")
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"cudnn {torch.backends.cudnn.version()}, cudnn.allow_tf32="
          f"{torch.backends.cudnn.allow_tf32}, matmul.allow_tf32="
          f"{torch.backends.cuda.matmul.allow_tf32}")
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
