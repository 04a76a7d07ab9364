"""Side-by-side timing of one LLTM step on CUDA: the native cell against the
reference Python LLTM, torch.compile(reference) (default mode) and
nn.LSTMCell, all in one process, interleaved in passes.

    python3 dev/timing/cuda_timing.py [--json PATH] [--quick]

Per implementation and size, medians (microseconds) of:
  fwd    forward, synchronized after each call (latency)
  bwd    backward (torch.autograd.grad of every input), synchronized each call
  step   pipelined forward+backward, N steps with no sync inside, per step
  g_fwd  GPU time of the forward, from replaying a CUDA graph of it
  g_bwd  GPU time of the backward, likewise
Every input (x, weights, bias, h, c) requires grad. float32 unless noted;
"native[fused]" / "native[cublas]" force one route of the CUDA binding.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import lltm  # noqa: E402
from lltm import _native, reference  # noqa: E402

DEVICE = "cuda"
SMALL = (16, 32, 128)
MEDIUM = (64, 256, 512)  # where the fused kernels and cuBLAS meet
LARGE = (256, 512, 1024)


def set_policy(name: str) -> None:
    """Forces the CUDA cell's route (fused kernels or cuBLAS) through the
    library's exported lltm_cuda_set_matmul_policy; "auto" restores the
    library's own choice."""
    fn = _native._loaded["cuda"].lltm_cuda_set_matmul_policy
    fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_int]
    fn({"auto": 0, "fused": 1, "cublas": 2}[name])


class Impl:
    """One implementation at one size: inputs, forward closure, upstream grads."""

    def __init__(self, label, B, I, H, compiled_cache):
        """label: "<impl>[<route>] <dtype>", route and dtype optional
        (default auto, float32); impl: native, reference, compile, lstmcell,
        and two floors: "ops" (the native operators called directly, no
        autograd: what the binding and launches cost) and "autograd-floor"
        (one multiply and its backward through autograd: the least any
        autograd implementation pays on this host)."""
        self.name = label
        head, _, dtype_name = label.partition(" ")
        dtype = {"": torch.float32, "bf16": torch.bfloat16}[dtype_name]
        name, _, route = head.partition("[")
        self.policy = route.rstrip("]") or "auto"
        self.dtype = dtype
        dev = DEVICE
        g = torch.Generator(device=dev).manual_seed(0)

        def rand(*shape, scale=1.0):
            return (torch.randn(*shape, device=dev, generator=g) * scale).to(dtype).requires_grad_()
        self.x, self.h, self.c = rand(B, I), rand(B, H), rand(B, H)
        self.up = (torch.randn(B, H, device=dev, generator=g).to(dtype),
                   torch.randn(B, H, device=dev, generator=g).to(dtype))
        self.backward = self._autograd_backward
        if name == "autograd-floor":
            self.leaves = [self.h]
            self.up = self.up[:1]
            self.fn = lambda: (self.h * 2.0,)
            return
        if name == "lstmcell":
            self.cell = torch.nn.LSTMCell(I, H, device=dev, dtype=dtype)
            self.leaves = [self.x, self.h, self.c, *self.cell.parameters()]
            self.fn = lambda: self.cell(self.x, (self.h, self.c))
            return
        self.W = rand(3 * H, I + H, scale=1.0 / (I + H) ** 0.5)
        self.b = rand(3 * H, scale=0.1)
        self.leaves = [self.x, self.W, self.b, self.h, self.c]
        args = (self.x, self.W, self.b, self.h, self.c)
        if name == "ops":
            plain = [a.detach() for a in args]
            fwd_op = torch.ops.lltm.cell_forward.default
            bwd_op = torch.ops.lltm.cell_backward.default
            self.fn = lambda: fwd_op(*plain)
            self.backward = lambda out: bwd_op(self.up[0], self.up[1], out[1], out[2], plain[0],
                                               plain[3], plain[1])
        elif name.startswith("native"):
            self.fn = lambda: lltm.functional.lltm_cell(*args)
        elif name == "reference":
            self.fn = lambda: reference.lltm_cell(*args)
        elif name == "compile":
            key = (B, I, H, dtype)
            if key not in compiled_cache:
                compiled_cache[key] = torch.compile(reference.lltm_cell)
            compiled = compiled_cache[key]
            self.fn = lambda: compiled(*args)
        else:
            raise ValueError(name)

    def _autograd_backward(self, out, retain_graph=False):
        return torch.autograd.grad(out, self.leaves, self.up, retain_graph=retain_graph)


def time_sync(fn, reps):
    samples = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) * 1e6)
    return samples


def measure_pass(impl: Impl, reps: int, steps: int) -> dict[str, list[float]]:
    set_policy(impl.policy)
    res = {"fwd": time_sync(impl.fn, reps)}
    bwd = []
    for _ in range(reps):
        out = impl.fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        impl.backward(out)
        torch.cuda.synchronize()
        bwd.append((time.perf_counter() - t0) * 1e6)
    res["bwd"] = bwd
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        impl.backward(impl.fn())
    torch.cuda.synchronize()
    res["step"] = [(time.perf_counter() - t0) * 1e6 / steps]
    return res


def graph_times(impl: Impl, per_graph: int = 20, replays: int = 20) -> dict[str, float | None]:
    """GPU time per forward and per backward: `per_graph` calls captured in one
    CUDA graph (so the host's graph launch is amortised), replayed."""
    set_policy(impl.policy)
    out_times = {}
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    retain = {} if impl.name.startswith("ops") else {"retain_graph": True}
    try:
        with torch.cuda.stream(side):
            for _ in range(3):
                impl.backward(impl.fn())
        torch.cuda.current_stream().wait_stream(side)
        g_fwd = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g_fwd):
            outs = [impl.fn() for _ in range(per_graph)]
        g_bwd = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g_bwd):
            grads = [impl.backward(outs[0], **retain) for _ in range(per_graph)]
        for key, graph in (("g_fwd", g_fwd), ("g_bwd", g_bwd)):
            for _ in range(3):
                graph.replay()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            samples = []
            for _ in range(5):
                start.record()
                for _ in range(replays):
                    graph.replay()
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end) * 1e3 / (replays * per_graph))
            out_times[key] = statistics.median(samples)
        del outs, grads
    except Exception as exc:  # noqa: BLE001 - a baseline that cannot be captured
        print(f"  ({impl.name}: graph capture failed: {type(exc).__name__}: {exc})", flush=True)
        out_times.setdefault("g_fwd", None)
        out_times.setdefault("g_bwd", None)
    torch.cuda.synchronize()
    return out_times


def run_size(B, I, H, labels, passes, reps, steps, compiled_cache):
    impls = [Impl(label, B, I, H, compiled_cache) for label in labels]
    for impl in impls:  # warm-up: compilation, cuBLAS handles, lazy loading
        set_policy(impl.policy)
        for _ in range(5):
            impl.backward(impl.fn())
    torch.cuda.synchronize()
    samples = {impl.name: {"fwd": [], "bwd": [], "step": []} for impl in impls}
    for _ in range(passes):  # interleaved, so drifts of the host hit all alike
        for impl in impls:
            for key, vals in measure_pass(impl, reps, steps).items():
                samples[impl.name][key].extend(vals)
    rows = {}
    for impl in impls:
        row = {k: statistics.median(v) for k, v in samples[impl.name].items()}
        row.update(graph_times(impl))
        rows[impl.name] = row
    set_policy("auto")
    return rows


def fmt(v):
    return "   n/a" if v is None else f"{v:8.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", default=None, help="save the results here")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = parser.parse_args()
    passes, reps, steps = (3, 30, 50) if args.quick else (5, 60, 100)
    torch.backends.cuda.matmul.allow_tf32 = False  # torch's default, stated
    # Lets the compiled baseline's backward be captured with retain_graph.
    import torch._functorch.config as functorch_config
    functorch_config.donated_buffer = False
    dev = torch.cuda.get_device_name()
    print(f"device {dev}, torch {torch.__version__}, float32 unless noted; "
          f"{passes} passes x {reps} reps, {steps} pipelined steps per pass", flush=True)
    cache: dict = {}
    results = {}
    base = ["native", "reference", "compile", "lstmcell"]
    results["small"] = run_size(*SMALL, base + ["native[fused]", "native[cublas]", "ops",
                                               "autograd-floor"],
                                passes, reps, steps, cache)
    results["medium"] = run_size(*MEDIUM, ["native[fused]", "native[cublas]", "reference"],
                                 max(2, passes // 2), max(10, reps // 2), max(20, steps // 2),
                                 cache)
    results["large"] = run_size(*LARGE, base + ["native[fused]", "native[cublas]", "native bf16",
                                                "native[fused] bf16", "native[cublas] bf16",
                                                "reference bf16"],
                                passes, max(10, reps // 2), max(20, steps // 2), cache)
    print("\n| size B,I,H | impl | fwd us | bwd us | step us | graph fwd us | graph bwd us |")
    print("|---|---|---|---|---|---|---|")
    for size_key, size in (("small", SMALL), ("medium", MEDIUM), ("large", LARGE)):
        for name, r in results[size_key].items():
            print(f"| {size} | {name} | {fmt(r['fwd'])} | {fmt(r['bwd'])} | {fmt(r['step'])} |"
                  f" {fmt(r.get('g_fwd'))} | {fmt(r.get('g_bwd'))} |")
    s, l = results["small"], results["large"]
    n = s["native"]
    fl = s["autograd-floor"]
    print(f"\nfloors at B16/I32/H128: one multiply through autograd, fwd+bwd step "
          f"{fl['step']:.1f} us (synced bwd {fl['bwd']:.1f}); the native operators without "
          f"autograd, step {s['ops']['step']:.1f} us")
    print("ratios (other / native; > 1 means native is faster), float32:")
    print(f"  B16/I32/H128 step: reference {s['reference']['step'] / n['step']:.2f}x, "
          f"compile {s['compile']['step'] / n['step']:.2f}x, "
          f"LSTMCell {s['lstmcell']['step'] / n['step']:.2f}x")
    print(f"  B16/I32/H128 synced fwd: reference {s['reference']['fwd'] / n['fwd']:.2f}x "
          f"; graph replay native fwd {fmt(n.get('g_fwd'))} us, "
          f"bwd {fmt(n.get('g_bwd'))} us")
    print(f"  B256/I512/H1024 step: reference {l['reference']['step'] / l['native']['step']:.2f}x "
          f"; bf16 vs fp32 native step {l['native']['step'] / l['native bf16']['step']:.2f}x, "
          f"graph fwd+bwd fp32 {(l['native']['g_fwd'] or 0) + (l['native']['g_bwd'] or 0):.1f} us, "
          f"bf16 {(l['native bf16']['g_fwd'] or 0) + (l['native bf16']['g_bwd'] or 0):.1f} us")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": dev, "torch": torch.__version__,
                                               "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
