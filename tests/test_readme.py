"""Every ```python block of README.md runs as written (CPU), each in a fresh
namespace, in the order they appear."""
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _python_blocks():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    blocks = []
    for match in re.finditer(r"^```python[^\n]*\n(.*?)^```", text, re.S | re.M):
        line = text.count("\n", 0, match.start()) + 1
        blocks.append(pytest.param(match.group(1), id=f"README.md:{line}"))
    return blocks


BLOCKS = _python_blocks()


def test_readme_has_python_blocks():
    assert BLOCKS, "README.md has no ```python block"


@pytest.mark.parametrize("code", BLOCKS)
def test_readme_block_runs(code):
    exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
