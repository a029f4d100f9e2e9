"""``--isolate`` for run and bench: the same session request, run in a child under limits."""

from __future__ import annotations

import tempfile
from typing import Any


def run_isolated(
    request: Any,
    timeout: float,
    memory_gb: float,
    bench: Any = None,
    splice_at: str | None = None,
) -> Any:
    """The report of ``request`` run (or benchmarked, with ``bench``) in a limited child."""
    from stagegraph.app.isolate import Limits
    from stagegraph.app.isolated import IsolatedRequest, run_isolated_report

    in_child = request.model_copy(update={"compile_timeout_s": None, "run_timeout_s": None})
    with tempfile.TemporaryDirectory(prefix="stagegraph-crumb-") as scratch:
        isolated = IsolatedRequest(
            session=in_child, breadcrumb=f"{scratch}/current", bench=bench, splice_at=splice_at
        )
        limits = Limits(timeout_s=timeout, memory_bytes=int(memory_gb * 2**30))
        return run_isolated_report(isolated, limits)
