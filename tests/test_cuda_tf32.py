"""float32's grid kernels on TF32 tensor cores on a GPU (where torch's float32
matmul precision allows TF32): lltm.LLTM's layer with the grid forced to its
TF32 build against the float64 reference, within TF32's error, and apart
from the same layer on the grid's FFMA build by more than float32's
rounding (the recurrent products did run on TF32). Skipped without a GPU;
tests/test_cuda_tf32_emulated.py holds the kernels to a TF32 reference
on the CPU."""

import pytest
import torch

import lltm
from lltm import _native, reference

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or not _native.has_cuda_kernels(),
    reason="needs a CUDA GPU and the CUDA kernels (liblltm_cuda.so)")


def _tf32_flag(on):
    matmul = torch.backends.cuda.matmul
    before = matmul.allow_tf32
    matmul.allow_tf32 = on
    yield
    matmul.allow_tf32 = before


@pytest.fixture
def tf32_allowed():
    yield from _tf32_flag(True)


@pytest.fixture
def tf32_not_allowed():
    yield from _tf32_flag(False)


def _tensor_cores():
    return torch.cuda.get_device_capability()[0] >= 8 and \
        lltm.overrides.grid_tensor_cores(torch.float32)


def _layer(args, grid_tf32, grid_shape):
    """output, h_n, c_n and the gradients of the layer on the forced grid build"""
    leaves = [a.clone().requires_grad_() for a in args]
    with lltm.overrides.sequence_plan(family="grid", grid_shape=grid_shape, grid_tf32=grid_tf32):
        out, (h_n, c_n) = lltm.functional.lltm_sequence(*leaves)
        g = torch.Generator(device="cpu").manual_seed(3)
        ups = [torch.randn(t.shape, generator=g).to(t.device) for t in (out, h_n, c_n)]
        torch.autograd.backward([out, h_n, c_n], ups)
    return [out.detach(), h_n.detach(), c_n.detach()] + [a.grad for a in leaves], ups


def _reference(args, ups):
    leaves = [a.double().cpu().requires_grad_() for a in args]
    x, W, b, h, c = leaves
    outs = []
    for t in range(x.shape[0]):
        h, c = reference.lltm_cell(x[t], W, b, h, c)
        outs.append(h)
    out = torch.stack(outs)
    torch.autograd.backward([out, h, c], [u.double().cpu() for u in ups])
    return [out.detach(), h.detach(), c.detach()] + [a.grad for a in leaves]


def _error(got, want):
    want = want.double().cpu()
    return ((got.double().cpu() - want).abs().max() / max(1.0, want.abs().max().item())).item()


@pytest.mark.parametrize("shape,B,H", [("16x8", 19, 100), ("16x32", 40, 300), ("16x32", 3, 512),
                                       ("32x32", 64, 1000)])
def test_grid_on_tf32_matches_reference(tf32_allowed, shape, B, H):
    if not _tensor_cores():
        pytest.skip("no TF32 tensor cores in the grid kernels here (compute capability < 8.0, "
                    "or code for an older GPU)")
    T, I = 6, 37
    plan = lltm.overrides.sequence_plan_in_force
    with lltm.overrides.sequence_plan(family="grid", grid_shape=shape, grid_tf32=True):
        forced = plan(torch.float32, T, B, I, H)
    assert forced["forward"]["tf32"] and forced["backward"]["tf32"]
    g = torch.Generator().manual_seed(B * H)
    args = [torch.randn(*s, generator=g) * k for s, k in
            (((T, B, I), 1.0), ((3 * H, I + H), 2.0 / (I + H) ** 0.5), ((3 * H,), 1.0),
             ((B, H), 1.0), ((B, H), 1.0))]
    args = [a.cuda() for a in args]
    tf32, ups = _layer(args, True, shape)
    ffma, _ = _layer(args, False, shape)
    want = _reference(args, ups)
    names = ["output", "h_n", "c_n", "grad_input", "grad_weights", "grad_bias", "grad_h0",
             "grad_c0"]
    for name, a, w in zip(names, tf32, want):
        assert _error(a, w) < 2e-2, (name, _error(a, w))  # TF32 (10 bits), T = 6
    # the recurrent products on TF32: h_n differs from FFMA's by TF32's error
    assert max(_error(a, f) for a, f in zip(tf32[:3], ffma[:3])) > 3e-5


def test_tf32_is_taken_only_where_allowed(tf32_not_allowed):
    """Without TF32 for float32 matmuls (torch's default) the grid never runs
    on TF32, and forcing its TF32 build is a clear error."""
    with lltm.overrides.sequence_plan(family="grid"):
        assert not lltm.overrides.sequence_plan_in_force(
            torch.float32, 10, 64, 256, 512)["forward"]["tf32"]
    args = [a.cuda() for a in (torch.randn(2, 3, 4), torch.randn(24, 12), torch.randn(24),
                               torch.randn(3, 8), torch.randn(3, 8))]
    with lltm.overrides.sequence_plan(family="grid", grid_tf32=True), \
            pytest.raises(RuntimeError, match="no plan of the forced kernel family"):
        lltm.functional.lltm_sequence(*args)
