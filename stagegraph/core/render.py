"""Rendering graphs and traces: DOT (through pydot), SVG (Graphviz), and terminal text."""

from __future__ import annotations

import shutil
from pathlib import Path

import networkx as nx

from stagegraph.core.engine import Trace
from stagegraph.core.graph import Graph
from stagegraph.core.ports import port_name
from stagegraph.errors import StagegraphError

STYLE = {
    "input": {"shape": "invhouse", "fillcolor": "#eeeeee"},
    "analysis": {"shape": "ellipse", "fillcolor": "#cfe2f3"},
    "params": {"shape": "diamond", "fillcolor": "#fff2cc"},
    "schedule": {"shape": "box", "fillcolor": "#d9ead3"},
    "passes": {"shape": "box", "fillcolor": "#ead1dc", "style": "filled,rounded"},
    "wrapper": {"shape": "hexagon", "fillcolor": "#fce5cd"},
    "emit": {"shape": "box3d", "fillcolor": "#d0e0e3"},
}


def _label(graph: Graph, node: str, trace: Trace | None) -> str:
    data = graph.network.nodes[node]
    lines = [node, f"({data['kind']})"]
    if data["tags"]:
        lines.append("#" + " #".join(sorted(data["tags"])))
    if trace is not None:
        record = next((r for r in trace.records if r.name == node), None)
        if record is not None:
            lines.append(f"{record.seconds * 1e3:.1f} ms" + (" (cached)" if record.cached else ""))
    return "\n".join(lines)


def display_graph(graph: Graph, trace: Trace | None = None) -> nx.MultiDiGraph:
    """A plain networkx copy carrying only DOT attributes (labels, shapes, colours)."""
    out = nx.MultiDiGraph(name=graph.name)
    for node in graph.order():
        style = {"style": "filled", **STYLE[graph.network.nodes[node]["kind"]]}
        out.add_node(node, label=_label(graph, node, trace), **style)
    for src, dst, key, data in graph.network.edges(keys=True, data=True):
        src_port, dst_port = key
        label = port_name(data["type"])
        if src_port != "value" and (src_port, dst_port) != ("module", "module"):
            label = f"{src_port}→{dst_port}\n{label}"
        out.add_edge(src, dst, key=f"{src_port}-{dst_port}", label=label)
    return out


def to_dot(graph: Graph, trace: Trace | None = None) -> str:
    """DOT text for a graph (or an executed trace, with each stage's time)."""
    dot = nx.nx_pydot.to_pydot(display_graph(graph, trace))
    dot.set_rankdir("TB")
    dot.set_name(_dot_id(graph.name))
    return dot.to_string()


def _dot_id(name: str) -> str:
    return '"' + name.replace('"', r"\"") + '"'


def to_text(graph: Graph, trace: Trace | None = None) -> str:
    """A terminal rendering that needs no Graphviz: one line per node in topological
    order, with the nodes it takes its inputs from (``<- load, select``).

    (networkx's tree rendering shows a node with several parents once and leaves
    ``└─╼ ...`` stubs in the other places, which reads like missing stages.)
    """
    order = graph.order()
    labels = {node: _label(graph, node, trace).replace("\n", " ") for node in order}
    width = max(len(label) for label in labels.values())
    lines = []
    for node in order:
        sources = sorted({e.src for e in graph.in_edges(node)}, key=order.index)
        arrow = f"  <- {', '.join(sources)}" if sources else ""
        lines.append(f"{labels[node]:<{width}}{arrow}".rstrip())
    return "\n".join(lines) + "\n"


def render_file(graph: Graph, path: str | Path, trace: Trace | None = None) -> None:
    """Render to an image format Graphviz knows (by suffix: svg, png, pdf)."""
    path = Path(path)
    if shutil.which("dot") is None:
        raise StagegraphError(
            f"cannot render {path}: the Graphviz 'dot' program is not installed "
            "(install it with 'apt-get install graphviz' or 'conda install graphviz'), "
            "or print DOT with 'stagegraph show GRAPH' and render it elsewhere"
        )
    fmt = path.suffix.lstrip(".") or "svg"
    dot = nx.nx_pydot.to_pydot(display_graph(graph, trace))
    try:
        path.write_bytes(dot.create(format=fmt))
    except OSError as exc:
        raise StagegraphError(f"cannot write {path}: {exc.strerror or exc}") from None


def first_sentence(doc: str) -> str:
    """The first sentence of a docstring as plain text: its first paragraph joined onto one
    line, cut after the first full stop, RST roles and backticks removed
    (``:func:`analyze``` and ````entry```` become ``analyze`` and ``entry``)."""
    import re

    paragraph = " ".join(doc.strip().split("\n\n", 1)[0].split())
    text = re.sub(r":[\w:.-]+:`([^`]*)`", r"\1", paragraph)
    text = re.sub(r"`+([^`]*)`+", r"\1", text)
    match = re.search(r"(?<!\be\.g)(?<!\bi\.e)(?<!\betc)(?<!\bvs)[.!?](?=\s|$)", text)
    return text[: match.end()] if match else text
