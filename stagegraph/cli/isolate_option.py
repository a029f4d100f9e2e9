"""``--isolate`` for run and bench: the same session request, run in a child under limits."""

from __future__ import annotations

from typing import Any


def run_isolated(
    request: Any,
    timeout: float,
    memory_gb: float,
    bench: Any = None,
    splice_at: str | None = None,
) -> Any:
    """The report of ``request`` run (or benchmarked, with ``bench``) in a limited child."""
    from stagegraph.app.isolated_session import run_in_child

    request = request.model_copy(update={"bench": bench, "splice_at": splice_at})
    return run_in_child(request, timeout, memory_gb)
