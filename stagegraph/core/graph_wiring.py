"""The wiring of a graph: edges between named ports and the graph inputs they start from."""

from __future__ import annotations

from dataclasses import dataclass

from stagegraph.core.ports import Module
from stagegraph.core.stage import Port
from stagegraph.errors import GraphError

INPUT_PORT = "value"


@dataclass(frozen=True)
class GraphInput:
    """A value the caller provides (usually the payload module), optionally tagged."""

    name: str
    type: type = Module["tensor"]
    tags: frozenset[str] = frozenset()

    @property
    def outputs(self) -> dict[str, Port]:
        return {INPUT_PORT: Port(INPUT_PORT, self.type)}


@dataclass(frozen=True, order=True)
class Edge:
    """Output port ``src.src_port`` feeds input port ``dst.dst_port``."""

    src: str
    src_port: str
    dst: str
    dst_port: str

    @classmethod
    def parse(cls, src: str, dst: str) -> Edge:
        s_node, _, s_port = src.partition(".")
        d_node, _, d_port = dst.partition(".")
        return cls(s_node, s_port or INPUT_PORT, d_node, d_port)

    def __str__(self) -> str:
        src = self.src if self.src_port == INPUT_PORT else f"{self.src}.{self.src_port}"
        return f"{src} -> {self.dst}.{self.dst_port}"


EdgeLike = Edge | tuple[str, str] | str


def as_edge(edge: EdgeLike) -> Edge:
    """An :class:`Edge` from an edge, a ``(src, dst)`` pair or ``"src.port -> dst.port"``."""
    if isinstance(edge, Edge):
        return edge
    if isinstance(edge, str):
        src, sep, dst = edge.partition("->")
        if not sep:
            raise GraphError(f"edge {edge!r} must look like 'stage.port -> stage.port'")
        return Edge.parse(src.strip(), dst.strip())
    return Edge.parse(*edge)
