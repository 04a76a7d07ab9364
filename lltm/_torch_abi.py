"""The table through which the native libraries call torch's stable C ABI.

The libraries carry no link-time dependency on torch's libraries (no DT_NEEDED
entry, so the wheel passes the manylinux policy and no torch file is needed to
build). Each calls the functions declared in csrc/binding/torch_stable_abi.h
through a table of pointers that ``lltm_resolve_torch()`` fills, when Python
loads the library, from the torch libraries the process has already loaded
(csrc/binding/torch_abi_loader.c: dlopen(soname, RTLD_NOLOAD) and dlsym).

This module writes that table from the header, so the two cannot disagree:

- csrc/binding/torch_stable_abi_table.h: the struct of pointers, each typed
  like the prototype it stands for, and a macro per function that turns a call
  by the function's own name into a call through the table (the binding's
  source reads as plain calls; an optional function torch lacks is NULL, as a
  weak symbol would be);
- csrc/binding/torch_stable_abi_table.c: the table itself and the list the
  loader walks (name, torch library, optional or not, slot).

Both are committed; ``python lltm/_torch_abi.py`` rewrites them after the
header changed, and the build refuses to run on stale ones (``check``).
Plain Python (no torch): lltm/build.py uses it.
"""
from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

# The CUDA-only part of the header (inside this #ifdef) lives in libtorch_cuda.
CUDA_GUARD = "LLTM_WITH_CUDA"
# Marks a function that an older torch may lack: its pointer stays NULL.
OPTIONAL = "LLTM_OPTIONAL"
CPU_LIB, CUDA_LIB = "libtorch_cpu.so", "libtorch_cuda.so"
LIBRARY_CODES = {CPU_LIB: "LLTM_TORCH_CPU_LIBRARY", CUDA_LIB: "LLTM_TORCH_CUDA_LIBRARY"}

HEADER = "torch_stable_abi.h"
TABLE_HEADER = "torch_stable_abi_table.h"
TABLE_SOURCE = "torch_stable_abi_table.c"


@dataclass(frozen=True)
class Function:
    name: str
    library: str      # CPU_LIB or CUDA_LIB
    optional: bool
    declaration: str  # the prototype on one line, without ';' and LLTM_OPTIONAL

    def pointer_declaration(self) -> str:
        """``ret (*name)(params)``: a pointer of the prototype's type."""
        return re.sub(rf"\b{self.name}\s*\(", f"(*{self.name})(", self.declaration, count=1)


def parse(header: Path) -> list[Function]:
    """The functions ``header`` declares, in order. Names starting with
    ``lltm_`` are ours, not torch's, and are left out."""
    text = re.sub(r"/\*.*?\*/", " ", header.read_text(), flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    functions: list[Function] = []
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
            if decl.startswith(("typedef", "extern", "struct", "enum")) or "(" not in decl:
                continue
            optional = re.search(rf"\b{OPTIONAL}\b", decl) is not None
            decl = " ".join(re.sub(rf"\b{OPTIONAL}\b", " ", decl).split())
            decl = re.sub(r"\(\s+", "(", re.sub(r"\s+\)", ")", decl))
            match = re.match(r"[\w\s\*]*?\b([A-Za-z_]\w*)\s*\(", decl)
            if match and not match.group(1).startswith("lltm_"):
                functions.append(Function(match.group(1), lib, optional, decl))
    if not any(f.library == CPU_LIB for f in functions):
        raise ValueError(f"no function declarations found in {header}")
    names = [f.name for f in functions]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"{header} declares {', '.join(duplicates)} more than once")
    return functions


_NOTICE = (" * Generated from torch_stable_abi.h by lltm/_torch_abi.py (run\n"
           " * `python lltm/_torch_abi.py` after changing the header); do not edit.\n")


def _by_library(functions: list[Function], body) -> list[str]:
    """Lines for the CPU functions, then the CUDA ones inside #ifdef."""
    lines = []
    for lib in (CPU_LIB, CUDA_LIB):
        chosen = [f for f in functions if f.library == lib]
        if not chosen:
            continue
        if lib == CUDA_LIB:
            lines.append(f"#ifdef {CUDA_GUARD}")
        lines += [body(f) for f in chosen]
        if lib == CUDA_LIB:
            lines.append("#endif")
    return lines


def table_header(functions: list[Function]) -> str:
    pointers = _by_library(functions, lambda f: f"    {f.pointer_declaration()};")
    redirects = _by_library(functions, lambda f: f"#define {f.name} (lltm_torch_abi.{f.name})")
    checks = _by_library(functions, lambda f: (
        f"static_assert(std::is_same<decltype(&{f.name}), "
        f"decltype(lltm_torch_abi.{f.name})>::value, \"{f.name}\");"))
    return "\n".join([
        "/*",
        " * torch_stable_abi_table.h - the pointers through which the binding calls",
        " * torch's stable C ABI, one per function of torch_stable_abi.h (which",
        " * includes this file), filled at load time by lltm_resolve_torch()",
        " * (torch_abi_loader.h). The macros make a call by the function's own name a",
        " * call through its pointer; an optional function that torch lacks is NULL.",
        " *",
        _NOTICE.rstrip("\n"),
        " */",
        "#ifndef LLTM_BINDING_TORCH_STABLE_ABI_TABLE_H",
        "#define LLTM_BINDING_TORCH_STABLE_ABI_TABLE_H",
        "",
        "#ifdef __cplusplus",
        "#include <type_traits>",
        'extern "C" {',
        "#endif",
        "",
        "struct lltm_torch_abi {",
        *pointers,
        "};",
        "",
        '/* one per library, hidden: the CPU and CUDA libraries each have their own */',
        'extern struct lltm_torch_abi lltm_torch_abi __attribute__((visibility("hidden")));',
        "",
        "#ifdef __cplusplus",
        "}",
        "/* tests/abi/abi_drift_check.cpp: each pointer has its function's type */",
        *checks,
        "#endif",
        "",
        "#ifndef LLTM_TORCH_ABI_NO_REDIRECT /* (defined by the table's definition) */",
        *redirects,
        "#endif",
        "",
        "#endif /* LLTM_BINDING_TORCH_STABLE_ABI_TABLE_H */",
        "",
    ])


def table_source(functions: list[Function]) -> str:
    entries = _by_library(functions, lambda f: (
        f"    {{\"{f.name}\", {LIBRARY_CODES[f.library]}, {'true' if f.optional else 'false'}, "
        f"&lltm_torch_abi.{f.name}}},"))
    return "\n".join([
        "/*",
        " * torch_stable_abi_table.c - the table of torch_stable_abi_table.h and the",
        " * list of its entries that lltm_resolve_torch() (torch_abi_loader.c) fills.",
        " *",
        _NOTICE.rstrip("\n"),
        " */",
        "#define LLTM_TORCH_ABI_NO_REDIRECT",
        '#include "torch_abi_loader.h"',
        "",
        "struct lltm_torch_abi lltm_torch_abi;",
        "",
        "const lltm_torch_symbol lltm_torch_symbols[] = {",
        *entries,
        "};",
        "",
        "const size_t lltm_torch_symbol_count = sizeof lltm_torch_symbols / sizeof lltm_torch_symbols[0];",
        "",
    ])


def generated(csrc: Path) -> dict[Path, str]:
    """{path: the text it must have} for the two generated files."""
    binding = csrc / "binding"
    functions = parse(binding / HEADER)
    return {binding / TABLE_HEADER: table_header(functions),
            binding / TABLE_SOURCE: table_source(functions)}


def stale(csrc: Path) -> list[Path]:
    """The generated files whose text is not what the header gives now."""
    return [path for path, text in generated(csrc).items()
            if not path.exists() or path.read_text() != text]


def write(csrc: Path) -> list[Path]:
    changed = stale(csrc)
    for path, text in generated(csrc).items():
        if path in changed:
            path.write_text(text)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write csrc/binding/torch_stable_abi_table.{h,c} "
                                     "from csrc/binding/torch_stable_abi.h.")
    parser.add_argument("--check", action="store_true", help="only say whether they are current "
                        "(exit status 1 when not)")
    parser.add_argument("--csrc", default=str(Path(__file__).resolve().parent.parent / "csrc"))
    args = parser.parse_args(argv)
    csrc = Path(args.csrc)
    if args.check:
        out = stale(csrc)
        for path in out:
            print(f"{path} is out of date with {HEADER}", file=sys.stderr)
        return 1 if out else 0
    for path in write(csrc):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
