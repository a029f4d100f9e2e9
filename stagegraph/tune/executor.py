"""Where batches run: a local pool of isolated children, or a Dask cluster.

A batch is evaluated by :func:`evaluate_batch` in whatever process the executor picks; it
runs :func:`~stagegraph.tune.worker.run_batch` under :mod:`stagegraph.app.child_process` (time and
memory limits). When that child dies (segfault, hang, OOM), the candidate it was working on
becomes a failed result with the reason, and the rest of the batch continues in a new child.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import tempfile
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from stagegraph.errors import ClusterUnreachableError, IsolatedFailure, StagegraphError
from stagegraph.stages.common.tuning_db import CandidateResult
from stagegraph.tune.worker import BatchTask, run_batch

_SLACK_S = 30.0


def evaluate_batch(task: BatchTask) -> list[dict[str, Any]]:
    """Evaluate every candidate of ``task`` in isolated children; never raises for one."""
    from stagegraph.app.child_process import run_isolated

    _allow_children()
    results: dict[str, CandidateResult] = {}
    remaining = list(task.candidates)
    while remaining:
        with tempfile.TemporaryDirectory(prefix="stagegraph-tune-") as work:
            batch = task.model_copy(update={"candidates": remaining})
            per = task.compile_timeout_s + task.run_timeout_s + _SLACK_S
            failure: BaseException | None = None
            try:
                run_isolated(
                    run_batch,
                    batch,
                    work,
                    timeout_s=per * (len(remaining) + 1),
                    memory_bytes=task.memory_bytes,
                    label="tune batch",
                )
            except (IsolatedFailure, StagegraphError, RuntimeError) as exc:
                failure = exc
            for result in _read_results(Path(work)):
                results[result.params_hash] = result
            remaining = [c for c in remaining if task.hash_of(c) not in results]
            if not remaining:
                break
            blamed, phase = _in_flight(Path(work))
            victims = [c for c in remaining if task.hash_of(c) == blamed] or remaining
            for params in victims:
                phase_of = phase if task.hash_of(params) == blamed else None
                result = _failed(task, params, failure, phase_of)
                results[result.params_hash] = result
                _record(task, result)
            remaining = [c for c in remaining if task.hash_of(c) not in results]
    return [results[task.hash_of(c)].model_dump(mode="json") for c in task.candidates]


def _allow_children() -> None:
    """Dask (and pools) run tasks in daemonic processes, which multiprocessing forbids to
    start children; the isolated child is reaped by us, so lift the flag here."""
    process = multiprocessing.current_process()
    if process.daemon:
        process._config["daemon"] = False  # type: ignore[attr-defined]


def _read_results(work: Path) -> list[CandidateResult]:
    path = work / "results.jsonl"
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    return [CandidateResult.model_validate_json(line) for line in lines if line.strip()]


def _in_flight(work: Path) -> tuple[str | None, str | None]:
    try:
        data = json.loads((work / "progress").read_text())
    except (OSError, ValueError):
        return None, None
    return data.get("params_hash"), data.get("phase")


def _failed(
    task: BatchTask, params: dict, failure: BaseException | None, phase: str | None
) -> CandidateResult:
    if isinstance(failure, IsolatedFailure):
        reason, detail = failure.reason, failure.detail
        if reason == "timeout" or failure.signal == "SIGALRM":
            reason = f"{phase or 'batch'} timeout"
    elif failure is not None:
        reason, detail = "exception", str(failure).splitlines()[0]
    else:
        reason, detail = "exit", "the worker ended without a result for this candidate"
    if phase is None:
        detail = f"not evaluated: the batch failed before it ({detail})"
        reason = f"batch {reason}"
    else:
        detail = f"during {phase}: {detail}"
    return CandidateResult(
        params_hash=task.hash_of(params),
        params=params,
        status="failed",
        reason=reason,
        detail=detail,
    )


def _record(task: BatchTask, result: CandidateResult) -> None:
    if task.db:
        from stagegraph.stages.common.tuning_db import TuneDB

        db = TuneDB(task.db)
        try:
            db.record(task.key, result)
        finally:
            db.close()


class LocalExecutor:
    """``--jobs`` isolated children at a time, driven from threads of this process."""

    shares_filesystem = True

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs
        self.pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="tune")

    def run(self, tasks: Iterable[BatchTask]) -> Iterator[list[CandidateResult]]:
        futures = [self.pool.submit(evaluate_batch, t) for t in tasks]
        for future in as_completed(futures):
            yield [CandidateResult.model_validate(r) for r in future.result()]

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


class DaskExecutor:
    """Batches as tasks on a Dask cluster, one measurement per worker at a time.

    ``local:N`` starts a LocalCluster of N single-threaded worker processes with a
    ``measure=1`` resource; ``tcp://host:port`` connects to a running scheduler (start its
    workers with ``--nthreads 1`` or ``--resources measure=1``).
    """

    def __init__(self, address: str, connect_timeout_s: float = 5.0) -> None:
        import dask
        from distributed import Client, LocalCluster

        self.cluster = None
        self.shares_filesystem = address.startswith("local:")
        try:
            if address.startswith("local:"):
                workers = int(address.split(":", 1)[1])
                dask.config.set({"distributed.worker.daemon": False})
                self.cluster = LocalCluster(
                    n_workers=workers,
                    threads_per_worker=1,
                    processes=True,
                    resources={"measure": 1},
                    dashboard_address=None,
                )
                self.client = Client(self.cluster)
            else:
                self.client = Client(address, timeout=connect_timeout_s)
        except (OSError, TimeoutError, ValueError) as exc:
            self.close()
            raise ClusterUnreachableError(
                f"cannot reach the Dask scheduler at {address!r}: {exc}; start one with "
                "'dask scheduler' and workers with 'dask worker ADDRESS --nthreads 1', or use "
                "--cluster local:N"
            ) from None
        workers = self.client.scheduler_info().get("workers", {}).values()
        has_resource = any("measure" in w.get("resources", {}) for w in workers)
        self.resources = {"measure": 1} if has_resource else None

    def run(self, tasks: Iterable[BatchTask]) -> Iterator[list[CandidateResult]]:
        from distributed import as_completed as dask_completed

        futures = [
            self.client.submit(evaluate_batch, t, pure=False, resources=self.resources)
            for t in tasks
        ]
        for future in dask_completed(futures):
            yield [CandidateResult.model_validate(r) for r in future.result()]

    def close(self) -> None:
        for thing in (getattr(self, "client", None), self.cluster):
            if thing is not None:
                # closing a half-started cluster must not mask the cause
                with contextlib.suppress(Exception):
                    thing.close()


def make_executor(cluster: str | None, jobs: int) -> Any:
    """Raises: ClusterUnreachableError for a bad or unreachable ``cluster`` address."""
    if cluster is None:
        return LocalExecutor(jobs)
    if not (cluster.startswith(("tcp://", "tls://")) or cluster.startswith("local:")):
        raise ClusterUnreachableError(f"--cluster {cluster!r}: expected tcp://HOST:PORT or local:N")
    if cluster.startswith("local:"):
        count = cluster.split(":", 1)[1]
        if not count.isdigit() or int(count) < 1:
            raise ClusterUnreachableError(f"--cluster {cluster!r}: N must be a positive integer")
    return DaskExecutor(cluster)
