"""GPU architectures, in PyTorch's notation ("8.6", "9.0+PTX", "9.0a"): what
TORCH_CUDA_ARCH_LIST means, the build's default, nvcc's -gencode flags, and
which GPUs code built for them runs on. Plain Python (no torch): the build
(lltm/build.py) and the loader (lltm/_native.py) both use it."""
from __future__ import annotations

import re
import subprocess

# PyTorch's names in TORCH_CUDA_ARCH_LIST (torch.utils.cpp_extension).
NAMED_ARCHS = {
    "Turing": "7.5+PTX", "Ampere+Tegra": "8.7", "Ampere": "8.0;8.6+PTX", "Ada": "8.9+PTX",
    "Hopper": "9.0+PTX", "Blackwell+Tegra": "11.0", "Blackwell": "10.0;10.3;12.0;12.1+PTX",
}
# Without TORCH_CUDA_ARCH_LIST and without a visible GPU: every architecture the
# installed nvcc supports in this range, plus PTX of the newest.
FAT_RANGE = ((7, 5), (12, 0))
VISIBLE_GPUS = "the visible GPUs"
ENVIRONMENT = "TORCH_CUDA_ARCH_LIST"
DEFAULT = "the default (every nvcc architecture sm_75 to sm_120, PTX of the newest)"
_ARCH = re.compile(r"(\d+)\.(\d+)([af]?)(\+PTX)?")


def parse_arch_list(text: str) -> list[str]:
    """TORCH_CUDA_ARCH_LIST in PyTorch's syntax ("8.0;8.6;9.0+PTX", spaces or
    semicolons, PyTorch's names like "Hopper") -> ["8.0", "8.6", "9.0+PTX"]."""
    for name, archs in NAMED_ARCHS.items():
        text = re.sub(rf"(?<![\w+]){re.escape(name)}(?![\w+])", archs, text)
    archs = []
    for item in text.replace(",", ";").replace(" ", ";").split(";"):
        if not item:
            continue
        if not _ARCH.fullmatch(item):
            raise ValueError(f"TORCH_CUDA_ARCH_LIST: unknown CUDA architecture {item!r} "
                             "(expected e.g. \"8.0;8.6;9.0+PTX\")")
        if item not in archs:
            archs.append(item)
    if not archs:
        raise ValueError("TORCH_CUDA_ARCH_LIST is set but names no architecture")
    return archs


def nvcc_supported(nvcc: str) -> list[tuple[int, int]]:
    """(major, minor) of every sm_XY that ``nvcc --list-gpu-code`` names."""
    proc = subprocess.run([nvcc, "--list-gpu-code"], capture_output=True, text=True)
    return sorted({(int(m.group(1)[:-1]), int(m.group(1)[-1]))
                   for m in re.finditer(r"\bsm_(\d+)\b", proc.stdout)})


def fat_default(nvcc: str) -> list[str]:
    lo, hi = FAT_RANGE
    archs = [f"{a}.{b}" for a, b in nvcc_supported(nvcc) if lo <= (a, b) <= hi]
    if not archs:
        raise ValueError(f"{nvcc} supports no GPU architecture from sm_{lo[0]}{lo[1]} "
                         f"to sm_{hi[0]}{hi[1]}: set TORCH_CUDA_ARCH_LIST")
    archs[-1] += "+PTX"
    return archs


def gencode_flags(archs: list[str]) -> list[str]:
    """nvcc's flags for ``archs``: machine code for each, PTX where "+PTX"."""
    flags = []
    for arch in archs:
        num = arch.split("+")[0].replace(".", "")
        flags.append(f"-gencode=arch=compute_{num},code=sm_{num}")
        if arch.endswith("+PTX"):
            flags.append(f"-gencode=arch=compute_{num},code=compute_{num}")
    return flags


def runs_on(arch: str, capability: tuple[int, int]) -> bool:
    """Does code built for ``arch`` run on a GPU of ``capability``? Machine
    code runs on its own major version at the same or a higher minor ("a":
    that exact GPU only); PTX compiles for any newer GPU."""
    match = _ARCH.fullmatch(arch)
    if not match:
        return False
    built = (int(match.group(1)), int(match.group(2)))
    variant, ptx = match.group(3), bool(match.group(4))
    capability = tuple(capability)
    if ptx and not variant and built <= capability:
        return True
    if variant == "a":
        return built == capability
    return built[0] == capability[0] and built[1] <= capability[1]


def unsupported_gpu_message(device: int, name: str, capability: tuple[int, int],
                            archs: list[str]) -> str | None:
    """The error for a GPU that code built for ``archs`` cannot run on, else None."""
    if any(runs_on(a, capability) for a in archs):
        return None
    major, minor = capability
    return (f"lltm: the GPU cuda:{device} ({name}) is sm_{major}{minor} (compute capability "
            f"{major}.{minor}), but lltm's CUDA library was built for "
            f"{', '.join(archs) or 'no architecture'} only. Rebuild it for this GPU: "
            f"TORCH_CUDA_ARCH_LIST=\"{major}.{minor}\" pip install . (from a source "
            f"checkout), or `python lltm/build.py --cuda yes` there (with no "
            f"TORCH_CUDA_ARCH_LIST the build targets the GPUs it sees).")
