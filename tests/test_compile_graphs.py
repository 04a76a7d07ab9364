"""What torch.compile makes of the lltm operators: the forward and backward
graphs hold the autograd-free twins (lltm::_cell_forward, ...), so running a
compiled graph enters no Python between the kernels, and nothing else is
inserted around them (no copies, no clones); compiled results equal eager
ones; the twins themselves compute what the public operators compute."""
import pytest
import torch
import torch._dynamo
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd

import lltm
from conftest import cell_inputs

def _capturing_backend(graphs):
    def keep(kind):
        def compiler(gm, example_inputs):
            graphs.append((kind, gm))
            return make_boxed_func(gm.forward)
        return compiler
    return aot_autograd(fw_compiler=keep("forward"), bw_compiler=keep("backward"))


def _lltm_ops(gm):
    """(name, overload) of every lltm operator the graph calls, in order."""
    return [(n.target._opname, n.target._overloadname) for n in gm.graph.nodes
            if n.op == "call_function" and getattr(n.target, "namespace", None) == "lltm"]


def _aten_ops(gm):
    return {n.target._opname for n in gm.graph.nodes
            if n.op == "call_function" and getattr(n.target, "namespace", None) == "aten"}


class TwoCellSteps(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = lltm.LLTMCell(5, 7, dtype=torch.float64)
        self.head = torch.nn.Linear(7, 3, dtype=torch.float64)

    def forward(self, xs, h, c):
        for x in xs:
            h, c = self.cell(x, (h, c))
        return self.head(h).sum()


def test_cell_graphs_hold_the_twins_and_nothing_around_them():
    torch._dynamo.reset()
    model = TwoCellSteps()
    xs = torch.randn(2, 4, 5, dtype=torch.float64)
    h, c = torch.randn(4, 7, dtype=torch.float64), torch.randn(4, 7, dtype=torch.float64)
    graphs = []
    compiled = torch.compile(model, backend=_capturing_backend(graphs), fullgraph=True)
    compiled(xs, h, c).backward()
    kinds = {kind: gm for kind, gm in graphs}
    assert set(kinds) == {"forward", "backward"}
    assert _lltm_ops(kinds["forward"]) == [("_cell_forward", "default")] * 2
    assert _lltm_ops(kinds["backward"]) == [("_cell_backward", "default")] * 2
    for kind, gm in graphs:
        extra = _aten_ops(gm) & {"clone", "copy", "copy_", "_to_copy", "contiguous"}
        assert not extra, f"{kind} graph copies around the operators: {extra}"


@pytest.mark.parametrize("lengths", [None, [3, 1, 2]], ids=["all", "lengths"])
def test_sequence_graphs_hold_the_twins(lengths):
    torch._dynamo.reset()
    x, W, b, h0, c0 = cell_inputs(3, 5, 7, requires_grad=True)
    xs = torch.randn(3, 3, 5, dtype=torch.float64, requires_grad=True)
    lt = None if lengths is None else torch.tensor(lengths)

    def f(xs, W, b, h0, c0, lt):
        out, (h_n, c_n) = lltm.functional.lltm_sequence(xs, W, b, h0, c0, lengths=lt)
        return out.sum() + (h_n * c_n).sum()

    graphs = []
    torch.compile(f, backend=_capturing_backend(graphs), fullgraph=True)(
        xs, W, b, h0, c0, lt).backward()
    overload = "default" if lengths is None else "lengths"
    kinds = {kind: gm for kind, gm in graphs}
    assert _lltm_ops(kinds["forward"]) == [("_sequence_forward", overload)]
    assert _lltm_ops(kinds["backward"]) == [("_sequence_backward", overload)]


def test_inference_graph_holds_the_twin():
    torch._dynamo.reset()
    x, W, b, h, c = cell_inputs(3, 5, 7)
    graphs = []
    with torch.no_grad():
        torch.compile(lambda *a: torch.ops.lltm.cell_forward(*a),
                      backend=_capturing_backend(graphs), fullgraph=True)(x, W, b, h, c)
    assert [(_lltm_ops(gm)) for _, gm in graphs] == [[("_cell_forward", "default")]]


@pytest.mark.parametrize("mode", [None, "reduce-overhead"], ids=["default", "reduce-overhead"])
def test_compiled_training_steps_match_eager(mode):
    """Three SGD steps of a model stepping the cell 3 times, compiled with
    inductor, against the same steps eager (float32 on the CPU)."""
    torch._dynamo.reset()

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.cell = lltm.LLTMCell(6, 9)
            self.head = torch.nn.Linear(9, 4)

        def forward(self, xs, h, c, target):
            for x in xs:
                h, c = self.cell(x, (h, c))
            return torch.nn.functional.cross_entropy(self.head(h), target)

    xs, h, c = torch.randn(3, 5, 6), torch.randn(5, 9), torch.randn(5, 9)
    target = torch.randint(0, 4, (5,))
    results = []
    for compiled in (False, True):
        model = Model()
        run = torch.compile(model, mode=mode) if compiled else model
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        losses = []
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            loss = run(xs, h, c, target)
            loss.backward()
            opt.step()
            losses.append(loss.detach().clone())
        results.append((losses, [p.detach().clone() for p in model.parameters()]))
    (eager_losses, eager_params), (losses, params) = results
    for got, want in zip(losses + params, eager_losses + eager_params):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_twins_compute_what_the_public_operators_compute():
    x, W, b, h, c = cell_inputs(3, 5, 7)
    public = torch.ops.lltm.cell_forward(x, W, b, h, c)
    twin = torch.ops.lltm._cell_forward(x, W, b, h, c)
    for p, t in zip(public, twin):
        assert torch.equal(p, t)
    gh, gc = torch.randn(3, 7, dtype=torch.float64), torch.randn(3, 7, dtype=torch.float64)
    args = (gh, gc, public[1], public[2], x, h, W, [True, False, True, False, True])
    for p, t in zip(torch.ops.lltm.cell_backward(*args), torch.ops.lltm._cell_backward(*args)):
        assert (p is None and t is None) or torch.equal(p, t)


def test_public_operator_without_gradients_tracks_none_and_with_them_does():
    x, W, b, h, c = cell_inputs(3, 5, 7)
    out = torch.ops.lltm.cell_forward(x, W, b, h, c)
    assert all(o.grad_fn is None and not o.requires_grad for o in out)
    W.requires_grad_()
    new_h, new_cell, gates = torch.ops.lltm.cell_forward(x, W, b, h, c)
    assert new_h.requires_grad and new_cell.requires_grad and not gates.requires_grad
    (gw,) = torch.autograd.grad(new_h.sum() + new_cell.sum(), W)
    want = torch.autograd.grad(sum(o.sum() for o in lltm.reference.lltm_cell(x, W, b, h, c)), W)
    torch.testing.assert_close(gw, want[0])


def test_opcheck_of_the_twins():
    """Schemas, fake kernels and AOT tracing of the twins (their inputs need
    no gradient: they have no autograd kernel)."""
    x, W, b, h, c = args = cell_inputs(3, 5, 7)
    torch.library.opcheck(torch.ops.lltm._cell_forward.default, args)
    new_h, new_cell, gates = torch.ops.lltm.cell_forward(*args)
    grads = (torch.randn_like(new_h), torch.randn_like(new_h))
    for mask in ([True] * 5, [False, True, True, False, True]):
        torch.library.opcheck(torch.ops.lltm._cell_backward.default,
                              (*grads, new_cell, gates, x, h, W, mask))
    xs = torch.randn(4, 3, 5, dtype=torch.float64)
    seq = (xs, W, b, h, c)
    torch.library.opcheck(torch.ops.lltm._sequence_forward.default, seq)
    lengths = torch.tensor([4, 1, 3])
    torch.library.opcheck(torch.ops.lltm._sequence_forward.lengths, (*seq, lengths))
    out, h_n, c_n, cells, gates = torch.ops.lltm.sequence_forward(*seq)
    g = (torch.randn_like(out), torch.randn_like(h_n), torch.randn_like(c_n))
    torch.library.opcheck(torch.ops.lltm._sequence_backward.default,
                          (*g, xs, W, h, out, cells, gates, [True] * 5))
