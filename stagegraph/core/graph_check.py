"""Validation of a :class:`~stagegraph.core.graph.Graph` as it is built: the types its
outputs carry, then every problem of its wiring at once (unknown stages and ports, type
mismatches, unconnected or doubly connected inputs, cycles, an untagged default splice).

Each check reads the graph's edge index (edges by destination) once: linear in the graph.
"""

from __future__ import annotations

import graphlib
from collections.abc import Mapping
from typing import Any

from stagegraph.core.graph_wiring import Edge, GraphInput
from stagegraph.core.ports import Module, compatible, port_name
from stagegraph.errors import (
    CycleError,
    DoublyConnectedPortError,
    EmptyGraphError,
    GraphError,
    PortTypeError,
    UnconnectedPortError,
    UnknownPortError,
    UnknownStageError,
    UnknownTagError,
    did_you_mean,
    unknown_name_message,
)

# ``graph`` below is the Graph being built (core.graph imports this module, not the reverse).
Graph = Any


def output_types(graph: Graph, order: list[str]) -> dict[tuple[str, str], type]:
    """The type each output carries in this graph: the declared one, except that a
    ``Module["any"]`` output of a stage whose module inputs are all ``any`` (a pass
    pipeline of unknown passes, a wrapper) carries the level fed into it, so a level
    mismatch further down is still found. ``order``: the nodes, producers first."""
    types: dict[tuple[str, str], type] = {}
    for name in order:
        node = graph.stages.get(name) or graph.inputs.get(name)
        if node is None:
            continue
        for port in node.outputs.values():
            types[(name, port.name)] = port.type
        if isinstance(node, GraphInput):
            continue
        module_ins = {p.name for p in node.inputs.values() if issubclass(p.type, Module)}
        if not module_ins or any(node.inputs[p].type.level != "any" for p in module_ins):
            continue
        fed = {
            types.get((e.src, e.src_port)) for e in graph.in_edges(name) if e.dst_port in module_ins
        }
        levels = {
            t.level for t in fed if t is not None and issubclass(t, Module) and t.level != "any"
        }
        if len(levels) != 1:
            continue
        level = levels.pop()
        for port in node.outputs.values():
            if issubclass(port.type, Module) and port.type.level == "any":
                types[(name, port.name)] = Module[level]
    return types


def check(graph: Graph, types: Mapping[tuple[str, str], type]) -> list[GraphError]:
    """Every problem of ``graph``, in a fixed order (the first is raised alone); ``types``:
    what its outputs carry (:func:`output_types`)."""
    problems: list[GraphError] = []
    if not graph.stages:
        problems.append(EmptyGraphError(f"graph {graph.name!r} has no stages"))
    feeds: dict[tuple[str, str], list[Edge]] = {}
    for edge in graph.edges:
        problems.extend(_check_edge(graph, edge, types, feeds))
    problems.extend(_check_inputs_connected(graph, feeds))
    problems.extend(_check_acyclic(graph))
    if graph.default_splice is not None and not graph.tagged(graph.default_splice):
        problems.append(
            UnknownTagError(
                f"graph {graph.name!r}: default splice tag {graph.default_splice!r} "
                "is on no stage" + did_you_mean(graph.default_splice, graph.tags)
            )
        )
    return problems


def _check_edge(
    graph: Graph,
    edge: Edge,
    types: Mapping[tuple[str, str], type],
    feeds: dict[tuple[str, str], list[Edge]],
) -> list[GraphError]:
    """An edge's problems: unknown nodes or ports, a graph input fed, incompatible types.
    A known input port it feeds is recorded in ``feeds``."""
    problems: list[GraphError] = []
    src = graph.stages.get(edge.src) or graph.inputs.get(edge.src)
    dst = graph.stages.get(edge.dst) or graph.inputs.get(edge.dst)
    for node_name, node in ((edge.src, src), (edge.dst, dst)):
        if node is None:
            nodes = [*graph.inputs, *graph.stages]
            problems.append(
                UnknownStageError(
                    f"graph {graph.name!r}: edge '{edge}' names "
                    + unknown_name_message("stage", node_name, nodes)
                )
            )
    if isinstance(dst, GraphInput):
        problems.append(GraphError(f"graph {graph.name!r}: edge '{edge}' feeds a graph input"))
        return problems
    out = src.outputs.get(edge.src_port) if src is not None else None
    inp = dst.inputs.get(edge.dst_port) if dst is not None else None
    if src is not None and out is None:
        problems.append(_unknown_port(graph, edge.src, "output", edge.src_port, src.outputs))
    if dst is not None and inp is None:
        problems.append(_unknown_port(graph, edge.dst, "input", edge.dst_port, dst.inputs))
    if inp is not None:
        feeds.setdefault((edge.dst, edge.dst_port), []).append(edge)
    if out is None or inp is None:
        return problems
    out_type = types.get((edge.src, edge.src_port), out.type)
    if not compatible(out_type, inp.type):
        problems.append(
            PortTypeError(
                f"graph {graph.name!r}: {_describe_output(graph, edge)} "
                f"({port_name(out_type)}) cannot feed stage {edge.dst!r} input "
                f"{edge.dst_port!r} ({port_name(inp.type)})"
            )
        )
    return problems


def _check_inputs_connected(
    graph: Graph, feeds: dict[tuple[str, str], list[Edge]]
) -> list[GraphError]:
    """Every required input port fed, and none fed twice."""
    problems: list[GraphError] = []
    for stage in graph.stages.values():
        for port in stage.inputs.values():
            incoming = feeds.get((stage.name, port.name), [])
            if not incoming and not port.optional:
                problems.append(
                    UnconnectedPortError(
                        f"graph {graph.name!r}: stage {stage.name!r} input {port.name!r} "
                        f"({port_name(port.type)}) is not connected"
                    )
                )
            if len(incoming) > 1:
                sources = ", ".join(str(e).split(" ->")[0] for e in incoming)
                problems.append(
                    DoublyConnectedPortError(
                        f"graph {graph.name!r}: stage {stage.name!r} input {port.name!r} "
                        f"is connected {len(incoming)} times (from {sources})"
                    )
                )
    return problems


def _check_acyclic(graph: Graph) -> list[GraphError]:
    """A cycle, named by its path."""
    predecessors: dict[str, set[str]] = {}
    for e in graph.edges:
        predecessors.setdefault(e.dst, set()).add(e.src)
    try:
        graphlib.TopologicalSorter(predecessors).prepare()
    except graphlib.CycleError as exc:
        path = " -> ".join(exc.args[1])
        return [CycleError(f"graph {graph.name!r} has a cycle: {path}")]
    return []


def _describe_output(graph: Graph, edge: Edge) -> str:
    if edge.src in graph.inputs:
        return f"graph input {edge.src!r}"
    return f"stage {edge.src!r} output {edge.src_port!r}"


def _unknown_port(graph: Graph, node: str, direction: str, port: str, ports: Mapping) -> GraphError:
    return UnknownPortError(
        f"graph {graph.name!r}: stage {node!r} has no {direction} port {port!r}"
        f"{did_you_mean(port, ports)}; its {direction}s: {', '.join(ports) or 'none'}"
    )
