"""Rendering: DOT that pydot parses with every stage and edge, text, trace times."""

from __future__ import annotations

import pydot

from stagegraph.core.engine import Engine
from stagegraph.core.render import to_dot, to_text
from tests.conftest import MATMUL_MLIR
from tests.test_engine import linear_graph


def test_dot_parses_and_has_every_stage_and_edge():
    graph = linear_graph()
    (dot,) = pydot.graph_from_dot_data(to_dot(graph))
    names = {n.get_name().strip('"') for n in dot.get_nodes()} - {"node", "graph", "edge"}
    assert names == set(graph.order())
    edges = {(e.get_source().strip('"'), e.get_destination().strip('"')) for e in dot.get_edges()}
    assert edges == {(e.src, e.dst) for e in graph.edges}
    shapes = {n.get_name(): n.get_shape() for n in dot.get_nodes()}
    assert shapes["tile"] == "box" and shapes["payload"] == "invhouse"
    labels = {n.get_name(): n.get_label() for n in dot.get_nodes()}
    assert "#scheduled" in labels["tile"]
    assert any("Module[buffer]" in (e.get_label() or "") for e in dot.get_edges())


def test_text_rendering_lists_stages_in_order():
    text = to_text(linear_graph())
    assert text.index("load") < text.index("tile") < text.index("lower")
    assert "#bufferized" in text


def test_trace_renders_stage_times():
    graph = linear_graph()
    trace = Engine().run(graph, MATMUL_MLIR).trace
    (dot,) = pydot.graph_from_dot_data(to_dot(graph, trace))
    label = next(n.get_label() for n in dot.get_nodes() if n.get_name() == "tile")
    assert " ms" in label
