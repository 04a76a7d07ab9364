"""Variable-length sequences in lltm.LLTM, as nn.LSTM runs them: padded input
with lengths=, and PackedSequence in and out (sorted, and unsorted with
enforce_sorted=False). Against a loop of reference cells run per row length
and per direction (tests/lstm_reference.py)."""
import pytest
import torch
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

import lltm
from lstm_reference import reference_lltm

F64 = torch.float64
TOL = dict(rtol=1e-10, atol=1e-12)
LENGTHS = {  # B = 4, T = 7
    "sorted": [7, 5, 5, 2],
    "unsorted": [3, 7, 1, 6],
    "all_T": [7, 7, 7, 7],
    "short_of_T": [4, 2, 4, 1],  # no row reaches T: trailing steps are zeros
    "one_distinct": [3, 3, 3, 3],
}


def make(I, H, bidirectional, **kw):
    return lltm.LLTM(I, H, bidirectional=bidirectional, dtype=F64, **kw)


def state(m, B, requires_grad=False):
    n = m.num_directions * m.num_layers
    return tuple(torch.randn(n, B, m.hidden_size, dtype=F64, requires_grad=requires_grad)
                 for _ in range(2))


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.parametrize("case", sorted(LENGTHS))
@pytest.mark.parametrize("with_state", [False, True])
def test_lengths_match_reference(bidirectional, num_layers, case, with_state):
    T, B, I, H = 7, 4, 3, 5
    m = make(I, H, bidirectional, num_layers=num_layers)
    lengths = LENGTHS[case]
    x = torch.randn(T, B, I, dtype=F64)
    hx = state(m, B) if with_state else None
    out, (h_n, c_n) = m(x, hx, lengths=lengths)
    want = reference_lltm(m, x, *(hx or (None, None)), lengths=lengths)
    for g, w in zip((out, h_n, c_n), want):
        torch.testing.assert_close(g, w, **TOL)
    for b, n in enumerate(lengths):
        assert torch.equal(out[n:, b], torch.zeros_like(out[n:, b]))


@pytest.mark.parametrize("impl", ["reference"])
def test_lengths_other_impls(impl):
    T, B, I, H = 5, 3, 2, 4
    m = make(I, H, True, num_layers=2, impl=impl)
    x = torch.randn(T, B, I, dtype=F64)
    lengths = [2, 5, 3]
    got = m(x, lengths=lengths)
    for g, w in zip((got[0], *got[1]), reference_lltm(m, x, lengths=lengths)):
        torch.testing.assert_close(g, w, **TOL)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_lengths_tensor_batch_first_and_padding_never_read(bidirectional):
    T, B, I, H = 6, 3, 4, 5
    m = make(I, H, bidirectional, num_layers=2, batch_first=True)
    lengths = torch.tensor([4, 6, 1])
    x = torch.randn(B, T, I, dtype=F64)
    want = m(x, lengths=lengths.tolist())
    poisoned = x.clone()
    for b, n in enumerate(lengths.tolist()):
        poisoned[b, n:] = float("nan")
    got = m(poisoned, lengths=lengths)
    assert got[0].shape == (B, T, m.num_directions * H)
    for a, b in zip((got[0], *got[1]), (want[0], *want[1])):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    ref = reference_lltm(m, x.transpose(0, 1), lengths=lengths)
    torch.testing.assert_close(got[0], ref[0].transpose(0, 1), **TOL)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_gradients_zero_beyond_each_row_and_match_reference(bidirectional):
    T, B, I, H = 6, 4, 3, 4
    m = make(I, H, bidirectional, num_layers=2)
    lengths = [2, 6, 3, 5]
    x = torch.randn(T, B, I, dtype=F64, requires_grad=True)
    hx = state(m, B, requires_grad=True)
    got, want = m(x, hx, lengths=lengths), reference_lltm(m, x, *hx, lengths=lengths)
    got = (got[0], *got[1])
    weights = [torch.randn_like(t) for t in want]
    inputs = (x, *hx, *m.parameters())
    g_got = torch.autograd.grad([(g * w).sum() for g, w in zip(got, weights)], inputs)
    g_want = torch.autograd.grad([(g * w).sum() for g, w in zip(want, weights)], inputs)
    for a, b in zip(g_got, g_want):
        torch.testing.assert_close(a, b, **TOL)
    for b, n in enumerate(lengths):
        assert torch.equal(g_got[0][n:, b], torch.zeros_like(g_got[0][n:, b]))
        assert g_got[0][:n, b].abs().min() > 0


@pytest.mark.parametrize("bidirectional", [False, True])
def test_lengths_gradcheck(bidirectional):
    T, B, I, H = 4, 3, 2, 3
    m = make(I, H, bidirectional, num_layers=2)
    names = [n for n, _ in m.named_parameters()]
    lengths = [2, 4, 1]

    def f(x, h0, c0, *p):
        out, (h_n, c_n) = torch.func.functional_call(m, dict(zip(names, p)), (x, (h0, c0)),
                                                     {"lengths": lengths})
        return out, h_n, c_n
    x = torch.randn(T, B, I, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(f, (x, *state(m, B, True), *m.parameters()))


@pytest.mark.parametrize("bidirectional", [False, True])
def test_lengths_compile_fullgraph(bidirectional):
    torch._dynamo.reset()
    T, B, I, H = 5, 3, 4, 6
    m = lltm.LLTM(I, H, num_layers=2, bidirectional=bidirectional)
    x = torch.randn(T, B, I, requires_grad=True)
    lengths = [3, 5, 1]
    compiled = torch.compile(m, fullgraph=True)
    got, want = compiled(x, lengths=lengths), m(x, lengths=lengths)
    for a, b in zip((got[0], *got[1]), (want[0], *want[1])):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    g_got = torch.autograd.grad(got[0].sum() + got[1][1].sum(), (x, *m.parameters()))
    g_want = torch.autograd.grad(want[0].sum() + want[1][1].sum(), (x, *m.parameters()))
    for a, b in zip(g_got, g_want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


# --- PackedSequence -----------------------------------------------------------------

@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("enforce_sorted", [True, False])
@pytest.mark.parametrize("with_state", [False, True])
def test_packed_like_lstm(bidirectional, enforce_sorted, with_state):
    T, B, I, H, L = 7, 4, 3, 5, 2
    lengths = LENGTHS["sorted" if enforce_sorted else "unsorted"]
    m = make(I, H, bidirectional, num_layers=L)
    lstm = torch.nn.LSTM(I, H, num_layers=L, bidirectional=bidirectional, dtype=F64)
    x = torch.randn(T, B, I, dtype=F64)
    hx = state(m, B) if with_state else None
    packed = pack_padded_sequence(x, lengths, enforce_sorted=enforce_sorted)
    out, (h_n, c_n) = m(packed, hx)
    theirs, (h_l, c_l) = lstm(packed, hx)
    assert isinstance(out, PackedSequence)
    assert torch.equal(out.batch_sizes, theirs.batch_sizes)
    for a, b in ((out.sorted_indices, theirs.sorted_indices),
                 (out.unsorted_indices, theirs.unsorted_indices)):
        assert (a is None and b is None) or torch.equal(a, b)
    assert out.data.shape == theirs.data.shape and h_n.shape == h_l.shape
    # values: the reference per row, in the original batch order
    want = reference_lltm(m, x, *(hx or (None, None)), lengths=lengths)
    padded, got_lengths = pad_packed_sequence(out)
    assert got_lengths.tolist() == lengths
    torch.testing.assert_close(padded, want[0][:max(lengths)], **TOL)
    torch.testing.assert_close(h_n, want[1], **TOL)
    torch.testing.assert_close(c_n, want[2], **TOL)
    # the same as padded input with lengths=, to rounding (the per-step
    # products take the rows up to the last one still running, and the
    # packed batch is sorted: their row counts differ)
    via_lengths = m(x, hx, lengths=lengths)
    torch.testing.assert_close(padded, via_lengths[0][:max(lengths)], **TOL)
    torch.testing.assert_close(c_n, via_lengths[1][1], **TOL)


@pytest.mark.parametrize("T,H,num_layers,lengths,enforce_sorted", [
    (4, 3, 2, [4, 2, 1], True),
    (4, 3, 2, [2, 4, 1], False),
    (3, 2, 1, [1 + (7 * b) % 3 for b in range(18)], False),  # more rows than a 16-row chunk
])
def test_packed_gradcheck(T, H, num_layers, lengths, enforce_sorted):
    B, I = len(lengths), 2
    m = make(I, H, True, num_layers=num_layers)
    names = [n for n, _ in m.named_parameters()]

    def f(x, h0, c0, *p):
        packed = pack_padded_sequence(x, lengths, enforce_sorted=enforce_sorted)
        out, (h_n, c_n) = torch.func.functional_call(m, dict(zip(names, p)),
                                                     (packed, (h0, c0)))
        return out.data, h_n, c_n
    x = torch.randn(T, B, I, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(f, (x, *state(m, B, True), *m.parameters()))


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("enforce_sorted", [True, False])
def test_packed_batch_of_several_chunks(bidirectional, enforce_sorted):
    """More rows than one of the kernels' 16-row chunks: outputs, h_n, c_n
    (in the original batch order) and every gradient match the per-row
    reference."""
    T, B, I, H, L = 6, 37, 3, 4, 2
    g = torch.Generator().manual_seed(5)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[7] = T
    if enforce_sorted:
        lengths = lengths.sort(descending=True).values
    lengths = lengths.tolist()
    m = make(I, H, bidirectional, num_layers=L)
    x = torch.randn(T, B, I, dtype=F64, generator=g, requires_grad=True)
    hx = tuple(t.requires_grad_() for t in state(m, B))
    packed = pack_padded_sequence(x, lengths, enforce_sorted=enforce_sorted)
    out, (h_n, c_n) = m(packed, hx)
    padded, _ = pad_packed_sequence(out, total_length=T)
    want = reference_lltm(m, x, *hx, lengths=lengths)
    torch.testing.assert_close(padded, want[0], **TOL)
    torch.testing.assert_close(h_n, want[1], **TOL)
    torch.testing.assert_close(c_n, want[2], **TOL)
    weights = torch.randn(padded.shape, dtype=F64, generator=g)
    leaves = (x, *hx, *m.parameters())
    got = torch.autograd.grad((padded * weights).sum() + h_n.sum() + (c_n * c_n).sum(), leaves)
    expected = torch.autograd.grad((want[0] * weights).sum() + want[1].sum()
                                   + (want[2] * want[2]).sum(), leaves)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, **TOL)


def test_packed_batch_first_is_ignored_like_lstm():
    m = make(3, 4, True, batch_first=True)
    m2 = make(3, 4, True)
    m2.load_state_dict(m.state_dict())
    packed = pack_padded_sequence(torch.randn(5, 3, 3, dtype=F64), [5, 3, 2])
    torch.testing.assert_close(m(packed)[0].data, m2(packed)[0].data, rtol=0, atol=0)


def test_empty_batch_with_lengths():
    m = make(3, 4, True)
    out, (h_n, c_n) = m(torch.randn(5, 0, 3, dtype=F64), lengths=[])
    assert out.shape == (5, 0, 8) and h_n.shape == (2, 0, 4)


# --- bad inputs -----------------------------------------------------------------------

@pytest.mark.parametrize("lengths,error,pattern", [
    ([5, 8, 2], ValueError, r"LLTM: lengths\[1\] = 8; every length must be in \[1, T\] with "
                            r"T = 7"),
    ([5, 0, 2], ValueError, r"lengths\[1\] = 0; every length must be in \[1, T\]"),
    ([5, -1, 2], ValueError, r"lengths\[1\] = -1"),
    ([5, 2], ValueError, r"LLTM: lengths has 2 entries, expected one per batch row \(B = 3\)"),
    (torch.tensor([5, 2, 1, 1]), ValueError, r"lengths has 4 entries.*B = 3"),
    (torch.tensor([5.0, 2.0, 1.0]), ValueError, r"lengths must be a 1-D integer tensor.*float"),
    (torch.tensor([[5, 2, 1]]), ValueError, r"lengths must be a 1-D integer tensor.*\[1, 3\]"),
    ([5, 2.0, 1], TypeError, r"LLTM: lengths must hold ints, got float 2.0"),
    ([5, True, 1], TypeError, r"lengths must hold ints, got bool"),
    (5, TypeError, r"lengths must be a 1-D integer tensor or a list of ints, got int"),
])
def test_bad_lengths(lengths, error, pattern):
    m = lltm.LLTM(2, 3)
    with pytest.raises(error, match=pattern):
        m(torch.randn(7, 3, 2), lengths=lengths)


def test_lengths_refused_where_meaningless():
    m = lltm.LLTM(2, 3)
    with pytest.raises(ValueError, match=r"lengths needs batched input"):
        m(torch.randn(7, 2), lengths=[7])
    packed = pack_padded_sequence(torch.randn(4, 2, 2), [4, 3])
    with pytest.raises(ValueError, match=r"lengths is for padded input; a PackedSequence"):
        m(packed, lengths=[4, 3])
    with pytest.raises(ValueError, match=r"input has 5 features.*input_size=2"):
        m(pack_padded_sequence(torch.randn(4, 2, 5), [4, 3]))
    with pytest.raises(ValueError, match=r"h0 must have shape \[1, 2, 3\]"):
        m(packed, (torch.zeros(1, 3, 3), torch.zeros(1, 3, 3)))


def test_unsorted_packing_needs_enforce_sorted_false():
    """pack_padded_sequence's own check; both packings then run."""
    x = torch.randn(4, 2, 2)
    with pytest.raises(RuntimeError, match="sorted in decreasing order"):
        pack_padded_sequence(x, [3, 4])
    m = lltm.LLTM(2, 3, bidirectional=True)
    a = m(pack_padded_sequence(x, [3, 4], enforce_sorted=False))
    b = m(pack_padded_sequence(x.flip(1), [4, 3]))
    torch.testing.assert_close(a[1][1], b[1][1].flip(1), rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["packed", "tensor_lengths"])
def test_compile_with_lengths_read_from_tensors(kind):
    """A PackedSequence's batch_sizes and a lengths tensor are read on the
    host (their values shape the calls): torch.compile breaks the graph there
    (fullgraph=True refuses them; a list of ints compiles in one graph)."""
    torch._dynamo.reset()
    m = lltm.LLTM(3, 4, num_layers=2, bidirectional=True)
    x = torch.randn(5, 3, 3)
    compiled = torch.compile(m)
    if kind == "packed":
        packed = pack_padded_sequence(x, [2, 5, 3], enforce_sorted=False)
        got, want = compiled(packed), m(packed)
        got, want = (got[0].data, *got[1]), (want[0].data, *want[1])
    else:
        lengths = torch.tensor([2, 5, 3])
        got, want = compiled(x, lengths=lengths), m(x, lengths=lengths)
        got, want = (got[0], *got[1]), (want[0], *want[1])
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_bidirectional_lengths_gradgradcheck():
    T, B, I, H = 3, 2, 2, 2
    m = make(I, H, True)
    lengths = [1, 3]

    def f(x, h0, c0):
        out, (h_n, c_n) = m(x, (h0, c0), lengths=lengths)
        return out, c_n
    x = torch.randn(T, B, I, dtype=F64, requires_grad=True)
    assert torch.autograd.gradgradcheck(f, (x, *state(m, B, True)))


def test_packed_gradgradcheck():
    """A PackedSequence's rows move to the kernels' layout and back by
    gathers whose gradients are gathers again: second derivatives through
    them, with the state reordered (enforce_sorted=False)."""
    T, I, H = 3, 2, 2
    lengths = [2, 3, 1]
    m = make(I, H, False)

    def f(x, h0, c0):
        packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
        out, (h_n, c_n) = m(packed, (h0, c0))
        return out.data, h_n, c_n
    x = torch.randn(T, len(lengths), I, dtype=F64, requires_grad=True)
    assert torch.autograd.gradgradcheck(f, (x, *state(m, len(lengths), True)))


def test_packed_under_torch_func_vjp_and_jacrev():
    """torch.func's vjp and jacrev through a packed call (state reordered,
    enforce_sorted=False) give autograd's gradients: the moves of the packed
    layout work under functorch transforms."""
    T, I, H = 4, 2, 3
    lengths = [4, 2, 3]
    m = make(I, H, False)
    h0, c0 = state(m, len(lengths))
    x = torch.randn(T, len(lengths), I, dtype=F64)

    def f(x):
        out, (h_n, c_n) = m(pack_padded_sequence(x, lengths, enforce_sorted=False), (h0, c0))
        return (out.data * torch.arange(out.data.numel(), dtype=F64).view_as(out.data)).sum() \
            + (h_n * c_n).sum()
    leaf = x.clone().requires_grad_()
    want, = torch.autograd.grad(f(leaf), leaf)
    got = torch.func.vjp(f, x)[1](torch.tensor(1.0, dtype=F64))[0]
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(torch.func.jacrev(f)(x), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("states", [0, 1, 2], ids=["rows", "states_1_layer", "states_2_layers"])
@pytest.mark.parametrize("move", ["to_padded", "to_packed"])
def test_packed_moves_match_index_select(move, states):
    """Each move of rows (with the states' rows reordered in the same node,
    where asked) and every gradient equal index_select's (whose gradient is
    a scatter-add), on a layout with rows of unequal lengths."""
    from lltm import _packed
    batch_sizes = torch.tensor([4, 3, 3, 1])
    positions, sources, lengths = _packed.layout(batch_sizes)
    assert lengths.tolist() == [4, 3, 3, 1]
    T, B, N = 4, 4, int(batch_sizes.sum())
    order = torch.tensor([2, 0, 3, 1])
    h, c = (torch.randn(states or 1, B, 5, dtype=F64, requires_grad=True) for _ in range(2))
    moved = (h, c) if states else ()
    if move == "to_padded":
        src = torch.randn(N, 3, dtype=F64, requires_grad=True)
        got = _packed.to_padded(src, positions, sources, T, B, moved, order,
                                torch.argsort(order))
        want = src.new_zeros(T * B, 3).index_copy(0, positions, src).view(T, B, 3)
    else:
        src = torch.randn(T, B, 3, dtype=F64, requires_grad=True)
        got = _packed.to_packed(src, positions, sources, moved, order, torch.argsort(order))
        want = src.reshape(T * B, 3).index_select(0, positions)
    wants = (want, *(s.index_select(1, order) for s in moved))
    assert len(got) == len(wants)
    for g, w in zip(got, wants):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    grads = [torch.randn_like(w) for w in wants]
    inputs = (src, *moved)
    for g, w in zip(torch.autograd.grad(got, inputs, grads),
                    torch.autograd.grad(wants, inputs, grads)):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
