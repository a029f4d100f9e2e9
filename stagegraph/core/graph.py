"""Immutable stage graphs stored in networkx, with validation and composition.

Wiring is explicit: every edge names an output port and an input port
(``"select.params" -> "schedule.params"``); graph inputs (the payload) are nodes too, named
by their bare name in edges. Every constructor validates and reports all problems at once.
"""

from __future__ import annotations

import graphlib
import heapq
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from stagegraph.core.graph_check import check, output_types
from stagegraph.core.graph_wiring import Edge, EdgeLike, GraphInput, as_edge
from stagegraph.core.ports import Params, compatible

if TYPE_CHECKING:
    import networkx as nx
from stagegraph.core.stage import Port, Stage
from stagegraph.errors import (
    AmbiguousTagError,
    ConfigError,
    DuplicateStageError,
    GraphError,
    InvalidGraphError,
    PortTypeError,
    UnknownStageError,
    UnknownTagError,
    did_you_mean,
    unknown_name_message,
)


@dataclass(frozen=True, eq=False)
class Graph:
    """A validated, immutable DAG of stages. Operations return new graphs."""

    name: str
    stages: Mapping[str, Stage]
    edges: tuple[Edge, ...]
    inputs: Mapping[str, GraphInput]
    default_splice: str | None = None
    description: str = ""
    _types: dict[tuple[str, str], type] = field(repr=False, default=None)  # type: ignore[assignment]
    _order: tuple[str, ...] = field(repr=False, default=())
    _network: Any = field(repr=False, default=None)
    # The edge index, built once (the graph is immutable): edges by destination and by
    # source, and the known nodes each node feeds and is fed by.
    _in: Mapping[str, tuple[Edge, ...]] = field(repr=False, default=None)  # type: ignore[assignment]
    _out: Mapping[str, tuple[Edge, ...]] = field(repr=False, default=None)  # type: ignore[assignment]
    _following: Mapping[str, list[str]] = field(repr=False, default=None)  # type: ignore[assignment]
    _preceding: Mapping[str, list[str]] = field(repr=False, default=None)  # type: ignore[assignment]

    def __init__(
        self,
        name: str,
        stages: Iterable[Stage],
        edges: Iterable[EdgeLike],
        inputs: Iterable[GraphInput] | Mapping[str, type] = (),
        default_splice: str | None = None,
        description: str = "",
    ) -> None:
        stage_list = list(stages)
        if isinstance(inputs, Mapping):
            inputs = [GraphInput(n, t) for n, t in inputs.items()]
        input_list = list(inputs)
        problems: list[GraphError] = []
        seen: set[str] = set()
        for node_name in [i.name for i in input_list] + [s.name for s in stage_list]:
            if node_name in seen:
                problems.append(
                    DuplicateStageError(f"graph {name!r}: duplicate stage name {node_name!r}")
                )
            seen.add(node_name)
        edge_list: list[Edge] = []
        for raw in edges:
            try:
                edge_list.append(as_edge(raw))
            except GraphError as exc:
                problems.append(exc)
        set_ = object.__setattr__
        set_(self, "name", name)
        set_(self, "stages", MappingProxyType({s.name: s for s in stage_list}))
        set_(self, "inputs", MappingProxyType({i.name: i for i in input_list}))
        set_(self, "edges", tuple(sorted(set(edge_list))))
        set_(self, "default_splice", default_splice)
        set_(self, "description", description)
        self._index_edges()
        try:
            producers_first = _ranked_order(self._following, str)
        except graphlib.CycleError:  # reported by check(); declared types meanwhile
            producers_first = [*self.inputs, *self.stages]
        set_(self, "_types", output_types(self, producers_first))
        problems.extend(check(self, self._types))
        if problems:
            raise problems[0] if len(problems) == 1 else InvalidGraphError(name, problems)
        set_(self, "_order", tuple(_ranked_order(self._following, self._rank)))

    def _index_edges(self) -> None:
        """Index the edges by node once, so queries cost what they return, not a scan."""
        incoming: dict[str, list[Edge]] = {}
        outgoing: dict[str, list[Edge]] = {}
        following: dict[str, list[str]] = {n: [] for n in [*self.inputs, *self.stages]}
        preceding: dict[str, list[str]] = {}
        for e in self.edges:
            incoming.setdefault(e.dst, []).append(e)
            outgoing.setdefault(e.src, []).append(e)
            if e.src in following and e.dst in following:
                following[e.src].append(e.dst)
                preceding.setdefault(e.dst, []).append(e.src)
        set_ = object.__setattr__
        set_(self, "_in", MappingProxyType({n: tuple(es) for n, es in incoming.items()}))
        set_(self, "_out", MappingProxyType({n: tuple(es) for n, es in outgoing.items()}))
        set_(self, "_following", MappingProxyType(following))
        set_(self, "_preceding", MappingProxyType(preceding))

    @property
    def network(self) -> nx.MultiDiGraph:
        """The graph as a frozen networkx multigraph (node kinds, tags, edge port types), for
        rendering and analysis; built on first use (importing networkx costs ~0.2 s)."""
        if self._network is None:
            import networkx as nx

            object.__setattr__(self, "_network", nx.freeze(self._to_networkx()))
        return self._network

    # -- validation -------------------------------------------------------------------------

    def _node(self, name: str) -> Stage | GraphInput | None:
        return self.stages.get(name) or self.inputs.get(name)

    def output_type(self, node: str, port: str) -> type:
        """The type ``node``'s output ``port`` carries here (levels flow through ``any``)."""
        return self._types[(node, port)]

    def _to_networkx(self) -> nx.MultiDiGraph:
        import networkx as nx

        graph = nx.MultiDiGraph(name=self.name)
        for node in self.inputs.values():
            graph.add_node(node.name, kind="input", node=node, tags=node.tags)
        for stage in self.stages.values():
            graph.add_node(stage.name, kind=stage.kind, node=stage, tags=stage.tags)
        for e in self.edges:
            port_type = self._types[(e.src, e.src_port)]
            graph.add_edge(e.src, e.dst, key=(e.src_port, e.dst_port), type=port_type)
        return graph

    # -- queries ----------------------------------------------------------------------------

    @property
    def tags(self) -> dict[str, list[str]]:
        """Tag → the nodes carrying it."""
        result: dict[str, list[str]] = {}
        for node in [*self.inputs.values(), *self.stages.values()]:
            for tag in sorted(node.tags):
                result.setdefault(tag, []).append(node.name)
        return result

    def tagged(self, tag: str) -> list[str]:
        """The nodes carrying ``tag``."""
        return [n.name for n in [*self.inputs.values(), *self.stages.values()] if tag in n.tags]

    def node_for_tag(self, tag: str) -> str:
        """The one node carrying ``tag`` (a stage or graph-input name is accepted too)."""
        nodes = self.tagged(tag)
        if not nodes and self._node(tag) is not None:
            return tag
        if not nodes:
            known = self.tags
            raise UnknownTagError(
                f"graph {self.name!r} has no tag {tag!r}{did_you_mean(tag, known)}; "
                f"its tags: {', '.join(sorted(known)) or 'none'}"
            )
        if len(nodes) > 1:
            raise AmbiguousTagError(
                f"graph {self.name!r}: tag {tag!r} is on several stages ({', '.join(nodes)}); "
                "tag exactly one stage or name the stage"
            )
        return nodes[0]

    def stages_of_kind(self, kind: str) -> list[Stage]:
        """The stages of ``kind`` (``"params"``, ``"emit"``, ...), in declaration order."""
        return [s for s in self.stages.values() if s.kind == kind]

    def one_stage_of_kind(self, kind: str) -> Stage:
        """The graph's one stage of ``kind``.

        Raises:
            ConfigError: the graph has none or several.
        """
        found = self.stages_of_kind(kind)
        if len(found) != 1:
            raise ConfigError(f"graph {self.name!r} has {len(found)} {kind} stages; need one")
        return found[0]

    def params_output(self) -> tuple[Stage, Port]:
        """The graph's cost model (its one params stage) and the output port carrying its
        Params model.

        Raises:
            ConfigError: no params stage, several, or one without a Params output.
        """
        stage = self.one_stage_of_kind("params")
        port = next((p for p in stage.outputs.values() if issubclass(p.type, Params)), None)
        if port is None:
            raise ConfigError(
                f"graph {self.name!r}: params stage {stage.name!r} has no Params output"
            )
        return stage, port

    def order(self) -> list[str]:
        """Nodes in a deterministic topological order."""
        return list(self._order)

    def _rank(self, node: str) -> str:
        return f"{0 if node in self.inputs else 1}:{node}"

    def in_edges(self, node: str) -> list[Edge]:
        """The edges into ``node`` (in the graph's edge order)."""
        return list(self._in.get(node, ()))

    def out_edges(self, node: str, port: str | None = None) -> list[Edge]:
        """The edges out of ``node`` (of its output ``port`` only, if given)."""
        return [e for e in self._out.get(node, ()) if port in (None, e.src_port)]

    def ancestors(self, node: str) -> set[str]:
        """The nodes ``node`` depends on, at any distance."""
        return _reachable(self._preceding, node)

    def descendants(self, node: str) -> set[str]:
        """The nodes that depend on ``node``, at any distance."""
        return _reachable(self._following, node)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Graph):
            return NotImplemented
        return (
            self.name == other.name
            and dict(self.stages) == dict(other.stages)
            and self.edges == other.edges
            and dict(self.inputs) == dict(other.inputs)
            and self.default_splice == other.default_splice
        )

    def __hash__(self) -> int:
        return hash((self.name, self.edges))

    def __repr__(self) -> str:
        return f"<Graph {self.name!r}: {len(self.stages)} stages, {len(self.edges)} edges>"

    # -- composition ------------------------------------------------------------------------

    def _with(self, **changes: Any) -> Graph:
        fields = {
            "name": self.name,
            "stages": list(self.stages.values()),
            "edges": list(self.edges),
            "inputs": list(self.inputs.values()),
            "default_splice": self.default_splice,
            "description": self.description,
        }
        fields.update(changes)
        return Graph(**fields)

    def _require_stage(self, name: str) -> Stage:
        if name not in self.stages:
            raise UnknownStageError(
                f"graph {self.name!r}: " + unknown_name_message("stage", name, self.stages)
            )
        return self.stages[name]

    def replace(self, name: str, stage: Stage) -> Graph:
        """Swap the stage ``name`` for ``stage`` keeping its wiring and tags (type-checked).

        Raises:
            PortTypeError: the new stage's ports do not fit the existing edges.
            UnknownPortError: an edge uses a port the new stage does not have.
        """
        old = self._require_stage(name)
        new = stage.renamed(name) if stage.name != name else stage
        new = new.with_tags(*old.tags)
        stages = [new if s.name == name else s for s in self.stages.values()]
        return self._with(stages=stages)

    def extend(
        self,
        stages: Iterable[Stage] = (),
        edges: Iterable[EdgeLike] = (),
        inputs: Iterable[GraphInput] = (),
    ) -> Graph:
        """The graph with more stages, edges and inputs (checked like a new graph): how a
        tool adds its own stages after a user's graph (the tuner's check and measure)."""
        return self._with(
            stages=[*self.stages.values(), *stages],
            edges=[*self.edges, *edges],
            inputs=[*self.inputs.values(), *inputs],
        )

    def renamed(self, name: str) -> Graph:
        """The same graph under another name (the name it is registered or loaded under)."""
        return self if name == self.name else self._with(name=name)

    def with_config(self, name: str, **changes: Any) -> Graph:
        """The same graph with one stage's config fields changed."""
        return self.replace(name, self._require_stage(name).with_config(**changes))

    def splice(self, after: str, stage: Stage, port: str | None = None) -> Graph:
        """Insert ``stage`` after the node tagged ``after`` on one of its outputs.

        The new stage takes the tagged node's output (the module by default) and its
        output of the same type takes over every edge that output had.
        """
        anchor = self.node_for_tag(after)
        node = self._node(anchor)
        out_port, in_port, new_out = self._splice_ports(anchor, node, stage, port)
        if stage.name in self.stages or stage.name in self.inputs:
            raise DuplicateStageError(
                f"graph {self.name!r}: cannot splice {stage.name!r}: the name is taken"
            )
        edges = []
        for e in self.edges:
            if e.src == anchor and e.src_port == out_port:
                e = Edge(stage.name, new_out, e.dst, e.dst_port)
            edges.append(e)
        edges.append(Edge(anchor, out_port, stage.name, in_port))
        return self._with(stages=[*self.stages.values(), stage], edges=edges)

    def _splice_ports(
        self, anchor: str, node: Stage | GraphInput, stage: Stage, port: str | None
    ) -> tuple[str, str, str]:
        candidates = [
            (o.name, i.name, n.name)
            for o in node.outputs.values()
            if port in (None, o.name)
            for i in stage.inputs.values()
            if compatible(o.type, i.type)
            for n in stage.outputs.values()
            if compatible(n.type, o.type)
        ]
        required = [p for p in stage.inputs.values() if not p.optional]
        if len(required) > 1 or not candidates:
            raise PortTypeError(
                f"graph {self.name!r}: cannot splice stage {stage.name!r} after {anchor!r}: "
                f"it needs exactly one input fed by {anchor!r}'s outputs "
                f"({', '.join(str(p) for p in node.outputs.values())}) and an output of the "
                "same type"
            )
        return candidates[0]

    def select(self, until: str) -> Graph:
        """The subgraph that computes the node tagged ``until`` (it and its ancestors)."""
        anchor = self.node_for_tag(until)
        keep = self.ancestors(anchor) | {anchor}
        default = self.default_splice
        if default is not None and not any(n in keep for n in self.tagged(default)):
            default = None
        return self._with(
            stages=[s for s in self.stages.values() if s.name in keep],
            edges=[e for e in self.edges if e.src in keep and e.dst in keep],
            inputs=[i for i in self.inputs.values() if i.name in keep],
            default_splice=default,
        )


def _ranked_order(successors: Mapping[str, list[str]], rank: Callable[[str], str]) -> list[str]:
    """A topological order that takes, among the nodes ready, the lowest ``rank`` first
    (deterministic: the same graph always runs its stages in the same order).

    Raises:
        graphlib.CycleError: the edges have a cycle.
    """
    waiting = {node: 0 for node in successors}
    for targets in successors.values():
        for target in targets:
            waiting[target] += 1
    ready = [(rank(n), n) for n, count in waiting.items() if count == 0]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        _, node = heapq.heappop(ready)
        order.append(node)
        for target in successors[node]:
            waiting[target] -= 1
            if waiting[target] == 0:
                heapq.heappush(ready, (rank(target), target))
    if len(order) != len(waiting):
        raise graphlib.CycleError("the graph has a cycle", [])
    return order


def _reachable(following: Mapping[str, list[str]], start: str) -> set[str]:
    """Nodes reachable from ``start`` along ``following`` (``start`` itself excluded)."""
    seen: set[str] = set()
    todo = list(following.get(start, ()))
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(following.get(node, ()))
    return seen
