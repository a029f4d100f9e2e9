"""Running a sharded graph on MPI ranks: ``stagegraph run GRAPH WORKLOAD --ranks N``.

The launcher starts ``mpiexec -n N python -m stagegraph.mpi_worker`` (MPICH from the
``mpich`` wheel) in its own process group and waits. Ranks leave their phase and, when they
fail, their error in a scratch directory; rank 0 leaves the report there. A rank that fails
aborts the job at once (``MPI_Abort``); a job that hangs is killed, whole process group, at
the timeout. Either way the error names the rank, its phase and what it said.
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

from stagegraph.errors import (
    MpiTimeoutError,
    MpiUnavailableError,
    RankFailedError,
    RanksMismatchError,
)
from stagegraph.execute import RunReport

DEFAULT_TIMEOUT = float(os.environ.get("STAGEGRAPH_MPI_TIMEOUT", "600"))
REPORT_FILE = "report.json"
INSTALL_HINT = "pip install mpich==5.0.2 mpi4py==4.1.2"


class MpiReport(RunReport):
    """The ``--json`` report of a multi-rank run (written by rank 0)."""

    ranks: int
    grid: tuple[int, ...]
    local_inputs: list[tuple[int, ...]]
    local_outputs: list[tuple[int, ...]]
    rank_run_seconds: list[float]


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
    mpich = find_mpich()
    with tempfile.TemporaryDirectory(prefix="stagegraph-mpi-") as scratch:
        command = [
            str(mpich.mpiexec), "-n", str(ranks),
            sys.executable, "-m", "stagegraph.mpi_worker",
            graph, work.spec, "--scratch", scratch, "--libmpi", str(mpich.libmpi),
        ]  # fmt: skip
        path = f"{mpich.mpiexec.parent}{os.pathsep}{os.environ.get('PATH', '')}"
        env = {**os.environ, "PATH": path}  # hydra finds its proxy on PATH
        returncode, stderr = _run_group(command, env, timeout, Path(scratch), ranks)
        report = Path(scratch) / REPORT_FILE
        if returncode == 0 and report.is_file():
            return MpiReport.model_validate(json.loads(report.read_text()))
        raise RankFailedError(_failure_message(Path(scratch), ranks, returncode, stderr))


def run_command(
    graph: str, workload: str, ranks: int, as_json: bool, unsupported: dict[str, Any]
) -> None:
    """``stagegraph run ... --ranks N``: run, print the report, exit 1 on a wrong result.

    Raises:
        ConfigError: an option that a multi-rank run does not support was given.
    """
    import click

    from stagegraph.cli import emit_json
    from stagegraph.errors import ConfigError

    given = [name for name, value in unsupported.items() if value]
    if given:
        raise ConfigError(f"--ranks cannot be combined with {', '.join(given)}")
    report = run_on_ranks(graph, workload, ranks)
    if as_json:
        emit_json(report.model_dump(mode="json"))
    else:
        verdict = "VERIFIED" if report.verified else "WRONG RESULT"
        click.echo(f"{report.graph} on {report.workload}, {ranks} ranks: {verdict}")
        click.echo(f"  {report.message}")
        click.echo(f"  local inputs {report.local_inputs}, outputs {report.local_outputs}")
        click.echo(f"  compile {report.compile_seconds * 1e3:.1f} ms (rank 0), "
                   f"run {report.run_seconds * 1e3:.2f} ms (slowest rank)")  # fmt: skip
    if not report.verified:
        raise SystemExit(1)


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
