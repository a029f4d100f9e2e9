"""The CLI's core commands: list, show, validate, schema, and exit code 2 on user errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pydot

from stagegraph.cli.main import main
from tests.test_spec import GOOD


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_help_lists_commands(capsys):
    code, out, _ = run_cli(capsys, "--help")
    assert code == 0
    for command in ("list", "show", "validate", "schema"):
        assert command in out


def test_list_stages_json(capsys):
    code, out, _ = run_cli(capsys, "list", "stages", "--json")
    assert code == 0
    rows = {r["name"]: r for r in json.loads(out)}
    assert rows["bufferize"]["kind"] == "passes"
    assert rows["bufferize"]["outputs"] == ["module: Module[buffer]"]


def test_show_file_as_dot_and_text(capsys, tmp_path):
    path = tmp_path / "demo.yaml"
    path.write_text(GOOD)
    code, out, _ = run_cli(capsys, "show", str(path))
    assert code == 0
    (dot,) = pydot.graph_from_dot_data(out)
    assert {n.get_name() for n in dot.get_nodes()} >= {"analyze", "select", "schedule", "payload"}
    code, out, _ = run_cli(capsys, "show", str(path), "--format", "text")
    assert code == 0 and "schedule (schedule) #scheduled" in out


def test_validate_json_and_errors(capsys, tmp_path):
    path = tmp_path / "demo.yaml"
    path.write_text(GOOD)
    code, out, _ = run_cli(capsys, "validate", str(path), "--json")
    assert code == 0 and json.loads(out)["valid"] is True
    path.write_text(GOOD.replace("factory: test.select,", "factory: test.selectt,"))
    code, _, err = run_cli(capsys, "validate", str(path))
    assert code == 2
    assert "did you mean 'test.select'" in err and "Traceback" not in err


def test_unknown_graph_exit_2(capsys):
    code, _, err = run_cli(capsys, "show", "no-such-graph")
    assert code == 2
    assert err.startswith("error: unknown graph 'no-such-graph'")


def test_render_svg_without_graphviz_says_how(capsys, tmp_path, monkeypatch):
    import shutil

    path = tmp_path / "demo.yaml"
    path.write_text(GOOD)
    monkeypatch.setattr(shutil, "which", lambda _name: None)
    code, _, err = run_cli(capsys, "show", str(path), "-o", str(tmp_path / "g.svg"))
    assert code == 2 and "Graphviz 'dot' program is not installed" in err


def test_schema_prints_json_schema(capsys):
    code, out, _ = run_cli(capsys, "schema")
    assert code == 0 and json.loads(out)["title"] == "GraphFile"


def test_console_script_runs_without_traceback(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "stagegraph.cli.main", "show", "nope"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr


def test_import_does_not_load_mlir():
    code = (
        "import sys, stagegraph, stagegraph.core.graph, stagegraph.core.engine; "
        "import stagegraph.cli.main; "
        "print(any(m.split('.')[0] in ('mlir', 'torch_mlir') for m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "False"


def test_show_x86_has_every_stage_and_edge(capsys):
    from stagegraph.core.catalog import load_graph

    graph = load_graph("x86")
    code, out, _ = run_cli(capsys, "show", "x86")
    assert code == 0
    (dot,) = pydot.graph_from_dot_data(out)
    names = {n.get_name().strip('"') for n in dot.get_nodes()} - {"node", "graph", "edge"}
    assert names == set(graph.order())
    edges = [(e.get_source(), e.get_destination()) for e in dot.get_edges()]
    assert sorted(edges) == sorted((e.src, e.dst) for e in graph.edges)


def test_list_graphs_and_workloads(capsys):
    code, out, _ = run_cli(capsys, "list", "graphs")
    assert code == 0 and {"naive", "x86", "sharded"} <= set(out.split())
    code, out, _ = run_cli(capsys, "list", "workloads")
    assert code == 0 and {"matmul", "mlp", "ff", "ff-sharded"} <= set(out.split())
