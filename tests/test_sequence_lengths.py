"""Per-row lengths inside the sequence operator (lltm::sequence_forward.lengths
and sequence_backward.lengths; lltm.functional.lltm_sequence(lengths=)): each
row stops at its own length in the kernels. Against a loop of reference
cells run row by row over each row's own length, on the CPU (the CUDA
families: tests/test_cuda_sequence_emulated.py without a GPU,
tests/test_cuda_sequence.py on one)."""
import itertools

import pytest
import torch

import lltm
from lltm import functional, reference

F64 = torch.float64


def inputs(T, B, I, H, dtype=F64, device="cpu", requires_grad=False, seed=0):
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0):
        t = (torch.randn(*shape, generator=g, dtype=F64) * scale).to(dtype).to(device)
        return t.requires_grad_(requires_grad)
    return (rand(T, B, I), rand(3 * H, I + H, scale=(I + H) ** -0.5), rand(3 * H),
            rand(B, H), rand(B, H))


def per_row_reference(x, W, b, h0, c0, lengths):
    """(output [T,B,H] zero beyond each row's length, h_n, c_n): each row a
    loop of reference cells over its own first lengths[b] steps."""
    T, B = x.shape[:2]
    outs, hs, cs = [], [], []
    for r in range(B):
        h, c = h0[r:r + 1], c0[r:r + 1]
        steps = []
        for t in range(int(lengths[r])):
            h, c = reference.lltm_cell(x[t, r:r + 1], W, b, h, c)
            steps.append(h[0])
        steps += [torch.zeros_like(h[0])] * (T - len(steps))
        outs.append(torch.stack(steps))
        hs.append(h[0])
        cs.append(c[0])
    return torch.stack(outs, 1), torch.stack(hs), torch.stack(cs)


LENGTHS = {  # B = 5, T = 6
    "mixed": [6, 3, 1, 5, 3],
    "sorted": [6, 5, 5, 2, 1],
    "none_reach_T": [4, 2, 4, 1, 3],  # the kernels still run T steps: all rows stopped at the end
    "all_T": [6, 6, 6, 6, 6],
}


@pytest.mark.parametrize("case", sorted(LENGTHS))
@pytest.mark.parametrize("dtype", [F64, torch.float32])
def test_forward_and_gradients_match_per_row_reference(case, dtype):
    T, B, I, H = 6, 5, 3, 7
    args = inputs(T, B, I, H, dtype, requires_grad=True)
    lengths = torch.tensor(LENGTHS[case])
    out, (h_n, c_n) = functional.lltm_sequence(*args, lengths=lengths)
    want = per_row_reference(*args, lengths)
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == F64 else dict(rtol=1e-4, atol=1e-5)
    for got, w in zip((out, h_n, c_n), want):
        torch.testing.assert_close(got, w, **tol)
    for r, n in enumerate(LENGTHS[case]):
        assert torch.equal(out[n:, r], torch.zeros_like(out[n:, r]))
    grads_out = [torch.randn_like(t) for t in (out, h_n, c_n)]
    got = torch.autograd.grad((out, h_n, c_n), args, grads_out)
    expected = torch.autograd.grad(want, args, grads_out)
    for name, g, w in zip(("input", "weights", "bias", "h0", "c0"), got, expected):
        torch.testing.assert_close(g, w, **tol, msg=name)
    beyond = got[0][LENGTHS[case][2]:, 2]  # the input's gradient past row 2's end
    assert torch.equal(beyond, torch.zeros_like(beyond))


def test_rows_are_independent_and_padding_never_read():
    T, B, I, H = 5, 4, 3, 6
    x, W, b, h0, c0 = inputs(T, B, I, H)
    lengths = torch.tensor([2, 5, 1, 4])
    want = functional.lltm_sequence(x, W, b, h0, c0, lengths=lengths)
    poisoned = x.clone()
    for r, n in enumerate(lengths.tolist()):
        poisoned[n:, r] = float("nan")
    got = functional.lltm_sequence(poisoned, W, b, h0, c0, lengths=lengths)
    for g, w in zip((got[0], *got[1]), (want[0], *want[1])):
        assert torch.equal(g, w)
    # one row alone gives the same row
    alone = functional.lltm_sequence(x[:4, 3:4], W, b, h0[3:4], c0[3:4])
    torch.testing.assert_close(got[0][:4, 3:4], alone[0], rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(got[1][0][3:4], alone[1][0], rtol=1e-12, atol=1e-14)


def test_all_lengths_T_equals_the_plain_operator():
    args = inputs(4, 3, 2, 5)
    with_lengths = torch.ops.lltm.sequence_forward.lengths(*args, torch.tensor([4, 4, 4]))
    plain = torch.ops.lltm.sequence_forward.default(*args)
    for a, p in zip(with_lengths, plain):
        assert torch.equal(a, p)


@pytest.mark.parametrize("T,B,I,H", [(1, 1, 1, 1), (7, 3, 0, 5), (5, 17, 33, 31)])
def test_odd_sizes(T, B, I, H):
    args = inputs(T, B, I, H)
    lengths = torch.randint(1, T + 1, (B,), generator=torch.Generator().manual_seed(1))
    out, (h_n, c_n) = functional.lltm_sequence(*args, lengths=lengths)
    for got, w in zip((out, h_n, c_n), per_row_reference(*args, lengths)):
        torch.testing.assert_close(got, w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_types(dtype):
    T, B, I, H = 5, 4, 3, 8
    args = inputs(T, B, I, H, dtype)
    lengths = torch.tensor([5, 2, 3, 1])
    got = functional.lltm_sequence(*args, lengths=lengths)
    want = per_row_reference(*(a.double() for a in args), lengths)
    for g, w in zip((got[0], *got[1]), want):
        torch.testing.assert_close(g.double(), w, rtol=3e-2, atol=3e-2)


def test_gradcheck_and_gradgradcheck():
    T, B, I, H = 4, 3, 2, 3
    args = inputs(T, B, I, H, requires_grad=True)
    lengths = torch.tensor([2, 4, 1])

    def fn(*a):
        out, (h_n, c_n) = functional.lltm_sequence(*a, lengths=lengths)
        return out, h_n, c_n
    assert torch.autograd.gradcheck(fn, args)
    assert torch.autograd.gradgradcheck(fn, args)


def test_opcheck():
    T, B, I, H = 4, 3, 2, 5
    args = inputs(T, B, I, H, requires_grad=True)
    lengths = torch.tensor([3, 4, 1])
    torch.library.opcheck(torch.ops.lltm.sequence_forward.lengths, (*args, lengths))
    with torch.no_grad():
        out, h_n, c_n, cells, gates = torch.ops.lltm.sequence_forward.lengths(*args, lengths)
    grads = [torch.randn_like(t) for t in (out, h_n, c_n)]
    x, W, _, h0, _ = args
    torch.library.opcheck(torch.ops.lltm.sequence_backward.lengths,
                          (*grads, x.detach(), W.detach(), h0.detach(), out, cells, gates,
                           lengths))


def test_compile_fullgraph():
    T, B, I, H = 5, 3, 2, 4
    args = inputs(T, B, I, H, requires_grad=True)
    lengths = torch.tensor([5, 2, 3])

    def fn(x, W, b, h0, c0, lengths):
        out, (h_n, c_n) = functional.lltm_sequence(x, W, b, h0, c0, lengths=lengths)
        return (out * out).sum() + h_n.sum() + (c_n * 2).sum()
    eager = fn(*args, lengths)
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True)(*args, lengths)
    torch.testing.assert_close(compiled, eager)
    got = torch.autograd.grad(compiled, args)
    want = torch.autograd.grad(eager, args)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def test_vmap_folds_into_the_batch():
    T, B, I, H, N = 4, 3, 2, 5, 2
    x = torch.randn(N, T, B, I, dtype=F64)
    _, W, b, h0, c0 = inputs(T, B, I, H)
    lengths = torch.tensor([[4, 1, 2], [3, 3, 4]])
    got = torch.vmap(lambda xx, ll: functional.lltm_sequence(xx, W, b, h0, c0, lengths=ll))(
        x, lengths)
    for n in range(N):
        want = functional.lltm_sequence(x[n], W, b, h0, c0, lengths=lengths[n])
        torch.testing.assert_close(got[0][n], want[0])
        torch.testing.assert_close(got[1][0][n], want[1][0])


def test_autocast_bfloat16():
    args = inputs(4, 3, 2, 5, torch.float32)
    lengths = torch.tensor([4, 2, 1])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = functional.lltm_sequence(*args, lengths=lengths)
    assert out.dtype == torch.bfloat16
    want = per_row_reference(*(a.double() for a in args), lengths)[0]
    torch.testing.assert_close(out.double(), want, rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("lengths,pattern", [
    (torch.tensor([3, 0, 2]), r"lengths\[1\] = 0"),
    (torch.tensor([3, 5, 2]), r"lengths\[1\] = 5"),
    (torch.tensor([-1, 2, 2]), r"lengths\[0\] = -1"),
    (torch.tensor([3, 2]), r"shape \[3\]"),
    (torch.tensor([[3, 2, 1]]), r"shape \[3\]"),
    (torch.tensor([3.0, 2.0, 1.0]), r"int64"),
    (torch.tensor([3, 2, 1], dtype=torch.int32), r"int64"),
])
def test_bad_lengths_rejected(lengths, pattern):
    args = inputs(4, 3, 2, 5)
    with pytest.raises(RuntimeError, match=pattern):
        torch.ops.lltm.sequence_forward.lengths(*args, lengths)
    with torch.no_grad():
        out, h_n, c_n, cells, gates = torch.ops.lltm.sequence_forward.default(*args)
    x, W, _, h0, _ = args
    with pytest.raises(RuntimeError, match=pattern):
        torch.ops.lltm.sequence_backward.lengths(out, h_n, c_n, x, W, h0, out, cells, gates,
                                                 lengths)


def test_bad_lengths_list_rejected_by_functional():
    args = inputs(4, 3, 2, 5)
    with pytest.raises(RuntimeError, match=r"lengths\[2\] = 7; every length must be in \[1, T\]"):
        functional.lltm_sequence(*args, lengths=[1, 2, 7])


def test_module_makes_one_call_per_layer_and_direction():
    """A batch of 64 distinct lengths is one operator call
    per layer and direction, not one per distinct length (both forms of a
    bidirectional layer: one autograd node a layer, and one per operator)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from lltm import _directions

    class Calls(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.namespace == "lltm":
                self.ops.append(func)
            return func(*args, **(kwargs or {}))
    T, B, I, H = 70, 64, 3, 4
    m = lltm.LLTM(I, H, num_layers=2, bidirectional=True, dtype=F64)
    x = torch.randn(T, B, I, dtype=F64)
    for fused in (True, False):
        saved = _directions.fused
        if not fused:
            _directions.fused = lambda x: False
        try:
            with Calls() as calls:
                m(x, lengths=list(range(T, T - B, -1)))
        finally:
            _directions.fused = saved
        # the public operator or its autograd-free twin (lltm/_ops.py)
        names = [(f.__name__.split(".")[0].lstrip("_"), f._overloadname) for f in calls.ops]
        assert names == [("sequence_forward", "lengths")] * 4, (fused, calls.ops)


def test_output_mask_with_lengths():
    """The lengths overload's backward computes only the gradients asked
    for; each one bitwise equal to the full backward's."""
    args = inputs(5, 4, 3, 6)
    lengths = torch.tensor([5, 2, 1, 3])
    out, h_n, c_n, cells, gates = torch.ops.lltm.sequence_forward.lengths(*args, lengths)
    grads = [torch.randn_like(t) for t in (out, h_n, c_n)]
    x, W, _, h0, _ = args
    saved = (x, W, h0, out, cells, gates, lengths)
    full = torch.ops.lltm.sequence_backward.lengths(*grads, *saved)
    for mask in itertools.product([False, True], repeat=5):
        got = torch.ops.lltm.sequence_backward.lengths(*grads, *saved, list(mask))
        for g, f, wanted in zip(got, full, mask):
            assert (g is None) if not wanted else torch.equal(g, f), mask


def test_forward_mode_jvp():
    """Tangents through the lengths overload (dual tensors: the Function's
    jvp; torch.func.jvp: the forward in plain operations) against the
    per-row reference's."""
    import torch.autograd.forward_ad as fwAD
    T, B, I, H = 4, 3, 2, 5
    args = inputs(T, B, I, H)
    tangents = inputs(T, B, I, H, seed=1)
    lengths = torch.tensor([4, 1, 3])

    def fn(*a):
        out, (h_n, c_n) = functional.lltm_sequence(*a, lengths=lengths)
        return out, h_n, c_n
    _, want = torch.func.jvp(lambda *a: per_row_reference(*a, lengths), args, tangents)
    _, got = torch.func.jvp(fn, args, tangents)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)
    with fwAD.dual_level():
        duals = [fwAD.make_dual(a, t) for a, t in zip(args, tangents)]
        got = [fwAD.unpack_dual(o).tangent for o in fn(*duals)]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)
