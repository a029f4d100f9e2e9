"""``run`` and ``bench`` in a child process under limits (``--isolate``): the child opens the
same Session as an in-process run, and a crash becomes an error naming the stage it hit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stagegraph.app.session import SessionRequest
from stagegraph.core.ports import Schema


class IsolatedRequest(Schema):
    """What the child needs: the session (with bench options: benchmark instead of run) and
    where to leave its breadcrumb."""

    session: SessionRequest
    breadcrumb: str


def run_in_child(request: SessionRequest, timeout_s: float, memory_gb: float) -> Any:
    """The report of ``request`` run (or benchmarked, when it has bench options) in a child
    process under these limits; the child has no watchdog of its own (the parent's limit
    ends it)."""
    import tempfile

    from stagegraph.app.child_process import Limits

    in_child = request.model_copy(update={"compile_timeout_s": None, "run_timeout_s": None})
    with tempfile.TemporaryDirectory(prefix="stagegraph-crumb-") as scratch:
        isolated = IsolatedRequest(session=in_child, breadcrumb=f"{scratch}/current")
        limits = Limits(timeout_s=timeout_s, memory_bytes=int(memory_gb * 2**30))
        return run_isolated_report(isolated, limits)


def _isolated_child(request: IsolatedRequest) -> Any:
    from stagegraph.app.run import run_report
    from stagegraph.app.session import Session
    from stagegraph.instrument.repro import CrashBreadcrumb

    with Session(request.session, extra_hooks=[CrashBreadcrumb(request.breadcrumb)]) as session:
        bench = request.session.bench
        if bench is None:
            return run_report(session)
        from stagegraph.app.bench import benchmark

        session.prepare_workload()
        return benchmark(session.engine, session.graph, session.workload,
                         request.session.splice_at, bench, request.session.threads)  # fmt: skip


def run_isolated_report(request: IsolatedRequest, limits: Any) -> Any:
    """Compile and run (or benchmark) in a child under ``limits``; a crash becomes a
    StageFailed naming the stage that was running, with a reproducer of its input.

    Raises:
        StageFailed: the child died in a stage (signal, timeout, memory) or a stage raised.
    """
    from stagegraph.errors import IsolatedFailure, StageFailed
    from stagegraph.instrument.repro import claim_breadcrumb

    breadcrumb = Path(request.breadcrumb)
    repro_dir = request.session.inspection.repro_dir
    label = f"{request.session.graph} on {request.session.workload}"
    try:
        return limits.run(_isolated_child, request, label=label)
    except StageFailed as failed:  # a stage raised in the child: same error, plus a reproducer
        if failed.reproducer is None:
            claimed = claim_breadcrumb(breadcrumb, failed.reason, repro_dir, failed.diagnostics)
            if claimed is not None:
                raise claimed from failed
        raise
    except IsolatedFailure as failure:
        tail = failure.stderr_tail.splitlines()[-12:]
        error = claim_breadcrumb(breadcrumb, failure.detail, repro_dir, tail)
        if error is None:
            raise
        raise error from failure
