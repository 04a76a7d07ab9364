"""One LLTM layer on the emulated GPU (tests/cuda_emu, as in
tests/test_cuda_sequence_emulated.py) through the core's entry points,
lltm_sequence_forward_cuda / lltm_sequence_backward_cuda (csrc/core/lltm.h),
with a matrix-product callback in torch: every result against the float64
reference, the gradients not wanted (NULL) not formed and the others bitwise
the same, dG handed out (grad_gates) with nothing written past it; the
small products eager and under capture."""

import ctypes
import shutil
import threading

import pytest
import torch

from guarded import SENTINEL, Guarded, as_ptr
from sequence_emu import (CLUSTER, GEMM, GRID, STEPS, assert_close_to, layer_inputs, make_plan,
                          random_lengths, reference_layer, torch_gemm, weight_grads)

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


class ForwardTensors(ctypes.Structure):
    """lltm_sequence_forward_tensors"""
    _fields_ = [(name, ctypes.c_void_p) for name in (
        "input", "weights", "bias", "h0", "c0", "output", "h_n", "c_n", "cells", "gates",
        "lengths")]


class BackwardTensors(ctypes.Structure):
    """lltm_sequence_backward_tensors"""
    _fields_ = [(name, ctypes.c_void_p) for name in (
        "grad_output", "grad_h_n", "grad_c_n", "input", "weights", "h0", "output", "cells",
        "gates", "grad_input", "grad_weights", "grad_bias", "grad_h0", "grad_c0", "lengths",
        "grad_gates")]


def _declare_layer(lib):
    i64, p = ctypes.c_int64, ctypes.c_void_p
    lib.lltm_sequence_forward_workspace_cuda.argtypes = [p, i64, i64, i64, i64]
    lib.lltm_sequence_forward_workspace_cuda.restype = ctypes.c_size_t
    lib.lltm_sequence_backward_workspace_cuda.argtypes = [p, i64, i64, i64, i64]
    lib.lltm_sequence_backward_workspace_cuda.restype = ctypes.c_size_t
    lib.lltm_sequence_forward_cuda.argtypes = [p, i64, i64, i64, i64, p, p, GEMM, p, p]
    lib.lltm_sequence_backward_cuda.argtypes = [p, i64, i64, i64, i64, p, p, GEMM, p, p]
    lib.lltm_sequence_forward_cuda.restype = ctypes.c_int
    lib.lltm_sequence_backward_cuda.restype = ctypes.c_int


@pytest.mark.parametrize("family", [STEPS, GRID, CLUSTER], ids=["steps", "grid", "cluster"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64],
                         ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("T,B,I,H", [(3, 5, 4, 9), (2, 3, 0, 6), (1, 40, 3, 12)])
@pytest.mark.parametrize("with_lengths", [False, True], ids=["all_T", "lengths"])
def test_layer(emu, family, dtype, T, B, I, H, with_lengths):
    """lltm_sequence_forward_cuda / _backward_cuda: the whole layer (input
    projection, recurrence, h_n / c_n, weight-gradient and input-gradient
    products) with a torch matmul as the gemm callback, every output
    against the reference; with lengths, rows stopping at their own."""
    status, plan = make_plan(emu, dtype, T, B, I, H, family=family)
    if family == CLUSTER and dtype == torch.float64 and B > 32:
        assert status != 0  # float64 state of more than 32 rows: no cluster plan
        return
    assert status == 0 and plan.family == family
    _check_layer(emu, plan, dtype, T, B, I, H, random_lengths(T, B) if with_lengths else None)


@pytest.mark.parametrize("H", [513, 600])
def test_float64_past_its_grid_layout(emu, H):
    """float64 past H = 512: no persistent plan holds it (its widest grid
    layout, 32x16, holds 512 units; one of 32 values a lane would take 192
    registers of W_h a thread), so the chooser's plan is the per-step
    family, which runs the layer against the reference, with lengths too."""
    T, B, I = 3, 5, 4
    assert make_plan(emu, torch.float64, T, B, I, H, family=GRID)[0] != 0
    status, plan = make_plan(emu, torch.float64, T, B, I, H)
    assert status == 0 and plan.family == STEPS
    _check_layer(emu, plan, torch.float64, T, B, I, H, None)
    _check_layer(emu, plan, torch.float64, T, B, I, H, random_lengths(T, B))


def _check_layer(emu, plan, dtype, T, B, I, H, lengths):
    """The layer by `plan` against the reference (see test_layer)."""
    _declare_layer(emu)
    (x, W, b, h0, c0), ref_args = layer_inputs(T, B, I, H, dtype)
    lengths_ptr = None if lengths is None else as_ptr(lengths)
    out_r, h_r, c_r, cells_r, acts_r, backward = reference_layer(*ref_args, lengths)
    ws = emu.lltm_sequence_forward_workspace_cuda(ctypes.byref(plan), T, B, I, H)
    workspace = torch.full((max(1, ws // 8 + 1),), float("nan"), dtype=torch.float64)
    output, cells = Guarded((T, B, H), dtype), Guarded((T, B, H), dtype)
    h_n, c_n, gates = Guarded((B, H), dtype), Guarded((B, H), dtype), Guarded((T, B, 3 * H), dtype)
    tensors = ForwardTensors(as_ptr(x), as_ptr(W), as_ptr(b), as_ptr(h0), as_ptr(c0),
                             output.ptr, h_n.ptr, c_n.ptr, cells.ptr, gates.ptr, lengths_ptr)
    status = emu.lltm_sequence_forward_cuda(ctypes.byref(plan), T, B, I, H, ctypes.byref(tensors),
                                            as_ptr(workspace), torch_gemm, None, None)
    assert status == 0
    assert_close_to("output", output.check("output"), out_r, dtype)
    assert_close_to("h_n", h_n.check("h_n"), h_r, dtype)
    assert_close_to("c_n", c_n.check("c_n"), c_r, dtype)
    assert_close_to("cells", cells.check("cells"), cells_r, dtype)
    assert_close_to("gates", gates.check("gates"), acts_r, dtype)

    go = torch.randn(T, B, H, dtype=torch.float64).to(dtype)
    ghn, gcn = [torch.randn(B, H, dtype=torch.float64).to(dtype) for _ in range(2)]
    d_x, d_W, d_b, d_h0, d_c0 = backward(go.double(), ghn.double(), gcn.double())
    ws = emu.lltm_sequence_backward_workspace_cuda(ctypes.byref(plan), T, B, I, H)
    workspace = torch.full((max(1, ws // 8 + 1),), float("nan"), dtype=torch.float64)
    outs = {"grad_input": Guarded((T, B, I), dtype), "grad_weights": Guarded((3 * H, I + H), dtype),
            "grad_bias": Guarded((3 * H,), dtype), "grad_h0": Guarded((B, H), dtype),
            "grad_c0": Guarded((B, H), dtype)}

    def run_backward(results, dG=None):
        """The core's backward into ``results`` (name -> Guarded, or None:
        not wanted) and dG into ``dG`` (a Guarded, or None); its status."""
        workspace.fill_(float("nan"))
        tensors = BackwardTensors(as_ptr(go), as_ptr(ghn), as_ptr(gcn), as_ptr(x), as_ptr(W),
                                  as_ptr(h0), as_ptr(output.value), as_ptr(cells.value),
                                  as_ptr(gates.value),
                                  *[None if o is None else o.ptr for o in results.values()],
                                  lengths_ptr, None if dG is None else dG.ptr)
        return emu.lltm_sequence_backward_cuda(ctypes.byref(plan), T, B, I, H,
                                               ctypes.byref(tensors), as_ptr(workspace),
                                               torch_gemm, None, None)

    assert run_backward(outs) == 0
    full = {}
    for (name, guarded), want in zip(outs.items(), (d_x, d_W, d_b, d_h0, d_c0)):
        full[name] = guarded.check(name)
        assert_close_to(name, full[name], want, dtype)

    def backward_without(skip, dG=None):
        """The backward with the gradients in ``skip`` not wanted (NULL) and
        dG handed out to ``dG`` (a Guarded, or None): the others bitwise
        equal to the full run's."""
        some = {name: None if name in skip else Guarded(g.shape, dtype)
                for name, g in outs.items()}
        assert run_backward(some, dG) == 0
        for name, guarded in some.items():
            if guarded is not None:
                assert torch.equal(guarded.check(name), full[name]), \
                    f"{name} without {skip}, grad_gates {dG is not None}"

    for skip in (("grad_input",), ("grad_weights",), ("grad_h0", "grad_c0", "grad_bias"),
                 ("grad_input", "grad_weights", "grad_h0"),
                 ("grad_input", "grad_weights", "grad_bias", "grad_c0"), tuple(outs)):
        backward_without(skip)

    # dG given out (grad_gates), no dW: the rest as before (the unwanted ones
    # in the workspace's places, nothing written past dG as far as the
    # workspace reaches), and dW formed from dG as the core forms it
    for skip in (("grad_weights",), ("grad_weights", "grad_h0", "grad_c0", "grad_bias")):
        dG = Guarded((T, B, 3 * H), dtype)
        beyond = torch.full((ws // dG.buf.element_size() + 1,), SENTINEL, dtype=dtype)
        dG.buf = torch.cat([dG.buf, beyond])
        backward_without(skip, dG)
        assert_close_to("grad_weights from grad_gates",
                        weight_grads(dG.check("grad_gates"), x, W, h0, output.value, H)[0], d_W,
                        dtype)


def test_small_products_eager_and_captured(emu):
    """The layer's small products (lltm_small_mm_fits): eager on the
    library's kernel, a thread's first readying the gemm by one 1 x 1 x 1
    call (torch makes a thread's cuBLAS handle at its first product, which a
    capture may not do); while the stream is captured (the emulator's
    switch), through the gemm with their own sizes; the results alike."""
    _declare_layer(emu)
    emu.emu_set_capturing.argtypes = [ctypes.c_int]
    emu.emu_set_capturing.restype = None
    T, B, I, H, dtype = 3, 5, 4, 9, torch.float32
    status, plan = make_plan(emu, dtype, T, B, I, H, family=GRID)
    assert status == 0
    (x, W, b, h0, c0), _ = layer_inputs(T, B, I, H, dtype)
    go = torch.randn(T, B, H)
    ghn, gcn = torch.randn(B, H), torch.randn(B, H)
    calls = []

    @GEMM
    def counting_gemm(ctx, code, M, N, K, a, a_rs, a_cs, b_, b_rs, b_cs, c, ldc):
        calls.append((M, N, K))
        return torch_gemm(ctx, code, M, N, K, a, a_rs, a_cs, b_, b_rs, b_cs, c, ldc)

    def layer():
        """(gemm calls, every output) of one forward and backward"""
        calls.clear()
        fwd = {name: torch.zeros(shape) for name, shape in (
            ("output", (T, B, H)), ("h_n", (B, H)), ("c_n", (B, H)), ("cells", (T, B, H)),
            ("gates", (T, B, 3 * H)))}
        ws = torch.zeros(emu.lltm_sequence_forward_workspace_cuda(
            ctypes.byref(plan), T, B, I, H) // 4 + 64)
        tensors = ForwardTensors(as_ptr(x), as_ptr(W), as_ptr(b), as_ptr(h0), as_ptr(c0),
                                 *[as_ptr(t) for t in fwd.values()], None)
        assert emu.lltm_sequence_forward_cuda(ctypes.byref(plan), T, B, I, H,
                                              ctypes.byref(tensors), as_ptr(ws),
                                              counting_gemm, None, None) == 0
        bwd = {name: torch.zeros(shape) for name, shape in (
            ("grad_input", (T, B, I)), ("grad_weights", (3 * H, I + H)), ("grad_bias", (3 * H,)),
            ("grad_h0", (B, H)), ("grad_c0", (B, H)))}
        ws = torch.zeros(emu.lltm_sequence_backward_workspace_cuda(
            ctypes.byref(plan), T, B, I, H) // 4 + 64)
        tensors = BackwardTensors(as_ptr(go), as_ptr(ghn), as_ptr(gcn), as_ptr(x), as_ptr(W),
                                  as_ptr(h0), as_ptr(fwd["output"]), as_ptr(fwd["cells"]),
                                  as_ptr(fwd["gates"]), *[as_ptr(t) for t in bwd.values()],
                                  None)
        assert emu.lltm_sequence_backward_cuda(ctypes.byref(plan), T, B, I, H,
                                               ctypes.byref(tensors), as_ptr(ws),
                                               counting_gemm, None, None) == 0
        return list(calls), [*fwd.values(), *bwd.values()]

    seen = {}

    def fresh_thread():  # the gemm is readied once a thread (and device)
        seen["eager first"] = layer()
        seen["eager again"] = layer()
        emu.emu_set_capturing(1)
        try:
            seen["captured"] = layer()
        finally:
            emu.emu_set_capturing(0)

    worker = threading.Thread(target=fresh_thread)
    worker.start()
    worker.join()
    assert seen["eager first"][0] == [(1, 1, 1)]
    assert seen["eager again"][0] == []
    assert seen["captured"][0] == [(T * B, 3 * H, I), (3 * H, H + I, T * B), (T * B, I, 3 * H)]
    for eager, captured in zip(seen["eager again"][1], seen["captured"][1]):
        torch.testing.assert_close(captured, eager, rtol=1e-5, atol=1e-6)
    for first, again in zip(seen["eager first"][1], seen["eager again"][1]):
        assert torch.equal(first, again)  # the readying call leaves no trace
