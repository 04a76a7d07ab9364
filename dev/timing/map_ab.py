"""lltm.LLTM at the shapes of the H200 maps (T 100, I = H/2; one and three
layers; bfloat16 and float32), a forward + backward eager and by CUDA-graph
replay, with the schedule and plan each ran: run it once in each of two
checkouts, then compare the two files.

    python3 dev/timing/map_ab.py time OUT.json [--time-limit S]
    python3 dev/timing/map_ab.py compare NEW.json BASE.json
"""
import argparse
import json
import math
import time

import torch


def _median(xs):
    return sorted(xs)[len(xs) // 2]


def _plan(p):
    if p is None or p["family"] in ("steps", "block"):
        return None if p is None else p["family"]
    f = p["forward"]
    return f'{p["family"]} {f["lanes"]}x{f["values"]}/{f["chunk"]}g{f["groups"]}'


def time_shapes(out, limit):
    import lltm
    from lltm import _schedule, overrides
    rows, start = [], time.time()
    shapes = [(d, L, B, H) for L in (1, 3) for d in ("bfloat16", "float32")
              for B in (1, 16, 64, 256, 1024) for H in (64, 128, 256, 512, 1024, 2048)]
    for dt, L, B, H in shapes:
        if time.time() - start > limit:
            break
        dtype, T, I = getattr(torch, dt), 100, H // 2  # noqa: E741
        torch.manual_seed(0)
        m = lltm.LLTM(I, H, num_layers=L).cuda().to(dtype)
        x = torch.randn(T, B, I, device="cuda", dtype=dtype, requires_grad=True)
        g = torch.randn(T, B, H, device="cuda", dtype=dtype)

        def step():
            m(x)[0].backward(g)

        def timed(run, n=5):
            times = []
            for _ in range(n):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                run()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b) * 1000)
            return _median(times)
        for _ in range(2):
            step()
        eager = timed(step)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
            schedule = _schedule.for_call(m, x)
            captured = overrides.sequence_plan_in_force(dtype, T, B, H, H)
        graph.replay()
        replay = timed(lambda: [graph.replay() for _ in range(5)]) / 5
        rows.append(dict(dtype=dt, L=L, B=B, H=H, eager_us=eager, graph_us=replay,
                         route=schedule.route, chunks=schedule.chunks, sharing=schedule.sharing,
                         plan_captured=_plan(captured),
                         plan_eager=_plan(overrides.sequence_plan_in_force(dtype, T, B, H, H))))
        del m, x, g, graph
    json.dump(rows, open(out, "w"))
    print(len(rows), "shapes in", round(time.time() - start), "s")


def compare(new_path, base_path):
    def load(p):
        return {(r["dtype"], r["L"], r["B"], r["H"]): r for r in json.load(open(p))}
    new, base = load(new_path), load(base_path)
    keys = [k for k in new if k in base]
    for mode in ("graph_us", "eager_us"):
        r = [new[k][mode] / base[k][mode] for k in keys]
        print(f"{mode}: new/base geomean {math.exp(sum(map(math.log, r)) / len(r)):.3f} "
              f"min {min(r):.2f} max {max(r):.2f} over {len(r)}")

    def what(r):
        return f'{r["route"]}{r["chunks"]}s{r["sharing"]} {r["plan_captured"]}|{r["plan_eager"]}'
    for k in keys:
        n, b = new[k], base[k]
        rg, re_ = n["graph_us"] / b["graph_us"], n["eager_us"] / b["eager_us"]
        if abs(rg - 1) > 0.04 or abs(re_ - 1) > 0.04 or what(n) != what(b):
            print(f"{k[0][:4]} L{k[1]} B{k[2]:<4} H{k[3]:<4} graph {rg:.2f} eager {re_:.2f}  "
                  f"new {what(n)}  base {what(b)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("time", "compare"))
    parser.add_argument("files", nargs="+")
    parser.add_argument("--time-limit", type=float, default=170)
    args = parser.parse_args()
    if args.action == "time":
        time_shapes(args.files[0], args.time_limit)
    else:
        compare(*args.files[:2])
