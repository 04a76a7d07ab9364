"""lltm.LLTMCell: parameters, initialisation, state handling, the tutorial's state_dict."""
import math

import pytest
import torch

import lltm
from lltm import reference


def test_parameters_match_tutorial_layout():
    cell = lltm.LLTMCell(32, 128)
    assert cell.weights.shape == (384, 160) and cell.bias.shape == (384,)
    bound = 1 / math.sqrt(128)
    for p in cell.parameters():
        assert p.abs().max() <= bound and p.std() > bound / 3  # uniform in +-1/sqrt(H)


@pytest.mark.parametrize("impl", ["native", "reference", "reference_function"])
def test_impls_agree(impl):
    torch.manual_seed(torch.randint(2**31 - 1, ()).item())
    cell = lltm.LLTMCell(7, 5, impl=impl, dtype=torch.float64)
    ref = lltm.LLTMCell(7, 5, impl="reference", dtype=torch.float64)
    ref.load_state_dict(cell.state_dict())
    x = torch.randn(3, 7, dtype=torch.float64)
    state = (torch.randn(3, 5, dtype=torch.float64), torch.randn(3, 5, dtype=torch.float64))
    for a, b in zip(cell(x, state), ref(x, state)):
        torch.testing.assert_close(a, b)


def test_default_state_is_zeros():
    cell = lltm.LLTMCell(4, 6, dtype=torch.float64)
    x = torch.randn(2, 4, dtype=torch.float64)
    zeros = torch.zeros(2, 6, dtype=torch.float64)
    for a, b in zip(cell(x), cell(x, (zeros, zeros))):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("bias_shape", ["flat", "row"])
def test_tutorial_state_dict_round_trip(bias_shape):
    tutorial = reference.LLTM(5, 6).double()
    sd = tutorial.state_dict()
    if bias_shape == "row":  # the tutorial's C++ variant keeps bias as [1, 3H]
        sd = {"weights": sd["weights"], "bias": sd["bias"].reshape(1, -1)}
    cell = lltm.LLTMCell(5, 6, dtype=torch.float64)
    cell.load_state_dict(sd)
    x = torch.randn(3, 5, dtype=torch.float64)
    state = (torch.randn(3, 6, dtype=torch.float64), torch.randn(3, 6, dtype=torch.float64))
    for a, b in zip(cell(x, state), tutorial(x, state)):
        torch.testing.assert_close(a, b)
    back = reference.LLTM(5, 6).double()
    back.load_state_dict(cell.state_dict())
    torch.testing.assert_close(back.weights, tutorial.weights)


def test_bad_module_arguments():
    with pytest.raises(ValueError, match="impl"):
        lltm.LLTMCell(3, 4, impl="fast")
    with pytest.raises(ValueError, match="state_size"):
        lltm.LLTMCell(3, 0)
    with pytest.raises(ValueError, match=r"\[B, 3\]"):
        lltm.LLTMCell(3, 4)(torch.randn(4))


def test_device_and_dtype_arguments():
    cell = lltm.LLTMCell(3, 4, device="cpu", dtype=torch.float64)
    assert cell.weights.dtype == torch.float64 and cell.bias.device.type == "cpu"
