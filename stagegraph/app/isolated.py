"""``run`` and ``bench`` in a child process under limits (``--isolate``): the child opens the
same Session as an in-process run, and a crash becomes an error naming the stage it hit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stagegraph.app.bench import BenchOptions
from stagegraph.app.session import SessionRequest
from stagegraph.core.ports import Schema


class IsolatedRequest(Schema):
    """What the child needs: the session, where to leave its breadcrumb, and (to benchmark
    instead of run) the bench options with the splice tag."""

    session: SessionRequest
    breadcrumb: str
    bench: BenchOptions | None = None
    splice_at: str | None = None


def _isolated_child(request: IsolatedRequest) -> Any:
    from stagegraph.app.run import run_report
    from stagegraph.app.session import Session
    from stagegraph.instrument.repro import CrashBreadcrumb

    with Session(request.session, extra_hooks=[CrashBreadcrumb(request.breadcrumb)]) as session:
        if request.bench is None:
            return run_report(session)
        from stagegraph.app.bench import benchmark

        return benchmark(session.engine, session.graph, session.workload, request.splice_at,
                         request.bench, request.session.threads)  # fmt: skip


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
