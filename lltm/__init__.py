"""lltm: the LLTM recurrent unit for PyTorch, with native kernels in C and CUDA C++.

    import lltm
    cell = lltm.LLTMCell(32, 128)
    h, c = cell(torch.randn(16, 32))
    rnn = lltm.LLTM(32, 128, num_layers=2)         # whole sequences, like nn.LSTM
    output, (h_n, c_n) = rnn(torch.randn(100, 16, 32))

Operators: ``torch.ops.lltm.cell_forward``, ``sequence_forward`` (one layer),
``stack_forward`` (stacked layers) and their backward operators
(``csrc/core/lltm.h``: the math and the shapes).
"""
from . import _native
from ._native import build_info  # noqa: F401  (how the native libraries were built)

_native.ensure_loaded()

from . import _ops, _vmap  # noqa: E402,F401  (fake kernels, autograd, autocast, vmap)
from . import _onnx, backends, functional, overrides, reference  # noqa: E402
from .modules import LLTMCell  # noqa: E402
from .sequence import LLTM  # noqa: E402
from ._schedule import explain  # noqa: E402

overrides.apply_environment()
_onnx.install()  # the ONNX translations, once torch.onnx's exporter loads

__all__ = ["LLTM", "LLTMCell", "backends", "build_info", "explain", "functional", "overrides",
           "reference"]
__version__ = "0.1.0"
