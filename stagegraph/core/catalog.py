"""Finding graphs by name: the ``graphs/`` definitions shipped as ``stagegraph.graphs``.

A graph name is a module ``graphs/NAME.py`` (defining ``build() -> Graph`` or ``graph``) or a
file ``graphs/NAME.yaml``/``.json``; a path to such a file works anywhere.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from importlib import resources
from pathlib import Path

from stagegraph.core.graph import Graph
from stagegraph.errors import GraphError, UnknownGraphError, unknown_name_message

GRAPH_SUFFIXES = (".yaml", ".yml", ".json")


def list_graphs() -> list[str]:
    root = resources.files("stagegraph.graphs")
    names = {
        Path(item.name).stem
        for item in root.iterdir()
        if item.name.endswith((".py", *GRAPH_SUFFIXES)) and not item.name.startswith("_")
    }
    return sorted(names)


def load_graph(name: str) -> Graph:
    """A graph by name (from ``graphs/``) or by path to a ``.py``/``.yaml``/``.json`` file."""
    path = Path(name)
    if path.suffix in (".py", *GRAPH_SUFFIXES):
        if not path.exists():
            raise UnknownGraphError(f"graph file {name} does not exist")
        return _load_path(path)
    root = resources.files("stagegraph.graphs")
    for suffix in GRAPH_SUFFIXES:
        candidate = root / f"{name}{suffix}"
        if candidate.is_file():
            return _load_path(Path(str(candidate)))
    if (root / f"{name}.py").is_file():
        return _from_module(importlib.import_module(f"stagegraph.graphs.{name}"), name)
    raise UnknownGraphError(unknown_name_message("graph", name, list_graphs()))


def _load_path(path: Path) -> Graph:
    if path.suffix == ".py":
        module_name = f"stagegraph._user_graphs.{path.stem}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
        return _from_module(module, str(path))
    from stagegraph.core.graphfile import load_graph_file

    return load_graph_file(path)


def _from_module(module: object, where: str) -> Graph:
    build = getattr(module, "build", None)
    graph = build() if callable(build) else getattr(module, "graph", None)
    if not isinstance(graph, Graph):
        raise GraphError(f"{where}: a graph module must define build() -> Graph or 'graph'")
    return graph
