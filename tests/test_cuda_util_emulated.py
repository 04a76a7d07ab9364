"""The CUDA library's small generic pieces (csrc/core/lltm_cuda_util.cu)
compiled against the fiber emulator (the ``emu`` fixture, conftest.py)."""
import ctypes

import torch


def test_join_rows(emu):
    """lltm_cuda_join_rows: dst row r = [row r of a | row r of b], in the
    widest unit every row and address allows (16 bytes down to 1: rows of
    odd byte counts, addresses off alignment); nothing to do for no rows;
    an argument error for a missing array."""
    emu.lltm_cuda_join_rows.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                        ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t,
                                        ctypes.c_void_p]
    emu.lltm_cuda_join_rows.restype = ctypes.c_int
    g = torch.Generator().manual_seed(7)
    for a_bytes, b_bytes, rows, offset in [(64, 32, 5, 0), (256, 128, 33, 0), (24, 8, 3, 0),
                                           (12, 4, 7, 0), (6, 10, 4, 0), (3, 5, 9, 0),
                                           (64, 32, 5, 1), (0, 7, 3, 0), (5, 0, 3, 0)]:
        a = torch.randint(0, 256, (rows * a_bytes + 16,), dtype=torch.uint8, generator=g)
        b = torch.randint(0, 256, (rows * b_bytes + 16,), dtype=torch.uint8, generator=g)
        dst = torch.zeros(rows * (a_bytes + b_bytes) + 16, dtype=torch.uint8)
        pa, pb, pd = (t.data_ptr() + offset for t in (a, b, dst))
        assert emu.lltm_cuda_join_rows(pd, pa, a_bytes, pb, b_bytes, rows, None) == 0
        want = torch.cat([a[offset:offset + rows * a_bytes].view(rows, a_bytes),
                          b[offset:offset + rows * b_bytes].view(rows, b_bytes)], dim=1)
        got = dst[offset:offset + rows * (a_bytes + b_bytes)].view(rows, a_bytes + b_bytes)
        assert torch.equal(got, want), (a_bytes, b_bytes, rows, offset)
        assert not dst[:offset].any() and not dst[offset + got.numel():].any()
    dst = torch.zeros(16, dtype=torch.uint8)
    assert emu.lltm_cuda_join_rows(dst.data_ptr(), None, 4, None, 0, 0, None) == 0  # no rows
    assert emu.lltm_cuda_join_rows(dst.data_ptr(), None, 4, None, 0, 2, None) != 0
