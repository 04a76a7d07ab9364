"""lltm.backends.cuda.benchmark (lltm/_autotune.py): the CUDA sequence plan
measured fastest for each call's key. On the CPU with a fake device, plan
query and timer: what it picks, when it measures, its keys, its cache file,
the settings a tuned forward and its backward run with; that it is inert on
the CPU. On a GPU (skipped without one): results against the reference, the
plan it picks fits, one measurement a key, captured calls."""
import json
import types

import pytest
import torch

import lltm
from lltm import _autotune, _directions, _layer_grads, _native, _ops, _settings, overrides
from lltm.functional import lltm_sequence
from lstm_reference import reference_lltm

HAS_CUDA = torch.cuda.is_available() and _native.has_cuda_kernels()
F64 = torch.float64
STEPS, GRID, CLUSTER, BLOCK = (overrides.SequencePlan(family=f).packed()
                               for f in ("steps", "grid", "cluster", "block"))
EAGER_US = {0: 10.0, STEPS: 12.0, GRID: 5.0, CLUSTER: 1.0, BLOCK: 11.0}
CAPTURED_US = {0: 10.0, STEPS: 4.0, GRID: 5.0, CLUSTER: 1.0, BLOCK: 11.0}
BACKWARD_US = {0: 10.0, STEPS: 9.9, GRID: 20.0, CLUSTER: 1.0, BLOCK: 6.0}  # STEPS: no clear win


@pytest.fixture
def fake(monkeypatch):
    """The tuner on the CPU: every tensor on a fake GPU, every family but the
    cluster fitting, a fake timer of samples 3% apart (forward, eager: the
    grid fastest; captured: the per-step family; backward: the block);
    ``fake.calls`` the measurements, ``fake.capturing`` the capture flag."""
    state = types.SimpleNamespace(calls=[], capturing=False)

    def measure(fields, dtype, T, B, I, H, index, settings, training):  # noqa: E741
        state.calls.append(dict(fields=fields, T=T, B=B, training=training, settings=settings))
        times = {(False, "forward"): EAGER_US, (True, "forward"): CAPTURED_US}
        if training:
            times.update({(False, "backward"): BACKWARD_US, (True, "backward"): BACKWARD_US})
        return {at: [[us.get(f, 20.0) * k for k in (0.97, 1.0, 1.03)] for f in fields]
                for at, us in times.items()}
    monkeypatch.setattr(_autotune, "_measure", measure)
    monkeypatch.setattr(_autotune, "_fits", lambda dtype, T, B, I, H, index, s:  # noqa: E741
                        s & _autotune.PLAN_FIELDS != CLUSTER)
    monkeypatch.setattr(_autotune, "_cuda_index", lambda x: 0)
    monkeypatch.setattr(_autotune, "_device", lambda index: ("Fake GPU", 100))
    monkeypatch.setattr(_autotune, "_capturing", lambda index: state.capturing)
    monkeypatch.setattr(lltm.backends.cuda, "benchmark", True)
    monkeypatch.setattr(lltm.backends.cuda, "cache_file", None)
    _autotune.clear()
    yield state
    _autotune.clear()


def base(concurrent=1, tf32=False):
    return (_settings.current(concurrent) & ~_settings.TF32) | (_settings.TF32 if tf32 else 0)


def test_picks_the_fastest_that_fits(fake):
    x = torch.randn(100, 3, 5)
    assert _autotune.settings(base(), x, 7, True) == base() | GRID
    fake.capturing = True  # measured at the eager call, for captured calls too
    assert _autotune.settings(base(), x, 7, True) == base() | STEPS
    [call] = fake.calls
    assert call["fields"] == [0, STEPS, GRID, BLOCK]  # the cluster does not fit
    assert call["T"] == _autotune.MAX_STEPS and call["B"] == 3 and call["training"]
    for captured, forward in ((False, GRID), (True, STEPS)):
        assert _autotune.lookup(0, x.dtype, 100, 3, 5, 7, True, captured, base()) == (forward,
                                                                                     BLOCK)


def test_only_a_clear_win_replaces_the_library():
    assert _autotune.clear_winner([[10, 11], [9, 9.5], [5, 12], [8, 9.9]]) == 3
    assert _autotune.clear_winner([[10, 11], [10, 12], [5, 10.5]]) == 0
    assert _autotune.clear_winner([[10], [10]]) == 0


def test_the_inference_forward_alone(fake):
    x = torch.randn(20, 3, 5)
    assert _autotune.settings(base(), x, 7, False) == base() | GRID
    assert _autotune.lookup(0, x.dtype, 20, 3, 5, 7, False, False, base()) == (GRID, 0)


def test_one_measurement_a_key(fake):
    for T, B in ((20, 3), (20, 3), (30, 3), (32, 3), (20, 4), (300, 4)):  # T 20 - 32: a bucket
        _autotune.settings(base(), torch.randn(T, B, 5), 7, True)
    assert [(c["T"], c["B"]) for c in fake.calls] == [(32, 3), (32, 4), (_autotune.MAX_STEPS, 4)]


def test_keys_separate_flags_modes_and_sharing(fake):
    x = torch.randn(20, 3, 5)
    _autotune.settings(base(), x, 7, True)
    _autotune.settings(base(tf32=True), x, 7, True)
    _autotune.settings(base(), x, 7, False)
    _autotune.settings(base(concurrent=2), x, 7, True)
    assert len(fake.calls) == 4
    assert [c["training"] for c in fake.calls] == [True, True, False, True]
    tf32_grid = [overrides.SequencePlan(family="grid", grid_tf32=t).packed() for t in (True, False)]
    assert fake.calls[1]["fields"] == [0, STEPS, *tf32_grid, BLOCK]  # float32 on TF32
    eager = _autotune.lookup(0, x.dtype, 20, 3, 5, 7, True, False, base())
    captured = _autotune.lookup(0, x.dtype, 20, 3, 5, 7, True, True, base())
    assert (eager, captured) == ((GRID, BLOCK), (STEPS, BLOCK))


def test_never_measures_under_capture(fake):
    x = torch.randn(20, 3, 5)
    fake.capturing = True
    assert _autotune.settings(base(), x, 7, True) == base()  # a miss: the library's choice
    assert not fake.calls


def test_never_measures_while_compiling(fake, monkeypatch):
    x = torch.randn(20, 3, 5)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert _autotune.settings(base(), x, 7, True) == base()
    monkeypatch.undo()
    monkeypatch.setattr(lltm.backends.cuda, "benchmark", True)
    w, b, h, c = torch.randn(21, 12), torch.randn(21), torch.randn(3, 7), torch.randn(3, 7)
    compiled = torch.compile(lambda *a: lltm_sequence(*a)[0], backend="aot_eager",
                             fullgraph=True)
    torch.testing.assert_close(compiled(x, w, b, h, c), lltm_sequence(x, w, b, h, c)[0])
    assert not fake.calls


def test_never_measures_under_torch_func(fake):
    x, w, b, h, c = (torch.randn(*shape, dtype=F64)
                     for shape in ((20, 3, 5), (21, 12), (21,), (3, 7), (3, 7)))
    torch.func.grad(lambda w: lltm_sequence(x, w, b, h, c)[0].sum())(w)
    torch.vmap(lambda x: lltm_sequence(x, w, b, h, c)[0])(x.unsqueeze(0))
    assert not fake.calls


def test_a_forced_plan_is_left_alone(fake):
    x = torch.randn(20, 3, 5)
    with overrides.sequence_plan(family="block"):
        settings = _settings.current()
        assert _autotune.settings(settings, x, 7, True) == settings
        lltm.LLTM(5, 7)(x)
    assert not fake.calls


def test_cache_file_round_trip(fake, tmp_path, monkeypatch):
    path = tmp_path / "plans.json"
    monkeypatch.setattr(lltm.backends.cuda, "cache_file", str(path))
    x = torch.randn(20, 3, 5)
    assert _autotune.settings(base(), x, 7, True) == base() | GRID
    data = json.loads(path.read_text())
    entries = data["Fake GPU"]
    assert sorted(tuple(e["plans"]) for e in entries.values()) == [("grid", "block"),
                                                                   ("steps", "block")]
    lltm.backends.cuda.clear_cache()
    monkeypatch.setattr(_autotune, "_measure", lambda *a: pytest.fail("measured again"))
    assert _autotune.settings(base(), x, 7, True) == base() | GRID  # read back
    for entry in entries.values():  # the choice is the file's
        entry["forward"] = BLOCK
    path.write_text(json.dumps(data))
    lltm.backends.cuda.clear_cache()
    for _ in range(2):
        assert _autotune.settings(base(), x, 7, True) == base() | BLOCK
    for entry in entries.values():  # an entry of an older lltm: measured again
        entry["fields"] = entry.pop("forward")
    path.write_text(json.dumps(data))
    lltm.backends.cuda.clear_cache()
    with pytest.raises(pytest.fail.Exception, match="measured again"):
        _autotune.settings(base(), x, 7, True)


class Spy:
    """An operator packet whose overloads record their settings argument."""

    def __init__(self, packet, seen):
        self.packet, self.seen = packet, seen

    def __getattr__(self, overload):
        op = getattr(self.packet, overload)
        return lambda *args: self.seen.append(args[-1]) or op(*args)


@pytest.mark.parametrize("how", ["functional", "bidirectional", "chunks"])
def test_forward_and_backward_run_their_measured_plans(fake, monkeypatch, how):
    forwards, backwards = [], []
    tune = _autotune.settings
    monkeypatch.setattr(_autotune, "settings", lambda *a: forwards.append(tune(*a)) or forwards[-1])
    for module, name in ((_ops, "_sequence_backward_kernel"), (_directions, "_BACKWARD"),
                         (_layer_grads, "_backward_gates")):
        monkeypatch.setattr(module, name, Spy(getattr(module, name), backwards))
    x = torch.randn(20, 3, 5, dtype=F64, requires_grad=True)
    m = lltm.LLTM(5, 7, num_layers=2, bidirectional=how == "bidirectional").double()
    if how == "functional":
        out = lltm_sequence(x, *m.layer_parameters(0), torch.zeros(3, 7, dtype=F64),
                            torch.zeros(3, 7, dtype=F64))[0]
    else:
        with overrides.wavefront(2 if how == "chunks" else None):
            out = m(x)[0]
    out.sum().backward()
    assert forwards and {s & _autotune.PLAN_FIELDS for s in forwards} == {GRID}
    assert backwards and {s & _autotune.PLAN_FIELDS for s in backwards} == {BLOCK}


def test_a_forced_forward_leaves_the_backward_unmeasured(fake):
    x = torch.randn(20, 3, 5)
    _autotune.settings(base(), x, 7, True)  # measured: GRID forward, BLOCK backward
    with overrides.sequence_plan(family="grid"):
        assert _autotune.backward_plan(_settings.current(), x, 7) is None
    assert _autotune.backward_plan(base() | GRID, x, 7) == BLOCK


@pytest.mark.parametrize("L, bidirectional", [(1, False), (3, False), (2, True)])
def test_inert_on_the_cpu(monkeypatch, L, bidirectional):
    monkeypatch.setattr(lltm.backends.cuda, "benchmark", True)
    monkeypatch.setattr(_autotune, "_measure", lambda *a: pytest.fail("measured on the CPU"))
    m = lltm.LLTM(5, 7, num_layers=L, bidirectional=bidirectional).double()
    x = torch.randn(9, 3, 5, dtype=F64, requires_grad=True)
    results = []
    for run in (lambda: m(x)[0], lambda: reference_lltm(m, x)[0]):
        out = run()
        results.append([out, *torch.autograd.grad(out.pow(2).sum(), [x, *m.parameters()])])
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


# --- on a GPU ------------------------------------------------------------------------

gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU and the CUDA kernels")


@pytest.fixture
def tuning_on(monkeypatch):
    monkeypatch.setattr(lltm.backends.cuda, "benchmark", True)
    monkeypatch.setattr(lltm.backends.cuda, "cache_file", None)
    calls = []
    measure = _autotune._measure
    monkeypatch.setattr(_autotune, "_measure", lambda *a: calls.append(a) or measure(*a))
    _autotune.clear()
    yield calls
    _autotune.clear()


def run_and_grads(m, x, hx):
    x = x.detach().requires_grad_()
    hx = tuple(t.detach().requires_grad_() for t in hx)
    out, (h_n, c_n) = m(x, hx)
    weight = torch.linspace(-1, 1, out.shape[-1], dtype=F64, device=out.device)
    loss = (out.double() * weight).sum() + h_n.double().pow(2).sum() + c_n.double().sum()
    return [out, h_n, c_n, *torch.autograd.grad(loss, (x, *hx, *m.parameters()))]


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, F64])
@pytest.mark.parametrize("L, how", [(1, ""), (3, "layers"), (3, "chunks"), (1, "bidirectional")])
def test_gpu_matches_the_reference(tuning_on, monkeypatch, dtype, L, how):
    T, B, I, H = 19, 5, 11, 37
    cpu = lltm.LLTM(I, H, num_layers=L, bidirectional=how == "bidirectional", dtype=F64)
    cuda = lltm.LLTM(I, H, num_layers=L, bidirectional=how == "bidirectional", dtype=dtype,
                     device="cuda")
    cuda.load_state_dict(cpu.state_dict())
    x = torch.randn(T, B, I, dtype=F64)
    hx = tuple(torch.randn(cpu.num_directions * L, B, H, dtype=F64) for _ in range(2))
    def run():
        with overrides.stacked_layers("off"), overrides.wavefront(2 if how == "chunks" else None):
            return run_and_grads(cuda, x.cuda().to(dtype), tuple(t.cuda().to(dtype) for t in hx))
    got = run()
    assert tuning_on  # measured
    monkeypatch.setattr(lltm.backends.cuda, "benchmark", False)
    library, want = run(), run_and_grads(cpu, x, hx)

    def error(results):
        return max(((r.double().cpu() - w).norm() / w.norm()).item() for r, w in zip(results, want))
    assert error(got) <= max({F64: 1e-9, torch.float32: 1e-4, torch.bfloat16: 4e-2}[dtype],
                             2 * error(library))


@gpu
def test_gpu_tuned_plan_fits_and_is_measured_once(tuning_on):
    m = lltm.LLTM(16, 64, device="cuda")
    x = torch.randn(20, 3, 16, device="cuda")
    for _ in range(2):
        m(x)[0].sum().backward()
    assert len(tuning_on) == 1
    text = lltm.explain(m, x)
    assert "benchmark: on" in text and "measured: " in text and "not yet" not in text
    index = torch.cuda.current_device()
    settings = _settings.current()
    for captured in (False, True):
        plans = _autotune.lookup(index, x.dtype, 20, 3, 16, 64, True, captured, settings)
        assert plans is not None
        for fields in plans:
            assert overrides.sequence_plan_in_force(x.dtype, 20, 3, 16, 64,
                                                    settings=settings | fields) is not None


@gpu
def test_gpu_captured_call_takes_the_cached_plan(tuning_on, monkeypatch):
    m = lltm.LLTM(16, 64, device="cuda")
    x = torch.randn(20, 3, 16, device="cuda")
    m(x)[0].sum().backward()  # eager: measured for eager and captured calls
    chosen = []
    tune = _autotune.settings
    monkeypatch.setattr(_autotune, "settings", lambda *a: chosen.append(tune(*a)) or chosen[-1])
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        m(x)  # warm-up on a side stream, as torch.cuda.graph asks
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        m(x)
    graph.replay()
    torch.cuda.synchronize()
    want = _autotune.lookup(torch.cuda.current_device(), x.dtype, 20, 3, 16, 64, True, True,
                            _settings.current())
    assert len(tuning_on) == 1 and want is not None
    assert chosen[-1] & _autotune.PLAN_FIELDS == want[0]


# --- lltm.LLTM's schedule (lltm/_schedule.py) ------------------------------------------

def schedule_us(run):
    """A fake timer of the schedule candidates (``run``: a partial of the
    candidate): runs it once, then eager the stacked launch clearly fastest,
    captured four chunks planned for two layers."""
    run()
    s = run.args[0]
    us = {"stacked": 5.0, "wavefront": 9.0 if (s.chunks, s.sharing) != (4, 2) else 2.0}
    return [us.get(s.route, 10.0) * k for k in (0.99, 1.0, 1.01)]


@pytest.fixture
def fake_schedules(fake, monkeypatch):
    """``fake`` with the stacked launch fitting, the schedule timers faked
    and ``for_call`` and ``by_rules`` of lltm/_schedule.py."""
    import contextlib
    from lltm import _schedule
    monkeypatch.setattr(overrides, "stack_plan_in_force", lambda *a, **k: {"family": "stack"})
    monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())
    monkeypatch.setattr(_autotune, "_timed", schedule_us)
    monkeypatch.setattr(_schedule, "_timed_captured", schedule_us)
    fake.for_call, fake.by_rules = _schedule.for_call, _schedule._by_rules
    return fake


@pytest.mark.parametrize("training", [True, False])
def test_the_schedule_measured(fake_schedules, training):
    m = lltm.LLTM(5, 7, num_layers=3).double().requires_grad_(training)
    x = torch.randn(40, 3, 5, dtype=F64)
    got = fake_schedules.for_call(m, x)
    assert (got.route, got.groups) == ("stacked", (3,)) and "measured" in got.why
    fake_schedules.capturing = True
    got = fake_schedules.for_call(m, x)
    assert (got.route, got.chunks, got.sharing) == ("wavefront", 4, 2)
    key = (*_autotune._key(0, F64, 40, 3, 5, 7, training, True, _settings.current(1)),
           "schedule", 3)
    assert _autotune.cached(key) == ("wavefront", [], 4, 2)
    fake_schedules.capturing = False
    torch.testing.assert_close(m(x)[0], reference_lltm(m, x)[0])  # the stacked launch


def test_explain_measures_nothing(fake_schedules, monkeypatch):
    monkeypatch.setattr(_autotune, "_timed", lambda run: pytest.fail("measured"))
    m = lltm.LLTM(5, 7, num_layers=3).double()
    x = torch.randn(40, 3, 5, dtype=F64)
    assert "not yet measured" in fake_schedules.for_call(m, x, measure=False).why
    assert "not yet measured" in lltm.explain(m, x)


def test_the_rules_schedule_unless_one_clearly_wins(fake_schedules, monkeypatch):
    monkeypatch.setattr(_autotune, "_timed", lambda run: run() or [10.0, 10.5])
    m = lltm.LLTM(5, 7, num_layers=2).double()
    x = torch.randn(40, 3, 5, dtype=F64)
    rules = fake_schedules.by_rules(m, x)
    assert fake_schedules.for_call(m, x) == rules


@pytest.mark.parametrize("force", ["stacked", "wavefront", "dropout", "autocast"])
def test_a_forced_schedule_is_not_measured(fake_schedules, monkeypatch, force):
    monkeypatch.setattr(_autotune, "_timed", lambda run: pytest.fail("measured"))
    if force == "autocast":  # (a CPU build of torch turns CUDA autocast off)
        monkeypatch.setattr(torch, "is_autocast_enabled", lambda device: device == "cuda")
    m = lltm.LLTM(5, 7, num_layers=2, dropout=0.5 if force == "dropout" else 0.0).double()
    x = torch.randn(40, 3, 5, dtype=F64)
    with overrides.stacked_layers("off" if force == "stacked" else "auto"), \
            overrides.wavefront(2 if force == "wavefront" else None):
        assert "measured" not in fake_schedules.for_call(m, x).why


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_measured_schedule_matches_the_reference(tuning_on, dtype):
    T, B, I, H = 40, 5, 11, 37
    cpu = lltm.LLTM(I, H, num_layers=3, dtype=F64)
    cuda = lltm.LLTM(I, H, num_layers=3, dtype=dtype, device="cuda")
    cuda.load_state_dict(cpu.state_dict())
    x = torch.randn(T, B, I, dtype=F64)
    hx = tuple(torch.randn(3, B, H, dtype=F64) for _ in range(2))
    got = run_and_grads(cuda, x.cuda().to(dtype), tuple(t.cuda().to(dtype) for t in hx))
    assert [k for k in _autotune._cache if "schedule" in k]  # measured, eager and captured
    text = lltm.explain(cuda, x.cuda().to(dtype))
    lltm.backends.cuda.benchmark = False
    library, want = (run_and_grads(cuda, x.cuda().to(dtype), tuple(t.cuda().to(dtype) for t in hx)),
                     run_and_grads(cpu, x, hx))

    def error(results):
        return max(((r.double().cpu() - w).norm() / w.norm()).item() for r, w in zip(results, want))
    assert error(got) <= max({torch.float32: 1e-4, torch.bfloat16: 4e-2}[dtype], 2 * error(library))
    assert "why: " in text
    # captured: the schedule measured for captured calls, replayed
    lltm.backends.cuda.benchmark = True
    xc = x.cuda().to(dtype)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(stream):
        cuda(xc)  # eager inference: measured for captured calls too
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        out = cuda(xc)[0]
    graph.replay()
    torch.cuda.synchronize()
    with torch.no_grad():
        torch.testing.assert_close(out, cuda(xc)[0], rtol=2e-2, atol=2e-2)
