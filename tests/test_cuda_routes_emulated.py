"""The choice of the CUDA library's cost model (csrc/core/lltm_cuda_cost.c),
made by the chooser compiled against the fiber emulator (tests/sequence_emu.py),
against the times measured on an H100: the chosen plan or cell route is the
fastest measured or close to it, and the cost of the choice is smooth."""

import ctypes
import shutil
from pathlib import Path

import pytest
import torch

from sequence_emu import (BLOCK, CLUSTER, DTYPE_CODES, EXCHANGE_REDUCE_SCATTER, GRID, STEPS,
                          device, make_plan, recorded_cost)

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


# ----------------------------------------------------------------------------
# The choice by the cost model (csrc/core/lltm_cuda_cost.c) against the times
# measured on an H100 (python -m lltm.bench --sweep --sweep-variants; the
# medians kept by dev/timing/fit_routes.py --write-data).

ROUTE_DATA = Path(__file__).resolve().parent / "data" / "routes-h100.json"
# the chosen route's measured time may exceed the fastest measured by this
# much: the model's median error is 9-11% (the sequence's largest miss on
# the H100 data: 17%, bfloat16 B=4 H=1024; the cell's: 9%, float32 B=1
# H=512, 23 against 21 us)
SEQUENCE_TOLERANCE, CELL_TOLERANCE = 0.20, 0.25
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16,
                "float16": torch.float16, "float64": torch.float64}


def _measured(kind):
    """(dtype, tf32, T, B, H) -> {route: microseconds} of the H100 runs (tf32:
    float32 timed with torch's TF32 setting on). A 16-block cluster plan that
    ran B > 16 rows in one cluster (the only way before clusters a 16-row
    chunk; forced since as "cluster 16, one group") is that route."""
    import json
    import re
    out = {}
    for t in json.loads(ROUTE_DATA.read_text())["times"]:
        if t["kind"] == kind and "[" in t["impl"]:
            route = t["impl"][t["impl"].index("[") + 1:-1]
            chunk_groups = re.search(r" r\d+/(\d+) g(\d+) ", t["plan"])
            if route == "cluster 16" and t["B"] > 16 and chunk_groups and \
                    chunk_groups.groups() == ("16", "1"):
                route = "cluster 16, one group"
            key = (t["dtype"], bool(t.get("tf32")), t["T"], t["B"], t["H"])
            out.setdefault(key, {})[route] = t["us"]
    return out


def _route_of(plan):
    """The name under which the H100 runs measured this plan."""
    if plan.family == GRID:
        if plan.forward.chunk == 4:
            return "grid, 4-row chunks"
        return f"grid {plan.forward.lanes}x{plan.forward.values}"
    if plan.family == CLUSTER:
        if plan.backward.exchange != EXCHANGE_REDUCE_SCATTER:
            return "cluster 8"
        one = plan.B > 16 and plan.forward.chunk == 16 and plan.forward.groups == 1
        return "cluster 16, one group" if one else "cluster 16"
    if plan.family == BLOCK:
        return f"block, {plan.forward.chunk}-row chunks"
    return "steps"


def _options_of(route):
    """lltm_sequence_plan_options forcing the plan measured as `route`."""
    if route == "cluster 16, one group":
        return dict(family=CLUSTER, cluster_blocks=16, grid_groups_max=1)
    if route.startswith("cluster"):
        return dict(family=CLUSTER, cluster_blocks=int(route.split()[1]))
    if route == "grid, 4-row chunks":
        return dict(family=GRID, grid_chunk=4)
    if route.startswith("grid"):
        lanes, values = map(int, route.split()[1].split("x"))
        return dict(family=GRID, grid_lanes=lanes, grid_values=values, grid_chunk=16)
    if route.startswith("block"):
        return dict(family=BLOCK, block_chunk=int(route.split()[1].split("-")[0]))
    return dict(family=STEPS)


def test_sequence_choices_on_an_h100_are_the_fastest_measured(emu):
    """At every shape of the H100 run, the plan the model costs cheapest
    among those measured there is the fastest measured, or within
    SEQUENCE_TOLERANCE of it; where the chooser's own pick is a plan the runs
    did not time, it is one of those named below."""
    emu.lltm_sequence_plan_cost_cuda.argtypes = [ctypes.c_void_p, ctypes.c_void_p] + \
        [ctypes.c_int64] * 4
    emu.lltm_sequence_plan_cost_cuda.restype = ctypes.c_double
    misses, unmeasured, shapes = [], [], _measured("sequence")
    assert len(shapes) >= 100
    for (dtype, tf32, T, B, H), times in sorted(shapes.items()):
        I = max(1, H // 2)
        dev = device(emu, tf32=int(tf32))

        def cost(**options):
            status, plan = make_plan(emu, TORCH_DTYPES[dtype], T, B, I, H, dev=dev, **options)
            assert status == 0, (dtype, T, B, H, options)
            return emu.lltm_sequence_plan_cost_cuda(ctypes.byref(dev), ctypes.byref(plan), T, B,
                                                    I, H), plan
        picked = min(times, key=lambda r: cost(**_options_of(r))[0])
        fastest = min(times, key=times.get)
        if times[picked] > (1 + SEQUENCE_TOLERANCE) * times[fastest]:
            misses.append(f"{dtype}{' tf32' if tf32 else ''} T={T} B={B} H={H}: {picked} "
                          f"({times[picked]} us), {fastest} {times[fastest]} us")
        chosen = _route_of(cost()[1])
        if chosen not in times:
            unmeasured.append((chosen, dtype, T, B, H))
    assert not misses, "\n".join(misses)
    # not timed there: the per-step kernels at shapes the runs skipped; the
    # 16-block cluster at 16 < B <= 64, now a cluster a 16-row chunk (newer
    # than the runs, which timed one cluster walking the chunks: "cluster 16,
    # one group"); and the 16-block cluster at float32 T=1000 B=16 H=128,
    # which the 05:10 run's check found off (5.4e-3 against a bar of 4.5e-3,
    # twice the float32 reference loop's own error: a long float32
    # recurrence; the 8-block cluster passed); the grid layouts in 4-row
    # chunks at small B (newer than the runs, which timed 16-row chunks only);
    # the block family (newer than the runs but one, which timed it with
    # TF32 off, at B 1, 4, 16, 64, 256, 1024); the half types' layouts of 64
    # values a lane (newer; grid-x64-h100.json times them); the 16-block
    # clusters of 16 units a block at 128 < H <= 256, B <= 56 (newer; their
    # times against the grid's: docs/performance.md, "Clusters past H = 128")
    others = [u for u in unmeasured if u[0] != "steps" and not (
        u[0] == "cluster 16" and u[2] == 100 and 16 < u[3] <= 64 and u[4] <= 128)
        and not (u[0] == "cluster 16" and 128 < u[4] <= 256 and u[3] <= 56)
        and u[0] != "grid, 4-row chunks" and not u[0].startswith("block")
        and not (u[0].endswith("x64") and u[1] in ("bfloat16", "float16"))]
    assert others == [("cluster 16", "float32", 1000, 16, 128)], unmeasured


DATA = Path(__file__).resolve().parent / "data"
GROUPS_MEDIAN_ERROR, GROUPS_PICK_TOLERANCE = 0.10, 0.10


def _recorded_costs(emu, name, **device_changes):
    """The records of tests/data/<name> (one layer's plan as lltm.overrides
    gives it, and its time on the H100; the grid family unless named), each
    with the model's cost of its plan on the emulated H100 (with
    device_changes: tf32=1 where torch's TF32 setting was on)."""
    import json
    dev = device(emu, **device_changes)
    records = json.loads((DATA / name).read_text())["times"]
    return [(t, recorded_cost(emu, t, dev)) for t in records]


def _pick_misses(by_shape, tolerance):
    """The shapes where the plan the model costs cheapest of those measured
    took more than (1 + tolerance) times the fastest measured."""
    misses = []
    for key, plans in sorted(by_shape.items()):
        picked, fastest = min(plans), min(plans, key=lambda p: p[1])
        if picked[1] > (1 + tolerance) * fastest[1]:
            misses.append(f"{key}: {picked[2]} {picked[1]} us, {fastest[2]} {fastest[1]}")
    return misses


def _errors_by_shape(records, counted=lambda t: True, shape=lambda t: (t["B"], t["H"])):
    """Of _recorded_costs' records: the sorted relative errors of the model
    against the times of those `counted`, and every record by its shape as
    (model us, measured us, plan) for _pick_misses."""
    errors, by_shape = [], {}
    for t, us in records:
        if counted(t):
            errors.append(abs(us - t["us"]) / t["us"])
        by_shape.setdefault(shape(t), []).append((us, t["us"], t["plan"]))
    return sorted(errors), by_shape


def test_grid_costs_on_tensor_cores_by_batch_group(emu):
    """The grid's cost on tensor cores against the H100's times of one
    bfloat16 layer in every layout and chunk size at every batch-group count
    (tests/data/grid-groups-h100.json: the passes over chunks that a plan
    for half the device, or fewer resident blocks, walks): the median
    relative error within GROUPS_MEDIAN_ERROR, a plan of twice the passes
    costed dearer, and at each shape the measured plan the model costs
    cheapest within GROUPS_PICK_TOLERANCE of the fastest measured."""
    records = _recorded_costs(emu, "grid-groups-h100.json")
    assert len(records) >= 150
    errors, by_shape = _errors_by_shape(records)
    assert errors[len(errors) // 2] < GROUPS_MEDIAN_ERROR, errors[len(errors) // 2]
    misses = _pick_misses(by_shape, GROUPS_PICK_TOLERANCE)
    assert len(by_shape) >= 12 and not misses, "\n".join(misses)
    # where the passes double, so does the model's part of them: a layer
    # planned in half the batch groups (B256/H128 16x8, 16 -> 8 groups:
    # 797 -> 1,121 us measured, 1.41x)
    one, two = (next(p for p in by_shape[(256, 128)] if p[2].startswith(f"grid 16x8 r16/16 g{g} "))
                for g in (16, 8))
    assert 1.3 < two[0] / one[0] < 1.6 and 1.3 < two[1] / one[1] < 1.6, (one, two)


def test_grid_costs_on_tf32_against_the_h100(emu):
    """float32's grid on TF32 against the H100's times of every layout and
    batch-group count of its TF32 build (16-row chunks) at B 1 - 1024, H 128
    - 1024, and of the FFMA build's cheapest at each shape (tests/data/
    grid-tf32-h100.json, torch's TF32 on): the TF32 plans' median relative
    error under 5% (3.8%), nine in ten within 12% (10.8%: the 16x32 kernel
    at 8 - 16 groups and B >= 256 is costed up to 27% over, its one group at
    B 64 - 1024 up to 9% under; one pass term a kernel does not follow
    both), and at each shape the plan the model costs cheapest (either
    build) within 5% of the fastest (the FFMA build's 4-row plans where B is
    small, the TF32 build's elsewhere)."""
    errors, by_shape = _errors_by_shape(_recorded_costs(emu, "grid-tf32-h100.json", tf32=1),
                                        lambda t: t["forward"]["tf32"])
    assert len(errors) >= 80 and errors[len(errors) // 2] < 0.05, errors[len(errors) // 2]
    assert errors[len(errors) * 9 // 10] < 0.12, errors[len(errors) * 9 // 10]
    misses = _pick_misses(by_shape, 0.05)
    assert len(by_shape) >= 12 and not misses, "\n".join(misses)


def test_grid_costs_of_the_64_value_layouts_against_the_h100(emu):
    """The half types' grid layouts of 64 values a lane (8x64, 16x64) against
    the H100's times of one bfloat16 layer in either chunk size at each
    batch-group count, the other layouts' of the same run beside them
    (tests/data/grid-x64-h100.json): their median relative error under 5%
    (2.9%), nine in ten within 10% (6.9%), and at each of the 15 shapes the
    plan the model costs cheapest within 5% of the fastest measured (where a
    64-value layout is fastest: B64/H256 600 us against 788 for 16x32,
    B256/H256 1,127 against 1,587, B32/H512 610 against 795)."""
    errors, by_shape = _errors_by_shape(_recorded_costs(emu, "grid-x64-h100.json"),
                                        lambda t: t["forward"]["values"] == 64)
    assert len(errors) >= 150 and errors[len(errors) // 2] < 0.05, errors[len(errors) // 2]
    assert errors[len(errors) * 9 // 10] < 0.10, errors[len(errors) * 9 // 10]
    misses = _pick_misses(by_shape, 0.05)
    assert len(by_shape) >= 15 and not misses, "\n".join(misses)
    fastest = {key: min(plans, key=lambda p: p[1])[2] for key, plans in by_shape.items()}
    assert all(fastest[key].startswith("grid 8x64") for key in ((64, 256), (256, 256), (32, 512)))


def test_cluster_costs_against_the_h100(emu):
    """The cluster family's cost against the H100's times of every cluster
    shape and batch split at B 1 - 64, H 96 and 128, float32 and bfloat16
    (tests/data/clusters-h100.json, the grid's plans of the same run beside
    them): the median relative error of the cluster plans under 15%, and at
    every shape the plan the model costs cheapest the fastest measured, or
    within 10% of it."""
    errors, by_shape = _errors_by_shape(_recorded_costs(emu, "clusters-h100.json"),
                                        lambda t: t["family"] == "cluster",
                                        lambda t: (t["dtype"], t["B"], t["H"]))
    assert len(errors) >= 80 and errors[len(errors) // 2] < 0.15, errors[len(errors) // 2]
    misses = _pick_misses(by_shape, 0.10)
    assert len(by_shape) >= 24 and not misses, "\n".join(misses)


def test_wide_cluster_costs_against_the_h100(emu):
    """The clusters of 16 units a block (128 < H <= 256) against the H100's
    times of one layer, the grid's plan of the same run beside them
    (tests/data/clusters-wide-h100.json: B 1 - 48 x H 160, 192, 256, float32
    and bfloat16): the model within 20% of each cluster time, and at every
    shape the plan it costs cheaper the faster measured."""
    errors, by_shape = _errors_by_shape(_recorded_costs(emu, "clusters-wide-h100.json"),
                                        lambda t: t["family"] == "cluster",
                                        lambda t: (t["dtype"], t["B"], t["H"]))
    assert len(errors) >= 40 and errors[-1] < 0.20, errors[-1]
    misses = _pick_misses(by_shape, 0.0)
    assert len(by_shape) >= 48 and not misses, "\n".join(misses)


def test_cell_choices_on_an_h100_are_the_faster_measured(emu):
    emu.lltm_cell_route_cuda.argtypes = [ctypes.c_void_p, ctypes.c_int] + [ctypes.c_int64] * 3
    emu.lltm_cell_route_cuda.restype = ctypes.c_int
    dev, misses, shapes = device(emu), [], _measured("cell")
    assert len(shapes) >= 20
    for (dtype, _, _, B, H), times in sorted(shapes.items()):
        route = emu.lltm_cell_route_cuda(ctypes.byref(dev), DTYPE_CODES[TORCH_DTYPES[dtype]], B,
                                         max(1, H // 2), H)
        chosen, fastest = {1: "fused", 2: "cublas"}[route], min(times, key=times.get)
        if times[chosen] > (1 + CELL_TOLERANCE) * times[fastest]:
            misses.append(f"{dtype} B={B} H={H}: {chosen} ({times[chosen]} us), "
                          f"{fastest} {times[fastest]} us")
    assert not misses, "\n".join(misses)


# where the plans that can run change: a block plan holds H <= 64, a cluster
# H <= 128 and B <= 64 (and splits the batch for B <= 16), or 16 units a
# block H <= 256, a grid layout H <= 128, 512 or 1024 (past these the time
# does jump: the faster plans cannot run there)
LIMITS_H, LIMITS_B = (64, 128, 256, 512, 1024), (16, 64)
SMOOTH_RATIO = 1.5  # a 17th row, a second 16-row chunk: work steps within a plan


def test_the_cost_of_the_choice_is_smooth_and_deterministic(emu):
    """Neighbouring shapes (B or H one apart) get neighbouring predicted
    costs for the plan chosen wherever the same plans can run: the choice
    moves where two plans' costs cross, not at a threshold of its own; the
    same question gets the same plan."""
    emu.lltm_sequence_plan_cost_cuda.argtypes = [ctypes.c_void_p, ctypes.c_void_p] + \
        [ctypes.c_int64] * 4
    emu.lltm_sequence_plan_cost_cuda.restype = ctypes.c_double

    def cost(dtype, B, H):
        status, plan = make_plan(emu, dtype, 100, B, max(1, H // 2), H, dev=dev)
        assert status == 0
        again = make_plan(emu, dtype, 100, B, max(1, H // 2), H, dev=dev)[1]
        assert bytes(again) == bytes(plan)
        return emu.lltm_sequence_plan_cost_cuda(ctypes.byref(dev), ctypes.byref(plan), 100, B,
                                                max(1, H // 2), H)
    worst = (1.0, None)
    # float32 also with its products on TF32 (torch's setting)
    for dtype, tf32 in ((torch.float32, 0), (torch.float32, 1), (torch.bfloat16, 0)):
        dev = device(emu, tf32=tf32)
        for B in (1, 15, 16, 17, 63, 64, 65, 255, 256, 257, 1023):
            for H in (63, 64, 127, 128, 129, 255, 256, 511, 512, 513, 1023, 1024, 1025, 2047):
                c = cost(dtype, B, H)
                for nb, nh in ((B + 1, H), (B, H + 1)):
                    if (nh != H and H in LIMITS_H) or (nb != B and B in LIMITS_B):
                        continue
                    n = cost(dtype, nb, nh)
                    ratio = max(c, n) / min(c, n)
                    if ratio > worst[0]:
                        worst = (ratio, (str(dtype), tf32, B, H, nb, nh))
    assert worst[0] < SMOOTH_RATIO, worst


def test_eager_calls_weigh_the_hosts_time(emu):
    """Eager (the stream not captured), each plan costs the longer of its GPU
    time and the host's time to issue it: where the per-step family's GPU
    time is below its 100 steps' launches, an eager call takes a persistent
    plan and a captured one the per-step family (H100 machine: float32
    B1024/H128 eager 6.8 ms on the per-step family, 3.4 ms on the grid;
    graph 3.3 both); where its GPU time is the larger, both take it."""
    emu.lltm_sequence_plan_host_cost_cuda.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    emu.lltm_sequence_plan_host_cost_cuda.restype = ctypes.c_double
    dev = device(emu)
    for dtype, B, H in [(torch.float32, 1024, 128), (torch.float32, 256, 256),
                        (torch.bfloat16, 64, 1024), (torch.bfloat16, 256, 512)]:
        status, captured = make_plan(emu, dtype, 100, B, H // 2, H, dev=dev)
        assert status == 0 and captured.family == STEPS, (dtype, B, H)
        status, eager = make_plan(emu, dtype, 100, B, H // 2, H, dev=dev, eager=1)
        assert status == 0 and eager.family == GRID, (dtype, B, H, eager.family)
        assert emu.lltm_sequence_plan_host_cost_cuda(ctypes.byref(captured), 100) > 0
        assert emu.lltm_sequence_plan_host_cost_cuda(ctypes.byref(eager), 100) == 0
    for dtype, B, H in [(torch.float32, 1024, 256), (torch.bfloat16, 1024, 256)]:
        status, eager = make_plan(emu, dtype, 100, B, H // 2, H, dev=dev, eager=1)
        assert status == 0 and eager.family == STEPS, (dtype, B, H)
    # small sizes: the eager choice is the captured one
    for dtype, B, H in [(torch.float32, 16, 256), (torch.bfloat16, 1, 64)]:
        a = make_plan(emu, dtype, 100, B, H // 2, H, dev=dev)[1]
        b = make_plan(emu, dtype, 100, B, H // 2, H, dev=dev, eager=1)[1]
        assert (a.family, a.forward.lanes, a.forward.groups) == \
            (b.family, b.forward.lanes, b.forward.groups)
