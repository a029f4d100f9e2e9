"""Compile, run and verify a workload through a graph: what ``stagegraph run`` does."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from pydantic import Field

from stagegraph.core.engine import RunResult
from stagegraph.core.ports import Schema
from stagegraph.errors import ConfigError
from stagegraph.stages.target import effective_threads, payload_threads

if TYPE_CHECKING:
    from stagegraph.app.session import Session


class StageTime(Schema):
    name: str
    kind: str
    seconds: float
    cached: bool = False


class RunReport(Schema):
    """The result of ``stagegraph run`` (its ``--json`` output)."""

    graph: str
    workload: str
    verified: bool | None
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    message: str = ""
    stages: list[StageTime]
    compile_seconds: float
    run_seconds: float | None = None
    #: The threads granted (``--threads``, or all usable cores), and those the payload ran
    #: on: what its params chose (a cost model may take fewer for a small payload; None
    #: for a graph without params that say).
    threads: int | None = None
    payload_threads: int | None = None
    params: dict[str, Any] | None = None
    emitted: str | None = None
    specialized: dict[str, list[int]] = Field(default_factory=dict)
    #: What the stages warned about (e.g. ops the ``tuned`` cost model left to the heuristic).
    warnings: list[str] = Field(default_factory=list)
    #: Where the reference came from: ``npz``, ``pytorch``, ``numpy``, ``graph:NAME``, ``none``.
    reference: str = ""
    #: Passes over memory of the bufferized code (``stages.common.memory_passes``; None: the
    #: graph has no stage tagged ``bufferized``).
    memory_passes: int | None = None


def check_single_process(workload: Any) -> None:
    """Refuse to run a sharded workload in this process: its code takes one rank's blocks.

    A workload with a device grid (a ``layout``) compiles to per-rank code that calls MPI;
    called here on the global arrays it would fail on shapes, far from the real cause.

    Raises:
        ConfigError: the workload is sharded; the message says which ``--ranks`` to pass.
    """
    layout = getattr(workload, "layout", None)
    if layout is not None:
        ranks = layout().ranks
        raise ConfigError(
            f"workload {workload.spec!r} is sharded over {ranks} ranks and runs only on MPI "
            f"ranks: add --ranks {ranks}"
        )


def execute(result: RunResult, workload: Any) -> tuple[list[Any], float]:
    """Call the binary's entry on the workload's inputs; returns outputs and seconds."""
    binary = result.binary
    start = time.perf_counter()
    outputs = binary.call(workload.entry, workload.inputs())
    return outputs, time.perf_counter() - start


def compile_recording_warnings(session: Session) -> tuple[RunResult, list[str]]:
    """Compile, and keep the stages' warnings for the report (they are still shown)."""
    import warnings

    from stagegraph.errors import StagegraphWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", StagegraphWarning)
        result = session.compile()  # the watchdog's run phase starts when emit finishes
    for warning in caught:
        warnings.warn_explicit(warning.message, warning.category, warning.filename,
                               warning.lineno)  # fmt: skip
    return result, [str(w.message) for w in caught if issubclass(w.category, StagegraphWarning)]


def run_report(session: Session) -> RunReport:
    """Compile the session's workload through its graph, run it once and verify the outputs
    (an emitted file is written, not run)."""
    from stagegraph.app.memory_budget import check_fits
    from stagegraph.app.reference import check_verifiable, verifies

    workload = session.workload
    check_single_process(workload)
    session.prepare_workload()  # the checks below read its signature
    if verifies(session.request.reference):
        check_verifiable(workload)
    if session.request.emit == "jit":  # it will run: its buffers must fit
        check_fits(workload)
    result, warned = compile_recording_warnings(session)
    stages = [
        StageTime(name=r.name, kind=r.kind, seconds=r.seconds, cached=r.cached)
        for r in result.trace.records
    ]
    common = {
        "graph": session.graph.name,
        "workload": workload.spec,
        "stages": stages,
        "compile_seconds": result.trace.compile_seconds(),
        "threads": effective_threads(session.request.threads),
        "payload_threads": payload_threads(result.params),
        "params": result.params.model_dump(mode="json") if result.params else None,
        "specialized": workload.specialization,
        "warnings": warned,
        "reference": workload.reference_source,
        "memory_passes": session.memory_passes.total,
    }
    binary = result.binary
    if binary is None or not hasattr(binary, "call"):
        path = getattr(binary, "path", None)
        return RunReport(
            verified=None,
            message=f"wrote {path}; not executed",
            emitted=str(path) if path else None,
            **common,
        )
    outputs, seconds = execute(result, workload)
    emitted = str(binary.path) if hasattr(binary, "path") else None
    unverified = _why_unverified(session)
    if unverified:
        return RunReport(verified=None, message=unverified, run_seconds=seconds,
                         emitted=emitted, **common)  # fmt: skip
    from stagegraph.app.reference import caveat

    verdict = workload.verify(outputs)
    return RunReport(
        verified=verdict.ok,
        max_abs_error=verdict.max_abs_error,
        max_rel_error=verdict.max_rel_error,
        message=verdict.message + caveat(workload),
        run_seconds=seconds,
        emitted=emitted,
        **common,
    )


def _why_unverified(session: Session) -> str:
    """Why the outputs are not compared ("" when they are): ``--reference none``, or a
    reference that is the graph under test itself."""
    from stagegraph.app.reference import trivial_reference, verifies

    if not verifies(session.request.reference):
        return "ran; not verified (--reference none)"
    return trivial_reference(session.workload, session.graph.name) or ""
