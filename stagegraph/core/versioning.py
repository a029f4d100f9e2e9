"""Code versions for memo keys: the hash of a stage's module and of every in-project module
it imports (lazily too), found from the source without importing anything."""

from __future__ import annotations

import functools
import hashlib
import inspect
from typing import Any


def source_version(obj: Any) -> str:
    """Hash of the source of the module defining ``obj`` and of every module of the same
    package (and of stagegraph) it imports, at any depth, lazily imports included: editing
    a helper module (``matmul/schedule.py`` for ``x86.schedule``) changes the cache key."""
    module = inspect.getmodule(obj)
    if module is None:
        return hashlib.sha256(getattr(obj, "__qualname__", "").encode()).hexdigest()[:16]
    return dependency_version(module.__name__)


@functools.cache
def dependency_version(module_name: str) -> str:
    """Hash of ``module_name``'s source and its in-project imports' (see source_version)."""
    roots = {module_name.partition(".")[0], "stagegraph"}
    seen: dict[str, str] = {}
    todo = [module_name]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen[name] = _module_source(name)
        todo.extend(i for i in _imported_modules(name) if i.partition(".")[0] in roots)
    digest = hashlib.sha256()
    for name in sorted(seen):
        digest.update(f"{name}\0{seen[name]}\0".encode())
    return digest.hexdigest()[:16]


@functools.cache
def _module_source(name: str) -> str:
    path = _module_file(name)
    if path is None:
        return ""
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError:
        return ""


def _module_file(name: str) -> str | None:
    """The ``.py`` file of a module, found without importing it (importing
    ``stagegraph.mlir.bindings`` to hash it would load them)."""
    import importlib.util
    import os
    import sys

    loaded = sys.modules.get(name)
    if loaded is not None:
        path = getattr(loaded, "__file__", None)
        return path if path and path.endswith(".py") else None
    parent, _, leaf = name.rpartition(".")
    if not parent:
        spec = importlib.util.find_spec(name)  # a top-level name: nothing is imported
        origin = spec.origin if spec is not None else None
        return origin if origin and origin.endswith(".py") else None
    parent_file = _module_file(parent)
    if parent_file is None or not parent_file.endswith("__init__.py"):
        return None
    folder = os.path.dirname(parent_file)
    for candidate in (
        os.path.join(folder, f"{leaf}.py"),
        os.path.join(folder, leaf, "__init__.py"),
    ):
        if os.path.isfile(candidate):
            return candidate
    return None


@functools.cache
def _imported_modules(name: str) -> frozenset[str]:
    """Modules named by the import statements anywhere in the module (function bodies too)."""
    import ast

    try:
        tree = ast.parse(_module_source(name))
    except SyntaxError:
        return set()
    package = name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # submodules
    return frozenset(m for m in found if m)
