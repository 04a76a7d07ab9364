"""Stub libraries standing in for torch's at link time.

The native libraries are linked against libraries named like torch's
(libtorch_cpu.so, libtorch_cuda.so, libc10.so) that define, empty, each function
our own declarations of the stable C ABI (csrc/binding/torch_stable_abi.h)
name. The link then records those names, with no path and no torch file used;
at run time the torch imported first has them loaded, and the dynamic loader
takes its libraries by name. Plain Python (no torch): lltm/build.py uses it.
"""
from __future__ import annotations

import re
from pathlib import Path

# The CUDA-only part of the header (inside this #ifdef) lives in libtorch_cuda.
CUDA_GUARD = "LLTM_WITH_CUDA"
CPU_LIB, CUDA_LIB, C10_LIB = "libtorch_cpu.so", "libtorch_cuda.so", "libc10.so"


def declared_functions(header: Path) -> dict[str, list[str]]:
    """The functions ``header`` declares, by the torch library that defines
    them: {"libtorch_cpu.so": [...], "libtorch_cuda.so": [...]}."""
    text = re.sub(r"/\*.*?\*/", " ", header.read_text(), flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    libs: dict[str, list[str]] = {CPU_LIB: [], CUDA_LIB: []}
    lib, statement = CPU_LIB, ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            if re.match(rf"#\s*ifdef\s+{CUDA_GUARD}\b", stripped):
                lib = CUDA_LIB
            elif re.match(r"#\s*endif", stripped) and lib == CUDA_LIB:
                lib = CPU_LIB
            continue
        statement += " " + stripped
        while re.search(r"[;{}]", statement):
            cut = re.search(r"[;{}]", statement).start()
            decl, statement = statement[:cut].strip(), statement[cut + 1:]
            decl = re.sub(r"\bLLTM_WEAK\b|__attribute__\s*\(\(.*?\)\)", " ", decl).strip()
            if decl.startswith("typedef") or "(" not in decl:
                continue
            match = re.match(r"[\w\s\*]*?\b([A-Za-z_]\w*)\s*\(", decl)
            if match:
                libs[lib].append(match.group(1))
    if not libs[CPU_LIB]:
        raise ValueError(f"no function declarations found in {header}")
    return libs


def write_sources(header: Path, folder: Path) -> dict[str, Path]:
    """One C file per stub library: {soname: path}."""
    sources = {}
    for soname, names in {**declared_functions(header), C10_LIB: []}.items():
        path = folder / (soname[:-3] + "_stub.c")
        path.write_text("".join(f"void {n}(void) {{}}\n" for n in names)
                        + "void lltm_stub_library(void) {}\n")
        sources[soname] = path
    return sources
