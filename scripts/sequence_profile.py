"""One forward and backward of one LLTM layer on the GPU, for profilers:

    ncu -k regex:sequence_ --launch-count 2 python3 scripts/sequence_profile.py 64 256 512 100

Arguments B I H T (default 16 32 128 100); LLTM_CUDA_SEQUENCE picks the route.
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import lltm  # noqa: E402

B, I, H, T = (int(a) for a in (sys.argv[1:5] if len(sys.argv) >= 5 else (16, 32, 128, 100)))
m = lltm.LLTM(I, H).cuda()
x = torch.randn(T, B, I, device="cuda", requires_grad=True)
out, (h, c) = m(x)
(out.sum() + h.sum() + c.sum()).backward()
torch.cuda.synchronize()
print("profiled B I H T =", B, I, H, T)
