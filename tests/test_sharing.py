"""lltm._sharing: the number of layers a thread's CUDA sequence calls plan to
share the device with, set around both directions of a bidirectional layer
(and their backward calls); its effect on the plan is tested in
tests/test_cuda_sequence_emulated.py (the chooser) and test_lstm_cuda.py."""
import pytest
import torch

import lltm
from lltm import _sharing


def test_sharing_nests_and_restores():
    assert _sharing.concurrent_layers() == 1
    with _sharing.sharing_device(2):
        assert _sharing.concurrent_layers() == 2
        with _sharing.sharing_device(1):
            assert _sharing.concurrent_layers() == 1
        assert _sharing.concurrent_layers() == 2
    assert _sharing.concurrent_layers() == 1
    with pytest.raises(RuntimeError, match="inside"):
        with _sharing.sharing_device(2):
            raise RuntimeError("inside")
    assert _sharing.concurrent_layers() == 1


@pytest.mark.parametrize("layers", [0, 3, -1])
def test_sharing_refuses_other_counts(layers):
    with pytest.raises(ValueError, match="1 or 2"):
        with _sharing.sharing_device(layers):
            pass
    assert _sharing.concurrent_layers() == 1


def test_backward_of_a_shared_layer_matches():
    """A layer whose forward ran inside sharing_device(2) (its backward plans
    for the shared device too) gives the same gradients as alone."""
    torch.manual_seed(0)
    T, B, I, H = 5, 3, 4, 7
    x = torch.randn(T, B, I, dtype=torch.float64, requires_grad=True)
    W = torch.randn(3 * H, I + H, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3 * H, dtype=torch.float64, requires_grad=True)
    h0, c0 = torch.randn(2, B, H, dtype=torch.float64, requires_grad=True)

    def grads(shared):
        if shared:
            with _sharing.sharing_device(2):
                out, (h, c) = lltm.functional.lltm_sequence(x, W, b, h0, c0)
        else:
            out, (h, c) = lltm.functional.lltm_sequence(x, W, b, h0, c0)
        assert _sharing.concurrent_layers() == 1
        return torch.autograd.grad((out * out).sum() + h.sum() + c.sum(), (x, W, b, h0, c0))
    for g, w in zip(grads(True), grads(False)):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
