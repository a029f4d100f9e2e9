"""Running a sharded graph on MPI ranks: ``stagegraph run|bench GRAPH WORKLOAD --ranks N``.

The launcher starts ``mpiexec -n N python -m stagegraph.app.mpi_rank`` (MPICH from the
``mpich`` wheel) in its own process group and waits. Ranks leave their phase and, when they
fail, their error in a scratch directory; rank 0 leaves the report there. A rank that fails
aborts the job at once (``MPI_Abort``); a job that hangs is killed, whole process group, at
the timeout. Either way the error names the rank, its phase and what it said.

``bench --ranks N`` splices the timing wrapper after a tag at or after ``partitioned``, so it
wraps each rank's *local* entry. Every rank times its own calls; rank 0 gathers the timing
arrays and keeps the slowest rank per iteration (the iterations are in lock-step: each call
ends in an all-reduce). Outputs are gathered and verified first; an unverified result is
reported without timings.

Known upstream problem (MLIR ``convert-shard-to-mpi``): collectives over one axis of a
multi-dimensional grid (``grid=RxC``) call ``MPI_Comm_split`` on every call of the entry and
never free the communicator, so a benchmark loop leaks one communicator per split per call.
MPICH has 2048 context ids per process; at 2 splits per call the ~1023rd call fails. As
mpi4py sets ``MPI_ERRORS_RETURN`` and the compiled code ignores return codes, that failure
used to be silent (the all-reduce was skipped and results went wrong); the worker now makes
MPI errors fatal. The worker counts the ``MPI_Comm_split`` calls in the LLVM IR and caps
the samples so that at most ``COMM_SPLIT_BUDGET`` communicators leak (a capped run reports
``sample_limit`` and may end unconverged), and it verifies the result again after timing.
A 1-D grid all-reduces over ``MPI_COMM_WORLD`` and splits nothing: no cap, no leak.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from pydantic import Field

from stagegraph.app.bench import BenchOptions, BenchReport
from stagegraph.app.run import RunReport
from stagegraph.core.graph import Graph
from stagegraph.core.plugins import plugins_environment
from stagegraph.core.ports import Schema
from stagegraph.errors import (
    ConfigError,
    MpiTimeoutError,
    MpiUnavailableError,
    RankFailedError,
    RanksMismatchError,
)

DEFAULT_TIMEOUT = float(os.environ.get("STAGEGRAPH_MPI_TIMEOUT", "600"))
REPORT_FILE = "report.json"
INSTALL_HINT = "pip install mpich==5.0.2 mpi4py==4.1.2"
PARTITIONED = "partitioned"


class MpiReport(RunReport):
    """The ``--json`` report of a multi-rank run (written by rank 0)."""

    ranks: int
    grid: tuple[int, ...]
    local_inputs: list[tuple[int, ...]]
    local_outputs: list[tuple[int, ...]]
    rank_run_seconds: list[float]


class BenchRequest(Schema):
    """What the launcher tells every rank of ``bench --ranks N`` (as JSON on the command line)."""

    splice_at: str
    options: BenchOptions


class MpiBenchReport(BenchReport):
    """The ``--json`` report of ``bench --ranks N``: statistics of the slowest rank per call."""

    ranks: int
    grid: tuple[int, ...]
    local_inputs: list[tuple[int, ...]] = Field(default_factory=list)
    local_outputs: list[tuple[int, ...]] = Field(default_factory=list)
    rank_median_s: list[float] = Field(default_factory=list)
    sample_limit: int | None = None


@dataclass(frozen=True)
class Mpich:
    """Where the ``mpich`` wheel put ``mpiexec`` and the MPICH-ABI ``libmpi``."""

    mpiexec: Path
    libmpi: Path


def find_mpich() -> Mpich:
    """Locate MPICH through the ``mpich`` distribution's file list.

    Raises:
        MpiUnavailableError: ``mpich`` or ``mpi4py`` is not installed.
    """
    try:
        files = metadata.files("mpich") or []
    except metadata.PackageNotFoundError:
        raise MpiUnavailableError(
            f"MPI is not installed: no 'mpich' package ({INSTALL_HINT})"
        ) from None
    if importlib.util.find_spec("mpi4py") is None:
        raise MpiUnavailableError(f"MPI is not installed: no 'mpi4py' package ({INSTALL_HINT})")
    located = {Path(str(f)).name: Path(str(f.locate())).resolve() for f in files}
    mpiexec, libmpi = located.get("mpiexec"), located.get("libmpi.so.12")
    if mpiexec is None or libmpi is None or not (mpiexec.exists() and libmpi.exists()):
        raise MpiUnavailableError(
            "the 'mpich' package lacks bin/mpiexec or lib/libmpi.so.12; reinstall it "
            f"({INSTALL_HINT})"
        )
    return Mpich(mpiexec, libmpi)


def check_ranks(workload: Any, ranks: int) -> None:
    """Refuse a rank count that differs from the workload's device grid.

    Raises:
        RanksMismatchError: the workload has no grid, or one with another device count.
    """
    layout = getattr(workload, "layout", None)
    if layout is None:
        raise RanksMismatchError(
            f"--ranks {ranks}: workload {workload.spec!r} is not sharded (it has no device "
            "grid); use a sharded workload such as ff-sharded"
        )
    grid = layout().grid
    devices = layout().ranks
    if devices != ranks:
        shape = "x".join(str(g) for g in grid)
        raise RanksMismatchError(
            f"--ranks {ranks} does not match the device grid {shape} of workload "
            f"{workload.spec!r}, which has {devices} devices; use --ranks {devices}"
        )


def check_splice(graph: Graph, splice_at: str | None) -> str:
    """The tag to splice the wrapper after, refused when it precedes partitioning.

    Before the ``partitioned`` stage the entry still has the global signature: a wrapper
    there would be partitioned along with the payload, and no rank would time its own block.

    Raises:
        ConfigError: no tag given or defaulted, no ``partitioned`` stage, or a tag before it.
        SpliceError: the module at the tag is one no wrapper can be built for.
        UnknownTagError, AmbiguousTagError: the tag names no single node of ``graph``.
    """
    tag = splice_at or graph.default_splice
    if tag is None:
        raise ConfigError(f"graph {graph.name!r} declares no default splice tag; pass --splice-at")
    from stagegraph.app.bench import splice_level

    anchor = graph.node_for_tag(tag)
    splice_level(graph, tag)  # SpliceError: no wrapper can be built there (LLVM level)
    if PARTITIONED not in graph.tags:
        raise ConfigError(
            f"--ranks: graph {graph.name!r} has no stage tagged {PARTITIONED!r}, so it is not "
            "known where each rank's local code begins; use a sharded graph such as 'sharded'"
        )
    partition = graph.node_for_tag(PARTITIONED)
    if anchor != partition and anchor not in graph.descendants(partition):
        raise ConfigError(
            f"--ranks: cannot splice the benchmark wrapper at {tag!r} (node {anchor!r}): it "
            f"comes before stage {partition!r} (tagged {PARTITIONED!r}), where the entry "
            f"still has the global, unpartitioned signature; splice at {PARTITIONED!r} or a "
            "later tag so the wrapper times each rank's local code"
        )
    return tag


def run_on_ranks(
    graph: str, workload: str, ranks: int, *, timeout: float = DEFAULT_TIMEOUT
) -> MpiReport:
    """Compile and run ``workload`` through ``graph`` on ``ranks`` MPI processes.

    Raises:
        MpiUnavailableError, RanksMismatchError: before anything starts.
        RankFailedError: a rank raised or died (its error is in the message).
        MpiTimeoutError: the job did not finish within ``timeout`` seconds.
    """
    from stagegraph.workload import parse_workload

    work = parse_workload(workload)
    check_ranks(work, ranks)
    return MpiReport.model_validate(_launch(graph, work.spec, ranks, [], timeout))


def bench_on_ranks(
    graph: str,
    workload: str,
    ranks: int,
    splice_at: str | None = None,
    options: BenchOptions | None = None,
    *,
    timeout: float | None = None,
) -> MpiBenchReport:
    """Benchmark ``workload`` through ``graph`` on ``ranks`` MPI processes (slowest rank).

    ``timeout`` defaults to the sampling budget plus :data:`DEFAULT_TIMEOUT`.

    Raises:
        ConfigError, UnknownTagError: a splice tag before partitioning, or an unknown one.
        MpiUnavailableError, RanksMismatchError: before anything starts.
        RankFailedError, MpiTimeoutError: as for :func:`run_on_ranks`.
    """
    from stagegraph.core.catalog import load_graph
    from stagegraph.workload import parse_workload

    work = parse_workload(workload)
    check_ranks(work, ranks)
    options = options or BenchOptions()
    request = BenchRequest(splice_at=check_splice(load_graph(graph), splice_at), options=options)
    if timeout is None:
        timeout = DEFAULT_TIMEOUT + options.budget_s + options.min_time_s
    extra = ["--bench", request.model_dump_json()]
    return MpiBenchReport.model_validate(_launch(graph, work.spec, ranks, extra, timeout))


def _launch(
    graph: str, workload: str, ranks: int, extra: list[str], timeout: float
) -> dict[str, Any]:
    """Start the workers under ``mpiexec`` and return rank 0's report (as JSON data)."""
    mpich = find_mpich()
    with tempfile.TemporaryDirectory(prefix="stagegraph-mpi-") as scratch:
        command = [
            str(mpich.mpiexec), "-n", str(ranks),
            sys.executable, "-m", "stagegraph.app.mpi_rank",
            graph, workload, "--scratch", scratch, "--libmpi", str(mpich.libmpi), *extra,
        ]  # fmt: skip
        path = f"{mpich.mpiexec.parent}{os.pathsep}{os.environ.get('PATH', '')}"
        # hydra finds its proxy on PATH; the ranks rebuild the graph by name: plugins too
        env = {**plugins_environment(), "PATH": path}
        returncode, stderr = _run_group(command, env, timeout, Path(scratch), ranks)
        report = Path(scratch) / REPORT_FILE
        if returncode == 0 and report.is_file():
            return json.loads(report.read_text())
        raise RankFailedError(_failure_message(Path(scratch), ranks, returncode, stderr))


def _run_group(
    command: list[str], env: dict[str, str], timeout: float, scratch: Path, ranks: int
) -> tuple[int, str]:
    """Run ``command`` as a new process group; kill the whole group when done or late."""
    with tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen(
            command, env=env, stdin=subprocess.DEVNULL, stdout=err, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            returncode = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(process)
            err.seek(0)
            raise MpiTimeoutError(
                f"the {ranks}-rank job did not finish within {timeout:g} s and was killed; "
                + _phases(scratch, ranks)
                + _tail(err.read())
            ) from None
        finally:
            kill_group(process)  # stray proxies or ranks must not outlive the job
        err.seek(0)
        return returncode, err.read()


def kill_group(process: subprocess.Popen, grace: float = 2.0) -> None:
    """SIGTERM the job, then SIGKILL whatever is left after ``grace`` seconds.

    Hydra starts its proxy and every rank in a session of their own, so the launcher's
    process group alone does not reach them: the descendants of ``mpiexec`` (collected
    while it is alive, before they are reparented) are signalled by their own groups.
    """
    tree = {process.pid}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        tree |= descendants(process.pid)
        for pid in tree:
            _signal_group(pid, sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if process.poll() is not None and not any(_alive(pid) for pid in tree):
                return
            time.sleep(0.05)
    process.wait()


def descendants(root: int) -> set[int]:
    """Pids of every live descendant of ``root`` (from ``/proc``; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        group = os.getpgid(pid)
        if group == os.getpgrp():  # never our own group
            os.kill(pid, sig)
        else:
            os.killpg(group, sig)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    with contextlib.suppress(OSError):
        return stat.read_text().rpartition(")")[2].split()[0] != "Z"
    return True


def _failure_message(scratch: Path, ranks: int, returncode: int, output: str) -> str:
    errors = sorted(scratch.glob("rank-*.error"), key=lambda p: int(p.stem.split("-")[1]))
    if errors:
        first = errors[0]
        who = first.stem.replace("-", " ")
        return f"{who} failed: {first.read_text().strip()}\n" + _phases(scratch, ranks)
    return (
        f"the {ranks}-rank job ended with exit code {returncode} and no rank reported an "
        "error (a crash?); " + _phases(scratch, ranks) + _tail(output)
    )


def _phases(scratch: Path, ranks: int) -> str:
    """Where each rank was last seen, e.g. ``ranks at: 0 run, 1 compile``."""
    seen = []
    for rank in range(ranks):
        path = scratch / f"rank-{rank}.phase"
        seen.append(f"{rank} {path.read_text().strip() if path.is_file() else 'not started'}")
    return "ranks at: " + ", ".join(seen)


def _tail(output: str, lines: int = 15) -> str:
    kept = [line for line in output.strip().splitlines() if line.strip()][-lines:]
    return ("\nmpiexec output (tail):\n" + "\n".join(f"  {line}" for line in kept)) if kept else ""
