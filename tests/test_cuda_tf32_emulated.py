"""float32's grid kernels on TF32 tensor cores (mma.sync m16n8k8, where
torch's float32 matmul precision allows TF32: lltm_cuda_device.tf32), run
on the CPU through the fiber emulator (tests/cuda_emu), and the chooser's
handling of them.

On TF32 the recurrent products h_{t-1} W_h^T (forward) and dG_{t+1} W_h
(backward) take their operands rounded to 10 mantissa bits (cvt.rna), with
float32 sums. The kernels are held to a float64 reference whose recurrent
products round the same operands the same way, and must stand off the
unrounded reference by TF32's error: a kernel that ran its products in
full float32 fails the second check, one that rounded anything else (or
nothing, or the wrong values) the first.
"""

import ctypes
import shutil

import pytest
import torch
import torch.nn.functional as F

from guarded import Guarded, as_ptr
from lltm.bench.cases import round_to_tf32
from sequence_emu import GRID, PLANS, device, make_plan

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")

# the TF32 build comes in 16-row chunks only
GRID_PLANS = [name for name in PLANS if name.startswith("grid") and "grid_chunk" not in PLANS[name]
              and PLANS[name]["grid_values"] != 64]  # the 64-value layouts: half types only


def _tf32(t):
    """float64 values as the kernels round their float32 operands"""
    return round_to_tf32(t.float()).double()


class _TF32Product(torch.autograd.Function):
    """h W^T with both operands rounded to TF32 (float64 sums), and the
    input gradient g W the same way, as the backward kernel forms dG W_h;
    the weight gradient in float64 (the binding forms it after the kernel)."""

    @staticmethod
    def forward(ctx, h, w):
        ctx.save_for_backward(h, w)
        return _tf32(h) @ _tf32(w).t()

    @staticmethod
    def backward(ctx, g):
        h, w = ctx.saved_tensors
        return _tf32(g) @ _tf32(w), g.t() @ h


def _reference(x, W, b, h0, c0, tf32):
    """float64 outputs, cells, activations of the layer, and a backward
    closure; tf32: the recurrent products as _TF32Product forms them."""
    H = h0.shape[1]
    args = [t.clone().requires_grad_() for t in (x, W, b, h0, c0)]
    xs, w, bias, h, c = args
    outs, cells, acts = [], [], []
    for t in range(xs.shape[0]):
        rec = _TF32Product.apply(h, w[:, :H]) if tf32 else h @ w[:, :H].t()
        g = rec + xs[t] @ w[:, H:].t() + bias
        act = torch.cat([g[:, :H].sigmoid(), g[:, H:2 * H].sigmoid(), F.elu(g[:, 2 * H:])], 1)
        c = c + act[:, :H] * act[:, 2 * H:]
        h = torch.tanh(c) * act[:, H:2 * H]
        outs.append(h)
        cells.append(c)
        acts.append(act)
    output = torch.stack(outs)

    def backward(grad_output, grad_h_n, grad_c_n):
        return torch.autograd.grad((output, h, c), args, (grad_output, grad_h_n, grad_c_n),
                                   allow_unused=True)
    return [output.detach(), torch.stack(cells).detach(), torch.stack(acts).detach()], backward


def _error(got, want):
    """|got - want| relative to the largest |want| (at least 1): the largest,
    and the 99th percentile (a TF32 operand that the kernel's float32 value
    and the reference's float64 one round to neighbouring TF32 values moves a
    few elements by up to ~1e-4: the percentile stays at float32's sums)"""
    diff = (got.double() - want).abs().flatten() / max(1.0, want.abs().max().item())
    return diff.max().item(), torch.quantile(diff, 0.99).item()


def _run_tf32(lib, plan, T, B, I, H, seed):
    """The plan's kernels forward and backward on random inputs: the largest
    error of every output against the TF32 reference and the float32 one."""
    g = torch.Generator().manual_seed(seed)
    x, W, b, h0, c0 = [torch.randn(*s, generator=g, dtype=torch.float64) * k for s, k in
                       (((T, B, I), 1.0), ((3 * H, I + H), 2.0 / (I + H) ** 0.5), ((3 * H,), 1.0),
                        ((B, H), 1.0), ((B, H), 1.0))]
    x, W, b, h0, c0 = [t.float() for t in (x, W, b, h0, c0)]  # what both see
    go, ghn, gcn = [torch.randn(*s, generator=g).float() for s in ((T, B, H), (B, H), (B, H))]
    refs = {name: _reference(*[t.double() for t in (x, W, b, h0, c0)], tf32=tf32)
            for name, tf32 in (("tf32", True), ("float32", False))}

    proj = (x.double().reshape(T * B, I) @ W.double()[:, H:].t()).reshape(T, B, 3 * H)
    gates = Guarded((T, B, 3 * H), torch.float32, fill=proj.float())
    output, cells = Guarded((T, B, H), torch.float32), Guarded((T, B, H), torch.float32)
    plan_ref = ctypes.byref(plan)
    workspace = torch.full((max(1, plan.workspace_bytes // 4),), float("nan"))
    ws_ptr = as_ptr(workspace) if plan.workspace_bytes else None
    assert lib.lltm_sequence_forward_persistent_cuda(
        plan_ref, T, B, I, H, as_ptr(h0), as_ptr(c0), as_ptr(W), as_ptr(b), gates.ptr,
        output.ptr, cells.ptr, None, None, ws_ptr, None, None) == 0
    got = [output.check("output"), cells.check("cells"), gates.check("gates")]

    dG = Guarded((T, B, 3 * H), torch.float32)
    db, dh0, dc0 = (Guarded((3 * H,), torch.float32), Guarded((B, H), torch.float32),
                    Guarded((B, H), torch.float32))
    assert lib.lltm_sequence_backward_persistent_cuda(
        plan_ref, T, B, I, H, as_ptr(go), as_ptr(ghn), as_ptr(gcn), as_ptr(W),
        as_ptr(cells.value), as_ptr(gates.value), dG.ptr, db.ptr, dh0.ptr, dc0.ptr, ws_ptr,
        None, None) == 0
    got += [db.check("grad_bias"), dh0.check("grad_h0"), dc0.check("grad_c0")]

    errors = {}
    for name, (forward, backward) in refs.items():
        d_x, d_W, d_b, d_h0, d_c0 = backward(go.double(), ghn.double(), gcn.double())
        want = forward + [d_b, d_h0, d_c0]
        pairs = [_error(a, w) for a, w in zip(got, want)]
        errors[name] = max(p[0] for p in pairs)
        errors[name + " p99"] = max(p[1] for p in pairs)
    return errors


def _check_tf32(errors, p99=1e-5, apart=30):
    """within float32's sums of the TF32 reference (a few elements up to
    2e-4; the 99th percentile under p99), off the float32 one by TF32's error
    (~5e-4; the percentile `apart` times the TF32 reference's)"""
    assert errors["tf32"] < 2e-4 and errors["tf32 p99"] < p99, errors
    assert errors["float32"] > 2e-4 and errors["float32"] > 4 * errors["tf32"], errors
    assert errors["float32 p99"] > apart * errors["tf32 p99"], errors


def _tf32_plan(lib, T, B, I, H, **options):
    status, plan = make_plan(lib, torch.float32, T, B, I, H, dev=device(lib, tf32=1),
                             family=GRID, grid_tf32=1, **options)
    assert status == 0 and plan.family == GRID
    assert plan.forward.tf32 == 1 and plan.backward.tf32 == 1
    return plan


@pytest.mark.parametrize("plan_name", GRID_PLANS)
@pytest.mark.parametrize("T,B,I,H", [(4, 3, 5, 17), (3, 19, 4, 12), (2, 2, 0, 3)])
def test_grid_kernels_on_tf32(emu, plan_name, T, B, I, H):
    """Every grid layout, at odd sizes (H off a block's units and off 16-byte
    rows, B past a chunk, I = 0), with batch groups: the TF32 reference
    within float32's sums (~1e-7 here), the float32 one off by TF32's error
    (~5e-4)."""
    plan = _tf32_plan(emu, T, B, I, H, **{k: v for k, v in PLANS[plan_name].items()
                                           if k != "family"})
    _check_tf32(_run_tf32(emu, plan, T, B, I, H, seed=T * 1000 + B * 10 + H))


def test_grid_kernels_on_tf32_larger(emu):
    """A 32x32 block's k range over several warps (H = 200), B = 37 in three
    16-row chunks walked by one batch group and shared out over three. With
    30,000 recurrent operands a step, some round to the neighbouring TF32
    value of the reference's (float32 against float64: 1e-4 of them), and
    each moves its row from then on: the percentile 4.9e-5 against the
    float32 reference's 4.3e-4."""
    for options in (dict(grid_lanes=32, grid_values=32, grid_groups_max=1),
                    dict(grid_lanes=32, grid_values=32, grid_groups_max=3)):
        plan = _tf32_plan(emu, 3, 37, 7, 200, **options)
        assert plan.forward.groups == options["grid_groups_max"]
        _check_tf32(_run_tf32(emu, plan, 3, 37, 7, 200, seed=7), p99=1e-4, apart=4)


def test_tf32_plans(emu):
    """The grid's TF32 build runs only where forced (grid_tf32=1; the rules
    never take it by themselves) and the device description allows TF32
    (the binding: torch's float32 matmul precision) and the code runs it
    (compute capability and code 8.0+); never for the other dtypes, whose
    tensor-core use is the dtype's. grid_tf32 forces either build, or
    refuses where TF32 is not allowed."""
    f32, bf16 = torch.float32, torch.bfloat16
    allowed = device(emu, tf32=1)

    def grid_plan(dtype, dev, **options):
        status, plan = make_plan(emu, dtype, 100, 64, 256, 512, dev=dev, family=GRID, **options)
        assert status == 0 and plan.family == GRID
        assert plan.forward.tf32 == plan.backward.tf32
        return plan
    assert grid_plan(f32, device(emu)).forward.tf32 == 0
    assert grid_plan(f32, allowed).forward.tf32 == 0
    assert grid_plan(f32, allowed, grid_tf32=1).forward.tf32 == 1
    assert grid_plan(f32, allowed, grid_tf32=-1).forward.tf32 == 0
    assert grid_plan(bf16, allowed).forward.tf32 == 0
    for older in (device(emu, tf32=1, major=7, minor=0, cluster_launch=0),
                  device(emu, tf32=1, code_arch=75)):
        assert grid_plan(f32, older).forward.tf32 == 0
        assert make_plan(emu, f32, 100, 64, 256, 512, dev=older, family=GRID, grid_tf32=1)[0] != 0
    assert make_plan(emu, f32, 100, 64, 256, 512, family=GRID, grid_tf32=1)[0] != 0
    # no TF32 build in 4-row chunks (its 16-row tile lost to FFMA on 4 rows)
    assert make_plan(emu, f32, 100, 16, 128, 256, dev=allowed, family=GRID, grid_tf32=1,
                     grid_chunk=4)[0] != 0
    assert grid_plan(f32, allowed, grid_chunk=4).forward.tf32 == 0
    assert make_plan(emu, f32, 100, 64, 256, 512, dev=allowed, grid_tf32=2)[0] != 0
    # unforced: the rules' plan, on FFMA
    status, plan = make_plan(emu, f32, 100, 64, 256, 512, dev=allowed)
    assert status == 0 and plan.forward.tf32 == 0
    # the TF32 build stages float rows for the tiles: more shared memory
    ffma, tf32 = grid_plan(f32, allowed, grid_tf32=-1), grid_plan(f32, allowed, grid_tf32=1)
    assert (ffma.forward.lanes, ffma.forward.values) == (tf32.forward.lanes, tf32.forward.values)
    assert tf32.forward.smem > ffma.forward.smem and tf32.backward.smem >= ffma.backward.smem
