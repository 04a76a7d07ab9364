"""torch.autocast: the LLTM ops run in the autocast dtype, like linear and
lstm_cell; float32 parameters get float32 gradients; a short mixed-precision
training run matches the float32 run."""
import math

import pytest
import torch
import torch.nn.functional as F

import lltm
from conftest import assert_close

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
CASES = [pytest.param("cpu", torch.bfloat16, id="cpu-bfloat16"),
         pytest.param("cpu", torch.float16, id="cpu-float16"),
         pytest.param("cuda", torch.float16, marks=CUDA, id="cuda-float16"),
         pytest.param("cuda", torch.bfloat16, marks=CUDA, id="cuda-bfloat16")]


class LinearThen(torch.nn.Module):
    """Linear -> LLTMCell (two steps) or Linear -> LLTM: the layer gets the
    autocast dtype from the Linear, float32 state from us."""

    def __init__(self, kind, device, **kw):
        super().__init__()
        self.kind = kind
        self.proj = torch.nn.Linear(6, 5, device=device)
        self.rnn = (lltm.LLTMCell(5, 7, device=device) if kind == "cell"
                    else lltm.LLTM(5, 7, device=device, **kw))

    def forward(self, x):
        if self.kind == "cell":
            h = c = torch.zeros(x.shape[1], 7, device=x.device)  # float32 state
            for x_t in self.proj(x).unbind(0):
                h, c = self.rnn(x_t, (h, c))
            return h, c
        out, (h_n, c_n) = self.rnn(self.proj(x))
        return out, c_n


def run(model, x, device, dtype):
    """Outputs and the gradients of every parameter, under autocast if dtype."""
    model.zero_grad(set_to_none=True)
    with torch.autocast(device, dtype=dtype or torch.float32, enabled=dtype is not None):
        outs = model(x)
    sum(o.float().pow(2).sum() for o in outs).backward()
    return outs, {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("device,dtype", CASES)
@pytest.mark.parametrize("kind,kw", [
    pytest.param("cell", {}, id="cell"), pytest.param("sequence", {}, id="sequence"),
    pytest.param("sequence", {"num_layers": 2, "batch_first": True}, id="sequence-2-layers")])
def test_forward_backward_in_autocast_dtype_master_grads_float32(device, dtype, kind, kw):
    torch.manual_seed(torch.randint(2**31 - 1, ()).item())
    model = LinearThen(kind, device, **kw)
    x = torch.randn(4, 3, 6, device=device)
    ref_outs, ref_grads = run(model, x, device, None)
    outs, grads = run(model, x, device, dtype)
    for o, r in zip(outs, ref_outs):
        assert o.dtype == dtype and r.dtype == torch.float32
        assert_close("output", o, r, dtype)
    for name, g in grads.items():
        assert g.dtype == torch.float32, name  # the master weights' gradient dtype
        assert_close(f"grad of {name}", g, ref_grads[name], dtype)


@pytest.mark.parametrize("device,dtype", CASES)
def test_functional_and_direct_ops_cast_float32_inputs(device, dtype):
    x, W, b, h, c = (torch.randn(*s, device=device) for s in [(3, 4), (15, 9), (15,), (3, 5),
                                                                (3, 5)])
    W.requires_grad_()
    with torch.autocast(device, dtype=dtype):
        outs = [lltm.functional.lltm_cell(x, W, b, h, c),
                torch.ops.lltm.cell_forward(x, W, b, h, c)[:2],
                lltm.functional.lltm_sequence(x[None], W, b, h, c)[1],
                torch.ops.lltm.sequence_forward(x[None], W, b, h, c)[1:3]]
    want = lltm.functional.lltm_cell(*(t.to(dtype) for t in (x, W, b, h, c)))
    for pair in outs:
        for got, w in zip(pair, want):
            assert got.dtype == dtype
            assert_close("output", got, w, dtype)
    (g,) = torch.autograd.grad(sum(t.float().sum() for pair in outs for t in pair), W)
    assert g.dtype == torch.float32 and g.abs().max() > 0


def test_float64_is_left_alone_like_autocast_does():
    cell = lltm.LLTMCell(4, 5, dtype=torch.float64)
    x = torch.randn(3, 4, dtype=torch.float64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h, c = cell(x)
    assert h.dtype == torch.float64
    torch.testing.assert_close(h, cell(x)[0])


def test_torch_compile_under_autocast_matches_eager():
    model = LinearThen("sequence", "cpu", num_layers=2)
    x = torch.randn(4, 3, 6)
    compiled = torch.compile(model, fullgraph=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want, got = model(x), compiled(x)
    for g, w in zip(got, want):
        assert g.dtype == torch.bfloat16
        torch.testing.assert_close(g, w)


def _train(data, autocast_dtype, epochs, device="cpu", scaler=None):
    from lltm.examples import train
    torch.manual_seed(0)
    model = train.SequenceClassifier("lltm", data.features, 64).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    for epoch in range(1, epochs + 1):
        for group in opt.param_groups:
            group["lr"] = train.learning_rate(1e-2, epoch, epochs)
        order = torch.randperm(len(data.y_train), generator=g).to(device)
        for start in range(0, len(order), 32):
            idx = order[start:start + 32]
            with torch.autocast(device, dtype=autocast_dtype or torch.float32,
                                enabled=autocast_dtype is not None):
                loss = F.cross_entropy(model(data.x_train[idx]), data.y_train[idx])
            opt.zero_grad(set_to_none=True)
            if scaler is None:
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
            else:
                scaler.scale(loss).backward()
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(opt)
                scaler.update()
    assert all(p.dtype == torch.float32 for p in model.parameters())
    with torch.no_grad(), torch.autocast(device, dtype=autocast_dtype or torch.float32,
                                         enabled=autocast_dtype is not None):
        logits = model(data.x_test)
    assert math.isfinite(logits.float().sum().item())
    return (logits.argmax(1) == data.y_test).float().mean().item()


# A mixed-precision run reaches the float32 run's test accuracy within this
# margin (the runs see the same batches from the same initial weights).
MARGIN = 0.05


def test_short_training_run_in_cpu_bfloat16_matches_float32():
    pytest.importorskip("sklearn")
    from lltm.examples import train
    data = train.load_digits()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # batches of 32 x 8 steps: a thread pool only adds waiting
    try:
        f32 = _train(data, None, epochs=6)
        bf16 = _train(data, torch.bfloat16, epochs=6)
    finally:
        torch.set_num_threads(threads)
    print(f"test accuracy after 6 epochs on the CPU: float32 {f32:.4f}, bfloat16 {bf16:.4f}")
    assert f32 >= 0.8, f32  # it learned (0.88 at this length)
    assert bf16 >= f32 - MARGIN, (bf16, f32)


@CUDA
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_short_training_run_cuda_mixed_precision(dtype):
    """float16 with a GradScaler (as float16 training needs), bfloat16 without."""
    pytest.importorskip("sklearn")
    from lltm.examples import train
    data = train.load_digits().to("cuda")
    f32 = _train(data, None, epochs=6, device="cuda")
    scaler = torch.amp.GradScaler("cuda") if dtype == torch.float16 else None
    mixed = _train(data, dtype, epochs=6, device="cuda", scaler=scaler)
    print(f"test accuracy after 6 epochs on CUDA: float32 {f32:.4f}, {dtype} {mixed:.4f}")
    assert f32 >= 0.8, f32  # it learned (0.88 at this length)
    assert mixed >= f32 - MARGIN, (mixed, f32)
