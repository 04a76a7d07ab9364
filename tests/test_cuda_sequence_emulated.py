"""The CUDA sequence kernels (csrc/core/lltm_cuda_sequence.cu) run on the CPU
through a fiber emulation (tests/cuda_emu_seq: every thread of the grid is a
fiber, so the per-step grid and cluster barriers, block barriers and warp
shuffles all work), against the reference loop of cells in float64.

No GPU needed: CI checks, for every persistent plan and every dtype, at odd
sizes (H not a multiple of a block's units, B beyond one 16-row chunk, I = 0),
the kernels' indexing, padding, reductions and barriers, that every output
element is written and nothing outside the outputs is, and the per-step
kernels of the fallback. The cluster plan runs in both of its shapes (8
blocks of 16 units, 16 blocks of 8: LLTM_CUDA_CLUSTER_BLOCKS), with its
state exchanged through the emulated distributed shared memory (st.async
into every block, counted on transaction barriers) under a schedule that
lets some threads lag. Timing and the memory model are not emulated:
tests/test_cuda_sequence.py runs the real thing on a GPU.
"""
import ctypes
import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from lltm import reference
from guarded import Guarded, as_ptr

ROOT = Path(__file__).resolve().parent.parent
CU_SOURCE = ROOT / "csrc" / "core" / "lltm_cuda_sequence.cu"
EMU_INCLUDE = Path(__file__).resolve().parent / "cuda_emu_seq"
HALF_INCLUDE = Path(__file__).resolve().parent / "cuda_emu"  # cuda_fp16.h, cuda_bf16.h

DTYPE_CODES = {torch.float32: 0, torch.float64: 1, torch.float16: 2, torch.bfloat16: 3}
TOLERANCES = {torch.float64: 1e-10, torch.float32: 1e-4, torch.float16: 1e-2,
              torch.bfloat16: 4e-2}
PLANS = {"cluster_16_8": 1, "cluster_32_4": 1, "cluster_32_4_broadcast": 1,
         "cluster_32_4_lanes32": 1, "cluster_32_4_nosplit": 1, "cluster_32_4_split8": 1,
         "grid_16_8": 2, "grid_32_16": 3, "grid_32_32": 4,
         "grid_16_32": 5}
CLUSTER_BLOCKS = {"cluster_16_8": "8", "cluster_32_4": "16",  # LLTM_CUDA_CLUSTER_BLOCKS
                  "cluster_32_4_broadcast": "16", "cluster_32_4_lanes32": "16",
                  "cluster_32_4_nosplit": "16", "cluster_32_4_split8": "16"}
# the 16-block shape's backward: reduce-scatter (for B <= 16 on 8-row chunks, a
# cluster a chunk), or (LLTM_CUDA_CLUSTER_BWD) broadcast, or nosplit
CLUSTER_BWD = {"cluster_32_4_broadcast": "broadcast", "cluster_32_4_nosplit": "nosplit"}
# the 16-block shape's forward: for B <= 16 a cluster a chunk of 4 rows (8
# lanes a unit on one row), or of 8 (LLTM_CUDA_CLUSTER_SPLIT=8: 4 lanes on
# one row); (LLTM_CUDA_CLUSTER_FWD) nosplit: 4 lanes on 2 rows of 16-row
# chunks in one cluster, as for B > 16; lanes32: 32 lanes a unit on all 16
# rows, as float64 always
CLUSTER_FWD = {"cluster_32_4_lanes32": "lanes32", "cluster_32_4_nosplit": "nosplit"}
CLUSTER_SPLIT = {"cluster_32_4_split8": "8"}
ENVIRONMENT = {"LLTM_CUDA_CLUSTER_BLOCKS": CLUSTER_BLOCKS, "LLTM_CUDA_CLUSTER_BWD": CLUSTER_BWD,
               "LLTM_CUDA_CLUSTER_FWD": CLUSTER_FWD, "LLTM_CUDA_CLUSTER_SPLIT": CLUSTER_SPLIT}

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


def _emulated_source() -> str:
    text = CU_SOURCE.read_text()
    launch = re.compile(r"([A-Za-z_][\w:]*(?:<[^<>;()]*>)?)\s*<<<(.*?)>>>\s*\(", re.S)
    text, n_launch = launch.subn(lambda m: f"emu::launch(emu::cfg({m.group(2)}), {m.group(1)}, ",
                                 text)
    shared = re.compile(r"extern __shared__ __align__\(16\) unsigned char (\w+)\[\];")
    text, n_shared = shared.subn(r"unsigned char *\1 = emu::dynamic_smem();", text)
    assert n_launch >= 3 and n_shared == 5, "expected the launches of lltm_cuda_sequence.cu"
    return text


@pytest.fixture
def cluster_shape(monkeypatch):
    """pick_shape(plan name): sets LLTM_CUDA_CLUSTER_BLOCKS (and _BWD, _FWD)
    for the cluster shapes (read by the library at each launch and plan
    choice)."""
    def pick(plan):
        for variable, values in ENVIRONMENT.items():
            if plan in values:
                monkeypatch.setenv(variable, values[plan])
            else:
                monkeypatch.delenv(variable, raising=False)
    yield pick
    for variable in ENVIRONMENT:
        os.environ.pop(variable, None)


@pytest.fixture(scope="session")
def emu(tmp_path_factory):
    source = _emulated_source()
    digest = hashlib.sha1((source + (ROOT / "csrc/core/lltm.h").read_text()).encode()).hexdigest()
    out = tmp_path_factory.mktemp("cuda_emu_seq")
    cpp = out / f"sequence_emu_{digest[:12]}.cpp"
    cpp.write_text(source)
    lib = out / "libsequence_emu.so"
    cmd = ["g++", "-std=c++17", "-O1", "-fPIC", "-shared", "-Wall", "-Wextra",
           "-Wno-unknown-pragmas", "-Werror", "-I", str(EMU_INCLUDE), "-I", str(HALF_INCLUDE),
           "-I", str(ROOT / "csrc" / "core"), str(cpp), "-o", str(lib)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return _declare(ctypes.CDLL(str(lib)))


def _declare(lib):
    i64, p, i32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    lib.lltm_sequence_plan_cuda.argtypes = [i32, i64, i64, i32, ctypes.POINTER(ctypes.c_int)]
    lib.lltm_sequence_workspace_cuda.argtypes = [i32, i32, i64, i64]
    lib.lltm_sequence_workspace_cuda.restype = ctypes.c_size_t
    lib.lltm_sequence_forward_persistent_cuda.argtypes = [i32, i32, i64, i64, i64, i64] + [p] * 9
    lib.lltm_sequence_backward_persistent_cuda.argtypes = [i32, i32, i64, i64, i64, i64] + [p] * 12
    lib.lltm_sequence_forward_step_cuda.argtypes = [i32, i64, i64] + [p] * 7
    lib.lltm_sequence_backward_step_cuda.argtypes = [i32, i64, i64] + [p] * 8
    lib.lltm_sequence_convert_cuda.argtypes = [i32, i64, p, p, p]
    for fn in (lib.lltm_sequence_plan_cuda, lib.lltm_sequence_forward_persistent_cuda,
               lib.lltm_sequence_backward_persistent_cuda, lib.lltm_sequence_forward_step_cuda,
               lib.lltm_sequence_backward_step_cuda, lib.lltm_sequence_convert_cuda):
        fn.restype = ctypes.c_int
    return lib


def _inputs(T, B, I, H, dtype):
    g = torch.Generator().manual_seed(torch.seed() % (2**31))
    def rand(*shape, scale=1.0):
        return torch.randn(*shape, generator=g, dtype=torch.float64) * scale
    args64 = [rand(T, B, I), rand(3 * H, I + H, scale=2.0 / (I + H) ** 0.5), rand(3 * H),
              rand(B, H), rand(B, H)]
    args = [a.to(dtype) for a in args64]  # the reference sees the rounded inputs
    return args, [a.double() for a in args]


def _reference(x, W, b, h0, c0):
    """float64 outputs of the reference loop, its per-step activations, and a
    backward closure for (grad_output, grad_h_n, grad_c_n)."""
    args = [t.clone().requires_grad_() for t in (x, W, b, h0, c0)]
    H = h0.shape[1]
    h, c, outs, cells, acts = args[3], args[4], [], [], []
    for t in range(x.shape[0]):
        g = torch.cat([h, args[0][t]], 1) @ args[1].t() + args[2]
        acts.append(torch.cat([g[:, :H].sigmoid(), g[:, H:2 * H].sigmoid(),
                               torch.nn.functional.elu(g[:, 2 * H:])], 1))
        h, c = reference.lltm_cell(args[0][t], args[1], args[2], h, c)
        outs.append(h)
        cells.append(c)
    output, cells_t, acts_t = torch.stack(outs), torch.stack(cells), torch.stack(acts)

    def backward(grad_output, grad_h_n, grad_c_n):
        grads = torch.autograd.grad((output, h, c), args, (grad_output, grad_h_n, grad_c_n),
                                    allow_unused=True)
        return [torch.zeros_like(a) if gr is None else gr for a, gr in zip(args, grads)]
    return output.detach(), h.detach(), c.detach(), cells_t.detach(), acts_t.detach(), backward


def _close(name, got, want, dtype):
    tol = TOLERANCES[dtype]
    got = got.double()
    scale = max(1.0, want.abs().max().item()) if want.numel() else 1.0
    torch.testing.assert_close(got, want, rtol=tol, atol=tol * scale, msg=name)


def _weight_grads(dG, x, W, h0, output, H):
    """What the binding does after the backward kernel (cuBLAS there)."""
    T, B, G = dG.shape
    dG2 = dG.double().reshape(T * B, G)
    h_prev = torch.cat([h0.double().unsqueeze(0), output.double()[:-1]], 0).reshape(T * B, H)
    dW = torch.cat([dG2.t() @ h_prev, dG2.t() @ x.double().reshape(T * B, -1)], 1)
    dx = (dG2 @ W.double()[:, H:]).reshape(T, B, -1)
    return dW, dx


def _run_case(lib, plan, dtype, T, B, I, H):
    code = DTYPE_CODES[dtype]
    (x, W, b, h0, c0), ref_args = _inputs(T, B, I, H, dtype)
    out_r, h_r, c_r, cells_r, acts_r, backward = _reference(*ref_args)
    ws_bytes = lib.lltm_sequence_workspace_cuda(code, plan, B, H)
    workspace = torch.full((max(1, ws_bytes // 4),), float("nan"), dtype=torch.float32)
    ws_ptr = as_ptr(workspace) if ws_bytes else None

    # forward: gates enter holding x W_x^T (rounded to dtype, as cuBLAS returns it)
    proj = (x.double().reshape(T * B, I) @ W.double()[:, H:].t()).reshape(T, B, 3 * H)
    gates = Guarded((T, B, 3 * H), dtype, fill=proj.to(dtype))
    output, cells = Guarded((T, B, H), dtype), Guarded((T, B, H), dtype)
    status = lib.lltm_sequence_forward_persistent_cuda(
        code, plan, T, B, I, H, as_ptr(h0), as_ptr(c0), as_ptr(W), as_ptr(b), gates.ptr, output.ptr,
        cells.ptr, ws_ptr, None)
    assert status == 0, f"forward status {status}"
    _close("output", output.check("output"), out_r, dtype)
    _close("cells", cells.check("cells"), cells_r, dtype)
    _close("gates", gates.check("gates"), acts_r, dtype)

    # backward, from the kernel's own saved state (what the op does)
    grads_in = [torch.randn(T, B, H, dtype=torch.float64), torch.randn(B, H, dtype=torch.float64),
                torch.randn(B, H, dtype=torch.float64)]
    go, ghn, gcn = [t.to(dtype) for t in grads_in]
    d_x, d_W, d_b, d_h0, d_c0 = backward(go.double(), ghn.double(), gcn.double())
    dG = Guarded((T, B, 3 * H), dtype)
    db, dh0, dc0 = Guarded((3 * H,), dtype), Guarded((B, H), dtype), Guarded((B, H), dtype)
    workspace.fill_(float("nan"))
    status = lib.lltm_sequence_backward_persistent_cuda(
        code, plan, T, B, I, H, as_ptr(go), as_ptr(ghn), as_ptr(gcn), as_ptr(W), as_ptr(cells.value),
        as_ptr(gates.value), dG.ptr, db.ptr, dh0.ptr, dc0.ptr, ws_ptr, None)
    assert status == 0, f"backward status {status}"
    dW, dx = _weight_grads(dG.check("grad_gates"), x, W, h0, output.value, H)
    _close("grad_bias", db.check("grad_bias"), d_b, dtype)
    _close("grad_h0", dh0.check("grad_h0"), d_h0, dtype)
    _close("grad_c0", dc0.check("grad_c0"), d_c0, dtype)
    _close("grad_weights", dW, d_W, dtype)
    _close("grad_input", dx, d_x, dtype)


CASES = [  # (T, B, I, H): batch 1, B past one 16-row chunk, H off the block's units, I = 0,
    # H a multiple of 4 (16-byte staging loads), T = 1, B past one 8-row chunk
    (3, 1, 2, 5), (4, 3, 5, 17), (2, 18, 3, 9), (2, 2, 0, 3), (3, 19, 4, 12), (1, 4, 3, 10),
    (3, 13, 2, 11),
]


# float64 has no 32x32 or 16x32 grid plan (the registers that hold W_h)
PLAN_DTYPES = [(plan, dtype) for plan in PLANS for dtype in DTYPE_CODES
               if not (dtype == torch.float64 and PLANS[plan] in (4, 5))]


@pytest.mark.parametrize("plan,dtype", PLAN_DTYPES,
                         ids=[f"{p}-{str(d).split('.')[-1]}" for p, d in PLAN_DTYPES])
@pytest.mark.parametrize("T,B,I,H", CASES)
def test_persistent_kernels(emu, cluster_shape, plan, dtype, T, B, I, H):
    cluster_shape(plan)
    _run_case(emu, PLANS[plan], dtype, T, B, I, H)


@pytest.mark.parametrize("plan,H", [("cluster_16_8", 128), ("cluster_32_4", 128),
                                    ("cluster_32_4", 61), ("cluster_32_4", 124),
                                    ("cluster_32_4_broadcast", 128),
                                    ("cluster_32_4_lanes32", 128), ("cluster_32_4_nosplit", 128),
                                    ("grid_32_16", 40),
                                    ("grid_32_32", 70)])
def test_persistent_kernels_larger_h(emu, cluster_shape, plan, H):
    """Several blocks, the last one partly padded (or exactly full); the
    cluster plan at H = 128: 8 blocks, or 16 (a non-portable cluster)."""
    cluster_shape(plan)
    _run_case(emu, PLANS[plan], torch.float32, 4, 5, 7, H)


@pytest.mark.parametrize("plan", ["cluster_32_4", "cluster_32_4_split8"])
@pytest.mark.parametrize("B,H", [(16, 128), (13, 61), (6, 8)])
def test_cluster_batch_split(emu, cluster_shape, plan, B, H):
    """The 16-block kernels at B <= 16: a cluster a chunk of 4 rows (or 8),
    the last one partly padded at B = 13 and 6, each exchanging only its own
    rows; the backward's bias sums of the clusters added through the
    workspace."""
    cluster_shape(plan)
    _run_case(emu, PLANS[plan], torch.float32, 3, B, 5, H)


@pytest.mark.parametrize("groups", ["1", "3", None])
@pytest.mark.parametrize("plan,dtype", [("grid_16_8", torch.float32), ("grid_16_8", torch.float64),
                                        ("grid_16_32", torch.bfloat16),
                                        ("grid_32_16", torch.float16)])
def test_grid_batch_groups(emu, cluster_shape, monkeypatch, plan, dtype, groups):
    """The grid plans share B's 16-row chunks out over batch groups of
    blocks: B = 50 is 4 chunks, the last one partial; 3 groups (capped by
    LLTM_CUDA_GRID_GROUPS) take 2, 1 and 1 of them, None: one group a chunk,
    1: every block takes every chunk. The bias gradient is summed over the
    groups through the workspace."""
    cluster_shape(plan)
    if groups is None:
        monkeypatch.delenv("LLTM_CUDA_GRID_GROUPS", raising=False)
    else:
        monkeypatch.setenv("LLTM_CUDA_GRID_GROUPS", groups)
    _run_case(emu, PLANS[plan], dtype, 3, 50, 5, 20)


@pytest.mark.parametrize("plan", list(CLUSTER_BLOCKS))
@pytest.mark.parametrize("dtype,B", [(torch.float32, 64), (torch.float64, 32),
                                     (torch.bfloat16, 49)])
def test_cluster_plan_most_rows(emu, cluster_shape, plan, dtype, B):
    """The cluster plan keeps every row's state in shared memory: the most
    rows it takes (4 chunks of 16 in 4-byte state, 2 in float64)."""
    cluster_shape(plan)
    _run_case(emu, PLANS[plan], dtype, 3, B, 3, 24)


def test_plan_choice(emu, cluster_shape):
    cluster_shape(None)
    plan = ctypes.c_int(-1)
    def choose(dtype, B, H, mode=0):
        status = emu.lltm_sequence_plan_cuda(DTYPE_CODES[dtype], B, H, mode, ctypes.byref(plan))
        return status, plan.value
    assert choose(torch.float32, 16, 128) == (0, 1)  # one cluster of 8 blocks
    assert choose(torch.float32, 16, 129) == (0, 3)
    assert choose(torch.float32, 64, 512) == (0, 5)  # 16x32: 32 unit blocks x 4 batch groups
    assert choose(torch.float32, 32, 512) == (0, 3)  # 32x16: 64 unit blocks x 2 groups
    assert choose(torch.float64, 64, 512) == (0, 3)  # no 16x32 in float64
    assert choose(torch.float32, 64, 513) == (0, 4)
    assert choose(torch.float32, 64, 1024) == (0, 4)
    assert choose(torch.float32, 64, 1025) == (0, 0)  # per-step fallback
    assert choose(torch.float64, 8, 600) == (0, 0)
    assert choose(torch.bfloat16, 8, 1000) == (0, 4)
    assert choose(torch.float32, 16, 100, mode=2) == (0, 2)  # grid asked for
    assert choose(torch.float32, 16, 100, mode=3) == (0, 0)  # steps asked for
    assert choose(torch.float32, 16, 300, mode=1)[0] != 0  # no cluster plan that large
    # the cluster plan holds every row's state in shared memory (227 KB a block)
    assert choose(torch.float32, 64, 128) == (0, 1)
    assert choose(torch.float32, 65, 128) == (0, 2)
    assert choose(torch.bfloat16, 64, 100) == (0, 1)
    assert choose(torch.float64, 32, 128) == (0, 1)
    assert choose(torch.float64, 33, 128) == (0, 2)
    assert choose(torch.float32, 65, 128, mode=1)[0] != 0


@pytest.mark.parametrize("dtype", list(DTYPE_CODES), ids=lambda d: str(d).split(".")[-1])
def test_per_step_kernels(emu, dtype):
    """The fallback: the binding's time loop, with torch's matmul standing in
    for aten::mm on the GPU."""
    T, B, I, H = 3, 4, 3, 6
    code = DTYPE_CODES[dtype]
    (x, W, b, h0, c0), ref_args = _inputs(T, B, I, H, dtype)
    out_r, h_r, c_r, cells_r, acts_r, backward = _reference(*ref_args)
    Wd = W.double()
    gates = (x.double() @ Wd[:, H:].t()).to(dtype)
    output, cells = Guarded((T, B, H), dtype), Guarded((T, B, H), dtype)
    for t in range(T):
        h_prev = h0 if t == 0 else output.value[t - 1]
        c_prev = c0 if t == 0 else cells.value[t - 1]
        recurrent = (h_prev.double() @ Wd[:, :H].t()).to(dtype).contiguous()
        g_t = gates[t]
        status = emu.lltm_sequence_forward_step_cuda(
            code, B, H, as_ptr(recurrent), as_ptr(g_t), as_ptr(b), as_ptr(c_prev),
            ctypes.c_void_p(output.value[t].data_ptr()), ctypes.c_void_p(cells.value[t].data_ptr()),
            None)
        assert status == 0
    _close("output", output.check("output"), out_r, dtype)
    _close("cells", cells.check("cells"), cells_r, dtype)
    _close("gates", gates, acts_r, dtype)

    go = torch.randn(T, B, H, dtype=torch.float64).to(dtype)
    ghn, gcn = [torch.randn(B, H, dtype=torch.float64).to(dtype) for _ in range(2)]
    d_x, d_W, d_b, d_h0, d_c0 = backward(go.double(), ghn.double(), gcn.double())
    acc_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    bias_acc = torch.zeros(3 * H, dtype=acc_dtype)
    dG = Guarded((T, B, 3 * H), dtype)
    dc = gcn.clone()
    dh = ghn.clone()
    for t in reversed(range(T)):
        status = emu.lltm_sequence_backward_step_cuda(
            code, B, H, as_ptr(go[t]), as_ptr(dh), as_ptr(dc), as_ptr(cells.value[t]), as_ptr(gates[t]),
            ctypes.c_void_p(dG.value[t].data_ptr()), as_ptr(bias_acc), None)
        assert status == 0
        dh = (dG.value[t].double() @ Wd[:, :H]).to(dtype).contiguous()
    db = torch.empty(3 * H, dtype=dtype)
    assert emu.lltm_sequence_convert_cuda(code, 3 * H, as_ptr(bias_acc), as_ptr(db), None) == 0
    dW, dx = _weight_grads(dG.check("grad_gates"), x, W, h0, output.value, H)
    _close("grad_bias", db, d_b, dtype)
    _close("grad_h0", dh, d_h0, dtype)
    _close("grad_c0", dc, d_c0, dtype)
    _close("grad_weights", dW, d_W, dtype)
    _close("grad_input", dx, d_x, dtype)
