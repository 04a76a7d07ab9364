"""The CUDA library's cost model (csrc/core/lltm_cuda_cost.c) and the
sequence chooser, compiled against the fiber emulator (tests/sequence_emu.py):
the cost of the choice is smooth in the shape and deterministic, and an eager
call weighs the host's time to issue a plan."""

import ctypes
import shutil

import pytest
import torch

from sequence_emu import GRID, STEPS, device, make_plan

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


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
