"""GPU time (CUDA-graph replay) of one forward+backward step of an LLTM
layer over both directions against one direction, with the two directions
concurrent (the reverse one on a side stream) and one after the other,
under each sequence plan; cuDNN's bidirectional nn.LSTM beside it. Then a
packed batch against the same batch padded to T: graph time and GPU time per
kernel (torch.profiler).

    python3 dev/timing/directions.py [--bi B,I,H,T] [--packed B,I,H,T] [--plans auto,...]

Plans: auto (the library's choice), c16 (16-block clusters), c16c8 (16-block
clusters of 8-row chunks), c16c16, grid (grid4, grid16: 4- or 16-row chunks),
steps.
Every lltm result is first compared with the same module's output on the
CPU in float64.
"""
import argparse
import contextlib
import statistics
import sys
from pathlib import Path

import torch
from torch.nn.utils.rnn import pack_padded_sequence
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import lltm  # noqa: E402
import lltm._directions  # noqa: E402
import lltm._sharing  # noqa: E402
import lltm.sequence  # noqa: E402

PLANS = {
    "auto": {},
    "c16": dict(family="cluster", cluster_blocks=16),
    "c16c8": dict(family="cluster", cluster_blocks=16, cluster_chunk=8),
    "c16c16": dict(family="cluster", cluster_blocks=16, cluster_chunk=16),
    "grid": dict(family="grid"),
    "grid4": dict(family="grid", grid_chunk=4),
    "grid16": dict(family="grid", grid_chunk=16),
    "steps": dict(family="steps"),
}


def sizes(text):
    B, I, H, T = map(int, text.split(","))
    return B, I, H, T


def graph_us(step, replays=20, passes=7):
    """Median GPU microseconds of one step() from CUDA-graph replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    graph.replay()
    torch.cuda.synchronize()
    us = median_event_us(graph.replay, replays, passes)
    del graph
    return us


def eager_us(step, n=30, passes=5):
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    return median_event_us(step, n, passes)


def median_event_us(run, n, passes):
    """Median microseconds of one run(), timed by CUDA events around n calls,
    over `passes` passes."""
    samples = []
    for _ in range(passes):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            run()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / n)
    return statistics.median(samples)


def make_step(module, x, D, H, lengths=None, packed=False):
    """A forward+backward step of module on fresh leaves (made here, on the
    current stream) with fixed output gradients."""
    g = torch.Generator(device="cpu").manual_seed(1)
    B = x.shape[1]
    h = (torch.randn(D, B, H, generator=g) * 0.5).to(x.device, x.dtype).requires_grad_()
    c = (torch.randn(D, B, H, generator=g) * 0.5).to(x.device, x.dtype).requires_grad_()
    if packed:
        p = pack_padded_sequence(x, lengths, enforce_sorted=False)
        leaf = p.data.detach().requires_grad_()
        inp = torch.nn.utils.rnn.PackedSequence(leaf, p.batch_sizes, p.sorted_indices,
                                                p.unsorted_indices)
    else:
        inp = leaf = x.detach().clone().requires_grad_()
    params = list(module.parameters())

    def forward():
        out, (h_n, c_n) = module(inp, (h, c))
        return (out.data if packed else out), h_n, c_n
    outs = forward()
    grads = [torch.randn(o.shape, generator=g).to(x.device, o.dtype) for o in outs]

    def step():
        return torch.autograd.grad(forward(), [leaf, h, c, *params], grads)
    return step, forward


@contextlib.contextmanager
def whole_device_plans():
    """Both directions concurrent, each planned as if alone on the device."""
    saved = lltm._directions._Fork.SIDE_BY_SIDE
    lltm._directions._Fork.SIDE_BY_SIDE = 1
    try:
        yield
    finally:
        lltm._directions._Fork.SIDE_BY_SIDE = saved


@contextlib.contextmanager
def serial_directions():
    saved = lltm.sequence._concurrent, lltm._directions.concurrent
    lltm.sequence._concurrent = lltm._directions.concurrent = lambda x: False
    try:
        yield
    finally:
        lltm.sequence._concurrent, lltm._directions.concurrent = saved


def check(module, x, D, H):
    cpu = lltm.LLTM(module.input_size, H, bidirectional=D == 2, dtype=torch.float64)
    cpu.load_state_dict({k: v.double().cpu() for k, v in module.state_dict().items()})
    want = cpu(x.double().cpu())[0]
    got = module(x)[0].double().cpu()
    return ((got - want).abs().max() / want.abs().max()).item()


def describe(T, B, I, H):
    plan = lltm.overrides.sequence_plan_in_force(torch.float32, T, B, I, H)
    if plan is None:
        return "-"
    if plan["family"] == "steps":
        return "steps"
    return (plan["family"] + " f:{blocks}x{groups}/{chunk}".format(**plan["forward"])
            + " b:{blocks}x{groups}/{chunk}".format(**plan["backward"]))


def bidirectional(B, I, H, T, plans, kernels=False):
    torch.manual_seed(0)
    x = torch.randn(T, B, I, device="cuda")
    bi = lltm.LLTM(I, H, bidirectional=True, device="cuda")
    one = lltm.LLTM(I, H, device="cuda")
    one.load_state_dict({k: v for k, v in bi.state_dict().items() if "reverse" not in k})
    lstm = torch.nn.LSTM(I, H, bidirectional=True, device="cuda")
    print(f"## bidirectional B{B} I{I} H{H} T{T} float32 (us per forward+backward step)")
    cudnn = make_step(lstm, x, 2, H)[0]
    print(f"cuDNN bidirectional: graph {graph_us(cudnn):.0f}  eager {eager_us(cudnn):.0f}")
    print("| plan | plan alone; shared (forward / backward blocks x groups) | err | one dir graph"
          " | both concurrent graph | concurrent, plans for the whole device | both serial graph"
          " | concurrent / one | one dir eager | both concurrent eager |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in plans:
        try:
            with lltm.overrides.sequence_plan(**PLANS[name]):
                desc = describe(T, B, I, H)
                with lltm._sharing.sharing_device(2):
                    desc += "; " + describe(T, B, I, H)
                err = check(bi, x, 2, H)
                s1, sb = make_step(one, x, 1, H)[0], make_step(bi, x, 2, H)[0]
                g1, gc = graph_us(s1), graph_us(sb)
                with whole_device_plans():
                    gw = graph_us(make_step(bi, x, 2, H)[0])
                with serial_directions():
                    gs = graph_us(make_step(bi, x, 2, H)[0])
                e1, ec = eager_us(s1), eager_us(sb)
            print(f"| {name} | {desc} | {err:.1e} | {g1:.0f} | {gc:.0f} | {gw:.0f} | {gs:.0f} "
                  f"| {gc / g1:.2f} "
                  f"| {e1:.0f} | {ec:.0f} |")
            if name == "auto" and kernels:
                kernel_table(s1, "one direction, eager")
                kernel_table(sb, "both directions, eager")
        except Exception as error:  # noqa: BLE001
            print(f"| {name} | failed: {type(error).__name__}: {str(error)[:200]} |")
            torch.cuda.synchronize()


def kernel_table(step, title, rows=12):
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    print(f"### {title}: GPU us per step by kernel (5 steps profiled)")
    totals = {}
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if us > 0 and e.device_type == torch.autograd.DeviceType.CUDA:
            totals[e.key] = totals.get(e.key, 0) + us / 5
    for key, us in sorted(totals.items(), key=lambda kv: -kv[1])[:rows]:
        print(f"{us:9.1f}  {key[:110]}")
    print(f"{sum(totals.values()):9.1f}  total")


def packed(B, I, H, T):
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(T // 2, T + 1, (B,), generator=g).tolist()
    torch.manual_seed(0)
    x = torch.randn(T, B, I, device="cuda")
    m = lltm.LLTM(I, H, device="cuda")
    lstm = torch.nn.LSTM(I, H, device="cuda")
    print(f"## packed B{B} I{I} H{H} T{T}, mean length {sum(lengths) / B:.0f}")
    sp, fp = make_step(m, x, 1, H, lengths, packed=True)
    sd, _ = make_step(m, x, 1, H)
    sl, _ = make_step(lstm, x, 1, H, lengths, packed=True)
    for name, s in (("lltm packed", sp), ("lltm padded", sd), ("cuDNN packed", sl)):
        print(f"{name}: graph {graph_us(s):.0f}  eager {eager_us(s):.0f}")
    plan = lltm.overrides.sequence_plan_in_force(torch.float32, T, B, I, H)
    print("plan:", plan)
    kernel_table(sp, "lltm packed")
    kernel_table(sd, "lltm padded")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bi", type=sizes, default=(16, 32, 128, 100))
    parser.add_argument("--packed", type=sizes, default=(64, 64, 256, 200))
    parser.add_argument("--plans", default="auto,c16c8,c16c16,grid")
    parser.add_argument("--skip", default="", help="bidirectional and/or packed")
    parser.add_argument("--kernels", action="store_true",
                        help="GPU time by kernel of the library's plan, one and both directions")
    args = parser.parse_args()
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}")
    if "bidirectional" not in args.skip:
        bidirectional(*args.bi, args.plans.split(","), args.kernels)
    if "packed" not in args.skip:
        packed(*args.packed)


if __name__ == "__main__":
    main()
