"""lltm: the LLTM recurrent unit for PyTorch, with native kernels in C and CUDA C.

    import lltm
    cell = lltm.LLTMCell(32, 128)
    h, c = cell(torch.randn(16, 32))

Operators: ``torch.ops.lltm.cell_forward`` / ``cell_backward`` (see
``csrc/core/lltm.h`` for the math and the shapes).
"""
from . import _native

_native.ensure_loaded()

from . import _ops  # noqa: E402,F401  (fake kernels and autograd)
from . import functional, reference  # noqa: E402
from .modules import LLTMCell  # noqa: E402

__all__ = ["LLTMCell", "functional", "reference"]
__version__ = "0.1.0"
