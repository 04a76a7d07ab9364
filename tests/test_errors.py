"""Bad input gets a clear error naming the argument, never a crash, a silently
wrong result or a leak."""
import gc

import pytest
import torch

import lltm
from conftest import cell_inputs

B, I, H = 3, 4, 5


def forward(**override):
    args = dict(zip(["input", "weights", "bias", "old_h", "old_cell"],
                    cell_inputs(B, I, H, torch.float32)))
    args.update(override)
    return torch.ops.lltm.cell_forward(*args.values())


def good():
    return dict(zip(["input", "weights", "bias", "old_h", "old_cell"],
                    cell_inputs(B, I, H, torch.float32)))


@pytest.mark.parametrize("name,bad,pattern", [
    ("input", torch.randn(B, I, dtype=torch.complex64), r"input has dtype a non-floating or unsupported dtype; expected float32, float64, float16 or bfloat16"),
    ("weights", torch.randn(3 * H, I + H, dtype=torch.float64), r"one dtype: input is float32, weights is float64"),
    ("old_h", torch.randint(0, 5, (B, H)), r"one dtype.*old_h is a non-floating"),
    ("input", torch.randint(0, 5, (B, I)), r"input has dtype a non-floating"),
    ("input", torch.randn(B, I, 1), r"input must be 2-dimensional \[B, I\], got shape \[3, 4, 1\]"),
    ("old_h", torch.randn(B * H), r"old_h must be 2-dimensional"),
    ("weights", torch.randn(3 * H, I + H + 1), r"weights has size 10 in dimension 1, expected 9 \(I\+H"),
    ("weights", torch.randn(3 * H + 3, I + H), r"weights has size 18 in dimension 0, expected 15 \(3H"),
    ("old_cell", torch.randn(B, H + 1), r"old_cell has size 6 in dimension 1, expected 5 \(state size"),
    ("old_h", torch.randn(B + 1, H), r"old_h has size 4 in dimension 0, expected 3 \(batch size"),
    ("old_cell", torch.randn(B + 2, H), r"old_cell has size 5 in dimension 0, expected 3 \(batch"),
    ("bias", torch.randn(3 * H - 1), r"bias has size 14 in dimension 0, expected 15"),
    ("bias", torch.randn(2, 3 * H), r"bias has size 2 in dimension 0, expected 1"),
    ("bias", torch.randn(1, 1, 3 * H), r"bias must be 1-dimensional"),
])
def test_forward_rejects(name, bad, pattern):
    with pytest.raises(RuntimeError, match=pattern):
        forward(**{name: bad})


def test_mixed_devices_rejected():
    # On a CPU-only machine the "meta" device stands in for a second device;
    # the dispatcher then routes to the fake kernel, which checks the same rule.
    with pytest.raises(RuntimeError, match="one device"):
        forward(old_h=torch.randn(B, H, device="meta"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_mixed_cpu_cuda_rejected():
    with pytest.raises(RuntimeError, match="one device"):
        forward(old_h=torch.randn(B, H, device="cuda"))


def test_backward_rejects_mismatched_shapes():
    x, W, b, h, c = cell_inputs(B, I, H, torch.float32)
    new_h, new_cell, gates = torch.ops.lltm.cell_forward(x, W, b, h, c)
    with pytest.raises(RuntimeError, match=r"grad_h has size 6 in dimension 1"):
        torch.ops.lltm.cell_backward(torch.randn(B, H + 1), torch.randn(B, H), new_cell, gates, x, h, W)
    with pytest.raises(RuntimeError, match=r"gates has size 14 in dimension 1"):
        torch.ops.lltm.cell_backward(torch.randn(B, H), torch.randn(B, H), new_cell, gates[:, 1:], x, h, W)
    with pytest.raises(RuntimeError, match=r"one dtype"):
        torch.ops.lltm.cell_backward(torch.randn(B, H).double(), torch.randn(B, H), new_cell, gates, x, h, W)


def test_module_level_errors_are_clear():
    cell = lltm.LLTMCell(I, H)
    with pytest.raises(RuntimeError, match="input has size|weights has size"):
        cell(torch.randn(B, I + 1))


def tensor_refs(t):
    return t._use_count()  # references to the TensorImpl, as a C handle holds


def test_no_handle_leaks_on_error_paths():
    """Every input handle the kernel owns is freed before it raises: the
    storages' reference counts return to where they were, over many errors."""
    args = good()
    bad_old_cell = torch.randn(B, H + 1)
    bad_weights = torch.randn(3 * H, I + H + 1)
    grad_h_nc = torch.randn(H, B).t()  # non-contiguous
    watched = dict(args, bad_old_cell=bad_old_cell, bad_weights=bad_weights, grad_h_nc=grad_h_nc)
    before = {k: tensor_refs(v) for k, v in watched.items()}
    for _ in range(200):
        with pytest.raises(RuntimeError):
            torch.ops.lltm.cell_forward(args["input"], args["weights"], args["bias"],
                                        args["old_h"], bad_old_cell)
        with pytest.raises(RuntimeError):
            torch.ops.lltm.cell_backward(grad_h_nc, torch.randn(B, H), torch.randn(B, H),
                                         torch.randn(B, 3 * H), args["input"], args["old_h"],
                                         bad_weights)
    gc.collect()
    assert {k: tensor_refs(v) for k, v in watched.items()} == before


def test_no_leak_on_success_path():
    args = good()
    before = {k: tensor_refs(v) for k, v in args.items()}
    for _ in range(50):
        outs = torch.ops.lltm.cell_forward(*args.values())
        torch.ops.lltm.cell_backward(outs[0], outs[1], outs[1], outs[2], args["input"],
                                     args["old_h"], args["weights"])
    del outs
    gc.collect()
    assert {k: tensor_refs(v) for k, v in args.items()} == before
