"""Sharded feed-forward on MPI ranks: layout, partitioned IR, runs on 2 and 4 ranks, failures."""

from __future__ import annotations

import json
import subprocess
import time

import numpy as np
import pytest

from stagegraph.catalog import load_graph
from stagegraph.cli import main
from stagegraph.engine import Engine
from stagegraph.errors import (
    MpiTimeoutError,
    MpiUnavailableError,
    RankFailedError,
    RanksMismatchError,
)
from stagegraph.mpi import find_mpich, run_on_ranks
from stagegraph.mpi_worker import FAULT_ENV
from stagegraph.workload import parse_workload
from stagegraph.workloads.ff_sharded import local_slices, owns_block

SMALL_1D = "ff-sharded:m=16,n=32,k=16,grid=2"


def entry_arg_shapes(module) -> list[tuple[int, ...]]:
    """Shapes of ``main``'s arguments, read through the bindings."""
    from stagegraph.mlir import func, ir

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
        if "stagegraph.mpi_worker" in line and marker in line and " Z" not in line
    ]  # fmt: skip
    assert not orphans
