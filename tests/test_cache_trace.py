"""Persistent stage cache (--cache, Engine(cache_dir=...)) and Chrome traces (--trace,
show --trace) through the CLI as typed and through the API (issue #15 items 5 and 6)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from stagegraph.cli.main import main
from stagegraph.core.catalog import load_graph
from stagegraph.core.engine import Engine
from stagegraph.errors import StagegraphWarning
from stagegraph.workload import parse_workload

SMALL = "matmul:m=16,n=16,k=16"


def run_json(capsys, *args: str) -> tuple[dict, str]:
    assert main(list(args)) == 0
    captured = capsys.readouterr()
    return json.loads(captured.out), captured.err


def cached(report: dict) -> dict[str, bool]:
    return {s["name"]: s["cached"] for s in report["stages"]}


def test_second_cli_run_replays_compile_stages_and_ignores_a_corrupt_entry(tmp_path, capsys):
    cache = str(tmp_path / "cache")
    args = ["run", "naive", SMALL, "--json", "--cache", cache]
    first, _ = run_json(capsys, *args)
    assert not any(cached(first).values())
    second, err = run_json(capsys, *args)
    assert cached(second) == {
        "load": True, "bufferize": True, "loops": True, "lower": True, "emit": False,
    }  # fmt: skip
    assert second["verified"] and "warning" not in err
    entries = {
        json.loads(p.read_text())["stage"]: p.parent for p in Path(cache).rglob("entry.json")
    }
    assert set(entries) == {"load", "bufferize", "loops", "lower"}  # never emit (Binary)
    (entries["loops"] / "module.mlirbc").write_bytes(b"not bytecode")
    third, err = run_json(capsys, *args)
    assert "warning: ignoring cache entry" in err and "stage 'loops'" in err
    assert cached(third)["loops"] is False and cached(third)["lower"] is True
    assert third["verified"]
    fourth, err = run_json(capsys, *args)  # the bad entry was rewritten
    assert cached(fourth)["loops"] is True and "warning" not in err


def test_api_cache_dir_stores_facts_and_params_as_json(tmp_path):
    workload = parse_workload(SMALL)
    graph = load_graph("x86")
    Engine(cache_dir=str(tmp_path)).run(graph, workload)
    result = Engine(cache_dir=str(tmp_path)).run(graph, workload)
    flags = {r.name: r.cached for r in result.trace.records}
    assert flags["analyze"] and flags["select"] and flags["schedule"] and flags["lower"]
    assert not flags["target"] and not flags["emit"]  # reads the host / gives a Binary
    outputs = workload.verify(result.binary.call(workload.entry, workload.inputs()))
    assert outputs.ok
    entries = [json.loads(p.read_text()) for p in tmp_path.rglob("entry.json")]
    select = next(e for e in entries if e["stage"] == "select")
    assert select["outputs"]["params"]["class"] == "stagegraph.stages.x86.params_stage:X86Params"
    # A foreign class in an entry is never imported blindly: a warning, then recomputed.
    entry_file = next(
        p for p in tmp_path.rglob("entry.json") if json.loads(p.read_text())["stage"] == "select"
    )
    select["outputs"]["params"]["class"] = "no_such_module:Params"
    entry_file.write_text(json.dumps(select))
    with pytest.warns(StagegraphWarning, match="no_such_module:Params is not importable"):
        again = Engine(cache_dir=str(tmp_path)).run(graph, workload)
    assert {r.name: r.cached for r in again.trace.records}["select"] is False


def events_of(path: Path) -> list[dict]:
    data = json.loads(path.read_text())
    return [e for e in data["traceEvents"] if e["ph"] == "X"]


def test_run_trace_is_chrome_trace_and_show_draws_it(tmp_path, capsys):
    trace = tmp_path / "run.json"
    assert main(["run", "naive", SMALL, "--trace", str(trace)]) == 0
    capsys.readouterr()
    events = events_of(trace)
    assert [e["name"] for e in events] == ["load", "bufferize", "loops", "lower", "emit"]
    for e in events:
        assert {"ts", "dur", "pid", "tid"} <= set(e) and e["pid"] == os.getpid()
    assert not Path(f"{trace}.parts").exists()
    assert main(["show", "naive", "--trace", str(trace), "--format", "text"]) == 0
    text = capsys.readouterr().out
    assert "lower (passes)" in text and " ms" in text
    assert main(["show", "naive", "--trace", str(trace)]) == 0
    assert "ms" in capsys.readouterr().out
    import shutil

    if shutil.which("dot"):
        svg = tmp_path / "naive.svg"
        assert main(["show", "naive", "--trace", str(trace), "-o", str(svg)]) == 0
        assert "ms" in svg.read_text()


def test_isolated_child_and_bench_write_to_the_trace(tmp_path, capsys):
    trace = tmp_path / "iso.json"
    assert main(["run", "naive", SMALL, "--isolate", "--trace", str(trace)]) == 0
    events = events_of(trace)
    assert {e["pid"] for e in events} - {os.getpid()}, "the child's stages are missing"
    assert main(["bench", "naive", SMALL, "--budget", "0.2", "--trace", str(trace)]) == 0
    assert "bench" in [e["name"] for e in events_of(trace)]
    capsys.readouterr()
    assert main(["show", "naive", "--trace", str(trace), "--format", "text"]) == 0
    text = capsys.readouterr().out
    assert "bench (wrapper)" in text and "loops (passes)" in text
    assert text.index("bufferize") < text.index("bench (wrapper)") < text.index("loops")


@pytest.mark.slow
def test_tune_workers_and_mpi_ranks_write_to_the_trace(tmp_path, capsys):
    trace = tmp_path / "tune.json"
    args = ["tune", "x86", "matmul:m=64,n=64,k=64", "--budget", "2", "--jobs", "2", "--json",
            "--db", str(tmp_path / "t.db"), "--samples", "4", "--trace", str(trace)]  # fmt: skip
    assert main(args) == 0
    pids = {e["pid"] for e in events_of(trace)}
    assert len(pids - {os.getpid()}) >= 1
    capsys.readouterr()
    trace = tmp_path / "mpi.json"
    code = main(["run", "sharded", "ff-sharded:m=128,n=256,k=128,grid=2", "--ranks", "2",
                 "--trace", str(trace)])  # fmt: skip
    assert code == 0
    names = json.loads(trace.read_text())["traceEvents"]
    labels = {e["args"]["name"] for e in names if e["ph"] == "M"}
    assert {"rank 0", "rank 1"} <= labels
