"""The settings each operator call runs with (lltm/_settings.py,
csrc/binding/call_settings.h): packed in Python, read in C, and carried by
every mode of calling (eager, torch.compile, torch.export, direct calls).
What the CUDA library does with them is tested on a GPU
(tests/test_cuda_settings.py)."""
import ctypes
import random

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import lltm
from lltm import _native, _settings, overrides
from lltm.overrides import SequencePlan

FIELDS = ("family", "grid_lanes", "grid_values", "grid_groups_max", "cluster_blocks",
          "cluster_chunk", "concurrent", "grid_chunk", "block_chunk", "eager", "grid_tf32",
          "given", "float32_tf32", "deterministic", "cell_matmul")


def decoded(packed: int) -> dict | None:
    """The fields the native library reads from ``packed`` (None: refused)."""
    fields = (ctypes.c_int * len(FIELDS))()
    fn = _native._loaded["cpu"].lltm_settings_fields
    fn.argtypes, fn.restype = [ctypes.c_int64, ctypes.c_void_p], ctypes.c_int
    return dict(zip(FIELDS, fields)) if fn(packed, fields) == 0 else None


def random_constraints(rng: random.Random) -> tuple[str, SequencePlan]:
    def maybe(values):
        return rng.choice((None,) + tuple(values))
    shape = maybe(overrides.GRID_SHAPES)
    family = rng.choice(list(overrides.FAMILIES))
    groups = None if family == "cluster" else maybe(range(1, overrides.MAX_GRID_GROUPS + 1))
    plan = SequencePlan(family=family,
                        cluster_blocks=maybe(overrides.CLUSTER_BLOCKS),
                        cluster_chunk=maybe(overrides.CLUSTER_CHUNKS), grid_shape=shape,
                        grid_groups=groups,
                        grid_chunk=maybe(overrides.GRID_CHUNKS),
                        block_chunk=maybe(overrides.BLOCK_CHUNKS),
                        grid_tf32=maybe((True, False)))
    return rng.choice(list(overrides.MATMUL_POLICIES)), plan


@pytest.mark.parametrize("draw", range(4))
def test_what_python_packs_the_library_reads(draw):
    """Random constraints, flags and layer counts (a fresh seed each run,
    named on failure), packed by lltm and read by the native library's
    decoder: every field arrives as set."""
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    for _ in range(200):
        matmul, plan = random_constraints(rng)
        tf32, deterministic, layers = rng.random() < 0.5, rng.random() < 0.5, rng.choice((1, 2))
        with overrides.matmul(matmul), overrides.sequence_plan(**vars(plan)):
            packed = ((_settings.TF32 if tf32 else 0)
                      | (_settings.DETERMINISTIC if deterministic else 0)
                      | overrides.packed() | (layers << _settings.CONCURRENT_SHIFT))
        lanes, values = map(int, plan.grid_shape.split("x")) if plan.grid_shape else (0, 0)
        want = dict(family=overrides.FAMILIES[plan.family], grid_lanes=lanes, grid_values=values,
                    grid_groups_max=plan.grid_groups or 0,
                    cluster_blocks=plan.cluster_blocks or 0,
                    cluster_chunk=plan.cluster_chunk or 0, concurrent=layers,
                    grid_chunk=plan.grid_chunk or 0, block_chunk=plan.block_chunk or 0, eager=0,
                    grid_tf32={None: 0, True: 1, False: -1}[plan.grid_tf32], given=1,
                    float32_tf32=int(tf32), deterministic=int(deterministic),
                    cell_matmul=overrides.MATMUL_POLICIES[matmul])
        assert decoded(packed) == want, f"seed {seed}: {matmul}, {plan}, {packed:#x}"
    assert overrides.packed() == 0  # restored


def test_not_given_and_values_lltm_never_packs():
    assert decoded(_settings.NOT_GIVEN) == dict.fromkeys(FIELDS, 0)
    for bad in (-2, 1 << 52, 3 << 4,  # no such cell route
                3 << 8, 5 << 12,  # three layers at once; no such family
                2 << 16,  # grid lanes of 2
                6 << 16 | 4 << 20, 3 << 16 | 3 << 20,  # grid layouts 32x8, 4x4: none of ours
                3 << 12 | 1 << 24,  # a cap on the clusters' batch groups
                2 << 32, 4 << 32,  # cluster blocks of 2, of 8 (16 only)
                15 << 48):  # grid_tf32 of 15
        assert decoded(bad) is None, hex(bad)
    x = torch.randn(2, 3)
    args = (x, torch.randn(12, 7), torch.randn(12), torch.randn(2, 4), torch.randn(2, 4))
    with pytest.raises(RuntimeError, match=r"settings = 48 is not a value lltm packs"):
        torch.ops.lltm._cell_forward(*args, 48)


def test_torch_flags_are_read_at_each_call():
    tf32, deterministic = _settings.float32_tf32(), torch.are_deterministic_algorithms_enabled()
    try:
        for precision, warn_only in (("high", False), ("highest", True), ("high", True)):
            torch.set_float32_matmul_precision(precision)
            torch.use_deterministic_algorithms(True, warn_only=warn_only)
            flags = _settings.current() & 0xF
            assert flags == (_settings.TF32 if precision == "high" else 0) | _settings.DETERMINISTIC
            torch.use_deterministic_algorithms(False)
            assert _settings.current() & _settings.DETERMINISTIC == 0
        torch.backends.cuda.matmul.fp32_precision = "tf32"  # the newer setting
        assert _settings.current() & _settings.TF32
    finally:
        torch.set_float32_matmul_precision("high" if tf32 else "highest")
        torch.use_deterministic_algorithms(deterministic)


class Recorded(TorchDispatchMode):
    """The settings each lltm operator call reaches the kernels with."""

    def __init__(self):
        super().__init__()
        self.settings = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "lltm":
            schema = func._schema.arguments
            given = {**{a.name: a.default_value for a in schema if a.has_default_value()},
                     **dict(zip((a.name for a in schema), args)), **(kwargs or {})}
            self.settings.append((func.__name__, given["settings"]))
        return func(*args, **(kwargs or {}))


@pytest.fixture
def tf32_restored():
    before = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(before)


def inputs(T=4, B=3, I=5, H=6):
    return (torch.randn(T, B, I, requires_grad=True), torch.randn(3 * H, I + H),
            torch.randn(3 * H), torch.randn(B, H), torch.randn(B, H))


def test_direct_calls_take_the_settings_in_force(tf32_restored):
    """A public operator called without settings (its default, NOT_GIVEN)
    reaches the kernels with those in force at the call: TF32, a forced
    plan; backward operators alike."""
    for precision, plan in (("high", SequencePlan()), ("highest", SequencePlan("grid"))):
        torch.set_float32_matmul_precision(precision)
        with overrides.sequence_plan(**vars(plan)), Recorded() as seen:
            out = torch.ops.lltm.sequence_forward(*inputs())
            torch.ops.lltm.sequence_backward(*(torch.randn_like(t) for t in out[:3]),
                                             *inputs()[:2], out[1].new_zeros(3, 6), out[0],
                                             out[3], out[4])
            want = _settings.current()
        assert [s for _, s in seen.settings] == [want, want], (seen.settings, hex(want))
    args = inputs()
    with torch.inference_mode(), Recorded() as seen:  # no autograd kernel runs: NOT_GIVEN
        torch.ops.lltm.sequence_forward(*args)
    assert seen.settings == [("sequence_forward.default", _settings.NOT_GIVEN)]


def graph_settings(gm) -> list:
    return [n.args[-1] if len(n.args) == len(n.target._schema.arguments) else "default"
            for n in gm.graph.nodes if n.op == "call_function" and "lltm" in str(n.target)]


def test_compiled_graphs_hold_the_settings_of_their_trace(tf32_restored):
    """torch.compile: each graph holds the settings read when it was traced,
    and a change of TF32, deterministic mode or a forced plan traces anew."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(graph_settings(gm))
        return gm
    model = lltm.LLTM(5, 6, num_layers=2)
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    x = torch.randn(4, 3, 5)
    torch.set_float32_matmul_precision("highest")
    expected = []
    for step in ("start", "tf32", "deterministic", "plan", "start again"):
        if step == "tf32":
            torch.set_float32_matmul_precision("high")
        if step == "start again":
            torch.set_float32_matmul_precision("highest")
        deterministic = step == "deterministic"
        plan = SequencePlan("steps") if step == "plan" else SequencePlan()
        torch.use_deterministic_algorithms(deterministic, warn_only=True)
        try:
            with overrides.sequence_plan(**vars(plan)):
                compiled(x)
                expected.append(_settings.current())
        finally:
            torch.use_deterministic_algorithms(False)
        if step != "start again":
            assert graphs[-1] == [expected[-1]] * 2, (step, graphs, expected)
    assert len(set(expected)) == 4
    assert len(graphs) == 4  # the first settings again: their graph, traced before, runs


def test_exported_programs_read_the_settings_when_they_run(tf32_restored):
    """torch.export: the program holds no settings (NOT_GIVEN); run, its
    operator calls take those in force then."""
    model = lltm.LLTM(5, 6, num_layers=2).eval()
    x = torch.randn(4, 3, 5)
    torch.set_float32_matmul_precision("highest")
    program = torch.export.export(model, (x,))
    assert graph_settings(program.graph_module) == ["default"] * 2
    torch.set_float32_matmul_precision("high")
    with overrides.sequence_plan(family="grid"), Recorded() as seen:
        out = program.module()(x)
        want = _settings.current()
    assert [s for _, s in seen.settings] == [want] * 2
    torch.testing.assert_close(out[0], model(x)[0])
