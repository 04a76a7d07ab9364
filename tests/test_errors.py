"""Bad input gets a clear error naming the argument, never a crash, a silently
wrong result or a leak."""
import contextlib
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
@pytest.mark.parametrize("kernel", ["native", "fake"])
def test_forward_rejects(name, bad, pattern, kernel):
    args = good()
    args[name] = bad
    mode = contextlib.nullcontext()
    if kernel == "fake":  # the fake kernel: the same table, checks and messages
        mode, fakes = _fake(list(args.values()))
        args = dict(zip(args, fakes))
    with pytest.raises(RuntimeError, match=pattern), mode:
        torch.ops.lltm.cell_forward(*args.values())


@pytest.mark.parametrize("kernel", ["native", "fake"])
@pytest.mark.parametrize("lengths,pattern", [
    (torch.tensor([3, 3], dtype=torch.int32), r"lengths must be an int64 tensor of shape \[3\]"),
    (torch.tensor([3, 3, 3, 3]), r"shape \[3\] \(one length per batch row B of input\), got "
                                 r"int64 of 1 dimensions, first size 4"),
])
def test_lengths_rejected_by_both_kernels(kernel, lengths, pattern):
    T, I_, H_ = 4, 2, 5
    args = [torch.randn(T, 3, I_), torch.randn(3 * H_, I_ + H_), torch.randn(3 * H_),
            torch.randn(3, H_), torch.randn(3, H_), lengths]
    mode = contextlib.nullcontext()
    if kernel == "fake":
        mode, args = _fake(args)
    with pytest.raises(RuntimeError, match="lltm::sequence_forward: .*" + pattern), mode:
        torch.ops.lltm.sequence_forward.lengths(*args)


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


# --- the Python level: functional forms, modules, one rule for zero sizes -----------

@pytest.mark.parametrize("k", range(5))
@pytest.mark.parametrize("bad", [None, 1.0, [[1.0]]])
def test_functional_non_tensor_arguments_name_the_argument(k, bad):
    got = "None" if bad is None else type(bad).__name__
    cell_names = ["input", "weights", "bias", "old_h", "old_cell"]
    args = list(cell_inputs(B, I, H, torch.float32))
    args[k] = bad
    with pytest.raises(TypeError, match=rf"lltm\.functional\.lltm_cell: {cell_names[k]} must be "
                                        rf"a Tensor, got {got}"):
        lltm.functional.lltm_cell(*args)
    seq_names = ["input", "weights", "bias", "h0", "c0"]
    args = list(cell_inputs(B, I, H, torch.float32))
    args[0] = args[0][None]
    args[k] = bad
    if seq_names[k] == "bias" and bad is None:  # no bias: allowed
        lltm.functional.lltm_sequence(*args)
        return
    with pytest.raises(TypeError, match=rf"lltm\.functional\.lltm_sequence: {seq_names[k]} must "
                                        rf"be a Tensor, got {got}"):
        lltm.functional.lltm_sequence(*args)


def test_cell_module_wrong_feature_count_blames_input():
    cell = lltm.LLTMCell(I, H)
    with pytest.raises(ValueError, match=r"LLTMCell: input must have shape \[B, 4\] or unbatched "
                                         r"\[4\] \(input_features=4\), got \[3, 5\]"):
        cell(torch.randn(B, I + 1))
    with pytest.raises(TypeError, match="LLTMCell: input must be a Tensor, got NoneType"):
        cell(None)
    with pytest.raises(TypeError, match=r"LLTMCell: state must be a tuple \(h, c\)"):
        cell(torch.randn(B, I), torch.randn(B, H))


@pytest.mark.parametrize("args,kwargs,error,pattern", [
    ((True, 5), {}, TypeError, r"LLTM: input_size must be an int, got bool True"),
    ((3, True), {}, TypeError, r"LLTM: hidden_size must be an int, got bool"),
    ((3, 5.0), {}, TypeError, r"LLTM: hidden_size must be an int, got float 5.0"),
    ((3, 0), {}, ValueError, r"LLTM: hidden_size must be > 0, got 0"),
    ((-1, 5), {}, ValueError, r"LLTM: input_size must be >= 0, got -1"),
    ((3, 5), {"num_layers": 0}, ValueError, r"LLTM: num_layers must be > 0, got 0"),
    ((3, 5), {"num_layers": 2.0}, TypeError, r"LLTM: num_layers must be an int"),
    ((3, 5), {"num_layers": False}, TypeError, r"LLTM: num_layers must be an int, got bool"),
    ((3, 5), {"bias": 1}, TypeError, r"LLTM: bias must be a bool, got int 1"),
    ((3, 5), {"batch_first": "yes"}, TypeError, r"LLTM: batch_first must be a bool"),
    ((3, 5), {"dropout": 1.5}, ValueError, r"LLTM: dropout must be a number in \[0, 1\]"),
    ((3, 5), {"dropout": True}, ValueError, r"LLTM: dropout must be a number"),
    ((3, 5), {"impl": "fast"}, ValueError, r"impl must be one of"),
])
def test_sequence_module_constructor_rejects_like_lstm(args, kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        lltm.LLTM(*args, **kwargs)


@pytest.mark.parametrize("args,error,pattern", [
    ((True, 5), TypeError, r"LLTMCell: input_features must be an int, got bool"),
    ((3, 5.0), TypeError, r"LLTMCell: state_size must be an int, got float"),
    ((3, 0), ValueError, r"LLTMCell: state_size must be > 0, got 0"),
    ((-2, 5), ValueError, r"LLTMCell: input_features must be >= 0, got -2"),
])
def test_cell_module_constructor_rejects_like_lstm(args, error, pattern):
    with pytest.raises(error, match=pattern):
        lltm.LLTMCell(*args)


def _fake(args):
    from torch._subclasses import FakeTensorMode
    mode = FakeTensorMode()
    return mode, [mode.from_tensor(a) for a in args]


@pytest.mark.parametrize("kernel,opname,name", [
    ("native", "cell_forward", "old_h"),
    ("native", "sequence_forward", "h0"), ("fake", "cell_forward", "old_h"),
    ("fake", "sequence_forward", "h0")])
def test_zero_state_size_rejected_by_both_ops(kernel, opname, name):
    args = [torch.randn(2, 3), torch.randn(0, 3), torch.randn(0), torch.randn(2, 0),
            torch.randn(2, 0)]
    if opname == "sequence_forward":
        args[0] = torch.randn(4, 2, 3)
    op = getattr(torch.ops.lltm, opname).default
    mode = None
    if kernel == "fake":
        mode, args = _fake(args)
    with pytest.raises(RuntimeError, match=rf"lltm::{opname}: {name} has state size "
                                            rf"H = 0; expected H > 0"):
        if mode is None:
            op(*args)
        else:
            with mode:
                op(*args)


@pytest.mark.parametrize("kernel", ["native", "fake"])
@pytest.mark.parametrize("T,Bz,Iz", [(3, 0, 2), (3, 2, 0), (0, 2, 2), (0, 0, 0)])
def test_zero_batch_input_and_time_allowed_by_both_ops(kernel, T, Bz, Iz):
    Hz = 3
    cell = [torch.randn(Bz, Iz), torch.randn(3 * Hz, Iz + Hz), torch.randn(3 * Hz),
            torch.randn(Bz, Hz), torch.randn(Bz, Hz)]
    seq = [torch.randn(T, Bz, Iz)] + cell[1:]
    want = {"cell_forward": [(Bz, Hz), (Bz, Hz), (Bz, 3 * Hz)],
            "sequence_forward": [(T, Bz, Hz), (Bz, Hz), (Bz, Hz), (T, Bz, Hz), (T, Bz, 3 * Hz)]}
    for op, args in ((torch.ops.lltm.cell_forward.default, cell),
                     (torch.ops.lltm.sequence_forward.default, seq)):
        if kernel == "fake":
            mode, args = _fake(args)
            with mode:
                outs = op(*args)
        else:
            outs = op(*args)
        assert [tuple(o.shape) for o in outs] == want[op._opname]
