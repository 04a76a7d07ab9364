"""Every call runs with the settings in force when it is made, in every mode
(eager, a direct operator call, CUDA-graph capture, torch.compile default
and reduce-overhead, torch.export): flipping TF32, or a forced plan, from
one call to the next gives each call what its own settings ask for, never
what an earlier call left behind (lltm/_settings.py)."""
import contextlib

import pytest
import torch

import lltm
from lltm import _native, overrides

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or not _native.has_cuda_kernels(),
    reason="needs a CUDA GPU and lltm's CUDA library")

# Large enough that float32 on TF32 is far off float64 (products of K = 1536
# and 1024, a recurrence of 100 steps): 1e-2 - 5e-2 on TF32, ~3e-5 without.
L, T, B, I, H = 2, 100, 256, 512, 1024
BAR = {True: 1e-1, False: 1e-3}  # max |out - float64| with TF32 allowed / not
MODES = ("eager", "direct", "graph", "compile", "reduce-overhead", "export")


@pytest.fixture
def tf32_restored():
    before = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(before)


def set_tf32(on: bool) -> None:
    torch.set_float32_matmul_precision("high" if on else "highest")


def layer_by_layer(model, x):
    """The model's forward as direct calls of the public operator, one a
    layer, no settings given."""
    h0 = x.new_zeros(x.shape[1], model.hidden_size)
    for k in range(model.num_layers):
        weights, bias = model.layer_parameters(k)
        x = torch.ops.lltm.sequence_forward(x, weights, bias, h0, h0)[0]
    return x


def runner(mode: str, model, x):
    """A function making one call of ``model`` on ``x`` in ``mode`` (its
    output [T, B, H]), set up once: a compiled model is compiled at its first
    call, the exported program exported here, a CUDA graph captured anew at
    each call (a replay keeps what its capture chose, as torch's own
    products do)."""
    if mode == "eager":
        return lambda: model(x)[0]
    if mode == "direct":
        return lambda: layer_by_layer(model, x)
    if mode == "graph":
        def captured():
            model(x)  # warm-up on a side stream's worth of work, as torch.cuda.graph asks
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = model(x)[0]
            graph.replay()
            return out.clone()
        return captured
    if mode in ("compile", "reduce-overhead"):
        compiled = torch.compile(model, mode=None if mode == "compile" else mode)
        return lambda: compiled(x)[0].clone()
    program = torch.export.export(model, (x,)).module()
    return lambda: program(x)[0]


@pytest.mark.parametrize("mode", MODES)
def test_each_call_has_the_accuracy_of_its_tf32_setting(mode, tf32_restored):
    """Before each call an eager call under the opposite setting (what a
    library keeping a copy of the last eager call's settings would carry
    over); then the call, against float64: TF32's error where TF32 is
    allowed, float32's where not."""
    torch.manual_seed(0)
    model = lltm.LLTM(I, H, num_layers=L, device="cuda").eval()
    x = torch.randn(T, B, I, device="cuda")
    with torch.no_grad():
        want = model.double()(x.double())[0]
        model.float()
        call = runner(mode, model, x)
        errors = []
        for tf32 in (True, False, True, False):
            set_tf32(not tf32)
            model(x)
            set_tf32(tf32)
            error = (call().double() - want).abs().max().item()
            errors.append((tf32, error))
            assert error < BAR[tf32], (mode, errors)
    print(mode, errors)


@pytest.mark.parametrize("mode", MODES)
def test_each_call_runs_the_plan_forced_for_it(mode, tf32_restored):
    """A forced plan that cannot run these sizes (thread-block clusters hold
    H <= 256) fails the call it is forced for, and no other; a plan that can
    (per-step kernels) gives the model's result. Under reduce-overhead no
    call is made to fail: torch 2.11's CUDA-graph trees did not recover
    from a compiled call that raised (an internal assertion in
    cudagraph_trees at the next call, as in pytorch/pytorch#175562)."""
    set_tf32(False)
    torch.manual_seed(0)
    model = lltm.LLTM(64, 512, num_layers=2, device="cuda").eval()
    x = torch.randn(20, 16, 64, device="cuda")
    failing = "cluster" if mode != "reduce-overhead" else None
    with torch.no_grad():
        want = model(x)[0]
        call = runner(mode, model, x)
        for forced in (None, failing, None, "steps", failing, None):
            plan = overrides.sequence_plan(family=forced) if forced else contextlib.nullcontext()
            with plan:
                if forced == "cluster":
                    with pytest.raises(Exception, match="no plan of the forced kernel family"):
                        call()
                else:
                    torch.testing.assert_close(call(), want, rtol=1e-4, atol=1e-5,
                                               msg=f"{mode}, forced {forced}")
