"""Shared test helpers: fresh random inputs (never zeros) and the reference."""
import importlib.util
import os
import random

import pytest
import torch

import lltm  # noqa: F401  (loads the native library, registers the ops)


def cell_inputs(B, I, H, dtype=torch.float64, device="cpu", requires_grad=False):
    """Fresh random (input, weights, bias, old_h, old_cell); scaled so gates
    span both the linear and the saturated regions of the activations."""
    g = torch.Generator().manual_seed(torch.randint(2**31 - 1, ()).item())
    def rand(*shape, scale=1.0):
        t = (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype=dtype, device=device)
        return t.requires_grad_(requires_grad)
    return (rand(B, I), rand(3 * H, I + H, scale=1.0 / (I + H) ** 0.5 * 2), rand(3 * H),
            rand(B, H), rand(B, H))


def tolerances(dtype):
    return {torch.float64: dict(rtol=1e-10, atol=1e-12),
            torch.float32: dict(rtol=1e-4, atol=1e-5),
            torch.float16: dict(rtol=1e-2, atol=1e-2),
            torch.bfloat16: dict(rtol=4e-2, atol=4e-2)}[dtype]


@pytest.fixture(autouse=True)
def _fresh_seed(request):
    """Fresh random inputs every test, every run, from one seed that a failure
    reports; LLTM_TEST_SEED=<seed> replays it (every draw of a test, torch's
    and Python's, comes from the generators seeded here)."""
    seed = int(os.environ.get("LLTM_TEST_SEED") or random.SystemRandom().randrange(2**31))
    request.node.lltm_seed = seed
    torch.manual_seed(seed)
    random.seed(seed)
    yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    seed = getattr(item, "lltm_seed", None)
    if report.failed and seed is not None:
        report.sections.append(("random seed", f"replay with LLTM_TEST_SEED={seed}"))
    return report


def assert_matches(got, want, dtype, msg, tol=None):
    """``got`` (computed in ``dtype``) against the float64 ``want``: relative
    tolerance per element, plus an absolute one scaled by max|want|. Weight
    gradients are sums over many rows; their rounding error scales with the
    terms, not with a sum that may cancel to near zero. ``tol``: rtol/atol
    other than the dtype's."""
    tol = tol or tolerances(dtype)
    scale = max(1.0, want.abs().max().item()) if want.numel() else 1.0
    torch.testing.assert_close(got.double(), want, rtol=tol["rtol"], atol=tol["atol"] * scale,
                               msg=msg)


# The CUDA suites (tests/test_cuda_cell.py, tests/test_cuda_sequence.py):
# per-dtype tolerance against the float64 reference, and for the half types
# also the relative error of the whole tensor (half of the tolerance).
TOL = {torch.float64: 1e-10, torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 4e-2}
HALF = (torch.float16, torch.bfloat16)


def assert_close(name, got, want, dtype):
    """``got`` (any device, computed in ``dtype``) against ``want``: no NaN,
    elementwise within TOL[dtype] (absolute part scaled by max|want|), and for
    the half types a whole-tensor relative error within TOL[dtype] / 2."""
    tol = TOL[dtype]
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    assert not torch.isnan(got).any(), f"{name}: NaN"
    scale = max(1.0, want.abs().max().item()) if want.numel() else 1.0
    torch.testing.assert_close(got, want, rtol=tol, atol=tol * scale, msg=name)
    if dtype in HALF and want.numel() >= 64:
        rel = ((got - want).norm() / want.norm().clamp_min(1e-30)).item()
        assert rel <= tol / 2, f"{name}: relative error {rel:.2e}"


def require_sktime():
    """The example datasets come in sktime's wheel (installed without its
    dependencies by `make setup`): skip where it is absent, except under CI
    (CI=true), whose set-up installs it, so there its absence fails."""
    if importlib.util.find_spec("sktime") is None:
        reason = ("sktime is not installed: its wheel carries the .ts datasets "
                  "(`make setup` installs it: pip install --no-deps sktime==1.2.0)")
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)


@pytest.fixture(scope="session")
def emu(tmp_path_factory):
    """The CUDA sequence kernels compiled against the fiber emulator, built
    once per test run (tests/sequence_emu.py)."""
    import sequence_emu
    return sequence_emu.build(tmp_path_factory)
