"""Sharded feed-forward on MPI ranks: layout, partitioned IR, runs and benchmarks, failures."""

from __future__ import annotations

import json
import subprocess
import time

import numpy as np
import pytest

from stagegraph.app.bench import BenchOptions
from stagegraph.app.mpi_launch import bench_on_ranks, check_splice, find_mpich, run_on_ranks
from stagegraph.app.mpi_rank import COMM_SPLIT_BUDGET, FAULT_ENV, sample_limit
from stagegraph.cli.main import main
from stagegraph.core.catalog import load_graph
from stagegraph.core.engine import Engine
from stagegraph.errors import (
    ConfigError,
    MpiTimeoutError,
    MpiUnavailableError,
    RankFailedError,
    RanksMismatchError,
)
from stagegraph.workload import parse_workload
from stagegraph.workload.layout import local_slices, owns_block

SMALL_1D = "ff-sharded:m=16,n=32,k=16,grid=2"


def entry_arg_shapes(module) -> list[tuple[int, ...]]:
    """Shapes of ``main``'s arguments, read through the bindings."""
    from stagegraph.mlir.bindings import func, ir

    (main_op,) = [
        op for op in module.ir.body.operations
        if isinstance(op, func.FuncOp) and op.sym_name.value == "main"
    ]  # fmt: skip
    return [tuple(ir.RankedTensorType(t).shape) for t in main_op.type.inputs]


def test_cli_two_ranks_one_d(capsys):
    code = main(["run", "sharded", "ff-sharded:m=128,n=256,k=128,grid=2", "--ranks", "2", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert report["verified"] is True
    assert report["ranks"] == 2
    assert report["local_inputs"] == [[128, 128], [128, 128], [128, 128]]
    assert report["local_outputs"] == [[128, 128]]
    assert [s["name"] for s in report["stages"]][:4] == ["load", "propagate", "partition", "to_mpi"]


def test_four_ranks_two_d():
    report = run_on_ranks("sharded", "ff-sharded:m=32,n=64,k=32,grid=2x2", 4, timeout=120)
    assert report.verified, report.message
    assert report.grid == (2, 2)
    assert report.local_inputs == [(32, 16), (16, 32), (32, 16)]
    assert report.local_outputs == [(32, 16)]


def test_ranks_grid_mismatch_message(capsys):
    assert main(["run", "sharded", "ff-sharded:grid=2x2", "--ranks", "2"]) == 2
    err = capsys.readouterr().err
    assert "--ranks 2 does not match the device grid 2x2" in err
    assert "use --ranks 4" in err
    with pytest.raises(RanksMismatchError, match="not sharded"):
        run_on_ranks("sharded", "ff:m=8,n=8,k=8", 2)


def test_ranks_rejects_other_options(capsys):
    assert main(["run", "sharded", SMALL_1D, "--ranks", "2", "--until", "partitioned"]) == 2
    assert "--ranks cannot be combined with --until" in capsys.readouterr().err


def test_mpi_missing_is_a_clear_error(monkeypatch):
    from importlib import metadata

    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "files", missing)
    with pytest.raises(MpiUnavailableError, match="MPI is not installed: no 'mpich' package"):
        find_mpich()


def test_show_has_partitioned_tag(capsys):
    graph = load_graph("sharded")
    assert graph.node_for_tag("partitioned") == "partition"
    assert main(["show", "sharded", "--format", "text"]) == 0
    assert "partition (passes) #partitioned" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("grid", "local"),
    [("2", [(16, 16), (16, 16), (16, 16)]), ("2x2", [(16, 8), (8, 16), (16, 8)])],
)
def test_partitioned_ir_has_local_shapes(grid, local):
    workload = parse_workload(f"ff-sharded:m=16,n=32,k=16,grid={grid}")
    engine, graph = Engine(), load_graph("sharded")
    payload = engine.run(graph, workload, until="input").module
    assert entry_arg_shapes(payload) == [(16, 16), (16, 32), (32, 16)]
    assert entry_arg_shapes(engine.run(graph, workload, until="partitioned").module) == local


def test_layout_blocks_cover_the_global_arrays():
    workload = parse_workload("ff-sharded:m=4,n=8,k=4,grid=2x2")
    layout = workload.layout()
    for spec, split in zip(workload.input_specs(), layout.inputs, strict=True):
        hits = np.zeros(spec.shape, int)
        for rank in range(layout.ranks):
            if owns_block(split, layout, rank):
                hits[local_slices(split, spec.shape, layout, rank)] += 1
        assert (hits == 1).all()


def test_indivisible_shape_is_rejected():
    with pytest.raises(ValueError, match="does not divide evenly over grid 3"):
        parse_workload("ff-sharded:m=8,n=16,k=8,grid=3")


def test_failing_rank_ends_the_job_with_its_error(monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "1:fail:run")
    start = time.monotonic()
    with pytest.raises(RankFailedError, match=r"rank 1 failed: RuntimeError: injected fault"):
        run_on_ranks("sharded", SMALL_1D, 2, timeout=120)
    assert time.monotonic() - start < 60


def test_hanging_rank_is_killed_at_the_timeout(monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "1:hang:scatter")
    marker = "seed=4242"  # tells this job's processes from any other
    with pytest.raises(MpiTimeoutError, match=r"within 8 s.*1 scatter"):
        run_on_ranks("sharded", f"{SMALL_1D},{marker}", 2, timeout=8)
    time.sleep(0.5)
    left = subprocess.run(["ps", "-eo", "pid,stat,args"], capture_output=True, text=True).stdout
    orphans = [
        line for line in left.splitlines()
        if "stagegraph.app.mpi_rank" in line and marker in line and " Z" not in line
    ]  # fmt: skip
    assert not orphans


# -- bench --ranks N --------------------------------------------------------------------------

BENCH_1D = "ff-sharded:m=256,n=512,k=256,grid=2"


def test_bench_two_ranks_slowest_rank_statistics(capsys):
    args = ["bench", "sharded", BENCH_1D, "--ranks", "2", "--splice-at", "partitioned",
            "--json", "--budget", "0.3", "--repeat", "4", "--warmup", "1"]  # fmt: skip
    code = main(args)
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert report["verified"] is True
    assert (report["graph"], report["splice_at"]) == ("sharded", "partitioned")
    assert (report["ranks"], report["grid"]) == (2, [2])
    assert report["local_inputs"] == [[256, 256], [256, 256], [256, 256]]
    assert report["samples"] >= 4
    assert 0 < report["min_s"] <= report["p10_s"] <= report["median_s"] <= report["p90_s"]
    assert report["ci_low_s"] <= report["median_s"] <= report["ci_high_s"]
    assert report["gflops"] > 0 and report["compile_seconds"] > 0 and report["cv"] >= 0
    # the median of the per-call maximum bounds every rank's own median from above
    assert len(report["rank_median_s"]) == 2
    assert report["median_s"] >= max(report["rank_median_s"])
    assert report["sample_limit"] is None  # a 1-D grid splits no communicator
    assert "bench" in report["stage_seconds"]
    # what the number depends on, and whether it may be quoted, as in single-process reports
    assert report["host"]["cpu_model"] and report["host"]["target"]
    assert report["trustworthy"] in (True, False) and isinstance(report["warning"], str)


def test_bench_splice_before_partition_is_refused(capsys):
    start = time.monotonic()
    code = main(["bench", "sharded", SMALL_1D, "--ranks", "2", "--splice-at", "input"])
    err = capsys.readouterr().err
    assert code == 2
    assert "cannot splice the benchmark wrapper at 'input'" in err
    assert "before stage 'partition'" in err
    assert time.monotonic() - start < 30  # refused before any rank starts


def test_check_splice_accepts_partitioned_and_later():
    graph = load_graph("sharded")
    assert check_splice(graph, None) == "partitioned"
    assert check_splice(graph, "bufferized") == "bufferized"
    with pytest.raises(ConfigError, match="before stage 'partition'"):
        check_splice(graph, "load")
    with pytest.raises(ConfigError, match="no stage tagged 'partitioned'"):
        check_splice(load_graph("naive"), "input")


@pytest.mark.parametrize("versus", ["numpy", "naive"])
def test_bench_ranks_rejects_vs(capsys, versus):
    assert main(["bench", "sharded", SMALL_1D, "--ranks", "2", "--vs", versus]) == 2
    assert "--ranks cannot be combined with --vs" in capsys.readouterr().err


def test_bench_ranks_grid_mismatch(capsys):
    assert main(["bench", "sharded", "ff-sharded:grid=2x2", "--ranks", "2"]) == 2
    assert "use --ranks 4" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["run", "bench"])
def test_sharded_without_ranks_hints_at_ranks(capsys, command):
    assert main([command, "sharded", SMALL_1D]) == 2
    err = capsys.readouterr().err
    assert "runs only on MPI ranks: add --ranks 2" in err
    assert "shape" not in err


def test_two_d_bench_is_capped_below_the_comm_split_leak():
    """Each call of a 2-D grid's entry leaks two communicators (upstream); MPICH has 2048.

    Without the cap, the ~1023rd call fails; the repeat asked for here would pass that.
    """
    options = BenchOptions(warmup=0, repeat=2000, budget_s=30.0)
    report = bench_on_ranks("sharded", "ff-sharded:m=8,n=16,k=8,grid=1x2", 2, options=options)
    assert report.verified, report.message  # verified again after the timed calls
    assert report.sample_limit == COMM_SPLIT_BUDGET // 2 - 3
    assert report.samples == report.sample_limit
    assert sample_limit(0, 5) is None
