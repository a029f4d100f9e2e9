"""What ``stagegraph validate`` can know about a graph without a payload, beyond its
structure (which :class:`~stagegraph.core.graph.Graph` checks when built):

* the files a stage's config names (fields marked ``GRAPH_PATH``) exist;
* each stage's config is sound where only parsing can tell (:meth:`Config.static_problems`:
  pass pipelines parse, transform files parse and hold their entry).

The stage order's IR levels are checked when the graph is built (levels flow through
``Module["any"]`` ports: :meth:`Graph.output_type`), so a tensor module that reaches
``linalg_to_loops`` through a ``canonicalize,cse`` pipeline is refused there already.
"""

from __future__ import annotations

from pathlib import Path

from stagegraph.core.graph import Graph
from stagegraph.core.ports import GRAPH_PATH, Config
from stagegraph.errors import GraphError, InvalidGraphError


def static_problems(graph: Graph) -> list[GraphError]:
    """Every problem found, each naming the graph, the stage and (for levels) the ports."""
    problems: list[GraphError] = []
    for name in graph.order():
        stage = graph.stages.get(name)
        if stage is None:
            continue
        for problem in _missing_files(stage.config) + stage.config.static_problems():
            problems.append(
                GraphError(
                    f"graph {graph.name!r}: stage {name!r} ({stage.factory.name}): {problem}"
                )
            )
    return problems


def check_statics(graph: Graph, source: str | None = None) -> None:
    """Raise the problems :func:`static_problems` finds (one alone, several together).

    Raises:
        GraphError: one problem; InvalidGraphError: several.
    """
    problems = static_problems(graph)
    if source:
        problems = [GraphError(f"{source}: {p}") for p in problems]
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise InvalidGraphError(graph.name, problems)


def _missing_files(config: Config) -> list[str]:
    """Path fields (marked ``GRAPH_PATH``: a params file, a schedule, a database) that name
    no file."""
    missing = []
    for name, info in type(config).model_fields.items():
        value = getattr(config, name)
        is_path = GRAPH_PATH in info.metadata and isinstance(value, str) and value
        if is_path and not Path(value).is_file():
            missing.append(f"{name}: {value} does not exist")
    return missing
