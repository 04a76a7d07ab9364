"""Stacked layers in one launch (csrc/core/lltm_stack.h, the kernels of
lltm_cuda_sequence_stack.cuh) run on the CPU through the fiber emulation of
the CUDA runtime (tests/cuda_emu), against the reference loop of cells in
float64 run one layer after another: every layer's outputs, cells and
activations, and after the backward every layer's gate gradients (and the
weight and input gradients formed from them, as the caller does), bias,
dL/dh0 and dL/dc0; every output element written and nothing outside the
outputs. At odd sizes (H off a block's units, B off a 4-row chunk, several
batch groups), both layouts (H <= 128 and above), 2 and 3 layers, every
dtype the stack runs, with and without variable lengths; then the whole
calls (lltm_stack_forward_cuda / _backward_cuda: the products around the
recurrence through a torch matmul as the gemm callback). The GPU runs the
same kernels in dev/cuda/sequence_stack.cu."""

import ctypes
import shutil

import pytest
import torch

from guarded import Guarded, as_ptr
from sequence_emu import (DTYPE_CODES, GEMM, StackBackwardLayer, StackForwardLayer, StackPlan,
                          device, layer_inputs, random_lengths, reference_layer, torch_gemm,
                          weight_grads)

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")

# float16 / bfloat16: a layer's rounded output is the next one's input, so
# the stack's error against the float64 chain grows with depth
STACK_TOLERANCES = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 8e-2}


def _closer(dtype):
    tol = STACK_TOLERANCES[dtype]

    def close(name, got, want):
        torch.testing.assert_close(got.double(), want, rtol=tol,
                                   atol=tol * max(1.0, want.abs().max().item()), msg=name)
    return close


def stack_plan(lib, dtype, layers, T, B, I, H, dev=None):  # noqa: E741
    plan = StackPlan()
    status = lib.lltm_stack_plan_cuda(ctypes.byref(dev or device(lib)), DTYPE_CODES[dtype],
                                      layers, T, B, I, H, ctypes.byref(plan))
    return status, plan


def _stack_inputs(dtype, L, T, B, I, H, lengths):  # noqa: E741
    """Each layer's (x, W, b, h0, c0) in dtype (x used by layer 0 only) and
    its reference (reference_layer), the layers run one after another on the
    float64 outputs of the layer below."""
    params, refs, ref_x = [], [], None
    for l in range(L):
        (x, W, b, h0, c0), ref_args = layer_inputs(T, B, I if l == 0 else H, H, dtype)
        if l > 0:
            ref_args[0] = ref_x
        params.append((x, W, b, h0, c0))
        refs.append(reference_layer(*ref_args, lengths))
        ref_x = refs[-1][0]
    return params, refs


def _stack_grads(dtype, refs, T, B, H):
    """Random dL/d output of the top layer and dL/dh_n, dL/dc_n of each layer
    (in dtype), and each layer's reference gradients: the top layer's from
    grad_output, each one below from the dL/dx of the layer above."""
    L = len(refs)
    go = torch.randn(T, B, H, dtype=torch.float64).to(dtype)
    ghn = [torch.randn(B, H, dtype=torch.float64).to(dtype) for _ in range(L)]
    gcn = [torch.randn(B, H, dtype=torch.float64).to(dtype) for _ in range(L)]
    ref_grads, grad_out = [None] * L, go.double()
    for l in reversed(range(L)):
        ref_grads[l] = refs[l][5](grad_out, ghn[l].double(), gcn[l].double())
        grad_out = ref_grads[l][0]
    return go, ghn, gcn, ref_grads


def _run_stack(lib, dtype, L, T, B, I, H, lengths=None, dev=None):  # noqa: E741
    status, plan = stack_plan(lib, dtype, L, T, B, I, H, dev)
    assert status == 0, "no stack plan"
    close = _closer(dtype)

    lengths_ptr = None if lengths is None else as_ptr(lengths)
    workspace = torch.full((max(1, plan.workspace_bytes // 4),), float("nan"))
    ws_ptr = as_ptr(workspace) if plan.workspace_bytes else None

    params, refs = _stack_inputs(dtype, L, T, B, I, H, lengths)
    x0, W0 = params[0][0], params[0][1]
    proj = (x0.double().reshape(T * B, I) @ W0.double()[:, H:].t()).reshape(T, B, 3 * H)
    gates = [Guarded((T, B, 3 * H), dtype, fill=proj.to(dtype) if l == 0 else None)
             for l in range(L)]
    outputs = [Guarded((T, B, H), dtype) for _ in range(L)]
    cells = [Guarded((T, B, H), dtype) for _ in range(L)]
    h_n = [Guarded((B, H), dtype) for _ in range(L)]
    c_n = [Guarded((B, H), dtype) for _ in range(L)]
    fwd = (StackForwardLayer * L)()
    for l, (_, W, b, h0, c0) in enumerate(params):
        fwd[l] = StackForwardLayer(as_ptr(W), as_ptr(b), as_ptr(h0), as_ptr(c0), gates[l].ptr,
                                   outputs[l].ptr, cells[l].ptr, h_n[l].ptr, c_n[l].ptr)
    status = lib.lltm_stack_forward_persistent_cuda(ctypes.byref(plan), T, B, I, H, fwd, ws_ptr,
                                                    lengths_ptr, None)
    assert status == 0, f"forward status {status}"
    for l in range(L):
        out_r, h_r, c_r, cells_r, acts_r, _ = refs[l]
        close(f"output {l}", outputs[l].check(f"output {l}"), out_r)
        close(f"cells {l}", cells[l].check(f"cells {l}"), cells_r)
        close(f"gates {l}", gates[l].check(f"gates {l}"), acts_r)
        close(f"h_n {l}", h_n[l].check(f"h_n {l}"), h_r)
        close(f"c_n {l}", c_n[l].check(f"c_n {l}"), c_r)

    go, ghn, gcn, ref_grads = _stack_grads(dtype, refs, T, B, H)
    dG = [Guarded((T, B, 3 * H), dtype) for _ in range(L)]
    db = [Guarded((3 * H,), dtype) for _ in range(L)]
    dh0 = [Guarded((B, H), dtype) for _ in range(L)]
    dc0 = [Guarded((B, H), dtype) for _ in range(L)]
    bwd = (StackBackwardLayer * L)()
    for l, (_, W, _, _, _) in enumerate(params):
        bwd[l] = StackBackwardLayer(as_ptr(W), as_ptr(cells[l].value), as_ptr(gates[l].value),
                                    as_ptr(ghn[l]), as_ptr(gcn[l]), dG[l].ptr, db[l].ptr,
                                    dh0[l].ptr, dc0[l].ptr)
    workspace.fill_(float("nan"))
    status = lib.lltm_stack_backward_persistent_cuda(ctypes.byref(plan), T, B, I, H, as_ptr(go),
                                                     bwd, ws_ptr, lengths_ptr, None)
    assert status == 0, f"backward status {status}"
    for l in range(L):
        d_x, d_W, d_b, d_h0, d_c0 = ref_grads[l]
        x_l = params[0][0] if l == 0 else outputs[l - 1].value
        dW, dx = weight_grads(dG[l].check(f"grad_gates {l}"), x_l, params[l][1], params[l][3],
                               outputs[l].value, H)
        close(f"grad_bias {l}", db[l].check(f"grad_bias {l}"), d_b)
        close(f"grad_h0 {l}", dh0[l].check(f"grad_h0 {l}"), d_h0)
        close(f"grad_c0 {l}", dc0[l].check(f"grad_c0 {l}"), d_c0)
        close(f"grad_weights {l}", dW, d_W)
        if l == 0:
            close("grad_input", dx, d_x)
    return plan


CASES = [  # (L, T, B, I, H): B in one chunk and in several batch groups, H off a block's
    # 8 units, the wider layout past H = 128, T = 1
    (2, 4, 3, 5, 12), (3, 5, 9, 7, 20), (3, 3, 6, 4, 130), (2, 1, 5, 3, 9), (3, 4, 1, 1, 1)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("L, T, B, I, H", CASES)
def test_stack(emu, dtype, L, T, B, I, H):  # noqa: E741
    _run_stack(emu, dtype, L, T, B, I, H)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("L, T, B, I, H", [(3, 6, 9, 5, 20), (2, 5, 7, 3, 130)])
def test_stack_lengths(emu, dtype, L, T, B, I, H):  # noqa: E741
    _run_stack(emu, dtype, L, T, B, I, H, lengths=random_lengths(T, B))


# the half types on tensor cores (16 units a block): 4- and 16-row chunks
# (a device of few SMs, so that 4-row chunks would share blocks), one and
# several chunks a block, with and without lengths, both layouts (16 x 8,
# 16 x 16)
HALF_CASES = [(3, 4, 21, 5, 20, 4), (3, 4, 40, 5, 20, 2), (2, 3, 40, 3, 12, 8),
              (3, 3, 9, 4, 130, 32), (2, 2, 7, 3, 200, 132)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("L, T, B, I, H, sms", HALF_CASES)
@pytest.mark.parametrize("with_lengths", [False, True], ids=["all_T", "lengths"])
def test_stack_tensor_core_layouts(emu, dtype, L, T, B, I, H, sms, with_lengths):  # noqa: E741
    dev = device(emu, sm_count=sms)
    lengths = random_lengths(T, B) if with_lengths else None
    plan = _run_stack(emu, dtype, L, T, B, I, H, lengths=lengths, dev=dev)
    fits = sms // -(-H // 16)  # batch groups resident: a block an SM in the emulator
    want_chunk = 4 if -(-B // 4) <= fits else 16
    assert (plan.forward.lanes, plan.forward.values) == (16, 8 if H <= 128 else 16)
    assert plan.forward.chunk == plan.backward.chunk == want_chunk
    assert plan.forward.groups == min(fits, -(-B // want_chunk))


def test_stack_plans(emu):
    """Layouts by H and dtype, batch groups up to one a chunk and as many as
    are resident, chunks of 4 or 16 rows, the workspace by dtype; no plan
    where the stack does not run."""
    dev = device(emu)
    status, plan = stack_plan(emu, torch.float32, 3, 100, 16, 128, 256, dev)
    assert status == 0 and (plan.forward.lanes, plan.forward.values) == (32, 8)
    assert (plan.forward.blocks, plan.forward.groups) == (32, 4) and plan.layers == 3
    # float32: no float state; 4 groups: their bias sums [4, 3, 3H]
    assert plan.workspace_bytes == 4 * 3 * 768 * 4
    status, plan = stack_plan(emu, torch.bfloat16, 2, 100, 4, 64, 128, dev)
    assert status == 0 and (plan.forward.lanes, plan.forward.values) == (16, 8)
    assert plan.forward.groups == 1 and plan.forward.chunk == 4
    assert plan.workspace_bytes == 2 * 7 * 4 * 128 * 4  # h, c, dG, dc a layer, no groups
    # 132 SMs, a block each (the emulator): 16 unit blocks at H = 128 leave 8 groups
    status, plan = stack_plan(emu, torch.float32, 2, 100, 1024, 64, 128, dev)
    assert status == 0 and plan.forward.groups == 8
    for bad in [(torch.float64, 3, 100, 16, 128, 256), (torch.float32, 4, 100, 16, 128, 256),
                (torch.float32, 1, 100, 16, 128, 256), (torch.float32, 3, 100, 16, 128, 257),
                (torch.float32, 3, 0, 16, 128, 256), (torch.float32, 3, 100, 0, 128, 256)]:
        assert stack_plan(emu, *bad, dev=dev)[0] != 0, bad
    assert stack_plan(emu, torch.float32, 3, 100, 16, 128, 256,
                      device(emu, cooperative_launch=0))[0] != 0
    # the half types on tensor cores: 16 units a block, 16-row chunks where
    # 4-row ones outnumber the groups; before compute capability 8.0 (FFMA)
    # as float32
    status, plan = stack_plan(emu, torch.bfloat16, 3, 100, 64, 128, 256, dev)
    assert status == 0 and (plan.forward.lanes, plan.forward.values) == (16, 16)
    assert (plan.forward.blocks, plan.forward.groups, plan.forward.chunk) == (16, 4, 16)
    status, plan = stack_plan(emu, torch.float16, 3, 100, 16, 128, 256, dev)
    assert status == 0 and (plan.forward.groups, plan.forward.chunk) == (4, 4)
    status, plan = stack_plan(emu, torch.bfloat16, 2, 100, 1024, 64, 100, dev)
    assert status == 0 and (plan.forward.groups, plan.forward.chunk) == (18, 16)
    assert stack_plan(emu, torch.bfloat16, 3, 100, 16, 128, 257, dev)[0] != 0
    old = device(emu, major=7, minor=5, code_arch=75)
    status, plan = stack_plan(emu, torch.bfloat16, 3, 100, 64, 128, 256, old)
    assert status == 0 and (plan.forward.lanes, plan.forward.values) == (32, 8)
    assert (plan.forward.groups, plan.forward.chunk) == (4, 4)


def test_stack_refuses_a_plan_for_other_sizes(emu):
    status, plan = stack_plan(emu, torch.float32, 2, 4, 3, 5, 12)
    assert status == 0
    fwd = (StackForwardLayer * 2)()
    assert emu.lltm_stack_forward_persistent_cuda(ctypes.byref(plan), 4, 5, 5, 12, fwd, None,
                                                  None, None) != 0
    # a null array: refused before any launch
    assert emu.lltm_stack_forward_persistent_cuda(ctypes.byref(plan), 4, 3, 5, 12, fwd, None,
                                                  None, None) != 0


def _declare_whole(lib):
    i64, p = ctypes.c_int64, ctypes.c_void_p
    lib.lltm_stack_backward_workspace_cuda.argtypes = [p, i64, i64, i64, i64]
    lib.lltm_stack_backward_workspace_cuda.restype = ctypes.c_size_t
    lib.lltm_stack_forward_cuda.argtypes = [p, i64, i64, i64, i64, p, p, p, p, GEMM, p, p]
    lib.lltm_stack_backward_cuda.argtypes = [p, i64, i64, i64, i64, p, p, p, p, p, p, GEMM, p, p]
    lib.lltm_stack_forward_cuda.restype = ctypes.c_int
    lib.lltm_stack_backward_cuda.restype = ctypes.c_int


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("L, T, B, I, H", [(3, 4, 6, 5, 20), (2, 3, 5, 0, 12), (2, 3, 3, 7, 130)])
@pytest.mark.parametrize("wanted", ["all", "some"])
@pytest.mark.parametrize("with_lengths", [False, True], ids=["all_T", "lengths"])
def test_stack_whole_calls(emu, dtype, L, T, B, I, H, wanted, with_lengths):  # noqa: E741
    """lltm_stack_forward_cuda / _backward_cuda against the reference chain:
    every layer's output, h_n, c_n, weight, bias, h0 and c0 gradients and
    the input's; with some gradients not wanted (NULL), the rest alike."""
    _declare_whole(emu)
    status, plan = stack_plan(emu, dtype, L, T, B, I, H)
    assert status == 0
    close = _closer(dtype)
    lengths = random_lengths(T, B) if with_lengths else None
    lengths_ptr = None if lengths is None else as_ptr(lengths)
    params, refs = _stack_inputs(dtype, L, T, B, I, H, lengths)
    fwd_ws = torch.full((max(1, plan.workspace_bytes // 8 + 1),), float("nan"),
                        dtype=torch.float64)
    outs = [dict(output=Guarded((T, B, H), dtype), cells=Guarded((T, B, H), dtype),
                 gates=Guarded((T, B, 3 * H), dtype), h_n=Guarded((B, H), dtype),
                 c_n=Guarded((B, H), dtype)) for _ in range(L)]
    fwd = (StackForwardLayer * L)()
    for l, (_, W, b, h0, c0) in enumerate(params):
        o = outs[l]
        fwd[l] = StackForwardLayer(as_ptr(W), as_ptr(b), as_ptr(h0), as_ptr(c0), o["gates"].ptr,
                                   o["output"].ptr, o["cells"].ptr, o["h_n"].ptr, o["c_n"].ptr)
    status = emu.lltm_stack_forward_cuda(ctypes.byref(plan), T, B, I, H, as_ptr(params[0][0]),
                                         fwd, as_ptr(fwd_ws), lengths_ptr, torch_gemm, None, None)
    assert status == 0, f"forward status {status}"
    for l in range(L):
        out_r, h_r, c_r, _, _, _ = refs[l]
        close(f"output {l}", outs[l]["output"].check(f"output {l}"), out_r)
        close(f"h_n {l}", outs[l]["h_n"].check(f"h_n {l}"), h_r)
        close(f"c_n {l}", outs[l]["c_n"].check(f"c_n {l}"), c_r)

    go, ghn, gcn, ref_grads = _stack_grads(dtype, refs, T, B, H)
    some = wanted == "some"  # layer 0's h0 and bias gradients and the input's not wanted
    grads = [dict(dW=Guarded(tuple(params[l][1].shape), dtype), db=Guarded((3 * H,), dtype),
                  dh0=Guarded((B, H), dtype), dc0=Guarded((B, H), dtype)) for l in range(L)]
    bwd = (StackBackwardLayer * L)()
    for l, (_, W, _, h0, _) in enumerate(params):
        g, o = grads[l], outs[l]
        skip = some and l == 0
        bwd[l] = StackBackwardLayer(as_ptr(W), as_ptr(o["cells"].value), as_ptr(o["gates"].value),
                                    as_ptr(ghn[l]), as_ptr(gcn[l]), None,
                                    None if skip else g["db"].ptr, None if skip else g["dh0"].ptr,
                                    g["dc0"].ptr, as_ptr(h0), as_ptr(o["output"].value),
                                    g["dW"].ptr)
    dx = Guarded((T, B, I), dtype)
    ws = emu.lltm_stack_backward_workspace_cuda(ctypes.byref(plan), T, B, I, H)
    bwd_ws = torch.full((max(1, ws // 8 + 1),), float("nan"), dtype=torch.float64)
    status = emu.lltm_stack_backward_cuda(ctypes.byref(plan), T, B, I, H, as_ptr(params[0][0]),
                                          as_ptr(go), bwd, None if some or I == 0 else dx.ptr,
                                          as_ptr(bwd_ws), lengths_ptr, torch_gemm, None, None)
    assert status == 0, f"backward status {status}"
    for l in range(L):
        d_x, d_W, d_b, d_h0, d_c0 = ref_grads[l]
        g = grads[l]
        close(f"grad_weights {l}", g["dW"].check(f"grad_weights {l}"), d_W)
        close(f"grad_c0 {l}", g["dc0"].check(f"grad_c0 {l}"), d_c0)
        if some and l == 0:
            assert torch.isnan(g["db"].value).all() and torch.isnan(g["dh0"].value).all()
        else:
            close(f"grad_bias {l}", g["db"].check(f"grad_bias {l}"), d_b)
            close(f"grad_h0 {l}", g["dh0"].check(f"grad_h0 {l}"), d_h0)
        if l == 0 and I > 0:
            if some:
                assert torch.isnan(dx.value).all()
            else:
                close("grad_input", dx.check("grad_input"), d_x)
