"""The plans the CUDA choosers return are valid on every device the emulator
plays (sequence_emu.DEVICE_SETS: compute capability 7.5 to 12.0, with and
without clusters, an H100 running compute_80 PTX): what runs, never how fast
it runs.

For each device set, dtype (float32 with the TF32 setting off and on),
eager and captured calls (the plan of a call under CUDA-graph capture is
asked with eager 0, as the binding asks it), one layer alone or two at once
(concurrent 1, 2) and a B x H grid, the sequence chooser
(lltm_sequence_plan_cuda) gives a plan, the same one when asked again (and
after every other cell's questions have filled its caches), and the plan is
valid for that device:
  - each launch's shared memory within the block's opt-in;
  - the grid family's blocks x groups (x concurrent) resident at once
    (a cooperative launch waits for all of them), by the occupancy the
    device's runtime reports for the launch's threads and shared memory;
  - clusters only where the device has them and the code is sm_90 or
    later, no larger than the device allows, all of a launch's clusters
    (x concurrent) resident at once;
  - tensor-core layouts (the grid's x64 layouts, float32's TF32 build, the
    stack's 16-lane layouts) only where the dtype has tensor cores on that
    compute capability (float16 from 7.0, bfloat16 and TF32 from 8.0) and
    the library's mma code runs (sm_80 code or later); TF32 only with the
    TF32 setting on.
The best plan of each persistent family (forced through the options) must
be valid too, as must the stacked launch's plan (lltm_stack_plan_cuda)
wherever it gives one. The counts of cells that get a persistent plan are
printed per device set."""

import ctypes
import itertools
import shutil

import pytest
import torch

from sequence_emu import (BLOCK, CLUSTER, DEVICE_SETS, DTYPE_CODES, EXCHANGE_GLOBAL,
                          EXCHANGE_LOCAL, EXCHANGE_REDUCE_SCATTER, GRID, STEPS, StackPlan,
                          device, device_set, make_plan)

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")

NT = 256  # threads a block of the grid, cluster and stack kernels (lltm_cuda_sequence.cuh)
# lltm_cuda_grid_layouts.h: lanes x values; the x64 ones on tensor cores only, TF32 in the first 4
GRID_LAYOUTS = [(16, 8), (16, 32), (32, 16), (32, 32), (8, 64), (16, 64)]
TF32_LAYOUTS = GRID_LAYOUTS[:4]
HALF = (torch.float16, torch.bfloat16)
# (dtype, the TF32 setting)
PRECISIONS = {"float32": (torch.float32, 0), "float32_tf32": (torch.float32, 1),
              "float64": (torch.float64, 0), "float16": (torch.float16, 0),
              "bfloat16": (torch.bfloat16, 0)}
BATCHES = (1, 4, 16, 17, 64, 65, 256, 1024)
HIDDEN = (32, 64, 100, 128, 200, 256, 512, 1024, 2048)
MODES = {"eager": 1, "captured": 0}
T = 100
# the families' best plans, each forced
FORCED = {"grid": dict(family=GRID), "cluster": dict(family=CLUSTER), "block": dict(family=BLOCK)}
FORCED.update({f"grid_{lanes}x{values}": dict(family=GRID, grid_lanes=lanes, grid_values=values)
               for lanes, values in GRID_LAYOUTS})


def tensor_cores(dtype, tf32, s):
    """Whether the grid's (and the stack's) products of `dtype` may run on
    tensor cores on device set s: the hardware's (float16 from compute
    capability 7.0, bfloat16 and TF32 from 8.0) and the library's mma
    code's (lltm_cuda_mma.cuh: built for sm_80 and later)."""
    needs = {torch.float16: 70, torch.bfloat16: 80}.get(dtype)
    if dtype == torch.float32 and tf32:
        needs = 80
    return needs is not None and 10 * s.major + s.minor >= needs and s.code_arch >= 80


def launch_problems(lib, s, dtype, tf32, family, name, l, B, H, concurrent):
    """What is invalid about launch l (the forward or the backward) of a
    plan of `family` for B x H on device set s (the current device)"""
    bad = []
    if l.smem > s.smem_optin:
        bad.append(f"{name}: smem {l.smem} > opt-in {s.smem_optin}")
    if l.blocks < 1 or l.groups < 1:
        bad.append(f"{name}: {l.blocks} blocks x {l.groups} groups")
        return bad
    if l.tf32 and (family != GRID or dtype != torch.float32 or not tensor_cores(dtype, tf32, s)):
        bad.append(f"{name}: TF32 build (TF32 setting {tf32}, cc {s.major}.{s.minor}, "
                   f"code {s.code_arch})")
    if family == GRID:
        layout = (l.lanes, l.values)
        if layout not in GRID_LAYOUTS or H > l.lanes * l.values or l.chunk not in (4, 16):
            bad.append(f"{name}: grid layout {layout}, chunk {l.chunk} for H {H}")
            return bad
        if l.blocks != -(-H // (NT // l.lanes)) or l.exchange != EXCHANGE_GLOBAL:
            bad.append(f"{name}: {l.blocks} unit blocks, exchange {l.exchange}")
        resident = lib.emu_blocks_per_sm(NT, l.smem) * s.sm_count
        if l.blocks * l.groups * concurrent > resident:
            bad.append(f"{name}: {concurrent} x {l.blocks} x {l.groups} blocks, "
                       f"{resident} resident")
        if l.values == 64 and (dtype not in HALF or not tensor_cores(dtype, tf32, s)):
            bad.append(f"{name}: tensor-core layout {layout}")
        if l.tf32 and (layout not in TF32_LAYOUTS or l.chunk != 16):
            bad.append(f"{name}: TF32 in layout {layout}, chunk {l.chunk}")
    elif family == CLUSTER:
        if not (s.max_cluster and s.major >= 9 and s.code_arch >= 90):
            bad.append(f"{name}: clusters on cc {s.major}.{s.minor}, code {s.code_arch}, "
                       f"max cluster {s.max_cluster}")
            return bad
        if l.blocks > s.max_cluster:
            bad.append(f"{name}: clusters of {l.blocks} > {s.max_cluster}")
        threads = NT
        if name == "backward" and l.exchange == EXCHANGE_REDUCE_SCATTER:
            # lltm_seq::cluster_backward_rs_threads
            acc = 8 if dtype == torch.float64 else 4
            threads = min(l.chunk * 16 * (NT // l.lanes) * acc // 16, NT)
        resident = lib.emu_resident_clusters(l.blocks, threads, l.smem)
        if l.groups * concurrent > resident:
            bad.append(f"{name}: {concurrent} x {l.groups} clusters of {l.blocks}, "
                       f"{resident} resident")
    elif family == BLOCK:
        # one plain launch of independent blocks: they need not be resident together
        if H > 64 or l.blocks != 1 or l.exchange != EXCHANGE_LOCAL:
            bad.append(f"{name}: block family at H {H}, {l.blocks} blocks, "
                       f"exchange {l.exchange}")
    return bad


def plan_problems(lib, s, dtype, tf32, status, p, B, H, concurrent):
    if status != 0:
        return [f"no plan (status {status})"]
    if (p.dtype, p.B, p.H) != (DTYPE_CODES[dtype], B, H):
        return [f"a plan for dtype {p.dtype}, B {p.B}, H {p.H}"]
    if p.family == STEPS:
        zero = bytes(p.forward) == bytes(p.backward) == bytes(len(bytes(p.forward)))
        return [] if zero else ["per-step plan with launches"]
    if p.family not in (GRID, CLUSTER, BLOCK):
        return [f"family {p.family}"]
    return (launch_problems(lib, s, dtype, tf32, p.family, "forward", p.forward, B, H, concurrent)
            + launch_problems(lib, s, dtype, tf32, p.family, "backward", p.backward, B, H,
                              concurrent))


def stack_problems(lib, s, dtype, tf32, layers, p, B, H):
    if (p.dtype, p.layers, p.B, p.H) != (DTYPE_CODES[dtype], layers, B, H):
        return [f"a stack plan for {p.dtype}, {p.layers} layers, B {p.B}, H {p.H}"]
    bad = []
    if dtype == torch.float64 or H > 256:
        bad.append(f"a stack plan for {dtype} at H {H}")
    for name, l in (("forward", p.forward), ("backward", p.backward)):
        if l.smem > s.smem_optin:
            bad.append(f"stack {name}: smem {l.smem} > opt-in {s.smem_optin}")
        if (l.lanes not in (16, 32) or H > l.lanes * l.values or l.chunk not in (4, 16)
                or l.groups < 1 or l.blocks != -(-H // (NT // l.lanes))
                or l.exchange != EXCHANGE_GLOBAL):
            bad.append(f"stack {name}: layout {l.lanes}x{l.values}, chunk {l.chunk}, "
                       f"{l.blocks} x {l.groups} blocks")
            continue
        resident = lib.emu_blocks_per_sm(NT, l.smem) * s.sm_count
        if l.blocks * l.groups > resident:
            bad.append(f"stack {name}: {l.blocks} x {l.groups} blocks, {resident} resident")
        if l.lanes == 16 and (dtype not in HALF or not tensor_cores(dtype, tf32, s)):
            bad.append(f"stack {name}: tensor-core layout on cc {s.major}.{s.minor}, "
                       f"code {s.code_arch}")
        if l.tf32:
            bad.append(f"stack {name}: TF32")
    return bad


def _cell(mode, concurrent, B, H):
    return f"{mode} concurrent={concurrent} B={B} H={H}"


def survey_sequence(lib, s, dev, dtype, tf32):
    """The sequence chooser on every cell: (problems as (cell, what),
    cells given a persistent plan, cells where a persistent family fits,
    cells)"""
    problems, chosen, feasible, first = [], 0, 0, {}
    cells = list(itertools.product(MODES, (1, 2), BATCHES, HIDDEN))
    for mode, concurrent, B, H in cells:
        cell = _cell(mode, concurrent, B, H)
        options = dict(eager=MODES[mode], concurrent=concurrent)
        status, p = make_plan(lib, dtype, T, B, H, H, dev=dev, **options)
        again = make_plan(lib, dtype, T, B, H, H, dev=dev, **options)
        first[mode, concurrent, B, H] = (status, bytes(p))
        problems += [(cell, w) for w in plan_problems(lib, s, dtype, tf32, status, p, B, H,
                                                      concurrent)]
        if (again[0], bytes(again[1])) != (status, bytes(p)):
            problems.append((cell, "a second ask gives another plan"))
        chosen += status == 0 and p.family != STEPS
        fits = False
        for forced, o in FORCED.items():
            fs, fp = make_plan(lib, dtype, T, B, H, H, dev=dev, **options, **o)
            fits = fits or fs == 0
            if fs == 0:
                problems += [(f"{cell} {forced}", w) for w in plan_problems(
                    lib, s, dtype, tf32, fs, fp, B, H, concurrent)]
        feasible += fits
    # the caches every other cell filled change no answer
    for (mode, concurrent, B, H), want in first.items():
        status, p = make_plan(lib, dtype, T, B, H, H, dev=dev, eager=MODES[mode],
                              concurrent=concurrent)
        if (status, bytes(p)) != want:
            problems.append((_cell(mode, concurrent, B, H),
                             "another plan once the caches are warm"))
    return problems, chosen, feasible, len(cells)


def survey_stack(lib, s, dev, dtype, tf32):
    """The stacked launch's chooser on every cell where it gives a plan"""
    problems = []
    for layers, B, H in itertools.product((2, 3), BATCHES, HIDDEN):
        plans = [StackPlan(), StackPlan()]
        status = [lib.lltm_stack_plan_cuda(ctypes.byref(dev), DTYPE_CODES[dtype], layers, T, B,
                                           H, H, ctypes.byref(q)) for q in plans]
        cell = f"stack L={layers} B={B} H={H}"
        if status[0] != status[1] or bytes(plans[0]) != bytes(plans[1]):
            problems.append((cell, "a second ask gives another stack plan"))
        if status[0] == 0:
            problems += [(cell, w) for w in stack_problems(lib, s, dtype, tf32, layers,
                                                           plans[0], B, H)]
    return problems


def survey_set(lib, name):
    """Every cell on device set `name`: {precision: (problems, cells given
    a persistent plan, cells where a persistent family fits, cells)}"""
    s = DEVICE_SETS[name]
    results = {}
    with device_set(lib, name) as base:
        for prec, (dtype, tf32) in PRECISIONS.items():
            dev = device(lib, base.device, tf32=tf32)
            problems, chosen, feasible, cells = survey_sequence(lib, s, dev, dtype, tf32)
            if dtype != torch.float64:  # the stack has no float64 kernels
                problems += survey_stack(lib, s, dev, dtype, tf32)
            results[prec] = (problems, chosen, feasible, cells)
    return results


@pytest.fixture(scope="module")
def survey(emu):
    """Every device set's survey, once (a second or so)"""
    return {name: survey_set(emu, name) for name in DEVICE_SETS}


@pytest.mark.parametrize("prec", list(PRECISIONS))
@pytest.mark.parametrize("name", list(DEVICE_SETS))
def test_plans_are_valid(survey, name, prec):
    problems = survey[name][prec][0]
    assert not problems, f"{len(problems)} invalid: " + "; ".join(
        f"[{cell}] {what}" for cell, what in problems[:20])


def test_persistent_plans_per_device_set(survey, capsys):
    """Per device set, how many cells get a persistent plan (every cell gets
    one or the per-step family: test_plans_are_valid), and in how many one
    of the persistent families fits."""
    lines = [f"{'device set':<12} {'persistent chosen':>18} {'persistent fits':>16} {'cells':>6}"]
    for name, by_prec in survey.items():
        chosen = sum(r[1] for r in by_prec.values())
        feasible = sum(r[2] for r in by_prec.values())
        cells = sum(r[3] for r in by_prec.values())
        assert chosen <= feasible <= cells
        lines.append(f"{name:<12} {chosen:>18} {feasible:>16} {cells:>6}")
    with capsys.disabled():
        print("\n" + "\n".join(lines))


def test_the_h100_set_is_the_default_device(emu):
    """sm_90 describes the device the emulator plays by default: the same
    plans, cell for cell."""
    for prec, (dtype, tf32) in PRECISIONS.items():
        default = device(emu, tf32=tf32)
        for mode, concurrent, B, H in itertools.product(MODES, (1, 2), BATCHES, HIDDEN):
            options = dict(eager=MODES[mode], concurrent=concurrent)
            want = make_plan(emu, dtype, T, B, H, H, dev=default, **options)
            with device_set(emu, "sm_90") as dev:
                dev.tf32 = tf32
                got = make_plan(emu, dtype, T, B, H, H, dev=dev, **options)
            assert (got[0], bytes(got[1])) == (want[0], bytes(want[1])), (prec, mode, B, H)


def test_device_sets_as_the_runtime_reports_them(emu):
    """What lltm_cuda_device_query reads of each set: clusters only with
    sm_90 code on a device that has them; the occupancy answers follow from
    threads, shared memory and registers."""
    for name, s in DEVICE_SETS.items():
        with device_set(emu, name) as dev:
            assert (dev.major, dev.minor, dev.sm_count, dev.smem_optin, dev.code_arch) == \
                (s.major, s.minor, s.sm_count, s.smem_optin, s.code_arch)
            assert dev.cluster_launch == (s.max_cluster > 0 and s.code_arch >= 90)
            # up to 255 registers a thread: one 256-thread block an SM, two of
            # 128; any block size fits once
            assert emu.emu_blocks_per_sm(256, 0) == 1 and emu.emu_blocks_per_sm(128, 0) == 2
            assert emu.emu_blocks_per_sm(384, 0) == emu.emu_blocks_per_sm(1024, 0) == 1
            assert emu.emu_blocks_per_sm(128, s.smem_per_sm // 2 + 1) == 1  # shared memory
            assert emu.emu_blocks_per_sm(256, s.smem_optin + 1) == 0
            assert emu.emu_resident_clusters(s.max_cluster + 1, NT, 0) == 0
    assert device(emu).sm_count == 132  # device 0 is current again
