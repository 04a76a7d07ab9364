"""The cluster family past H = 128 (16 blocks of 16 units, H <= 256) on the
CPU through the fiber emulation (tests/cuda_emu), against the reference
loop of cells in float64 as tests/test_cuda_sequence_emulated.py runs the
other plans: a cluster a chunk of 4 rows (the forward 8 lanes x 32 values on
2 rows of it) or of 8 rows (16 x 16 on all 8), the backward's reduce-scatter
of 16 units a block; which plans the chooser makes of them, and where it
makes none. tests/test_cuda_sequence.py runs the real kernels on a GPU."""

import ctypes
import shutil

import pytest
import torch

from sequence_emu import (CLUSTER, EXCHANGE_BROADCAST, EXCHANGE_REDUCE_SCATTER, device, make_plan,
                          random_lengths)
from test_cuda_sequence_emulated import _run_case

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")

WIDE = dict(family=CLUSTER, cluster_blocks=16)


def _check_wide(B, H, chunk):
    """The plan's launches: 16-unit blocks, a cluster a chunk of `chunk` rows."""
    def check(p):
        groups, blocks = -(-B // chunk), -(-H // 16)
        fwd, bwd = p.forward, p.backward
        layout = (8, 32, 2) if chunk == 4 else (16, 16, 8)
        assert (fwd.lanes, fwd.values, fwd.rows) == layout
        assert (fwd.chunk, fwd.groups, fwd.blocks) == (chunk, groups, blocks)
        assert fwd.exchange == EXCHANGE_BROADCAST
        assert (bwd.exchange, bwd.lanes, bwd.values) == (EXCHANGE_REDUCE_SCATTER, 16, 4)
        assert (bwd.chunk, bwd.groups, bwd.blocks) == (chunk, groups, blocks)
    return check


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16],
                         ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("chunk", [4, 8])
@pytest.mark.parametrize("T,B,I,H", [(3, 1, 2, 129), (2, 6, 3, 200), (2, 9, 0, 256)])
def test_wide_cluster_kernels(emu, dtype, chunk, T, B, I, H):
    """Forward and backward: H just past 128 (the last block of 16 units
    holds one), between, and 256 (every block full); B of one row, a partial
    chunk, past one chunk; I = 0."""
    _run_case(emu, dict(WIDE, cluster_chunk=chunk), dtype, T, B, I, H, _check_wide(B, H, chunk))


@pytest.mark.parametrize("chunk", [4, 8])
def test_wide_cluster_lengths(emu, chunk):
    """Rows stopping at their own lengths in both kernels, over several
    clusters (the bias sums of the clusters added through the workspace)."""
    T, B, H = 5, 11, 150
    _run_case(emu, dict(WIDE, cluster_chunk=chunk), torch.float32, T, B, 3, H,
              _check_wide(B, H, chunk), lengths=random_lengths(T, B))


def test_wide_cluster_plans(emu):
    """Which plans the chooser makes of the wide clusters on the emulated
    H100 (7 clusters of 16 blocks at once): 4-row chunks while their
    clusters fit, 8-row ones past that, none past 56 rows (8 clusters of
    8), in float64, past H = 256, or where the options ask for another
    cluster size (16 blocks only) or chunk."""
    f32, f64, bf16 = torch.float32, torch.float64, torch.bfloat16

    def wide(dtype, B, H, **options):
        status, p = make_plan(emu, dtype, 100, B, H // 2, H, **dict(WIDE, **options))
        assert status == 0 and p.family == CLUSTER
        assert (p.backward.lanes, p.backward.chunk) == (16, p.forward.chunk)
        return p.forward.chunk, p.forward.groups
    assert wide(f32, 16, 256) == (4, 4)
    assert wide(bf16, 28, 200) == (4, 7)
    assert wide(f32, 29, 256) == (8, 4)  # 8 clusters of 4 rows do not fit
    assert wide(f32, 56, 256) == (8, 7)
    assert wide(f32, 16, 256, cluster_chunk=8) == (8, 2)
    for refused in [dict(dtype=f32, B=57, H=256), dict(dtype=f64, B=4, H=200),
                    dict(dtype=f32, B=4, H=257), dict(dtype=f32, B=4, H=200, cluster_blocks=8),
                    dict(dtype=f32, B=4, H=200, cluster_chunk=16),
                    dict(dtype=f32, B=29, H=256, cluster_chunk=4)]:
        dtype, B, H = refused.pop("dtype"), refused.pop("B"), refused.pop("H")
        status, _ = make_plan(emu, dtype, 100, B, H // 2, H, **dict(WIDE, **refused))
        assert status != 0, (dtype, B, H, refused)
    # two layers at once: only clusters of which both launches fit
    status, p = make_plan(emu, f32, 100, 16, 128, 256, concurrent=2, **WIDE)
    assert status == 0 and (p.forward.chunk, p.forward.groups) == (8, 2)
    # the bias sums of the clusters in the workspace, after nothing (float32)
    status, p = make_plan(emu, f32, 100, 16, 128, 256, **WIDE)
    assert p.workspace_bytes == 4 * 3 * 256 * 4


def test_wide_cluster_residency(emu):
    """The wide plan's parts are its clusters (a batch group each): 7 of 16
    blocks fit the emulated H100 at once."""
    status, p = make_plan(emu, torch.float32, 100, 16, 128, 256, **WIDE)
    assert status == 0
    resident, parts = (ctypes.c_int64 * 2)(-1, -1), (ctypes.c_int64 * 2)(-1, -1)
    assert emu.lltm_sequence_plan_residency_cuda(ctypes.byref(device(emu)), ctypes.byref(p),
                                                 resident, parts) == 0
    assert list(zip(resident, parts)) == [(7, 4)] * 2
