"""Finding graphs by name: the ``graphs/`` definitions shipped as ``stagegraph.graphs``.

A graph name is a module ``graphs/NAME.py`` (defining ``build() -> Graph`` or ``graph``), a
file ``graphs/NAME.yaml``/``.json``, or a name given to :func:`register_graph` (by a plugin);
a path to such a file works anywhere.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path

from stagegraph.core.graph import Graph
from stagegraph.core.plugins import ensure_plugins
from stagegraph.errors import (
    DuplicateNameError,
    GraphError,
    StagegraphError,
    UnknownGraphError,
    unknown_name_message,
)

GRAPH_SUFFIXES = (".yaml", ".yml", ".json")

_REGISTERED: dict[str, Callable[[], Graph] | Graph] = {}


def _shipped() -> list[str]:
    root = resources.files("stagegraph.graphs")
    names = {
        Path(item.name).stem
        for item in root.iterdir()
        if item.name.endswith((".py", *GRAPH_SUFFIXES)) and not item.name.startswith("_")
    }
    return sorted(names)


def list_graphs() -> list[str]:
    """Names of the shipped graphs and of those registered (by plugins)."""
    ensure_plugins()
    return sorted({*_shipped(), *_REGISTERED})


def register_graph(
    name: str, build: Callable[[], Graph] | Graph | None = None
) -> Callable[..., Graph] | Graph | Callable[[Callable[[], Graph]], Callable[[], Graph]]:
    """Make a graph available by ``name`` (``stagegraph run NAME ...``, ``load_graph``).

    ``build`` is a function returning the :class:`Graph` (called on every lookup, so each
    caller gets a graph it may rewrite) or a graph. Without ``build``, a decorator.

    Raises:
        DuplicateNameError: ``name`` is a shipped graph, or another definition has it
            (registering the same function again, as a re-import does, is no clash).
    """
    if build is None:
        return lambda fn: register_graph(name, fn)
    if not (callable(build) or isinstance(build, Graph)):
        raise TypeError(f"register_graph({name!r}, ...) needs a Graph or a function building one")
    if name in _shipped():
        raise DuplicateNameError(
            f"graph name {name!r} is already taken by a shipped graph; {_origin(build)} must "
            f"use another name"
        )
    other = _REGISTERED.get(name)
    if other is not None and other is not build and _origin(other) != _origin(build):
        raise DuplicateNameError(
            f"graph name {name!r} is already registered by {_origin(other)}; "
            f"{_origin(build)} must use another name"
        )
    _REGISTERED[name] = build
    return build


def _origin(obj: object) -> str:
    if isinstance(obj, Graph):
        return f"graph {obj.name!r}"
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


def load_graph(name: str) -> Graph:
    """A graph by name (shipped in ``graphs/`` or registered) or by path to a
    ``.py``/``.yaml``/``.json`` file."""
    path = Path(name)
    if path.suffix in (".py", *GRAPH_SUFFIXES):
        if not path.exists():
            raise UnknownGraphError(f"graph file {name} does not exist")
        return _load_path(path)
    ensure_plugins()
    if name in _REGISTERED:
        return _from_registered(name)
    root = resources.files("stagegraph.graphs")
    for suffix in GRAPH_SUFFIXES:
        candidate = root / f"{name}{suffix}"
        if candidate.is_file():
            return _load_path(Path(str(candidate)))
    if (root / f"{name}.py").is_file():
        return _from_module(importlib.import_module(f"stagegraph.graphs.{name}"), name)
    raise UnknownGraphError(unknown_name_message("graph", name, list_graphs()))


def _from_registered(name: str) -> Graph:
    build = _REGISTERED[name]
    if isinstance(build, Graph):
        graph = build
    else:
        with _user_code(f"graph {name!r}: {_origin(build)}"):
            graph = build()
    if not isinstance(graph, Graph):
        raise GraphError(f"graph {name!r}: {_origin(build)} returned {type(graph).__name__}, "
                         f"not a Graph")  # fmt: skip
    return graph.renamed(name)  # a graph derived from another (replace) keeps its own name


def _load_path(path: Path) -> Graph:
    if path.suffix == ".py":
        return _from_module(_exec_graph_module(path), str(path))
    from stagegraph.core.graphfile import load_graph_file

    return load_graph_file(path)


def _exec_graph_module(path: Path) -> object:
    """Run a ``.py`` graph file as the module named after its stem, its folder on
    ``sys.path``: it may import modules beside it, and the stages it declares can be named
    ``STEM:attribute`` in graph files. A stem that names another module already imported
    (``json.py``) falls back to a private module name."""
    path = path.resolve()
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    module_name = path.stem
    existing = sys.modules.get(module_name)
    if not module_name.isidentifier() or (
        existing is not None and Path(getattr(existing, "__file__", "") or "").resolve() != path
    ):
        module_name = f"stagegraph._user_graphs.{path.stem}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except ModuleNotFoundError as exc:
        sys.modules.pop(module_name, None)
        raise GraphError(
            f"graph file {path}: {exc} (modules beside the file and installed packages can be "
            f"imported; load other code with --plugin)"
        ) from exc
    except SyntaxError as exc:
        sys.modules.pop(module_name, None)
        raise GraphError(f"graph file {path}:{exc.lineno}: {exc.msg}") from exc
    except Exception as exc:
        sys.modules.pop(module_name, None)
        raise GraphError(f"graph file {path}: {_failure(exc)}") from exc
    return module


def _from_module(module: object, where: str) -> Graph:
    build = getattr(module, "build", None)
    if callable(build):
        with _user_code(f"{where}: build()"):
            graph = build()
    else:
        graph = getattr(module, "graph", None)
    if not isinstance(graph, Graph):
        raise GraphError(f"{where}: a graph module must define build() -> Graph or 'graph'")
    return graph


@contextlib.contextmanager
def _user_code(where: str) -> Iterator[None]:
    """Turn what a user's graph-building code raises into a :class:`GraphError` naming
    ``where`` and the line that raised, instead of a traceback."""
    try:
        yield
    except StagegraphError as exc:
        raise GraphError(f"{where}: {exc}") from exc
    except Exception as exc:
        raise GraphError(f"{where} raised {_failure(exc)}") from exc


def _failure(exc: BaseException) -> str:
    """``Type: message (at FILE:LINE)`` of an exception raised by user code."""
    from stagegraph.core.plugins import where_raised

    return f"{type(exc).__name__}: {exc}{where_raised(exc)}"
