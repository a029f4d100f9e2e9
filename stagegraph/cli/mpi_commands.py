"""``run`` and ``bench`` on MPI ranks (``--ranks N``): what :mod:`stagegraph.app.commands`
measured on the ranks, printed."""

from __future__ import annotations

from typing import Any

import click

from stagegraph.cli.output import emit_json


def print_mpi_run(report: Any, as_json: bool) -> None:
    """A multi-rank run's report; exit 1 on a wrong result."""
    ranks = report.ranks
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


def print_mpi_bench(report: Any, as_json: bool) -> None:
    """A multi-rank benchmark's report; exit 1 on a wrong result."""
    from stagegraph.app.bench import rough

    ranks = report.ranks
    if as_json:
        emit_json(report.model_dump(mode="json"))
    else:
        head = f"{report.graph} on {report.workload} (spliced at {report.splice_at}), {ranks} ranks"
        if not report.verified or report.median_s is None:
            click.echo(f"{head}: WRONG RESULT, not timed\n  {report.message}")
        else:
            speed = f", {report.gflops:.1f} GFLOP/s" if report.gflops else ""
            ms = [f"{m * 1e3:.4f}" for m in report.rank_median_s]
            median = (
                f"median {report.median_s * 1e3:.4f} ms [{report.ci_low_s * 1e3:.4f}, "
                f"{report.ci_high_s * 1e3:.4f}]"
            )
            if report.trustworthy is False:  # no precise-looking number for a noisy run
                median, speed = (
                    f"NOT TRUSTWORTHY, median roughly {rough(report.median_s * 1e3)} ms",
                    "",
                )
            click.echo(
                f"{head}: {median} (slowest rank per call) over {report.samples} "
                f"samples{speed}; per-rank medians {', '.join(ms)} ms; "
                f"compile {report.compile_seconds:.3f} s (rank 0)"
            )
            if report.trustworthy is False:
                click.echo(f"  warning: {report.warning}; rerun with a larger --budget")
            if report.sample_limit is not None:
                click.echo(
                    f"  at most {report.sample_limit} samples: every call leaks communicators "
                    "(MPI_Comm_split, see stagegraph.app.mpi_launch)"
                )
    if not report.verified:
        raise SystemExit(1)
