"""Plugins: ``--plugin``, ``STAGEGRAPH_PLUGINS`` and entry points register graphs, workloads,
stages and cost models that then work by name like built-in ones (in isolated children and
tuning workers too); registries refuse duplicate names alike; export round-trips."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import stagegraph as sg
from stagegraph.cli.main import main
from stagegraph.core.ports import TensorModule
from tests.plugin_fixture import write_plugin

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None):
    """``stagegraph ARGS`` in a fresh process (plugins load once per process)."""
    full = {k: v for k, v in os.environ.items() if k != "STAGEGRAPH_PLUGINS"}
    full.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "stagegraph.cli.main", *args],
        capture_output=True,
        text=True,
        env=full,
        cwd=cwd or ROOT,
        timeout=600,
    )


@pytest.fixture(scope="module")
def plugin(tmp_path_factory) -> Path:
    """One plugin loaded into this test process (a module is imported once per process)."""
    from stagegraph.core.plugins import load_plugin

    path = write_plugin(tmp_path_factory.mktemp("plugin"), "inproc")
    load_plugin(str(path))
    return path


def test_plugin_option_lists_graph_workload_and_cost_model(tmp_path):
    path = write_plugin(tmp_path, "sub")
    done = cli("--plugin", str(path), "list", "graphs")
    assert done.returncode == 0, done.stderr
    assert "sub-naive" in done.stdout.split()
    assert "sub-square" in cli("--plugin", str(path), "list", "workloads").stdout.split()
    models = cli("--plugin", str(path), "list", "cost-models").stdout.split()
    assert "sub.small_tiles" in models and "heuristic" in models


def test_plugin_by_module_name_from_the_environment(tmp_path):
    write_plugin(tmp_path, "envmod")
    env = {"STAGEGRAPH_PLUGINS": "envmod_plugin", "PYTHONPATH": str(tmp_path)}
    done = cli("run", "envmod-naive", "envmod-square:m=8,n=8,k=8", "--json", env=env)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["verified"] is True
    assert [s["name"] for s in report["stages"]][:2] == ["load", "cleanup"]


def test_plugin_reaches_the_isolated_child(tmp_path):
    path = write_plugin(tmp_path, "iso")
    done = cli("--plugin", str(path), "run", "iso-naive", "iso-square:m=8,n=8,k=8",
               "--isolate", "--json", cwd=tmp_path.parent)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["verified"] is True


def test_plugin_cost_model_by_name(tmp_path):
    path = write_plugin(tmp_path, "cm")
    done = cli("--plugin", str(path), "run", "x86", "matmul:m=32,n=32,k=32",
               "--cost-model", "cm.small_tiles", "--threads", "1", "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["verified"] is True
    site = report["params"]["matmul"][0]
    assert site["tile_m"] == site["reg_m"]


def test_plugin_reaches_tuning_workers(tmp_path):
    path = write_plugin(tmp_path, "tun")
    env = {"STAGEGRAPH_PLUGINS": str(path)}
    done = cli("tune", "x86", "tun-square:m=32,n=32,k=32", "--budget", "1", "--samples", "4",
               "--cost-model", "tun.small_tiles", "--db", str(tmp_path / "t.db"), "--json",
               env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["failed"] == 0 and report["measured"] == 1, report["failures"]


def test_entry_point_plugin(tmp_path):
    (tmp_path / "epmod.py").write_text(
        "import stagegraph as sg\nsg.register_graph('epgraph', lambda: sg.load_graph('naive'))\n"
    )
    info = tmp_path / "epplug-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: epplug\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[stagegraph.plugins]\nepplug = epmod\n")
    done = cli("list", "graphs", env={"PYTHONPATH": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert "epgraph" in done.stdout.split()


def test_bad_plugins_are_user_errors(tmp_path):
    done = cli("--plugin", str(tmp_path / "missing.py"), "list", "graphs")
    assert done.returncode == 2 and "missing.py does not exist" in done.stderr
    done = cli("--plugin", "no_such_plugin_module", "list", "graphs")
    assert done.returncode == 2 and "no module named 'no_such_plugin_module'" in done.stderr
    broken = tmp_path / "broken_plugin.py"
    broken.write_text("x = 1\nraise RuntimeError('boom')\n")
    done = cli("--plugin", str(broken), "list", "graphs")
    assert done.returncode == 2
    assert "RuntimeError: boom" in done.stderr and f"{broken}:2" in done.stderr
    assert "Traceback" not in done.stderr
    clash = tmp_path / "clash_plugin.py"
    clash.write_text("import stagegraph as sg\nsg.register_graph('naive', lambda: None)\n")
    done = cli("--plugin", str(clash), "list", "graphs")
    assert done.returncode == 2 and "graph name 'naive' is already registered" in done.stderr


def test_export_round_trips_a_plugin_graph(plugin, tmp_path, capsys):
    from stagegraph.core.catalog import load_graph

    for suffix in (".yaml", ".json"):
        out = tmp_path / f"exported{suffix}"
        assert main(["--plugin", str(plugin), "export", "inproc-naive", "-o", str(out)]) == 0
        assert load_graph(str(out)) == load_graph("inproc-naive")
    assert "factory: inproc_plugin:cleanup" in (tmp_path / "exported.yaml").read_text()
    assert main(["export", "x86"]) == 0
    printed = tmp_path / "x86.yaml"
    printed.write_text(capsys.readouterr().out)
    assert load_graph(str(printed)) == load_graph("x86")


def test_export_loads_in_a_fresh_process_beside_the_plugin(tmp_path):
    path = write_plugin(tmp_path, "fresh")
    out = tmp_path / "fresh.yaml"
    assert cli("--plugin", str(path), "export", "fresh-naive", "-o", str(out)).returncode == 0
    done = cli("validate", str(out))  # no plugin: the module beside the file is imported
    assert done.returncode == 0, done.stderr


def test_yaml_naming_a_registered_user_stage_loads(plugin, tmp_path):
    from stagegraph.core.catalog import load_graph

    path = tmp_path / "user.yaml"
    path.write_text(
        "name: user\nstages:\n  - {name: load, factory: verify}\n"
        "  - {name: tidy, factory: inproc.cleanup, config: {pipeline: cse}}\n"
        "edges: [payload -> load.module, load.module -> tidy.module]\n"
    )
    graph = load_graph(str(path))
    assert graph.stages["tidy"].factory.name == "inproc.cleanup"
    assert graph.stages["tidy"].config.pipeline == "cse"


def test_registries_refuse_duplicate_names_alike(plugin):
    from stagegraph.errors import DuplicateNameError
    from stagegraph.workloads.matmul import Matmul

    with pytest.raises(DuplicateNameError, match="graph name 'naive'"):
        sg.register_graph("naive", lambda: sg.load_graph("naive"))
    with pytest.raises(DuplicateNameError, match="graph name 'inproc-naive' is already"):
        sg.register_graph("inproc-naive", lambda: sg.load_graph("naive"))

    class Other(Matmul):
        name = "matmul"

    with pytest.raises(DuplicateNameError, match="workload name 'matmul'"):
        sg.register_workload(Other)
    from stagegraph.stages.x86.costmodels import analytical

    with pytest.raises(DuplicateNameError, match="cost model name 'heuristic'"):
        sg.register_cost_model("heuristic", analytical)
    with pytest.raises(DuplicateNameError, match="stage name 'inproc.cleanup'"):

        @sg.stage("passes", name="inproc.cleanup")
        def cleanup(module: TensorModule) -> TensorModule:
            return module

    module = sys.modules["inproc_plugin"]  # the same definitions again: no clash
    sg.register_graph("inproc-naive", module.build)
    sg.register_workload(module.Square)
    sg.register_cost_model("inproc.small_tiles", module.small_tiles)


def test_python_graph_file_imports_modules_beside_it(tmp_path, capsys):
    (tmp_path / "beside_stages.py").write_text("NAME = 'besides'\n")
    graph_file = tmp_path / "beside_graph.py"
    graph_file.write_text(
        "from beside_stages import NAME\nfrom stagegraph.core.catalog import load_graph\n"
        "def build():\n    g = load_graph('naive')\n    return g\n"
    )
    assert main(["validate", str(graph_file)]) == 0
    missing = tmp_path / "missing_import_graph.py"
    missing.write_text("import not_there_at_all\n")
    assert main(["validate", str(missing)]) == 2
    err = capsys.readouterr().err
    assert "No module named 'not_there_at_all'" in err and str(missing) in err


def test_plugins_environment_names_loaded_plugins(plugin):
    from stagegraph.app.session import SessionRequest
    from stagegraph.core.plugins import ENV, plugins_environment

    assert str(plugin) in plugins_environment({})[ENV].split(os.pathsep)
    assert str(plugin) in SessionRequest(graph="naive", workload="matmul").plugins


@pytest.mark.slow
def test_plugin_graph_on_mpi_ranks(tmp_path):
    plugin = tmp_path / "ranks_plugin.py"
    plugin.write_text(
        "import stagegraph as sg\n"
        "sg.register_graph('ranks-sharded', lambda: sg.load_graph('sharded'))\n"
    )
    done = cli("--plugin", str(plugin), "run", "ranks-sharded",
               "ff-sharded:m=64,n=128,k=64,grid=2", "--ranks", "2", "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["verified"] is True
