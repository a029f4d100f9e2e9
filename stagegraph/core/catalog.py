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
from stagegraph.core.registry import Registry, origin_of
from stagegraph.errors import GraphError, StagegraphError, UnknownGraphError

GRAPH_SUFFIXES = (".yaml", ".yml", ".json")


class _Shipped:
    """A graph definition shipped in ``stagegraph.graphs`` (a module or a graph file)."""

    def __init__(self, name: str, path: Path) -> None:
        self.name, self.path = name, path

    def load(self) -> Graph:
        if self.path.suffix == ".py":
            return _from_module(
                importlib.import_module(f"stagegraph.graphs.{self.name}"), self.name
            )
        return _load_path(self.path)


def _discover_shipped() -> None:
    """Index ``graphs/``: a YAML/JSON file wins over a module of the same stem."""
    root = resources.files("stagegraph.graphs")
    found: dict[str, Path] = {}
    for item in sorted(root.iterdir(), key=lambda item: item.name):
        stem, suffix = Path(item.name).stem, Path(item.name).suffix
        if item.name.startswith("_") or suffix not in (".py", *GRAPH_SUFFIXES):
            continue
        if stem not in found or found[stem].suffix == ".py":
            found[stem] = Path(str(item))
    for stem, path in found.items():
        GRAPHS.add_shipped(stem, _Shipped(stem, path), f"the shipped graph {path.name}")


#: Graph names: the shipped ``graphs/`` definitions and those of :func:`register_graph`.
GRAPHS: Registry[Graph] = Registry(
    "graph", error=UnknownGraphError, discover=_discover_shipped, discover_first=True
)


def list_graphs() -> list[str]:
    """Names of the shipped graphs and of those registered (by plugins)."""
    return GRAPHS.names()


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
    origin = f"graph {build.name!r}" if isinstance(build, Graph) else origin_of(build)
    return GRAPHS.register(name, build, origin=origin)


def load_graph(name: str) -> Graph:
    """A graph by name (shipped in ``graphs/`` or registered) or by path to a
    ``.py``/``.yaml``/``.json`` file."""
    path = Path(name)
    if path.suffix in (".py", *GRAPH_SUFFIXES):
        if not path.exists():
            raise UnknownGraphError(f"graph file {name} does not exist")
        return _load_path(path)
    build = GRAPHS.entry(name)
    if isinstance(build, _Shipped):
        return build.load()
    if isinstance(build, Graph):
        graph = build
    else:
        with _user_code(f"graph {name!r}: {GRAPHS.origin(name)}"):
            graph = build()
    if not isinstance(graph, Graph):
        raise GraphError(f"graph {name!r}: {GRAPHS.origin(name)} returned "
                         f"{type(graph).__name__}, not a Graph")  # fmt: skip
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
