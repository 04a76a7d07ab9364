"""lltm.LLTM and lltm.LLTMCell as drop-ins for torch.nn.LSTM / nn.LSTMCell:
keywords, shapes, repr, refused options."""
import pytest
import torch

import lltm
from lltm import reference

F64 = torch.float64


def seeded():
    torch.manual_seed(torch.randint(2**31 - 1, ()).item())


# --- keywords ---------------------------------------------------------------------

def test_hx_keyword_and_state_alias_agree():
    seeded()
    m = lltm.LLTM(3, 5, num_layers=2, dtype=F64)
    x = torch.randn(4, 2, 3, dtype=F64)
    hx = (torch.randn(2, 2, 5, dtype=F64), torch.randn(2, 2, 5, dtype=F64))
    a, b, c = m(x, hx), m(x, hx=hx), m(x, state=hx)
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(a, c)
    with pytest.raises(TypeError, match=r"LLTM.forward: got both hx and state"):
        m(x, hx, state=hx)


def test_cell_hx_keyword_and_state_alias_agree():
    seeded()
    cell = lltm.LLTMCell(3, 5, dtype=F64)
    x = torch.randn(2, 3, dtype=F64)
    hx = (torch.randn(2, 5, dtype=F64), torch.randn(2, 5, dtype=F64))
    torch.testing.assert_close(cell(x, hx), cell(x, hx=hx))
    torch.testing.assert_close(cell(x, hx), cell(x, state=hx))
    with pytest.raises(TypeError, match=r"LLTMCell.forward: got both hx and state"):
        cell(x, hx=hx, state=hx)


# --- unbatched cell ---------------------------------------------------------------

@pytest.mark.parametrize("impl", ["native", "reference", "reference_function"])
@pytest.mark.parametrize("with_state", [False, True])
def test_cell_unbatched_matches_batched_row(impl, with_state):
    seeded()
    cell = lltm.LLTMCell(7, 5, impl=impl, dtype=F64)
    x = torch.randn(7, dtype=F64)
    h, c = torch.randn(5, dtype=F64), torch.randn(5, dtype=F64)
    hx = (h, c) if with_state else None
    got = cell(x, hx)
    assert [tuple(t.shape) for t in got] == [(5,), (5,)]
    if not with_state:
        h, c = torch.zeros(5, dtype=F64), torch.zeros(5, dtype=F64)
    want = reference.lltm_cell(x[None], cell.weights, cell.bias, h[None], c[None])
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w[0])


def test_cell_unbatched_gradcheck():
    seeded()
    cell = lltm.LLTMCell(3, 4, dtype=F64)
    x, h, c = (torch.randn(n, dtype=F64, requires_grad=True) for n in (3, 4, 4))
    torch.autograd.gradcheck(lambda x, h, c: cell(x, (h, c)), (x, h, c))


def test_cell_unbatched_like_lstm_cell_shapes():
    seeded()
    ours, theirs = lltm.LLTMCell(3, 4), torch.nn.LSTMCell(3, 4)
    x = torch.randn(3)
    assert [t.shape for t in ours(x)] == [t.shape for t in theirs(x)]
    hx = (torch.randn(4), torch.randn(4))
    assert [t.shape for t in ours(x, hx)] == [t.shape for t in theirs(x, hx)]


@pytest.mark.parametrize("call,error,pattern", [
    (lambda c: c(torch.randn(3), (torch.randn(1, 4), torch.randn(1, 4))), ValueError,
     r"LLTMCell: for unbatched input \[3\] h must be 1-D \[4\], got \[1, 4\]"),
    (lambda c: c(torch.randn(3), (torch.randn(4), torch.randn(2))), RuntimeError, r"old_cell"),
    (lambda c: c(torch.randn(5)), ValueError,
     r"LLTMCell: input must have shape \[B, 3\] or unbatched \[3\] \(input_features=3\), "
     r"got \[5\]"),
    (lambda c: c(torch.randn(2, 2, 3)), ValueError, r"got \[2, 2, 3\]"),
    (lambda c: c(torch.randn(3), torch.randn(4)), TypeError, r"state must be a tuple"),
])
def test_cell_unbatched_bad_input(call, error, pattern):
    with pytest.raises(error, match=pattern):
        call(lltm.LLTMCell(3, 4))


# --- repr and constructor ----------------------------------------------------------

@pytest.mark.parametrize("kwargs", [
    {}, {"num_layers": 2, "batch_first": True}, {"bias": False}, {"dropout": 0.5, "num_layers": 2},
    {"num_layers": 2, "batch_first": True, "bidirectional": True}, {"proj_size": 0},
])
def test_repr_like_lstm(kwargs):
    assert repr(lltm.LLTM(32, 128, **kwargs)).replace("LLTM", "LSTM") == repr(
        torch.nn.LSTM(32, 128, **kwargs))


def test_repr_example():
    m = lltm.LLTM(32, 128, num_layers=2, batch_first=True, bidirectional=True)
    assert m.extra_repr() == "32, 128, num_layers=2, batch_first=True, bidirectional=True"
    assert "impl='reference'" in lltm.LLTM(3, 4, impl="reference").extra_repr()


@pytest.mark.parametrize("proj_size,error,pattern", [
    (4, ValueError, r"LLTM: proj_size=4 is not supported: LLTM has no projection.*README"),
    (-1, ValueError, r"LLTM: proj_size must be >= 0, got -1"),
    (2.0, TypeError, r"LLTM: proj_size must be an int"),
])
def test_proj_size_refused(proj_size, error, pattern):
    with pytest.raises(error, match=pattern):
        lltm.LLTM(3, 8, proj_size=proj_size)


def test_proj_size_zero_accepted():
    assert lltm.LLTM(3, 8, proj_size=0).proj_size == 0


def test_bidirectional_must_be_bool():
    with pytest.raises(TypeError, match=r"LLTM: bidirectional must be a bool, got int 1"):
        lltm.LLTM(3, 8, bidirectional=1)


def test_constructor_positional_order_like_lstm():
    """nn.LSTM(input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional)."""
    m = lltm.LLTM(3, 4, 2, False, True, 0.0)
    assert (m.num_layers, m.bias, m.batch_first) == (2, False, True)
