"""torch.onnx.export (dynamo=True) of lltm's modules and functional forms,
run in ONNX Runtime (CPU): each model exported once with dynamic T and B,
then run at two sequence lengths and two batch sizes other than the
export's example and compared with eager lltm; options that cannot be
exported refused at export time, by name."""
import importlib.util
import os
import subprocess
import sys
import warnings

import pytest
import torch

import lltm
from conftest import tolerances


def _require(name):
    """Skip where the package is absent, except under CI (CI=true), whose
    set-up (`make setup`) installs it: there its absence fails."""
    if importlib.util.find_spec(name) is None:
        reason = f"{name} is not installed (`make setup` installs onnx, onnxscript, onnxruntime)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    return pytest.importorskip(name)


for _name in ("onnx", "onnxscript"):
    if importlib.util.find_spec(_name) is None and not os.environ.get("CI"):
        pytest.skip(f"{_name} is not installed (`make setup` installs it)",
                    allow_module_level=True)

I, H = 6, 8
EXAMPLE = (5, 3)                 # (T, B) of the exported example
SIZES = [(2, 1), (2, 7), (11, 1), (11, 7)]  # two T x two B, none the example's


@pytest.fixture
def ort():
    return _require("onnxruntime")


def seeded() -> int:
    """This test's seed (fresh every run, conftest), printed for a rerun."""
    seed = torch.initial_seed()
    print(f"seed {seed}")
    return seed


def export(model, args, dynamic_shapes, kwargs=None):
    _require("onnxscript")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.onnx.export(model, args, kwargs=kwargs, dynamo=True,
                                 dynamic_shapes=dynamic_shapes, verbose=False)


def session(ort, program):
    return ort.InferenceSession(program.model_proto.SerializeToString(),
                                providers=["CPUExecutionProvider"])


def run(sess, *inputs):
    names = [i.name for i in sess.get_inputs()]
    return [torch.from_numpy(a) for a in sess.run(None, dict(zip(names, (
        t.numpy() for t in inputs))))]


def flat(outputs):
    if isinstance(outputs, torch.Tensor):
        return [outputs]
    return [t for o in outputs for t in flat(o)]


def dims():
    return torch.export.Dim("T", min=1, max=4096), torch.export.Dim("B", min=1, max=4096)


def check(sess, model, make_inputs, tol=None):
    """sess against model at each of SIZES: make_inputs(T, B) -> inputs."""
    for T, B in SIZES:
        inputs = make_inputs(T, B)
        with torch.no_grad():
            want = flat(model(*inputs))
        got = run(sess, *flat(inputs))
        assert len(got) == len(want)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, **(tol or {}), msg=lambda m: f"T={T} B={B}: {m}")


def lengths_for(T, B):
    return torch.randint(1, T + 1, (B,), dtype=torch.int64)


def test_importing_lltm_loads_no_onnx():
    """The translations register when torch's exporter loads, not before."""
    code = ("import sys, torch, lltm; loaded = {'onnx', 'onnxscript', 'onnxruntime'} & "
            "set(sys.modules); assert not loaded, loaded")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("layers", [1, 2, 3])
def test_layers_dynamic_time_and_batch(ort, layers):
    seeded()
    model = lltm.LLTM(I, H, num_layers=layers).eval()
    T, B = dims()
    program = export(model, (torch.randn(*EXAMPLE, I),), ({0: T, 1: B},))
    ops = {n.op_type for n in program.model_proto.graph.node}
    assert "LSTM" in ops
    check(session(ort, program), model, lambda t, b: (torch.randn(t, b, I),))


def test_batch_first_with_initial_state(ort):
    seeded()
    model = lltm.LLTM(I, H, num_layers=2, batch_first=True).eval()
    T, B = dims()
    x = torch.randn(EXAMPLE[1], EXAMPLE[0], I)
    h0, c0 = torch.randn(2, EXAMPLE[1], H), torch.randn(2, EXAMPLE[1], H)
    program = export(model, (x, (h0, c0)), ({0: B, 1: T}, ({1: B}, {1: B})))
    check(session(ort, program), model,
          lambda t, b: (torch.randn(b, t, I), (torch.randn(2, b, H), torch.randn(2, b, H))))


@pytest.mark.parametrize("layers", [1, 2])
def test_bidirectional(ort, layers):
    seeded()
    model = lltm.LLTM(I, H, num_layers=layers, bidirectional=True).eval()
    T, B = dims()
    program = export(model, (torch.randn(*EXAMPLE, I),), ({0: T, 1: B},))
    check(session(ort, program), model, lambda t, b: (torch.randn(t, b, I),))


class WithLengths(torch.nn.Module):
    """lltm.LLTM over padded input with each row's length (an int64 tensor)."""

    def __init__(self, **options):
        super().__init__()
        self.rnn = lltm.LLTM(I, H, **options)

    def forward(self, x, lengths, state=None):
        return self.rnn(x, state, lengths=lengths)


@pytest.mark.parametrize("options", [dict(num_layers=2),
                                     dict(num_layers=2, bidirectional=True, batch_first=True)],
                         ids=["forward", "bidirectional-batch_first"])
def test_lengths(ort, options):
    seeded()
    model = WithLengths(**options).eval()
    T, B = dims()
    bf = options.get("batch_first", False)
    shape = lambda t, b: (b, t, I) if bf else (t, b, I)  # noqa: E731
    D = 2 if options.get("bidirectional") else 1
    state = lambda b: (torch.randn(2 * D, b, H), torch.randn(2 * D, b, H))  # noqa: E731
    x = torch.randn(*shape(*EXAMPLE))
    program = export(model, (x, lengths_for(*EXAMPLE), state(EXAMPLE[1])),
                     ({1 if bf else 0: T, 0 if bf else 1: B}, {0: B}, ({1: B}, {1: B})))
    check(session(ort, program), model,
          lambda t, b: (torch.randn(*shape(t, b)), lengths_for(t, b), state(b)))


def test_cell_with_and_without_state(ort):
    seeded()

    class TwoSteps(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.cell = lltm.LLTMCell(I, H)

        def forward(self, x):
            h, c = self.cell(x)
            return self.cell(x, (h, c))

    model = TwoSteps().eval()
    B = torch.export.Dim("B", min=1, max=4096)
    program = export(model, (torch.randn(EXAMPLE[1], I),), ({0: B},))
    check(session(ort, program), model, lambda t, b: (torch.randn(b, I),))


def test_functional_forms(ort):
    seeded()

    class Functional(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(3 * H, I + H) / 3)
            self.b = torch.nn.Parameter(torch.randn(3 * H))

        def forward(self, x, h0, c0, lengths):
            out, (h, c) = lltm.functional.lltm_sequence(x, self.w, self.b, h0, c0)
            out_l, (h_l, c_l) = lltm.functional.lltm_sequence(x, self.w, None, h0, c0, lengths)
            step = lltm.functional.lltm_cell(x[0], self.w, self.b, h, c)
            return out, h, c, out_l, h_l, c_l, *step

    model = Functional().eval()
    T, B = dims()
    make = lambda t, b: (torch.randn(t, b, I), torch.randn(b, H), torch.randn(b, H),  # noqa
                         lengths_for(t, b))
    program = export(model, make(*EXAMPLE), ({0: T, 1: B}, {0: B}, {0: B}, {0: B}))
    check(session(ort, program), model, make)


def test_raw_operator_outputs_kept_for_backward(ort):
    """Each step's cells and gate activations, which the operators also
    return, exported too (recomputed beside ONNX's LSTM)."""
    seeded()

    class Raw(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(3 * H, I + H) / 3)
            self.b = torch.nn.Parameter(torch.randn(3 * H))

        def forward(self, x, h0, c0, lengths):
            return (torch.ops.lltm.sequence_forward(x, self.w, self.b, h0, c0),
                    torch.ops.lltm.sequence_forward.lengths(x, self.w, self.b, h0, c0, lengths),
                    torch.ops.lltm.cell_forward(x[0], self.w, self.b, h0, c0))

    model = Raw().eval()
    T, B = dims()
    make = lambda t, b: (torch.randn(t, b, I), torch.randn(b, H), torch.randn(b, H),  # noqa
                         lengths_for(t, b))
    program = export(model, make(*EXAMPLE), ({0: T, 1: B}, {0: B}, {0: B}, {0: B}))
    check(session(ort, program), model, make)


def test_stacked_layers_operator(ort):
    """lltm::stack_forward (the module's stacked route, forced here on the CPU)."""
    seeded()
    model = WithLengths(num_layers=3).eval()
    T, B = dims()
    make = lambda t, b: (torch.randn(t, b, I), lengths_for(t, b))  # noqa: E731
    with lltm.overrides.stacked_layers("on"):
        program = export(model, make(*EXAMPLE), ({0: T, 1: B}, {0: B}))
    traced = {str(n.target) for n in program.exported_program.graph.nodes}
    assert {"lltm._stack_forward.lengths", "lltm.stack_forward.lengths"} & traced, traced
    check(session(ort, program), model, make)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16], ids=["float64", "float16"])
def test_other_dtypes(ort, dtype):
    """float64 as a Scan of the step (ONNX Runtime's LSTM has no float64);
    float16 in float32 inside the layer, as lltm's kernels accumulate it."""
    seeded()
    model = lltm.LLTM(I, H, num_layers=2, dtype=dtype).eval()
    cell = lltm.LLTMCell(I, H, dtype=dtype).eval()

    class Both(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn, self.cell = model, cell

        def forward(self, x, lengths):
            out, (h, c) = self.rnn(x, lengths=lengths)
            return out, h, c, *self.cell(x[0], (h[-1], c[-1]))

    both = Both().eval()
    T, B = dims()
    make = lambda t, b: (torch.randn(t, b, I, dtype=dtype), lengths_for(t, b))  # noqa: E731
    program = export(both, make(*EXAMPLE), ({0: T, 1: B}, {0: B}))
    ops = {n.op_type for n in program.model_proto.graph.node}
    assert ("Scan" if dtype == torch.float64 else "LSTM") in ops
    check(session(ort, program), both, make, tolerances(dtype))


def test_training_example_model(ort):
    """Linear front, LLTM, linear head: the model of lltm/examples."""
    seeded()
    from lltm.examples.onnx_export import Classifier
    model = Classifier(I, H, 5).eval()
    T, B = dims()
    program = export(model, (torch.randn(EXAMPLE[1], EXAMPLE[0], I),), ({0: B, 1: T},))
    check(session(ort, program), model, lambda t, b: (torch.randn(b, t, I),))


class Packed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = lltm.LLTM(I, H)

    def forward(self, data, batch_sizes):
        from torch.nn.utils.rnn import PackedSequence
        return self.rnn(PackedSequence(data, batch_sizes))[0].data


class ListLengths(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = lltm.LLTM(I, H)

    def forward(self, x):
        return self.rnn(x, lengths=[5, 4, 2])


def _packed_example():
    from torch.nn.utils.rnn import pack_padded_sequence
    packed = pack_padded_sequence(torch.randn(5, 3, I), [5, 4, 2])
    return packed.data, packed.batch_sizes


REFUSED = {
    "PackedSequence": (Packed, _packed_example, r"PackedSequence input cannot be exported to ONNX.*"
                       r"lengths= \(an int64 tensor"),
    "lengths-list": (ListLengths, lambda: (torch.randn(5, 3, I),),
                     r"lengths given as a list of ints cannot be exported to ONNX.*int64 tensor"),
    "impl": (lambda: lltm.LLTM(I, H, impl="reference"), lambda: (torch.randn(5, 3, I),),
             r"LLTM\(impl='reference'\) cannot be exported to ONNX.*impl='native'"),
    "wavefront-override": (lambda: lltm.LLTM(I, H, num_layers=2),
                           lambda: (torch.randn(5, 3, I),),
                           r"lltm.overrides.wavefront\(chunks=2\) cannot be exported to ONNX"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_refused_at_export_by_name(case):
    """What would fix T or B to the example's values is refused, naming the
    option (torch.onnx.export's message carries lltm's)."""
    make_model, make_args, message = REFUSED[case]
    with lltm.overrides.wavefront(chunks=2 if case == "wavefront-override" else None):
        with pytest.raises(Exception, match=message) as raised:
            export(make_model().eval(), make_args(), None)
    print(raised.value)


@pytest.mark.parametrize("case", ["lengths-list", "impl"])
def test_torch_export_alone_keeps_what_onnx_refuses(case):
    """The refusals are ONNX's (a model meant to run at any size): torch.export
    alone still exports these, specialized to the example's sizes, and the
    program matches eager."""
    make_model, make_args, _ = REFUSED[case]
    model, args = make_model().eval(), make_args()
    program = torch.export.export(model, args).module()
    for got, want in zip(flat(program(*args)), flat(model(*args))):
        torch.testing.assert_close(got, want, **tolerances(torch.float32))
