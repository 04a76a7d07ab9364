"""A small driver for compute-sanitizer (memcheck, racecheck): every CUDA cell
kernel, both routes, every dtype, the shapes of tests/test_cuda_cell.py (each
tile configuration of the fused kernels among them), and the large tile
configurations once more in float32. Run by scripts/gpu_check.sh as

    compute-sanitizer --tool memcheck --error-exitcode 9 python3 scripts/sanitize_cuda.py

Exit status 0 and "sanitize driver: N steps ok" when every step ran; the
sanitizer's own exit code reports what it found.
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import lltm  # noqa: E402
from lltm import _native  # noqa: E402

SHAPES = [(1, 1, 1), (1, 5, 3), (3, 7, 5), (3, 2, 33), (16, 32, 128), (5, 300, 17),
          (64, 17, 65), (2, 0, 4), (7, 128, 7), (200, 9, 40),
          (4, 200, 96), (13, 150, 257)]
LARGE = (300, 100, 777)
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def main() -> int:
    assert torch.cuda.is_available() and _native.has_cuda_kernels(), "needs the CUDA kernels"
    quick = "--quick" in sys.argv  # racecheck: fewer dtypes (it is slow)
    steps = 0
    for policy in ("fused", "cublas"):
        lltm.overrides.set_matmul(policy)
        for dtype in DTYPES[:2] if quick else DTYPES:
            for B, I, H in SHAPES + ([LARGE] if dtype == torch.float32 else []):
                x, W, b, h, c = (torch.randn(*s, device="cuda", dtype=dtype)
                                 for s in ((B, I), (3 * H, I + H), (3 * H,), (B, H), (B, H)))
                new_h, new_cell, gates = torch.ops.lltm.cell_forward(x, W, b, h, c)
                grads = torch.ops.lltm.cell_backward(torch.randn_like(new_h),
                                                     torch.randn_like(new_cell), new_cell, gates,
                                                     x, h, W)
                torch.cuda.synchronize()
                if dtype in (torch.float32, torch.float64):  # values: tests/test_cuda_cell.py
                    assert all(torch.isfinite(g).all() for g in grads), (policy, dtype, B, I, H)
                steps += 1
    lltm.overrides.set_matmul("auto")
    print(f"sanitize driver: {steps} steps ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
