"""Draws docs/design.png: lltm's layers next to the files of PyTorch's C++/CUDA
extension tutorial that play the same part.

    python scripts/design_figure.py [--out docs/design.png]
"""
from __future__ import annotations

import argparse
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (x, y, width, height) in figure units (0-100 wide, 11-66 high).
LAYERS = [
    # Python: the package
    ((2, 50, 62, 11.5), "#dbe8f6", "lltm/  (Python package)",
     "modules.py  LLTMCell, LLTM (shaped like nn.LSTM)   functional.py   sequence.py\n"
     "_ops.py  autograd and fake (meta) kernels for torch.ops.lltm.*, registered in Python\n"
     "reference.py  the tutorial's pure-PyTorch LLTM: what every fast path is tested against\n"
     "build.py + _native.py  compile liblltm*.so, load them, call lltm_register()\n"
     "bench/  checked, interleaved timings     examples/  training on digits"),
    # the operator boundary
    ((2, 42, 62, 5.5), "#eeeeee", "torch.ops.lltm:  cell_forward / cell_backward / "
     "sequence_forward / sequence_backward", "schemas defined once; the dispatcher picks the "
     "CPU or CUDA kernel"),
    # C binding
    ((2, 29.5, 62, 10), "#fde9d4", "csrc/binding/  (C on PyTorch's stable C ABI)",
     "register.c  defines the schemas, registers the kernels\n"
     "cell_*.c, sequence_*.c  validate (name the argument), allocate, pick a route,\n"
     "    run large matrix products through torch, call the core\n"
     "tensor_args.*, ops.c  checks shared by all   torch_stable_abi.h  ABI declarations"),
    # C core
    ((2, 13, 30, 14), "#e3f1dc", "csrc/core/  CPU (C11)",
     "lltm.h  the documented C API:\n    every argument's shape, one notation\n"
     "cell: fused pointwise kernels\n"
     "sequence: the time loop, with\n    a matrix-product callback and\n"
     "    a parallel-for callback\n"
     "no torch, no environment"),
    ((34, 13, 30, 14), "#e3f1dc", "csrc/core/  CUDA (CUDA C++)",
     "extern \"C\" launchers, same header\n"
     "cell: fused kernels (product +\n    activations in one launch), or\n"
     "    cuBLAS products + pointwise\n"
     "sequence: the time loop on the GPU:\n    persistent kernels; one function\n"
     "    chooses the plan from the sizes"),
]

TUTORIAL = [
    ((70, 50, 28, 11.5), "LLTMFunction (autograd.Function)\n+ LLTM (nn.Module) in Python;\n"
     "setup.py / cpp_extension.load"),
    ((70, 42, 28, 5.5), "PYBIND11_MODULE (old) or\nTORCH_LIBRARY (current)"),
    ((70, 29.5, 28, 10), "lltm.cpp, lltm_cuda.cpp:\nC++ with ATen: CHECK_* macros,\n"
     "torch::addmm, pybind11 / TORCH_LIBRARY"),
    ((70, 13, 28, 14), "lltm_cuda_kernel.cu:\nelementwise kernels after an\nATen GEMM, "
     "AT_DISPATCH_FLOATING_TYPES;\nno sequence operator:\na Python loop of cells"),
]


def draw(out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    fig = plt.figure(figsize=(13, 6.6), dpi=110)
    ax = fig.add_axes([0, 0, 1, 1])
    ax.set_xlim(0, 100)
    ax.set_ylim(11, 66)
    ax.axis("off")
    ax.text(33, 64.3, "lltm", ha="center", fontsize=14, weight="bold")
    ax.text(84, 64.3, "the tutorial's counterpart", ha="center", fontsize=12, weight="bold",
            color="#555555")
    for (x, y, w, h), color, title, body in LAYERS:
        ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="square,pad=0.3",
                                    fc=color, ec="#444444", lw=1))
        ax.text(x + 1, y + h - 1.2, title, va="top", fontsize=10.5, weight="bold",
                family="monospace" if title.startswith("torch.ops") else None)
        ax.text(x + 1, y + h - 3.6 if h > 6 else y + 1.2, body, va="top" if h > 6 else "bottom",
                fontsize=8.6, linespacing=1.35)
    for (x, y, w, h), text in TUTORIAL:
        ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="square,pad=0.3",
                                    fc="white", ec="#999999", lw=1, ls="--"))
        ax.text(x + 1, y + h - 1.2, text, va="top", fontsize=8.8, color="#333333",
                linespacing=1.35)
    # calls flow down; the tutorial column sits level with what it maps to
    for x0, y0, x1, y1 in ((33, 50, 33, 47.8), (33, 42, 33, 39.8), (17, 29.5, 17, 27.3),
                           (49, 29.5, 49, 27.3)):
        ax.add_patch(FancyArrowPatch((x0, y0), (x1, y1), arrowstyle="-|>", mutation_scale=14,
                                     color="#444444", lw=1.2))
    for y in (55.7, 44.7, 34.5, 20):
        ax.add_patch(FancyArrowPatch((69.4, y), (64.8, y), arrowstyle="<->", mutation_scale=10,
                                     color="#999999", lw=1, ls=":"))
    # the core's time loop calls back into the binding for its matrix products
    for x in (26, 58):
        ax.add_patch(FancyArrowPatch((x, 27.3), (x, 29.5), arrowstyle="-|>", mutation_scale=12,
                                     color="#2a7a2a", lw=1.2, ls="--"))
    ax.text(26.8, 28.1, "matrix products (callback)", fontsize=7.5, color="#2a7a2a")
    ax.text(58.8, 28.1, "callback", fontsize=7.5, color="#2a7a2a")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "design.png"))
    args = parser.parse_args(argv)
    draw(Path(args.out))
    print(f"saved {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
