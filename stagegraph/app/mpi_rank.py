"""One MPI rank of ``stagegraph run|bench ... --ranks N``, started by
:mod:`stagegraph.app.mpi_launch`.

Rank 0 compiles the graph and broadcasts the LLVM-level IR as text; every rank JITs it
with the graph's own emit stage (``libmpi`` added to its shared libraries). Rank 0 scatters
the inputs per the workload's layout, all ranks run, rank 0 gathers, verifies against the
reference and writes the report. Progress goes to ``rank-N.phase``, a failure to
``rank-N.error`` before ``MPI_Abort`` takes the job down.

With ``--bench REQUEST`` the graph carries the timing wrapper; after verification rank 0
drives the sampling loop: it broadcasts each batch size (0 ends the loop), every rank runs
the wrapper, and rank 0 keeps the elementwise maximum of the gathered timing arrays.

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

from stagegraph.app.run import StageTime
from stagegraph.core.engine import Engine, Hook, StageEvent, StageRecord
from stagegraph.core.graph import Graph
from stagegraph.core.ports import LLVMModule, Module
from stagegraph.errors import RankFailedError

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


COMM_SPLIT = "MPI_Comm_split"
COMM_SPLIT_BUDGET = 1000
"""Communicators a benchmark may leak through ``MPI_Comm_split`` (MPICH has ~2000 ids)."""


class EmitInput(Hook):
    """Keeps the text of the module the emit stage receives (the LLVM-level IR).

    Also counts its calls of ``MPI_Comm_split``: each one leaks a communicator per call of
    the entry (see :mod:`stagegraph.app.mpi_launch`), which bounds how often a benchmark may
    call it.
    """

    text: str | None = None
    comm_splits: int = 0

    def before_stage(self, event: StageEvent) -> None:
        if event.stage.kind == "emit":
            module = next(v for v in event.inputs.values() if isinstance(v, Module))
            self.text = module.text()
            self.comm_splits = count_calls(module.ir, COMM_SPLIT)


def count_calls(module: Any, callee: str) -> int:
    """How many ``llvm.call`` / ``func.call`` ops in ``module`` call the symbol ``callee``."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import collect

    calls = collect(module, lambda op: op.name in ("llvm.call", "func.call"))
    return sum(
        "callee" in op.attributes and ir.FlatSymbolRefAttr(op.attributes["callee"]).value == callee
        for op in calls
    )


def emit_stage(graph: Graph, libmpi: str) -> Graph:
    """The graph with ``libmpi`` among its emit stage's shared libraries."""
    emit = graph.one_stage_of_kind("emit")
    libs = tuple(emit.config.model_dump().get("shared_libs", ()))
    return graph.with_config(emit.name, shared_libs=(*libs, libmpi))


def compile_on_rank(
    comm: Any, graph: Graph, workload: Any, hook: EmitInput | None = None
) -> tuple[Any, list[StageTime]]:
    """Rank 0 runs the graph; the others JIT the LLVM IR it broadcasts."""
    from stagegraph.instrument.trace_events import env_hook

    tracer = env_hook(f"rank {comm.rank}")  # --trace: every rank's stages in the trace
    if comm.rank == 0:
        hook = hook or EmitInput()
        result = Engine([hook, *([tracer] if tracer else [])]).run(graph, workload)
        comm.bcast(hook.text, root=0)
        times = [
            StageTime(name=r.name, kind=r.kind, seconds=r.seconds, cached=r.cached)
            for r in result.trace.records
        ]
        return result.binary, times
    from stagegraph.mlir.bindings import ir, new_context
    from stagegraph.mlir.diagnostics import parse_module

    text = comm.bcast(None, root=0)
    context = new_context()
    emit = graph.one_stage_of_kind("emit")
    module = LLVMModule(parse_module(text, context, source="rank 0 LLVM IR"))
    event = StageEvent(graph, emit, {"module": module})
    if tracer:
        tracer.before_stage(event)
    start = time.perf_counter()
    with context, ir.Location.unknown():
        binary = emit.run({"module": module})["binary"]
    if tracer:
        event.record = StageRecord(name=emit.name, kind=emit.kind,
                                   seconds=time.perf_counter() - start)  # fmt: skip
        tracer.after_stage(event)
    return binary, []


def scatter_inputs(comm: Any, workload: Any) -> list[np.ndarray]:
    """Each rank's block of every input, cut by rank 0 from the global arrays."""
    from stagegraph.workload.layout import local_slices

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
    from stagegraph.workload.layout import local_slices, owns_block

    layout = workload.layout()
    results = []
    for i, (spec, split) in enumerate(zip(workload.output_specs(), layout.outputs, strict=True)):
        out = np.zeros(spec.shape, spec.numpy_dtype)
        for rank, outputs in enumerate(gathered):
            if owns_block(split, layout, rank):
                out[local_slices(split, spec.shape, layout, rank)] = outputs[i]
        results.append(out)
    return results


def check_local_shapes(comm: Any, signature: Any, inputs: list[np.ndarray]) -> list[tuple]:
    """The entry's local input shapes, which must be those of this rank's blocks.

    Raises:
        RankFailedError: the compiled entry does not take the blocks the layout cuts.
    """
    expected = [tuple(a.shape) for a in signature.inputs]
    if [x.shape for x in inputs] != expected:
        raise RankFailedError(
            f"rank {comm.rank}: the partitioned signature takes {expected} but the layout "
            f"gives blocks {[x.shape for x in inputs]}"
        )
    return expected


def run_rank(comm: Any, args: argparse.Namespace, progress: Progress) -> dict[str, Any] | None:
    """Everything one rank does; rank 0 returns the report."""
    from stagegraph.app.session import Session, SessionRequest

    progress.phase("compile")
    session = Session(SessionRequest(graph=args.graph, workload=args.workload))
    graph = emit_stage(session.graph, args.libmpi)
    workload = session.workload
    binary, stages = compile_on_rank(comm, graph, workload)
    progress.phase("scatter")
    inputs = scatter_inputs(comm, workload)
    signature = binary.signatures[workload.entry]
    expected = check_local_shapes(comm, signature, inputs)
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


def bench_rank(comm: Any, args: argparse.Namespace, progress: Progress) -> dict[str, Any] | None:
    """One rank of ``bench --ranks N``: compile with the wrapper, verify, then time."""
    from stagegraph.app.bench import sample, spliced
    from stagegraph.app.host import host_info
    from stagegraph.app.mpi_launch import BenchRequest, check_splice
    from stagegraph.app.session import Session, SessionRequest
    from stagegraph.stages.common.bench_harness import bench_entry_name, run_benchmark

    progress.phase("compile")
    request = BenchRequest.model_validate_json(args.bench)
    session = Session(SessionRequest(graph=args.graph, workload=args.workload))
    workload, graph = session.workload, session.graph
    tag = check_splice(graph, request.splice_at)
    bench_graph, tag = spliced(emit_stage(graph, args.libmpi), tag, workload.entry)
    hook = EmitInput()
    binary, stages = compile_on_rank(comm, bench_graph, workload, hook)
    progress.phase("scatter")
    inputs = scatter_inputs(comm, workload)
    signature = binary.signatures[workload.entry]
    local_inputs = check_local_shapes(comm, signature, inputs)
    progress.phase("verify")
    ok, verdict = verify_on_ranks(comm, binary, workload, inputs)
    report: dict[str, Any] = {}
    if verdict is not None:
        report = {
            "graph": graph.name,
            "workload": workload.spec,
            "splice_at": tag,
            "verified": verdict.ok,
            "message": verdict.message,
            "compile_seconds": sum(s.seconds for s in stages),
            "stage_seconds": {s.name: s.seconds for s in stages},
            "ranks": comm.size,
            "grid": workload.layout().grid,
            "local_inputs": local_inputs,
            "local_outputs": [tuple(a.shape) for a in signature.outputs],
            "host": host_info(),
        }
    if not ok:
        return report or None  # a wrong result is reported, never timed

    options = request.options
    calls_outside_sampling = 2 + options.warmup + 1  # verify twice, warm up, time once
    limit = comm.bcast(sample_limit(hook.comm_splits, calls_outside_sampling), root=0)
    bench_entry = bench_entry_name(workload.entry)

    def timings(count: int, warmup: int = 0) -> np.ndarray:
        return run_benchmark(binary, bench_entry, inputs, warmup, count)

    progress.phase("warmup")
    timings(1, warmup=options.warmup)  # the same counts on every rank: the calls all-reduce
    progress.phase("bench")
    if comm.rank != 0:
        while count := comm.bcast(None, root=0):
            comm.gather(timings(count), root=0)
        progress.phase("reverify")
        verify_on_ranks(comm, binary, workload, inputs)
        return None
    per_rank: list[list[np.ndarray]] = [[] for _ in range(comm.size)]

    def slowest(count: int) -> np.ndarray:
        comm.bcast(count, root=0)
        arrays = comm.gather(timings(count), root=0)
        for rank, array in enumerate(arrays):
            per_rank[rank].append(array)
        return np.max(np.stack(arrays), axis=0)

    samples, converged = sample(slowest, options, max_samples=limit)  # rank 0 sizes batches
    comm.bcast(0, root=0)  # releases the other ranks (an error above aborts them instead)
    progress.phase("reverify")
    ok, after = verify_on_ranks(comm, binary, workload, inputs)
    if not ok:  # the timed calls broke something: their times describe wrong code
        return {**report, "verified": False, "message": f"wrong after timing: {after.message}"}
    return {
        **report,
        **summary(workload, samples),
        "converged": converged,
        "rank_median_s": [float(np.median(np.concatenate(a))) for a in per_rank],
        "sample_limit": limit,
    }


def verify_on_ranks(
    comm: Any, binary: Any, workload: Any, inputs: list[np.ndarray]
) -> tuple[bool, Any]:
    """Call the entry on every rank and verify the gathered result on rank 0.

    Returns whether it is right on every rank (rank 0 broadcasts it, so all ranks take the
    same branch afterwards) and the verdict itself on rank 0 (``None`` elsewhere).
    """
    gathered = comm.gather(binary.call(workload.entry, inputs), root=0)
    verdict = workload.verify(assemble(workload, gathered)) if comm.rank == 0 else None
    return comm.bcast(verdict.ok if verdict is not None else None, root=0), verdict


def sample_limit(comm_splits: int, calls_outside: int) -> int | None:
    """How many samples keep the leaked communicators within :data:`COMM_SPLIT_BUDGET`.

    ``None`` (no limit) when the entry splits no communicator, as for 1-D grids.
    """
    if not comm_splits:
        return None
    return max(2, COMM_SPLIT_BUDGET // comm_splits - calls_outside)


def summary(workload: Any, samples: np.ndarray) -> dict[str, Any]:
    """The statistics and trust fields of a :class:`~stagegraph.app.bench.BenchReport`."""
    from stagegraph.app.bench import timing_fields

    return timing_fields(samples, workload.complexity)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stagegraph.app.mpi_rank")
    parser.add_argument("graph")
    parser.add_argument("workload")
    parser.add_argument("--scratch", type=Path, required=True)
    parser.add_argument("--libmpi", required=True)
    parser.add_argument("--bench", metavar="REQUEST", help="benchmark: a BenchRequest as JSON")
    args = parser.parse_args(argv)

    from mpi4py import MPI  # initializes MPI in this process, before any JIT code runs

    comm = MPI.COMM_WORLD
    # mpi4py makes MPI errors return codes, which the compiled code ignores: an exhausted
    # MPI_Comm_split would silently skip the all-reduce. Fatal errors end the job instead.
    comm.Set_errhandler(MPI.ERRORS_ARE_FATAL)
    progress = Progress(args.scratch, comm.rank)
    try:
        report = (bench_rank if args.bench else run_rank)(comm, args, progress)
    except BaseException as error:  # every failure must reach the launcher
        progress.fail(error)
        sys.stderr.flush()
        comm.Abort(1)
        return 1
    if report is not None:
        from stagegraph.app.mpi_launch import REPORT_FILE, MpiBenchReport, MpiReport

        model = MpiBenchReport if args.bench else MpiReport
        text = model.model_validate(report).model_dump_json(indent=2)
        (args.scratch / REPORT_FILE).write_text(text)
    progress.phase("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
