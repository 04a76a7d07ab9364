"""Per-row lengths inside the CUDA sequence kernels (lltm::sequence_forward.lengths,
lltm.LLTM with lengths= and PackedSequence), every plan family forced with
lltm.overrides.sequence_plan, against the float64 loop of reference cells
run row by row on the CPU. Skipped without a GPU (the emulated kernels:
tests/test_cuda_sequence_emulated.py)."""
import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence

import lltm
from conftest import assert_close
from test_cuda_sequence import ROUTES, pytestmark, route, route_fits, seq_inputs  # noqa: F401
from test_sequence_lengths import per_row_reference

SHAPES = [(6, 5, 3, 7), (5, 19, 4, 128), (4, 3, 0, 33), (3, 40, 9, 129), (2, 4, 8, 1000)]


def random_lengths(T, B, seed=0, longest_first=False):
    """Lengths in [1, T], T and 1 among them; longest_first: sorted as a
    packed batch's are (whole chunks of rows then stop while others run)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    if longest_first:
        lengths = torch.sort(lengths, descending=True).values
    lengths[0] = T
    lengths[-1] = 1
    return lengths


@pytest.mark.parametrize("route", ROUTES, indirect=True)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16],
                         ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("T,B,I,H", SHAPES)
@pytest.mark.parametrize("order", ["random", "longest-first"])
def test_lengths_match_per_row_reference(route, dtype, T, B, I, H, order):
    if not route_fits(route, H, dtype) or (route.startswith("cluster") and B > 32
                                           and dtype == torch.float64):
        pytest.skip("no plan of this family for these sizes")
    args, ref_args = seq_inputs(T, B, I, H, dtype)
    lengths = random_lengths(T, B, longest_first=order == "longest-first")
    nat = [a.clone().requires_grad_() for a in args]
    ref = [a.clone().requires_grad_() for a in ref_args]
    out, (h_n, c_n) = lltm.functional.lltm_sequence(*nat, lengths=lengths.cuda())
    want = per_row_reference(*ref, lengths)
    for name, n, r in zip(["output", "h_n", "c_n"], (out, h_n, c_n), want):
        assert_close(name, n, r, dtype)
    for b, n in enumerate(lengths.tolist()):
        assert torch.equal(out[n:, b].cpu(), torch.zeros_like(out[n:, b].cpu()))
    ups = [torch.randn_like(w) for w in want]
    torch.autograd.backward([out, h_n, c_n], [u.to(dtype).cuda() for u in ups])
    torch.autograd.backward(list(want), ups)
    for name, n, r in zip(["input", "weights", "bias", "h0", "c0"], nat, ref):
        assert_close(f"grad of {name}", n.grad, r.grad, dtype)


@pytest.mark.parametrize("route", ["cluster16", "grid", "block", "steps"], indirect=True)
def test_lengths_gradcheck_float64(route):
    args, _ = seq_inputs(4, 3, 2, 5, torch.float64)
    args = [a.requires_grad_() for a in args]
    lengths = torch.tensor([2, 4, 1], device="cuda")

    def fn(*a):
        out, (h_n, c_n) = lltm.functional.lltm_sequence(*a, lengths=lengths)
        return out, h_n, c_n
    assert torch.autograd.gradcheck(fn, args)


def test_lengths_opcheck():
    args, _ = seq_inputs(3, 4, 5, 7, torch.float32)
    lengths = torch.tensor([3, 1, 2, 3], device="cuda")
    torch.library.opcheck(torch.ops.lltm.sequence_forward.lengths,
                          (*[a.requires_grad_() for a in args], lengths))


def test_lengths_on_another_device_rejected():
    args, _ = seq_inputs(3, 2, 5, 7, torch.float32)
    with pytest.raises(RuntimeError, match="lengths"):
        torch.ops.lltm.sequence_forward.lengths(*args, torch.tensor([3, 1]))


@pytest.mark.parametrize("bidirectional", [False, True])
def test_packed_module_matches_cpu_and_graph_captures(bidirectional):
    """lltm.LLTM on a PackedSequence on CUDA: one call per layer and
    direction, equal to the CPU module; its step captures into a CUDA graph
    (the index tensors are made once per batch_sizes)."""
    T, B, I, H = 9, 6, 4, 16
    m = lltm.LLTM(I, H, num_layers=2, bidirectional=bidirectional)
    x = torch.randn(T, B, I)
    lengths = [9, 3, 7, 1, 9, 5]
    want = m(pack_padded_sequence(x, lengths, enforce_sorted=False))
    mc = m.cuda()
    packed = pack_padded_sequence(x.cuda(), lengths, enforce_sorted=False)
    got = mc(packed)
    torch.testing.assert_close(got[0].data.cpu(), want[0].data, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got[1][0].cpu(), want[1][0], rtol=1e-4, atol=1e-5)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        mc(packed)
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        captured = mc(packed)
    graph.replay()
    torch.cuda.synchronize()
    first = captured[0].data.clone()
    graph.replay()
    assert torch.equal(captured[0].data, first)  # replays repeat exactly
    # captured, the small products run through cuBLAS, eager on the library's
    # kernel (lltm.h, "Matrix products"): equal up to rounding
    torch.testing.assert_close(captured[0].data, got[0].data, rtol=1e-5, atol=1e-6)
