"""Graph files: round trip, schema, and errors with file locations."""

from __future__ import annotations

import json

import pytest

from stagegraph.core.graph import Graph, GraphInput
from stagegraph.core.graphfile import dump_graph, graph_from_text, json_schema, load_graph_file
from stagegraph.core.ports import Module
from stagegraph.errors import (
    CycleError,
    GraphError,
    GraphFileError,
    PortTypeError,
    UnconnectedPortError,
)
from tests.stages_for_tests import analyze, bufferize, schedule, select

GOOD = """\
name: demo
inputs:
  payload: {type: "module:tensor", tags: [input]}
stages:
  - {name: analyze, factory: test.analyze}
  - {name: select, factory: test.select, config: {factor: 2}}
  - {name: schedule, factory: test.schedule, tags: [scheduled]}
edges:
  - payload -> analyze.module
  - analyze.facts -> select.facts
  - select.params -> schedule.params
  - payload -> schedule.module
"""


def python_graph() -> Graph:
    return Graph(
        "demo",
        [
            analyze("analyze"),
            select("select", factor=2),
            schedule("schedule", tags={"scheduled"}),
            bufferize("bufferize", tags={"bufferized"}),
        ],
        [
            "payload -> analyze.module",
            "analyze.facts -> select.facts",
            "select.params -> schedule.params",
            "payload -> schedule.module",
            "schedule.module -> bufferize.module",
        ],
        [GraphInput("payload", Module["tensor"], frozenset({"input"}))],
        default_splice="bufferized",
    )


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_round_trip(tmp_path, suffix):
    graph = python_graph()
    path = tmp_path / f"g{suffix}"
    dump_graph(graph, path)
    assert load_graph_file(path) == graph


def test_load_good_text():
    graph = graph_from_text(GOOD, "demo.yaml")
    assert graph.stages["select"].config.factor == 2
    assert graph.tags["scheduled"] == ["schedule"]


def test_bad_yaml_has_line_and_column():
    with pytest.raises(GraphFileError, match=r"g.yaml:\d+:\d+: invalid YAML"):
        graph_from_text("name: x\nstages:\n  - {name: a, factory: [\n", "g.yaml")


def test_missing_field_located():
    text = GOOD.replace(
        "  - {name: select, factory: test.select, config: {factor: 2}}\n",
        "  - {name: select, config: {factor: 2}}\n",
    )
    with pytest.raises(GraphFileError, match=r"g.yaml:6:\d+: stages.1.factory: Field required"):
        graph_from_text(text, "g.yaml")


def test_unknown_key_located():
    text = GOOD.replace("factory: test.analyze}", "factory: test.analyze, colour: red}")
    with pytest.raises(GraphFileError, match=r"g.yaml:5:\d+: stages.0.colour: Extra inputs"):
        graph_from_text(text, "g.yaml")


def test_bad_config_value_names_stage():
    text = GOOD.replace("factor: 2", "factor: lots")
    with pytest.raises(
        GraphFileError, match=r"stage 'select' \(test.select\): invalid config: factor"
    ):
        graph_from_text(text, "g.yaml")


def test_unknown_factory_suggests():
    text = GOOD.replace("factory: test.schedule", "factory: test.schedul")
    with pytest.raises(GraphFileError, match=r"stage 'schedule'.*did you mean 'test.schedule'"):
        graph_from_text(text, "g.yaml")


def test_cycle_in_file():
    text = GOOD.replace(
        "  - payload -> schedule.module\n", "  - schedule.module -> schedule.module\n"
    )
    with pytest.raises(CycleError, match="g.yaml: graph 'demo' has a cycle: schedule -> schedule"):
        graph_from_text(text, "g.yaml")


def test_unconnected_and_mismatch_in_file():
    with pytest.raises(UnconnectedPortError, match="g.yaml: .*input 'module'"):
        graph_from_text(GOOD.replace("  - payload -> schedule.module\n", ""), "g.yaml")
    text = GOOD.replace("  - payload -> schedule.module\n", "  - payload -> select.facts\n")
    with pytest.raises(GraphError, match="graph input 'payload' .* cannot feed stage 'select'"):
        graph_from_text(text, "g.yaml")
    text = GOOD + "  - schedule.module -> analyze.module\n"
    with pytest.raises(Exception) as info:
        graph_from_text(text, "g.yaml")
    assert "connected 2 times" in str(info.value)
    bad = GOOD.replace('"module:tensor"', '"module:buffer"')
    with pytest.raises(Exception) as info:
        graph_from_text(bad, "g.yaml")
    assert isinstance(info.value, PortTypeError) or "Module[buffer]" in str(info.value)


def test_bad_edge_syntax():
    with pytest.raises(GraphFileError, match="edge 'payload analyze.module' must look like"):
        graph_from_text(
            GOOD.replace("payload -> analyze.module", "payload analyze.module"), "g.yaml"
        )


def test_schema_is_json_schema():
    schema = json_schema()
    assert schema["title"] == "GraphFile"
    assert {"name", "stages"} <= set(schema["required"])
    json.dumps(schema)
