"""Reproducers, IR printing and per-stage verification through the one hook seam."""

from __future__ import annotations

import json
import re

from stagegraph.cli.main import main
from tests.conftest import tile_schedule

BROKEN = tile_schedule(4).replace(
    "%t, %loops:2 = transform.structured.tile_using_for %mm tile_sizes [4, 4]\n"
    "      : (!transform.any_op) -> (!transform.any_op, !transform.any_op, !transform.any_op)",
    "%i = transform.structured.interchange %mm iterator_interchange = [2, 1, 0]\n"
    "      : (!transform.any_op) -> !transform.any_op",
)


def broken_graph_file(tmp_path) -> str:
    import yaml

    assert "interchange" in BROKEN
    graph = {
        "name": "broken",
        "inputs": {"payload": {"type": "module:tensor", "tags": ["input"]}},
        "stages": [
            {"name": "schedule", "factory": "transform", "config": {"text": BROKEN}},
            {"name": "bufferize", "factory": "bufferize"},
        ],
        "edges": ["payload -> schedule.module", "schedule.module -> bufferize.module"],
    }
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(graph))
    return str(path)


def test_broken_schedule_writes_reproducer_that_fails_the_same_way(capsys, tmp_path):
    repro_root = tmp_path / "repro"
    code = main(["run", broken_graph_file(tmp_path), "matmul:m=8,n=8,k=8",
                 "--repro-dir", str(repro_root)])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "stage 'schedule' of graph 'broken' failed" in err
    assert "transform applied to the wrong op kind" in err
    directory = re.search(r"reproducer: (\S+)", err).group(1)
    files = {p.name for p in (tmp_path / directory).iterdir()}
    assert {
        "input.mlir",
        "stage.json",
        "inputs.json",
        "schedule.mlir",
        "README",
        "repro.sh",
    } <= files
    assert "linalg.matmul" in (tmp_path / directory / "input.mlir").read_text()
    assert json.loads((tmp_path / directory / "stage.json").read_text())["factory"] == "transform"

    code = main(["repro", directory])
    again = capsys.readouterr().err
    assert code == 2
    assert "stage 'schedule' of graph 'broken' failed" in again
    assert "transform applied to the wrong op kind" in again


def test_pass_stage_reproducer_prints_opt_command(capsys, tmp_path):
    import yaml

    graph = {
        "name": "badpass",
        "stages": [{"name": "p", "factory": "pipeline", "config": {"pipeline": "no-such-pass"}}],
        "edges": ["payload -> p.module"],
    }
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump(graph))
    code = main(["run", str(path), "matmul:m=4,n=4,k=4", "--repro-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2
    directory = re.search(r"reproducer: (\S+)", err).group(1)
    readme = (tmp_path / directory / "README").read_text()
    assert "--pass-pipeline='builtin.module(no-such-pass)'" in readme
    assert "-opt" in readme


def test_print_ir_after_stage_and_tag(capsys):
    code = main(["run", "naive", "matmul:m=4,n=4,k=4", "--print-ir-after", "bufferized"])
    err = capsys.readouterr().err
    assert code == 0
    assert "IR after bufferize (passes, buffer)" in err and "memref<4x4xf32>" in err
    assert "IR after lower" not in err
    code = main(["run", "naive", "matmul:m=4,n=4,k=4", "--print-ir-after", "all"])
    assert err.count("IR after") == 1 and capsys.readouterr().err.count("IR after") == 4


def test_print_ir_after_unknown_name(capsys):
    code = main(["run", "naive", "matmul", "--print-ir-after", "bufferise"])
    err = capsys.readouterr().err
    assert code == 2 and "did you mean" in err


def test_verify_each_passes_on_good_flow(capsys):
    assert main(["run", "naive", "matmul:m=4,n=4,k=4", "--verify-each"]) == 0


SEGV_GRAPH = """
import ctypes

from stagegraph.core.graph import Graph, GraphInput
from stagegraph.core.ports import Module, TensorModule
from stagegraph.core.stage import stage
from stagegraph.stages.common.passes import verify


@stage("schedule", name="test.segfault")
def segfault(module: TensorModule) -> TensorModule:
    ctypes.string_at(0)
    return module


def build():
    return Graph("segv", [verify("load"), segfault("boom")],
                 ["payload -> load.module", "load.module -> boom.module"],
                 [GraphInput("payload", Module["tensor"])])
"""


def test_isolated_segfault_names_stage_and_parent_survives(capsys, tmp_path):
    graph = tmp_path / "segv_graph.py"
    graph.write_text(SEGV_GRAPH)
    code = main(["run", str(graph), "matmul:m=4,n=4,k=4", "--isolate", "--timeout", "60",
                 "--repro-dir", str(tmp_path / "r")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2
    assert "stage 'boom' of graph 'segv' failed: killed by SIGSEGV" in err
    directory = re.search(r"reproducer: (\S+)", err).group(1)
    assert "linalg.matmul" in (tmp_path / directory / "input.mlir").read_text()
    # the parent is fine: a normal isolated run still works afterwards
    assert main(["run", "naive", "matmul:m=4,n=4,k=4", "--isolate"]) == 0


def test_isolated_bench_segfault_names_stage(capsys, tmp_path):
    graph = tmp_path / "segv_graph.py"
    graph.write_text(SEGV_GRAPH)
    code = main(["bench", str(graph), "matmul:m=4,n=4,k=4", "--isolate", "--splice-at", "boom",
                 "--timeout", "60", "--repro-dir", str(tmp_path / "r")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "stage 'boom' of graph 'segv' failed: killed by SIGSEGV" in err


def test_tune_shares_the_ir_inspection_options(capsys, tmp_path):
    dump = tmp_path / "ir"
    code = main(["tune", "x86", "matmul:m=32,n=32,k=32", "--budget", "1", "--samples", "4",
                 "--db", str(tmp_path / "t.db"), "--dump-ir", str(dump),
                 "--print-ir-after", "scheduled", "--verify-each", "--json"])  # fmt: skip
    capsys.readouterr()
    assert code == 0
    folders = [p for p in dump.iterdir() if p.is_dir()]
    assert folders, "one folder per compiled candidate (and the baseline)"
    for folder in folders:
        assert (folder / "index.json").exists()
        assert "IR after schedule" in (folder / "printed.mlir").read_text()
    code = main(["tune", "x86", "matmul", "--print-ir-after", "scheduled"])
    assert code == 2 and "give --dump-ir DIR" in capsys.readouterr().err


def test_x86_schedule_reproducer_holds_the_transform_schedules(tmp_path):
    """The reproducer of a failing x86.schedule carries the schedules built for its input."""
    from stagegraph.core.catalog import load_graph
    from stagegraph.core.engine import Engine
    from stagegraph.instrument.repro import ReproducerHook
    from stagegraph.workload import parse_workload

    graph = load_graph("x86")
    result = Engine().run(graph, parse_workload("mlp:batch=64,widths=8-16-8"), until="select")
    inputs = {"module": result.value("normalize", "module").text(),
              "facts": result.value("analyze", "facts"), "params": result.params}  # fmt: skip
    hook = ReproducerHook(tmp_path)
    event = type("Event", (), {"graph": graph, "stage": graph.stages["schedule"],
                               "inputs": inputs})()  # fmt: skip
    hook._pending = inputs
    folder = hook.on_failure(event, RuntimeError("boom"))
    text = (tmp_path / folder / "schedule.mlir").read_text()
    # The generic schedule, then one per matmul (each applied to its own site; 64 rows: packed).
    assert text.count("transform.named_sequence @__transform_main") == 3
    assert "transform.structured.pack" in text


def test_reproducer_keeps_the_input_as_it_was_without_printing_every_stage(tmp_path, monkeypatch):
    """The hook snapshots each stage's input module before the stage runs, without printing
    it (a failing stage is rare; printing a large module before every stage is slow); the
    reproducer still holds the input's text from before the stage changed it."""
    from stagegraph.core.catalog import load_graph
    from stagegraph.core.engine import Engine
    from stagegraph.core.ports import Module
    from stagegraph.instrument.repro import ReproducerHook
    from stagegraph.workload import parse_workload

    graph = load_graph("x86")
    result = Engine().run(graph, parse_workload("mlp:batch=4,widths=8-16-8"), until="select")
    module = result.value("load", "module")
    original = module.text()
    inputs = {"module": module, "facts": result.value("analyze", "facts"),
              "params": result.params}  # fmt: skip
    event = type("Event", (), {"graph": graph, "stage": graph.stages["schedule"],
                               "inputs": inputs})()  # fmt: skip
    hook = ReproducerHook(tmp_path)
    text = Module.text

    def refuse(self):
        raise AssertionError("printed a module before the stage")

    monkeypatch.setattr(Module, "text", refuse)
    hook.before_stage(event)
    monkeypatch.setattr(Module, "text", text)
    module.ir.body.operations[0].erase()  # the stage mutates its input, then fails
    folder = hook.on_failure(event, RuntimeError("boom"))
    assert (tmp_path / folder / "input.mlir").read_text() == original


def test_verify_each_makes_pass_pipelines_verify_after_every_pass():
    """Pipelines verify their result once; under --verify-each (the VerifyEach hook) their
    pass managers verify after every pass, so a pass that breaks the IR is named."""
    from stagegraph.core.catalog import load_graph
    from stagegraph.instrument.ir_hooks import VerifyEach
    from stagegraph.mlir.diagnostics import VERIFY_PASSES

    graph = load_graph("x86")
    event = type("Event", (), {"graph": graph, "stage": graph.stages["bufferize"],
                               "inputs": {}, "outputs": {}})()  # fmt: skip
    hook = VerifyEach()
    assert VERIFY_PASSES.get() is False
    hook.before_stage(event)
    assert VERIFY_PASSES.get() is True
    hook.after_stage(event)
    assert VERIFY_PASSES.get() is False
    hook.before_stage(event)
    hook.on_failure(event, RuntimeError("boom"))
    assert VERIFY_PASSES.get() is False


FOLDABLE = """\
func.func @main(%a: i32) -> i32 {
  %zero = arith.constant 0 : i32
  %b = arith.addi %a, %zero : i32
  return %b : i32
}
"""


def test_printed_opt_command_runs_the_pipeline(tmp_path):
    """The README's command runs as printed, bare or anchored: a pipeline nested twice in
    ``builtin.module(...)`` would run on no op and leave the module as it was."""
    import subprocess

    from stagegraph.instrument.repro import opt_command

    path = tmp_path / "input.mlir"
    path.write_text(FOLDABLE)
    for pipeline in ("canonicalize", "builtin.module(canonicalize)"):
        command = opt_command(pipeline, path)
        assert "builtin.module(builtin.module" not in command
        done = subprocess.run(command, shell=True, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        assert "func.func @main" in done.stdout and "arith.addi" not in done.stdout
    nested = opt_command("canonicalize", path).replace(
        "builtin.module(canonicalize)", "builtin.module(builtin.module(canonicalize))"
    )
    done = subprocess.run(nested, shell=True, capture_output=True, text=True)
    assert "arith.addi" in done.stdout  # what the old command did: nothing


def test_anchored_pipeline_reproducer_is_not_nested_twice(capsys, tmp_path):
    import yaml

    graph = {
        "name": "badanchor",
        "stages": [
            {"name": "p", "factory": "pipeline",
             "config": {"pipeline": "builtin.module(no-such-pass)"}},
        ],
        "edges": ["payload -> p.module"],
    }  # fmt: skip
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump(graph))
    assert main(["run", str(path), "matmul:m=4,n=4,k=4", "--repro-dir", str(tmp_path)]) == 2
    directory = re.search(r"reproducer: (\S+)", capsys.readouterr().err).group(1)
    readme = (tmp_path / directory / "README").read_text()
    assert "--pass-pipeline='builtin.module(no-such-pass)'" in readme
    assert (tmp_path / directory / "pipeline.txt").read_text() == "builtin.module(no-such-pass)\n"


def test_reproducer_folders_are_unique_within_a_second(capsys, tmp_path):
    root = tmp_path / "repro"
    graph = broken_graph_file(tmp_path)
    found = []
    for _ in range(3):
        assert main(["run", graph, "matmul:m=8,n=8,k=8", "--repro-dir", str(root)]) == 2
        found.append(re.search(r"reproducer: (\S+)", capsys.readouterr().err).group(1))
    assert len(set(found)) == 3
    assert len(list(root.iterdir())) == 3
    for directory in found:
        assert (root / directory / "stage.json").is_file()
