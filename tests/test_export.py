"""torch.export with dynamic batch and time, its AOTInductor package, and
TorchScript (refused when scripting, with a pointer to what works)."""
import pytest
import torch

import lltm


class Classifier(torch.nn.Module):
    """Linear -> LLTM (two layers, batch_first) -> Linear, and a cell step."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(5, 6)
        self.rnn = lltm.LLTM(6, 7, num_layers=2, batch_first=True)
        self.cell = lltm.LLTMCell(7, 7)
        self.head = torch.nn.Linear(7, 3)

    def forward(self, x):
        out, (h_n, c_n) = self.rnn(self.proj(x))
        h, c = self.cell(out[:, -1], (h_n[-1], c_n[-1]))
        return self.head(out), h, c


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a GPU"))]


def exported(device):
    torch.manual_seed(0)
    model = Classifier().to(device).eval()
    batch = torch.export.Dim("batch", min=1, max=4096)
    time = torch.export.Dim("time", min=1, max=100_000)
    program = torch.export.export(model, (torch.randn(3, 4, 5, device=device),),
                                  dynamic_shapes={"x": {0: batch, 1: time}})
    return model, program


SHAPES = [(3, 4), (1, 1), (6, 17)]

# Running an AOTInductor package that calls operators registered through the
# stable C ABI crashes inside torch 2.11's AOTInductor runtime (a segmentation
# fault in the package's run call, on the CPU and on CUDA: H100 machine,
# torch 2.11.0+cu130, 2026-11-24); torch 2.13 runs it.
AOTI_RUNS = tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 13)


@pytest.mark.parametrize("device", DEVICES)
def test_export_dynamic_batch_and_time_matches_eager(device):
    model, program = exported(device)
    ops = {n.target for n in program.graph.nodes if n.op == "call_function"}
    assert torch.ops.lltm.sequence_forward.default in ops
    assert torch.ops.lltm.cell_forward.default in ops
    for B, T in SHAPES:
        x = torch.randn(B, T, 5, device=device)
        for got, want in zip(program.module()(x), model(x)):
            torch.testing.assert_close(got, want)


@pytest.mark.skipif(not AOTI_RUNS, reason="AOTInductor packages calling stable-ABI operators "
                    "crash in torch < 2.13's runtime")
@pytest.mark.parametrize("device", DEVICES)
def test_aoti_package_runs_and_matches_eager(device, tmp_path):
    """The AOTInductor package (C++ compiled here: about a minute)."""
    model, program = exported(device)
    path = torch._inductor.aoti_compile_and_package(program,
                                                    package_path=str(tmp_path / "lltm.pt2"))
    runner = torch._inductor.aoti_load_package(path)
    for B, T in SHAPES:
        x = torch.randn(B, T, 5, device=device)
        for got, want in zip(runner(x), model(x)):
            torch.testing.assert_close(got, want)


@pytest.mark.parametrize("module", [lambda: lltm.LLTMCell(3, 4), lambda: lltm.LLTM(3, 4),
                                    lambda: Classifier()])
def test_torchscript_refused_at_script_time(module):
    with pytest.raises(RuntimeError, match=r"does not support torch.jit.script.*torch.compile"):
        torch.jit.script(module())
