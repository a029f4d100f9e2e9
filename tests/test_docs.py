"""The documentation's Python examples run: each page's ``python`` blocks, in order, in a
fresh process (pages that time or tune are marked slow)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
SLOW = {"getting-started", "benchmarking", "tuning", "mpi"}
NEEDS = {"from-pytorch": "torch", "gpu": "llvmlite"}  # pages whose examples need an extra
PAGES = sorted([DOCS / "getting-started.md", *(DOCS / "guides").glob("*.md")])


def python_blocks(page: Path) -> str:
    return "\n".join(re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.DOTALL))


@pytest.mark.parametrize(
    "page",
    [pytest.param(p, id=p.stem, marks=[pytest.mark.slow] if p.stem in SLOW else []) for p in PAGES],
)
def test_examples_run(page, tmp_path):
    code = python_blocks(page)
    if not code:
        pytest.skip("no Python example")
    if page.stem in NEEDS:
        pytest.importorskip(NEEDS[page.stem])
    script = tmp_path / f"{page.stem.replace('-', '_')}_example.py"
    script.write_text(code)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
