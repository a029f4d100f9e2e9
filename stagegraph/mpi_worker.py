"""One MPI rank of ``stagegraph run ... --ranks N`` (started by :mod:`stagegraph.mpi`).

Rank 0 compiles the graph and broadcasts the LLVM-level IR as text; every rank JITs it
with the graph's own emit stage (``libmpi`` added to its shared libraries). Rank 0 scatters
the inputs per the workload's layout, all ranks run, rank 0 gathers, verifies against the
reference and writes the report. Progress goes to ``rank-N.phase``, a failure to
``rank-N.error`` before ``MPI_Abort`` takes the job down.

``STAGEGRAPH_MPI_FAULT=RANK:fail|hang[:PHASE]`` injects a fault (tests of the launcher).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from stagegraph.engine import Engine, Hook, StageEvent
from stagegraph.errors import RankFailedError
from stagegraph.execute import StageTime
from stagegraph.graph import Graph
from stagegraph.ports import LLVMModule, Module

FAULT_ENV = "STAGEGRAPH_MPI_FAULT"


class Progress:
    """Phase and error files of one rank in the launcher's scratch directory."""

    def __init__(self, scratch: Path, rank: int) -> None:
        self.scratch, self.rank = scratch, rank

    def phase(self, name: str) -> None:
        (self.scratch / f"rank-{self.rank}.phase").write_text(name)
        _inject_fault(self.rank, name)

    def fail(self, error: BaseException) -> None:
        text = str(error).strip() or type(error).__name__
        (self.scratch / f"rank-{self.rank}.error").write_text(f"{type(error).__name__}: {text}")


def _inject_fault(rank: int, phase: str) -> None:
    spec = os.environ.get(FAULT_ENV, "")
    if not spec:
        return
    target, kind, at = ([*spec.split(":"), "run"])[:3]
    if int(target) != rank or at != phase:
        return
    if kind == "hang":
        while True:
            time.sleep(60)
    raise RuntimeError(f"injected fault on rank {rank} in phase {phase!r}")


class EmitInput(Hook):
    """Keeps the text of the module the emit stage receives (the LLVM-level IR)."""

    text: str | None = None

    def before_stage(self, event: StageEvent) -> None:
        if event.stage.kind == "emit":
            self.text = next(v.text() for v in event.inputs.values() if isinstance(v, Module))


def emit_stage(graph: Graph, libmpi: str) -> Graph:
    """The graph with ``libmpi`` among its emit stage's shared libraries."""
    (emit,) = [s for s in graph.stages.values() if s.kind == "emit"]
    libs = tuple(emit.config.model_dump().get("shared_libs", ()))
    return graph.with_config(emit.name, shared_libs=(*libs, libmpi))


def compile_on_rank(comm: Any, graph: Graph, workload: Any) -> tuple[Any, list[StageTime]]:
    """Rank 0 runs the graph; the others JIT the LLVM IR it broadcasts."""
    if comm.rank == 0:
        hook = EmitInput()
        result = Engine([hook]).run(graph, workload)
        comm.bcast(hook.text, root=0)
        times = [
            StageTime(name=r.name, kind=r.kind, seconds=r.seconds, cached=r.cached)
            for r in result.trace.records
        ]
        return result.binary, times
    from stagegraph.irutil import parse_module
    from stagegraph.mlir import ir, new_context

    text = comm.bcast(None, root=0)
    context = new_context()
    (emit,) = [s for s in graph.stages.values() if s.kind == "emit"]
    module = LLVMModule(parse_module(text, context, source="rank 0 LLVM IR"))
    with context, ir.Location.unknown():
        return emit.run({"module": module})["binary"], []


def scatter_inputs(comm: Any, workload: Any) -> list[np.ndarray]:
    """Each rank's block of every input, cut by rank 0 from the global arrays."""
    from stagegraph.workloads.ff_sharded import local_slices

    blocks = None
    if comm.rank == 0:
        layout = workload.layout()
        blocks = [
            [
                np.ascontiguousarray(x[local_slices(split, x.shape, layout, r)])
                for x, split in zip(workload.inputs(), layout.inputs, strict=True)
            ]
            for r in range(comm.size)
        ]
    return comm.scatter(blocks, root=0)


def assemble(workload: Any, gathered: list[list[np.ndarray]]) -> list[np.ndarray]:
    """Global results from the ranks' blocks (one owner per replicated block)."""
    from stagegraph.workloads.ff_sharded import local_slices, owns_block

    layout = workload.layout()
    results = []
    for i, (spec, split) in enumerate(zip(workload.output_specs(), layout.outputs, strict=True)):
        out = np.zeros(spec.shape, spec.numpy_dtype)
        for rank, outputs in enumerate(gathered):
            if owns_block(split, layout, rank):
                out[local_slices(split, spec.shape, layout, rank)] = outputs[i]
        results.append(out)
    return results


def run_rank(comm: Any, args: argparse.Namespace, progress: Progress) -> dict[str, Any] | None:
    """Everything one rank does; rank 0 returns the report."""
    from stagegraph.catalog import load_graph
    from stagegraph.execute import install_reference_runner
    from stagegraph.workload import parse_workload

    install_reference_runner()
    progress.phase("compile")
    graph = emit_stage(load_graph(args.graph), args.libmpi)
    workload = parse_workload(args.workload)
    binary, stages = compile_on_rank(comm, graph, workload)
    progress.phase("scatter")
    inputs = scatter_inputs(comm, workload)
    signature = binary.signatures[workload.entry]
    expected = [tuple(a.shape) for a in signature.inputs]
    if [x.shape for x in inputs] != expected:
        raise RankFailedError(
            f"rank {comm.rank}: the partitioned signature takes {expected} but the layout "
            f"gives blocks {[x.shape for x in inputs]}"
        )
    progress.phase("run")
    comm.Barrier()
    start = time.perf_counter()
    outputs = binary.call(workload.entry, inputs)
    seconds = time.perf_counter() - start
    progress.phase("gather")
    gathered = comm.gather(outputs, root=0)
    times = comm.gather(seconds, root=0)
    if comm.rank != 0:
        return None
    progress.phase("verify")
    verdict = workload.verify(assemble(workload, gathered))
    return {
        "graph": graph.name,
        "workload": workload.spec,
        "verified": verdict.ok,
        "max_abs_error": verdict.max_abs_error,
        "max_rel_error": verdict.max_rel_error,
        "message": verdict.message,
        "stages": [s.model_dump() for s in stages],
        "compile_seconds": sum(s.seconds for s in stages),
        "run_seconds": max(times),
        "ranks": comm.size,
        "grid": workload.layout().grid,
        "local_inputs": expected,
        "local_outputs": [tuple(a.shape) for a in signature.outputs],
        "rank_run_seconds": times,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stagegraph.mpi_worker")
    parser.add_argument("graph")
    parser.add_argument("workload")
    parser.add_argument("--scratch", type=Path, required=True)
    parser.add_argument("--libmpi", required=True)
    args = parser.parse_args(argv)

    from mpi4py import MPI  # initializes MPI in this process, before any JIT code runs

    comm = MPI.COMM_WORLD
    progress = Progress(args.scratch, comm.rank)
    try:
        report = run_rank(comm, args, progress)
    except BaseException as error:  # every failure must reach the launcher
        progress.fail(error)
        sys.stderr.flush()
        comm.Abort(1)
        return 1
    if report is not None:
        from stagegraph.mpi import REPORT_FILE, MpiReport

        text = MpiReport.model_validate(report).model_dump_json(indent=2)
        (args.scratch / REPORT_FILE).write_text(text)
    progress.phase("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
