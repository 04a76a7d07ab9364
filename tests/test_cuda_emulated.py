"""The CUDA cell kernels (csrc/core/lltm_cuda_cell_*.cu) run on the CPU
through the fiber emulation (tests/cuda_emu: blocks in turn, a block's
threads as fibers meeting at its barriers), against the reference in
float64.

No GPU needed: CI checks the kernels' indexing, tiling, edge guards and
barriers at odd sizes, for both tile configurations, every dtype, and that
every output element is written and nothing outside the outputs is. Timing,
warps and the memory model are not emulated: tests/test_cuda_cell.py runs the
real thing on a GPU.
"""
import ctypes
import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from lltm import reference
from guarded import Guarded, as_ptr

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "csrc" / "core"
CU_SOURCES = sorted(CORE.glob("lltm_cuda_cell_*.cu"))
EMU_INCLUDE = Path(__file__).resolve().parent / "cuda_emu"

DTYPE_CODES = {torch.float32: 0, torch.float64: 1, torch.float16: 2, torch.bfloat16: 3}
# Tolerances against float64: elementwise |got - ref| <= tol * (|ref| +
# max|ref|) (sums over a batch or a row lose precision relative to their
# largest terms, not to the result), and for the half types, over 64
# elements or more, also ||got - ref|| / ||ref|| <= tol / 2. Half types round inputs, saved state
# and outputs to 11 (float16) or 8 (bfloat16) significant bits.
TOLERANCES = {torch.float64: 1e-10, torch.float32: 1e-4, torch.float16: 1e-2,
              torch.bfloat16: 4e-2}
# "default": the size-based choice; "large" / "medium" / "small": one tile
# configuration for every size (csrc/core/lltm_cuda_rules.h's thresholds
# forced).
NEVER = 1 << 62
VARIANTS = {"default": {},
            "large": {"LARGE_TILE_MIN_BLOCKS": 1},
            "medium": {"LARGE_TILE_MIN_BLOCKS": NEVER, "MEDIUM_TILE_MIN_BLOCKS": 1,
                       "MEDIUM_TILE_MIN_ROWS": 0},
            "small": {"LARGE_TILE_MIN_BLOCKS": NEVER, "MEDIUM_TILE_MIN_BLOCKS": NEVER}}

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


@pytest.fixture(scope="session")
def emu_libs(tmp_path_factory):
    """The cell's .cu files compiled as they are by g++ against the fiber
    emulator, once per tile variant."""
    headers = (sorted(CORE.glob("*.h")) + sorted(CORE.glob("*.cuh"))
               + sorted(EMU_INCLUDE.glob("*.h")))
    digest = hashlib.sha1(b"".join(p.read_bytes() for p in CU_SOURCES + headers)).hexdigest()[:12]
    out = tmp_path_factory.mktemp("cuda_emu")
    libs = {}
    for name, thresholds in VARIANTS.items():
        lib = out / f"libcell_emu_{name}_{digest}.so"
        cmd = ["g++", "-std=c++17", "-O1", "-fPIC", "-shared", "-Wall", "-Wextra",
               "-Wno-unknown-pragmas", "-Werror", "-I", str(EMU_INCLUDE), "-I", str(CORE),
               "-x", "c++"] + [str(s) for s in CU_SOURCES] + ["-o", str(lib)]
        for macro, value in thresholds.items():
            cmd.insert(1, f"-DLLTM_CUDA_{macro}={value}")
        proc = subprocess.run(cmd, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        libs[name] = _declare(ctypes.CDLL(str(lib)))
    return libs


def _declare(lib):
    """argtypes: the sizes are int64_t (ctypes would pass a 32-bit int)."""
    i64, p, i32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    lib.lltm_cell_forward_fused_cuda.argtypes = [i32, i64, i64, i64] + [p] * 9
    lib.lltm_cell_backward_fused_cuda.argtypes = [i32, i64, i64, i64] + [p] * 14
    lib.lltm_concat_state_input_cuda.argtypes = [i32, i64, i64, i64] + [p] * 4
    lib.lltm_cell_forward_pointwise_cuda.argtypes = [i32, i64, i64] + [p] * 6
    lib.lltm_cell_backward_pointwise_cuda.argtypes = [i32, i64, i64, i64] + [p] * 12
    lib.lltm_cell_backward_pointwise_workspace_cuda.argtypes = [i32, i64, i64]
    lib.lltm_cell_backward_pointwise_workspace_cuda.restype = ctypes.c_size_t
    for fn in (lib.lltm_cell_forward_fused_cuda, lib.lltm_cell_backward_fused_cuda,
               lib.lltm_concat_state_input_cuda, lib.lltm_cell_forward_pointwise_cuda,
               lib.lltm_cell_backward_pointwise_cuda):
        fn.restype = ctypes.c_int
    return lib


def _inputs(B, I, H, dtype):
    g = torch.Generator().manual_seed(torch.randint(2**31 - 1, ()).item())
    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale)
    args64 = [rand(B, I), rand(3 * H, I + H, scale=2.0 / (I + H) ** 0.5), rand(3 * H),
              rand(B, H), rand(B, H)]
    # Round through dtype so the reference sees exactly the kernel's inputs.
    args = [a.to(dtype) for a in args64]
    return args, [a.double() for a in args]


def _reference_step(x, W, b, h, c):
    """(new_h, new_cell, gates) in float64 and a backward closure."""
    args = [t.clone().requires_grad_() for t in (x, W, b, h, c)]
    X = torch.cat([args[3], args[0]], dim=1)
    g = X @ args[1].t() + args[2]
    H = h.shape[1]
    gates = torch.cat([torch.sigmoid(g[:, :H]), torch.sigmoid(g[:, H:2 * H]),
                       torch.nn.functional.elu(g[:, 2 * H:])], dim=1)
    new_h, new_cell = reference.lltm_cell(*args)

    def backward(grad_h, grad_cell):
        grads = torch.autograd.grad((new_h, new_cell), args, (grad_h, grad_cell),
                                    allow_unused=True)
        return [torch.zeros_like(a) if gr is None else gr for a, gr in zip(args, grads)]
    return new_h.detach(), new_cell.detach(), gates.detach(), backward


def _close(name, got, want, dtype):
    tol = TOLERANCES[dtype]
    got = got.double()
    scale = max(1.0, want.abs().max().item()) if want.numel() else 1.0
    torch.testing.assert_close(got, want, rtol=tol, atol=tol * scale, msg=name)
    if dtype in (torch.float16, torch.bfloat16) and want.numel() >= 64:
        rel = ((got - want).norm() / want.norm().clamp_min(1e-30)).item()
        # bfloat16 keeps 8 significant bits: a product of few terms (B = 1)
        # reached 0.59 tol on random inputs; float16 stays within tol / 2
        limit = tol if dtype == torch.bfloat16 else tol / 2
        assert rel <= limit, f"{name}: relative error {rel:.2e} > {limit:.2e}"


SHAPES = [(1, 1, 1), (1, 5, 3), (3, 7, 5), (3, 2, 33), (16, 32, 128), (5, 70, 17),
          (17, 9, 7), (2, 0, 4), (40, 3, 70)]


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("dtype", list(DTYPE_CODES))
@pytest.mark.parametrize("B,I,H", SHAPES)
def test_fused_forward_backward(emu_libs, variant, dtype, B, I, H):
    if variant != "default" and dtype in (torch.float16, torch.bfloat16) and B * H > 600:
        pytest.skip("half types: each tile configuration is covered at the smaller sizes")
    lib = emu_libs[variant]
    code = DTYPE_CODES[dtype]
    (x, W, b, h, c), ref_args = _inputs(B, I, H, dtype)
    new_h, new_cell, gates = Guarded((B, H), dtype), Guarded((B, H), dtype), Guarded((B, 3 * H), dtype)
    status = lib.lltm_cell_forward_fused_cuda(code, B, I, H, as_ptr(x), as_ptr(h), as_ptr(W), as_ptr(b), as_ptr(c),
                                        new_h.ptr, new_cell.ptr, gates.ptr, None)
    assert status == 0
    r_h, r_c, r_g, backward = _reference_step(*ref_args)
    _close("new_h", new_h.check("new_h"), r_h, dtype)
    _close("new_cell", new_cell.check("new_cell"), r_c, dtype)
    _close("gates", gates.check("gates"), r_g, dtype)

    grad_h = torch.randn(B, H, dtype=torch.float64).to(dtype)
    grad_cell = torch.randn(B, H, dtype=torch.float64).to(dtype)
    K = I + H
    outs = {"grad_gates": Guarded((B, 3 * H), dtype), "grad_input": Guarded((B, I), dtype),
            "grad_weights": Guarded((3 * H, K), dtype), "grad_bias": Guarded((3 * H,), dtype),
            "grad_old_h": Guarded((B, H), dtype), "grad_old_cell": Guarded((B, H), dtype)}
    status = lib.lltm_cell_backward_fused_cuda(
        code, B, I, H, as_ptr(grad_h), as_ptr(grad_cell), as_ptr(new_cell.value), as_ptr(gates.value),
        as_ptr(x), as_ptr(h), as_ptr(W), *[o.ptr for o in outs.values()], None)
    assert status == 0
    # The reference backward at the kernel's own saved state (what the op
    # does): differentiate the float64 step.
    d_x, d_W, d_b, d_h, d_c = backward(grad_h.double(), grad_cell.double())
    got = {name: o.check(name) for name, o in outs.items()}
    _close("grad_input", got["grad_input"], d_x, dtype)
    _close("grad_weights", got["grad_weights"], d_W, dtype)
    _close("grad_bias", got["grad_bias"], d_b, dtype)
    _close("grad_old_h", got["grad_old_h"], d_h, dtype)
    _close("grad_old_cell", got["grad_old_cell"], d_c, dtype)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("B,I,H", [(3, 7, 5), (17, 9, 7), (40, 3, 70)])
def test_fused_backward_without_some_gradients(emu_libs, variant, dtype, B, I, H):
    """grad_input, grad_weights and grad_old_h may be NULL (not wanted): the
    others come out bitwise equal to the full backward's."""
    lib = emu_libs[variant]
    code = DTYPE_CODES[dtype]
    (x, W, b, h, c), _ = _inputs(B, I, H, dtype)
    new_h, new_cell, gates = (torch.empty(B, H, dtype=dtype), torch.empty(B, H, dtype=dtype),
                              torch.empty(B, 3 * H, dtype=dtype))
    assert lib.lltm_cell_forward_fused_cuda(code, B, I, H, as_ptr(x), as_ptr(h), as_ptr(W),
                                            as_ptr(b), as_ptr(c), as_ptr(new_h),
                                            as_ptr(new_cell), as_ptr(gates), None) == 0
    grad_h, grad_cell = (torch.randn(B, H, dtype=torch.float64).to(dtype) for _ in range(2))
    shapes = {"grad_gates": (B, 3 * H), "grad_input": (B, I), "grad_weights": (3 * H, I + H),
              "grad_bias": (3 * H,), "grad_old_h": (B, H), "grad_old_cell": (B, H)}

    def run(skip):
        outs = {n: None if n in skip else Guarded(shape, dtype) for n, shape in shapes.items()}
        assert lib.lltm_cell_backward_fused_cuda(
            code, B, I, H, as_ptr(grad_h), as_ptr(grad_cell), as_ptr(new_cell), as_ptr(gates),
            as_ptr(x), as_ptr(h), as_ptr(W), *[None if o is None else o.ptr
                                               for o in outs.values()], None) == 0
        return {n: o.check(n) for n, o in outs.items() if o is not None}

    full = run(())
    optional = ("grad_input", "grad_weights", "grad_old_h")
    for k in range(1, 8):
        skip = {n for j, n in enumerate(optional) if k & (1 << j)}
        for name, got in run(skip).items():
            assert torch.equal(got, full[name]), f"{name} without {sorted(skip)}"


@pytest.mark.parametrize("dtype", list(DTYPE_CODES))
@pytest.mark.parametrize("B,I,H", [(1, 1, 1), (3, 7, 5), (40, 3, 70), (2, 0, 4), (128, 2, 9),
                                   (201, 2, 33)])
def test_pointwise_pieces_with_torch_matmul(emu_libs, dtype, B, I, H):
    """The cuBLAS route: concat, mm (torch here), forward pointwise; backward
    pointwise (with X), mm. From B = 129 the backward splits the batch: the
    bias gradient's sums go through the workspace."""
    lib = emu_libs["default"]
    code = DTYPE_CODES[dtype]
    (x, W, b, h, c), ref_args = _inputs(B, I, H, dtype)
    X = Guarded((B, I + H), dtype)
    assert lib.lltm_concat_state_input_cuda(code, B, I, H, as_ptr(h), as_ptr(x), X.ptr, None) == 0
    assert torch.equal(X.check("X"), torch.cat([h, x], dim=1))
    gates = Guarded((B, 3 * H), dtype)
    gates.value.copy_((X.value.double() @ W.double().t()).to(dtype))
    new_h, new_cell = Guarded((B, H), dtype), Guarded((B, H), dtype)
    assert lib.lltm_cell_forward_pointwise_cuda(code, B, H, gates.ptr, as_ptr(b), as_ptr(c),
                                                new_h.ptr, new_cell.ptr, None) == 0
    r_h, r_c, r_g, backward = _reference_step(*ref_args)
    _close("new_h", new_h.check("new_h"), r_h, dtype)
    _close("new_cell", new_cell.check("new_cell"), r_c, dtype)
    _close("gates", gates.check("gates"), r_g, dtype)

    grad_h = torch.randn(B, H, dtype=torch.float64).to(dtype)
    grad_cell = torch.randn(B, H, dtype=torch.float64).to(dtype)
    d_gates, d_c, d_b, X2 = (Guarded((B, 3 * H), dtype), Guarded((B, H), dtype),
                             Guarded((3 * H,), dtype), Guarded((B, I + H), dtype))
    workspace_bytes = lib.lltm_cell_backward_pointwise_workspace_cuda(code, B, H)
    assert (workspace_bytes > 0) == (B > 128)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    workspace = Guarded((workspace_bytes // acc.itemsize,), acc)
    assert lib.lltm_cell_backward_pointwise_cuda(
        code, B, I, H, as_ptr(grad_h), as_ptr(grad_cell), as_ptr(new_cell.value), as_ptr(gates.value),
        as_ptr(h), as_ptr(x), d_gates.ptr, d_c.ptr, d_b.ptr, X2.ptr,
        workspace.ptr if workspace_bytes else None, None) == 0
    assert torch.equal(X2.check("X"), torch.cat([h, x], dim=1))
    if workspace_bytes:  # every partial sum written, nothing around it
        workspace.check("workspace")
    dG = d_gates.check("grad_gates").double()
    r_x, r_W, r_b, r_h_grad, r_c_grad = backward(grad_h.double(), grad_cell.double())
    _close("grad_bias", d_b.check("grad_bias"), r_b, dtype)
    _close("grad_old_cell", d_c.check("grad_old_cell"), r_c_grad, dtype)
    _close("grad_weights", (dG.t() @ X2.value.double()).to(dtype), r_W, dtype)
    dX = (dG @ W.double()).to(dtype)
    _close("grad_old_h", dX[:, :H], r_h_grad, dtype)
    _close("grad_input", dX[:, H:], r_x, dtype)


def test_unknown_dtype_and_bad_sizes_are_refused(emu_libs):
    lib = emu_libs["default"]
    null = ctypes.c_void_p(0)
    assert lib.lltm_cell_forward_fused_cuda(9, 1, 1, 1, *[null] * 8, None) != 0
    assert lib.lltm_cell_forward_fused_cuda(0, -1, 1, 1, *[null] * 8, None) != 0
    # Empty batch: nothing to do, nothing touched.
    assert lib.lltm_cell_forward_fused_cuda(0, 0, 3, 2, *[null] * 8, None) == 0
