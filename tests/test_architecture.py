"""The package's shape: layered imports (import-linter's contracts in pyproject.toml), no
import circle anywhere (lazy and type-checking imports included), and modules and functions
small enough to read (the project's limits: 500 lines a module, 80 a function)."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "stagegraph"
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80


def oversized(root: Path) -> list[str]:
    """Modules under ``root`` over MAX_MODULE_LINES and functions (methods and nested ones
    too, decorators not counted) over MAX_FUNCTION_LINES, as ``path[:line] name: lines``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        where = path.relative_to(root.parent)
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            found.append(f"{where}: {lines} lines")
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    found.append(f"{where}:{node.lineno} {node.name}: {length} lines")
    return found


def test_no_module_or_function_is_oversized():
    assert oversized(PACKAGE) == []


def test_the_size_check_finds_a_long_module_and_function(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (package / "long.py").write_text(f"def long():\n{body}\n")
    (package / "big.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    (package / "fine.py").write_text("def short():\n    return 1\n")
    assert oversized(package) == [
        f"pkg/big.py: {MAX_MODULE_LINES + 1} lines",
        f"pkg/long.py:1 long: {MAX_FUNCTION_LINES + 1} lines",
    ]


def test_no_import_cycles():
    grimp = pytest.importorskip("grimp")
    import networkx as nx

    graph = grimp.build_graph("stagegraph")
    edges = nx.DiGraph()
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            edges.add_edge(module, imported)
    circles = [sorted(c) for c in nx.strongly_connected_components(edges) if len(c) > 1]
    assert circles == []


def test_import_contracts_are_kept():
    lint = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    if not Path(lint).exists():
        pytest.skip("import-linter is not installed")
    done = subprocess.run([lint], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "BROKEN" not in done.stdout
