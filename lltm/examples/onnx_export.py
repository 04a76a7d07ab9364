"""The training example's kind of model exported to ONNX and timed in ONNX
Runtime against eager PyTorch (lltm's native kernels) on the CPU.

    python -m lltm.examples.onnx_export                  # 1 thread, the default sizes
    python -m lltm.examples.onnx_export --threads 2 --sizes 1x8,32x64 --out model.onnx

The model: a linear front (features -> hidden), one lltm.LLTM layer
(batch_first) and a linear head on its last hidden state, sized like
``python -m lltm.examples.train`` (8 features a step, hidden 64, 10 classes;
8 steps are its rows, 64 its --pixels sequence length; B 32 its batch, 450 its
test set). Weights are random: the time does not depend on them.

It is exported once, ``torch.onnx.export(model, (x,), dynamo=True,
dynamic_shapes=...)`` with the batch and the time dynamic, and the one file
then serves every size below. For each (B, T) the ONNX Runtime result is
checked against eager first (float32), then both are timed in turns: the
median of ``--repeats`` calls each, eager under ``torch.inference_mode()``,
both on ``--threads`` threads. speed-up = eager time / ONNX Runtime time.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import warnings

import torch

import lltm

DEFAULT_SIZES = "1x8,32x8,450x8,1x64,32x64,450x64"


class Classifier(torch.nn.Module):
    """Linear front, LLTM, linear head: x [B, T, features] -> logits [B, classes]."""

    def __init__(self, features: int = 8, hidden: int = 64, classes: int = 10,
                 layers: int = 1):
        super().__init__()
        self.front = torch.nn.Linear(features, hidden)
        self.rnn = lltm.LLTM(hidden, hidden, layers, batch_first=True)
        self.head = torch.nn.Linear(hidden, classes)

    def forward(self, x):
        _output, (h_n, _c_n) = self.rnn(self.front(x))
        return self.head(h_n[-1])


def export(model: Classifier, path: str) -> None:
    """model to ONNX at ``path``, batch and time dynamic."""
    batch = torch.export.Dim("batch", min=1, max=65536)
    time_ = torch.export.Dim("time", min=1, max=65536)
    example = torch.randn(3, 5, model.front.in_features)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(model, (example,), dynamo=True, verbose=False,
                                    dynamic_shapes=({0: batch, 1: time_},))
    program.save(path)


def _median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def measure(model: Classifier, path: str, sizes, threads: int, repeats: int) -> list[dict]:
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    torch.set_num_threads(threads)
    rows = []
    for B, T in sizes:
        x = torch.randn(B, T, model.front.in_features)
        feed = {name: x.numpy()}
        with torch.inference_mode():
            want = model(x)
        got = torch.from_numpy(session.run(None, feed)[0])
        torch.testing.assert_close(got, want)  # the same logits before any timing

        def eager():
            with torch.inference_mode():
                model(x)

        def onnx():
            session.run(None, feed)

        for fn in (eager, onnx):  # warm-up
            for _ in range(3):
                fn()
        eager_ms, onnx_ms = [], []
        for _ in range(5):  # in turns, so drift hits both
            eager_ms.append(_median_ms(eager, repeats))
            onnx_ms.append(_median_ms(onnx, repeats))
        e, o = statistics.median(eager_ms), statistics.median(onnx_ms)
        rows.append(dict(B=B, T=T, eager_ms=e, onnx_ms=o, speedup=e / o))
    return rows


def table(rows) -> str:
    lines = ["| B | T | eager torch (ms) | ONNX Runtime (ms) | speed-up |",
             "|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['B']} | {r['T']} | {r['eager_ms']:.3f} | {r['onnx_ms']:.3f} | "
                     f"{r['speedup']:.2f}x |")
    return "\n".join(lines)


def parse_sizes(text: str) -> list[tuple[int, int]]:
    sizes = []
    for item in text.split(","):
        B, T = item.lower().split("x")
        sizes.append((int(B), int(T)))
    return sizes


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=DEFAULT_SIZES,
                        help="BxT pairs, comma-separated (default %(default)s)")
    parser.add_argument("--threads", type=int, default=1, help="default %(default)s")
    parser.add_argument("--repeats", type=int, default=50,
                        help="calls per timed block (default %(default)s)")
    parser.add_argument("--hidden", type=int, default=64, help="default %(default)s")
    parser.add_argument("--out", help="keep the .onnx file here (default: a temporary one)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    model = Classifier(hidden=args.hidden).eval()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.out or os.path.join(tmp, "classifier.onnx")
        export(model, path)
        rows = measure(model, path, parse_sizes(args.sizes), args.threads, args.repeats)
    print(f"torch {torch.__version__}, lltm {lltm.__version__}, "
          f"onnxruntime {__import__('onnxruntime').__version__}, {args.threads} thread(s), "
          f"hidden {args.hidden}")
    print(table(rows))


if __name__ == "__main__":
    main()
