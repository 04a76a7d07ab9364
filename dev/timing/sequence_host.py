"""Host time of the pieces of an eager lltm.LLTM step on the GPU (where the
eager step at small sizes spends its time): each piece called N times back to
back with no synchronization inside, synchronized at the end, divided by N,
as lltm.bench times its pipelined step; median of 7 passes, microseconds.

    python3 dev/timing/sequence_host.py [B I H T]    (default 16 32 128 100; the CPU
                                                     where there is no GPU)
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import lltm  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sizes", nargs="*", type=int, metavar="B I H T",
                        help="batch, input, hidden, steps (default 16 32 128 100)")
    args = parser.parse_args(argv)
    if len(args.sizes) not in (0, 4):
        parser.error("give all four of B I H T, or none")
    B, I, H, T = args.sizes or (16, 32, 128, 100)

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    m = lltm.LLTM(I, H).to(dev)
    lstm = torch.nn.LSTM(I, H).to(dev)
    x = torch.randn(T, B, I, device=dev, requires_grad=True)
    W, b = m.weights_l0, m.bias_l0
    h0 = torch.zeros(B, H, device=dev)
    c0 = torch.zeros(B, H, device=dev)
    ops = torch.ops.lltm
    with torch.no_grad():
        out, h_n, c_n, cells, gates = ops.sequence_forward(x, W, b, h0, c0)
    g_out, g_h, g_c = torch.randn_like(out), torch.randn_like(h_n), torch.randn_like(c_n)
    g_h1, g_c1 = g_h.unsqueeze(0), g_c.unsqueeze(0)  # the modules' h_n, c_n: [layers, B, H]
    params = [x, W, b]
    lstm_params = [x] + list(lstm.parameters())


    def lltm_step():
        o, (hn, cn) = m(x)
        torch.autograd.grad([o, hn, cn], params, [g_out, g_h1, g_c1])


    def lstm_step():
        o, (hn, cn) = lstm(x)
        torch.autograd.grad([o, hn, cn], lstm_params, [g_out, g_h1, g_c1])


    def forward_module():
        m(x)


    def forward_op():
        ops.sequence_forward(x.detach(), W.detach(), b.detach(), h0, c0)


    def backward_op():
        ops.sequence_backward(g_out, g_h, g_c, x.detach(), W.detach(), h0, out, cells, gates)


    proj_a, proj_b = torch.randn(T * B, I, device=dev), torch.randn(I, 3 * H, device=dev)


    def mm_projection():
        torch.mm(proj_a, proj_b)


    def empty():
        torch.empty(T, B, H, device=dev)


    PIECES = [("lltm step (module fwd + autograd.grad)", lltm_step),
              ("nn.LSTM step (cuDNN on a GPU)", lstm_step),
              ("lltm module forward (recording)", forward_module),
              ("op sequence_forward", forward_op),
              ("op sequence_backward", backward_op),
              ("torch.mm [T*B,I] x [I,3H]", mm_projection),
              ("torch.empty [T,B,H]", empty)]


    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()


    def per_call(fn, n=100):
        sync()
        start = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        return (time.perf_counter() - start) / n * 1e6


    for _, fn in PIECES:
        per_call(fn, 20)
    results = {name: [] for name, _ in PIECES}
    for _ in range(7):
        for name, fn in PIECES:
            results[name].append(per_call(fn))
    name = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"
    print(f"B I H T = {B} {I} {H} {T}, {name}, torch {torch.__version__}")
    for name, samples in results.items():
        print(f"  {name:40} {statistics.median(samples):9.1f} us  [{min(samples):.1f}-{max(samples):.1f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
