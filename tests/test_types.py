"""Sound types (issue #15 item 4): IR levels per stage instance, checked at graph
construction; splice tags the wrapper can follow; mlir-opt style pipelines; config keys
checked against each factory; graph-file paths relative to the file."""

from __future__ import annotations

import json

import pytest

from stagegraph.cli.main import main
from stagegraph.core.engine import Engine
from stagegraph.core.graph import Graph, GraphInput
from stagegraph.core.graphfile import graph_from_text, load_graph_file
from stagegraph.core.ports import Module
from stagegraph.errors import ConfigError, PortTypeError, SpliceError
from stagegraph.stages.common.passes import (
    anchored,
    bufferize,
    infer_levels,
    linalg_to_loops,
    pipeline,
    verify,
)

PAYLOAD = [GraphInput("payload", Module["tensor"], frozenset({"input"}))]


def chain(*stages):
    names = ["payload"] + [f"{s.name}.module" for s in stages]
    edges = [f"{a} -> {b.name}.module" for a, b in zip(names, stages, strict=False)]
    return Graph("demo", stages, edges, PAYLOAD)


def test_tensor_module_into_buffer_stage_fails_at_construction():
    with pytest.raises(PortTypeError, match=r"'load' output 'module' \(Module\[tensor\]\)"):
        chain(verify("load"), linalg_to_loops("loops"))


def test_pipeline_levels_inferred_from_passes_declared_or_passed_through():
    assert infer_levels("one-shot-bufferize{bufferize-function-boundaries}") == ("tensor", "buffer")
    assert infer_levels("canonicalize,func.func(cse)") == (None, None)
    assert infer_levels("one-shot-bufferize,convert-to-llvm") == ("tensor", "llvm")
    ports = pipeline("b", pipeline="one-shot-bufferize")
    assert (ports.inputs["module"].type, ports.outputs["module"].type) == (
        Module["tensor"],
        Module["buffer"],
    )
    chain(verify("load"), pipeline("b", pipeline="one-shot-bufferize"), linalg_to_loops("l"))
    chain(verify("load"), bufferize("b"), pipeline("clean", pipeline="cse"), linalg_to_loops("l"))
    # A level-neutral pipeline passes on the tensor level it was fed: the mismatch is found.
    with pytest.raises(PortTypeError, match=r"'clean' output 'module' \(Module\[tensor\]\)"):
        chain(verify("load"), pipeline("clean", pipeline="cse"), linalg_to_loops("l"))
    with pytest.raises(PortTypeError, match=r"Module\[llvm\]"):
        chain(verify("load"), pipeline("x", pipeline="cse", gives="llvm"), linalg_to_loops("l"))


def test_level_mismatch_through_the_cli(capsys, tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text(
        "name: demo\nstages:\n  - {name: load, factory: verify}\n"
        "  - {name: clean, factory: pipeline, config: {pipeline: 'builtin.module(cse)'}}\n"
        "  - {name: loops, factory: linalg_to_loops}\n"
        "edges: [payload -> load.module, load.module -> clean.module, "
        "clean.module -> loops.module]\n"
    )
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "stage 'clean' output 'module' (Module[tensor]) cannot feed stage 'loops'" in err
    path.write_text(path.read_text().replace("builtin.module(cse)", "one-shot-bufferize"))
    assert main(["validate", str(path)]) == 0


@pytest.mark.parametrize(
    "text",
    ["canonicalize,cse", "builtin.module(canonicalize,cse)", " func.func(canonicalize) "],
)
def test_pipelines_run_bare_or_anchored(text):
    payload = (
        "func.func @main() -> i32 {\n  %a = arith.constant 1 : i32\n"
        "  %b = arith.constant 2 : i32\n  %c = arith.addi %a, %b : i32\n  return %c : i32\n}\n"
    )
    graph = chain(pipeline("clean", pipeline=text))
    module = Engine().run(graph, {"payload": payload}).module
    assert "arith.addi" not in module.text()
    assert "arith.constant 3" in module.text()
    assert anchored("builtin.module(a),builtin.module(b)").startswith("builtin.module(builtin")


def test_splice_at_a_tag_the_wrapper_cannot_follow_fails_before_compiling():
    from stagegraph.app.bench import splice_level, spliced
    from stagegraph.core.catalog import load_graph

    graph = load_graph("x86")
    with pytest.raises(SpliceError, match=r"stage 'lower' gives Module\[llvm\]"):
        splice_level(graph, "lower")
    assert splice_level(graph, "bufferized") == "buffer"
    bench_graph, _ = spliced(graph, "input", "main")
    assert bench_graph.stages["bench"].inputs["module"].type is Module["tensor"]


def test_unknown_param_keys_in_configs_are_refused_with_did_you_mean():
    from stagegraph.stages.x86.costmodels import fixed
    from stagegraph.stages.x86.params_stage import heuristic

    with pytest.raises(ConfigError, match=r"overrides: unknown parameter 'tile_mm'.*'tile_m'"):
        heuristic("select", overrides={"tile_mm": 12})
    with pytest.raises(ConfigError, match=r"params: unknown parameter 'tile_mm'"):
        fixed("select", params={"tile_mm": 12})
    fixed("select", params={"tile_m": 12})
    with pytest.raises(ConfigError, match=r"pipelin: .*did you mean 'pipeline'"):
        pipeline("p", pipelin="cse")


def test_schema_has_each_factorys_config(capsys):
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    branches = schema["$defs"]["StageEntry"]["allOf"]
    by_factory = {b["if"]["properties"]["factory"]["const"]: b["then"] for b in branches}
    transform = by_factory["transform"]["properties"]["config"]
    assert set(transform["properties"]) == {"file", "text", "entry"}
    assert transform["additionalProperties"] is False
    assert "takes" in by_factory["pipeline"]["properties"]["config"]["properties"]
    overrides = by_factory["x86.heuristic"]["properties"]["config"]["properties"]["overrides"]
    assert "tile_m" in overrides["propertyNames"]["enum"]
    assert "tile_mm" not in overrides["propertyNames"]["enum"]
    try:
        import jsonschema
    except ImportError:
        return
    good = {"name": "g", "stages": [{"name": "t", "factory": "transform", "config": {"file": "x"}}]}
    jsonschema.validate(good, schema)
    bad = {"name": "g", "stages": [{"name": "t", "factory": "transform", "config": {"fil": "x"}}]}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


SCHEDULE = """\
module attributes {transform.with_named_sequence} {
  transform.named_sequence @__transform_main(%root: !transform.any_op {transform.readonly}) {
    transform.yield
  }
}
"""


def test_graph_file_paths_resolve_next_to_the_graph_file(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "flows"
    folder.mkdir()
    (folder / "schedule.mlir").write_text(SCHEDULE)
    (folder / "g.yaml").write_text(
        "name: demo\nstages:\n  - {name: sched, factory: transform, "
        "config: {file: schedule.mlir}}\nedges: [payload -> sched.module]\n"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    graph = load_graph_file("../flows/g.yaml")
    resolved = graph.stages["sched"].config.file
    assert (elsewhere / resolved).resolve() == folder / "schedule.mlir"
    payload = (
        "func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {\n  return %a : tensor<4xf32>\n}\n"
    )
    assert Engine().run(graph, {"payload": payload}).module is not None
    # Text without a file keeps paths as written (relative to the current directory).
    text_graph = graph_from_text((folder / "g.yaml").read_text())
    assert text_graph.stages["sched"].config.file == "schedule.mlir"
    assert main(["validate", "../flows/g.yaml"]) == 0
