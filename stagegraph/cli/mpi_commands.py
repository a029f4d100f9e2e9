"""``run`` and ``bench`` on MPI ranks (``--ranks N``): launch through the app, print here."""

from __future__ import annotations

from typing import Any

import click

from stagegraph.app.bench import BenchOptions
from stagegraph.cli.output import emit_json


def mpi_run_command(
    graph: str, workload: str, ranks: int, as_json: bool, unsupported: dict[str, Any]
) -> None:
    """``stagegraph run ... --ranks N``: run, print the report, exit 1 on a wrong result.

    Raises:
        ConfigError: an option that a multi-rank run does not support was given.
    """
    from stagegraph.app.mpi_launch import refuse_options, run_on_ranks

    refuse_options(unsupported)
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


def mpi_bench_command(
    graph: str,
    workload: str,
    ranks: int,
    splice_at: str | None,
    options: BenchOptions,
    as_json: bool,
    csv_path: str | None,
    unsupported: dict[str, Any],
) -> None:
    """``stagegraph bench ... --ranks N``: benchmark, print, exit 1 on a wrong result.

    Raises:
        ConfigError: an option that a multi-rank benchmark does not support was given.
    """
    from stagegraph.app.bench import append_csv, rough
    from stagegraph.app.mpi_launch import bench_on_ranks, refuse_options

    refuse_options(unsupported)
    report = bench_on_ranks(graph, workload, ranks, splice_at, options)
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
    if csv_path:
        append_csv(csv_path, report)
    if not report.verified:
        raise SystemExit(1)
