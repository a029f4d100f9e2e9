"""The public API: ``import stagegraph as sg`` (lazy, no MLIR), ``sg.run``/``sg.bench``/
``sg.tune`` with the CLI's options, and a Graph object where a graph name goes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import stagegraph as sg
from stagegraph.errors import ConfigError

PUBLIC = [
    "Config", "Engine", "Facts", "Graph", "GraphInput", "Module", "Params", "StagegraphError",
    "Workload", "bench", "load_graph", "load_plugin", "parse_workload", "register_cost_model",
    "register_graph", "register_workload", "run", "stage", "tune", "Binary", "WorkloadRef",
    "declare_space", "Range", "Choice", "TuningSite", "build_artifact", "from_torch", "compile",
    "torch_backend",
]  # fmt: skip


def test_import_is_lazy_and_loads_no_mlir():
    code = (
        "import sys, stagegraph as sg\n"
        "assert 'stagegraph.core' not in sys.modules, 'eager import'\n"
        f"names = {PUBLIC!r}\n"
        "[getattr(sg, n) for n in names]\n"
        "print(any(m.split('.')[0] in ('mlir', 'torch_mlir', 'torch') for m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_public_names():
    assert sorted(sg.__all__) == sorted(PUBLIC)
    assert set(PUBLIC) <= set(dir(sg))
    with pytest.raises(AttributeError):
        _ = sg.no_such_name


def test_run_by_name_with_cli_options():
    report = sg.run("x86", "matmul:m=32,n=32,k=32", param={"tile_m": 24}, threads=1)
    assert report.verified is True
    assert report.params["matmul"][0]["tile_m"] == 24
    assert sg.run("x86", "matmul:m=32,n=32,k=32", param=["tile_m=48"]).verified


def _composed() -> sg.Graph:
    from stagegraph.stages.common.emit import jit
    from stagegraph.stages.common.passes import bufferize, linalg_to_loops, lower_to_llvm, verify

    return sg.Graph(
        "composed",
        [verify("load"), bufferize(tags={"bufferized"}), linalg_to_loops("loops"),
         lower_to_llvm("lower"), jit("emit")],
        ["payload -> load.module", "load.module -> bufferize.module",
         "bufferize.module -> loops.module", "loops.module -> lower.module",
         "lower.module -> emit.module"],
        [sg.GraphInput("payload", sg.Module["tensor"], frozenset({"input"}))],
    )  # fmt: skip


def test_run_a_graph_object():
    graph = _composed()
    report = sg.run(graph, "matmul:m=8,n=8,k=8")
    assert report.verified is True and report.graph == "composed"
    result = sg.run(graph, "matmul:m=8,n=8,k=8", until="bufferized")
    assert "memref" in result.module.text()
    result = sg.Engine().run(graph, sg.parse_workload("matmul:m=8,n=8,k=8"))
    assert result.binary is not None


def test_a_graph_object_cannot_cross_processes():
    with pytest.raises(ConfigError, match="register it"):
        sg.run(_composed(), "matmul:m=8,n=8,k=8", isolate=True)
    with pytest.raises(ConfigError, match="register it"):
        sg.tune(_composed(), "matmul:m=8,n=8,k=8", explain=True)


def test_bench_versus_numpy(tmp_path):
    comparison = sg.bench(
        "x86", "matmul:m=64,n=64,k=64", budget=0.5, vs="numpy", threads=1,
        csv=str(tmp_path / "runs.csv"),
    )  # fmt: skip
    assert comparison.a.verified and comparison.ratio > 0
    assert len((tmp_path / "runs.csv").read_text().splitlines()) == 3  # header + 2 rows
    report = sg.bench(
        _composed(), "matmul:m=16,n=16,k=16", splice_at="bufferized", budget=0.2, repeat=4
    )
    assert report.verified and report.samples >= 4


def test_tune_explain_and_one_candidate(tmp_path):
    space = sg.tune("x86", "matmul:m=64,n=64,k=64", explain=True)
    assert "matmul0.tile_m" in space["fields"]
    report = sg.tune("x86", "matmul:m=32,n=32,k=32", budget=1, samples=4,
                     db=str(tmp_path / "t.db"))  # fmt: skip
    assert report.measured == 1 and report.failed == 0


def test_tuning_script_without_main_guard(tmp_path):
    """The isolated children must not re-run an unguarded ``__main__`` (they did, and every
    candidate failed with "not evaluated: the batch failed before it")."""
    script = tmp_path / "tune_script.py"
    script.write_text(
        "import stagegraph as sg\n"
        f"report = sg.tune('x86', 'matmul:m=32,n=32,k=32', budget=1, samples=4, "
        f"db={str(tmp_path / 't.db')!r})\n"
        "print('RESULT', report.measured, report.failed)\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=600
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["RESULT 1 0"]


def test_readme_mentions_the_api():
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    for snippet in ("Engine().run", "sg.run(", "sg.bench("):
        assert snippet in readme
