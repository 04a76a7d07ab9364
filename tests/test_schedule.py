"""lltm/_schedule.py: the one place that decides what lltm.LLTM runs. The
schedule it returns is the one the module executes (each route's results
against one call a layer), its forced routes, and lltm.explain's account of
it (CPU; on CUDA each layer's plan too, skipped without a GPU). Which plans
fit a device: tests/test_schedule_validity.py."""
import pytest
import torch

import lltm
from lltm import _native, _schedule, _stack, _wavefront, overrides

HAS_CUDA = torch.cuda.is_available() and _native.has_cuda_kernels()


def model(L, bidirectional=False, impl="native", I=5, H=7):
    torch.manual_seed(torch.randint(2**31 - 1, ()).item())
    return lltm.LLTM(I, H, num_layers=L, bidirectional=bidirectional, impl=impl).double()


@pytest.mark.parametrize("L, bidirectional, impl, forced, want", [
    (1, False, "native", None, ("layers", "")),
    (3, False, "native", None, ("layers", "")),
    (3, False, "native", ("wavefront", 3), ("wavefront", "")),
    (4, False, "native", ("stacked", "on"), ("stacked", "")),
    (2, True, "native", None, ("layers", "one node")),
    (2, True, "reference", None, ("layers", "in line")),
    (2, False, "reference", ("wavefront", 3), ("layers", "")),
])
def test_schedule_on_the_cpu(L, bidirectional, impl, forced, want):
    m = model(L, bidirectional, impl)
    x = torch.randn(20, 3, 5, dtype=torch.float64)
    manager = (overrides.wavefront(forced[1]) if forced and forced[0] == "wavefront" else
               overrides.stacked_layers(forced[1]) if forced else overrides.wavefront(None))
    with manager:
        s = _schedule.for_call(m, x)
        text = lltm.explain(m, x)
    assert (s.route, s.directions) == want
    assert s.why and s.why in text and f"route: {s.route}" in text
    if s.route == "stacked":
        assert s.groups == (2, 2) and sum(s.groups) == L
    if s.route == "wavefront":
        assert s.chunks == 3 and s.sharing == 1


@pytest.mark.parametrize("route", ["stacked", "wavefront"])
def test_module_runs_the_schedule(route, monkeypatch):
    """The module runs the route its schedule names, with the results of
    one call a layer."""
    m = model(3)
    x = torch.randn(17, 2, 5, dtype=torch.float64, requires_grad=True)
    want, _ = m(x)
    ran = []
    for module, name in ((_stack, "run"), (_wavefront, "run")):
        original = getattr(module, name)
        monkeypatch.setattr(module, name,
                            lambda *a, _o=original, _m=module, **k: ran.append(_m) or _o(*a, **k))
    forced = overrides.stacked_layers("on") if route == "stacked" else overrides.wavefront(4)
    with forced:
        assert _schedule.for_call(m, x).route == route
        got, _ = m(x)
    assert ran == [_stack if route == "stacked" else _wavefront]
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_explain_unbatched_and_batch_first():
    m = lltm.LLTM(4, 6, batch_first=True)
    assert "T=9 B=2" in lltm.explain(m, torch.randn(2, 9, 4))
    assert "T=9 B=1" in lltm.explain(m, torch.randn(9, 4))


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU and the CUDA kernels")
@pytest.mark.parametrize("L, bidirectional", [(1, False), (3, False), (2, True)])
def test_explain_names_each_layers_plan_on_cuda(L, bidirectional):
    m = lltm.LLTM(32, 64, num_layers=L, bidirectional=bidirectional).cuda()
    text = lltm.explain(m, torch.randn(50, 8, 32, device="cuda"))
    s = _schedule.for_call(m, torch.randn(50, 8, 32, device="cuda"))
    layers = [line for line in text.splitlines() if line.startswith("layer")]
    assert layers and "no plan fits" not in text
    assert len(layers) == (len(s.groups) if s.route == "stacked" else L)
