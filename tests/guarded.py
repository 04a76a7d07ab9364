"""Guarded output buffers for the CPU-emulation tests of the CUDA kernels
(test_cuda_emulated.py, test_cuda_sequence_emulated.py)."""
import ctypes

import torch

SENTINEL = 7777.0  # guard zones around every output: must stay untouched


class Guarded:
    """An output poisoned with NaN (or holding ``fill``, for in/out arguments)
    inside guard zones of SENTINEL: afterwards every element must be written
    and no guard touched."""

    GUARD = 67

    def __init__(self, shape, dtype, fill=None):
        n = 1
        for s in shape:
            n *= s
        self.buf = torch.full((n + 2 * self.GUARD,), SENTINEL, dtype=dtype)
        self.buf[self.GUARD:self.GUARD + n] = float("nan") if fill is None else fill.reshape(-1)
        self.n, self.shape = n, shape

    @property
    def ptr(self):
        return ctypes.c_void_p(self.buf.data_ptr() + self.GUARD * self.buf.element_size())

    @property
    def value(self):
        return self.buf[self.GUARD:self.GUARD + self.n].view(self.shape)

    def check(self, name):
        g = self.GUARD
        assert (self.buf[:g] == SENTINEL).all() and (self.buf[g + self.n:] == SENTINEL).all(), \
            f"{name}: a write outside the output"
        assert not torch.isnan(self.value).any(), f"{name}: elements left unwritten"
        return self.value


def as_ptr(t):
    """The data pointer of a tensor, for ctypes."""
    return ctypes.c_void_p(t.data_ptr())
