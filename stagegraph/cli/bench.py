"""``stagegraph bench``: time a workload with the wrapper spliced at a tag, alone or against
a second variant (another graph or a peer) measured interleaved. The options and what they
do come from :mod:`stagegraph.app.commands`; this module prints."""

from __future__ import annotations

from typing import Any

import click

from stagegraph.app.commands import bench_options
from stagegraph.cli.options import console, json_option, model_options
from stagegraph.cli.output import (
    emit_json,
    note_cost_model,
    print_bench_report,
    print_host,
    print_ratio,
)


@click.command()
@click.argument("graph")
@click.argument("workload")
@model_options(bench_options())
@json_option
def bench(graph: str, workload: str, as_json: bool, **options: Any) -> None:
    """Benchmark WORKLOAD through GRAPH with the timing wrapper spliced at a tag."""
    from stagegraph.app import commands

    outcome = commands.bench(graph, workload, options, console(as_json))
    if outcome.how == "ranks":
        from stagegraph.cli.mpi_commands import print_mpi_bench

        print_mpi_bench(outcome.result, as_json)
        return
    note_cost_model(outcome.cost_model)
    if outcome.how == "versus" and outcome.verified:
        _print_comparison(outcome.result, options["vs"], as_json)
    elif as_json:
        extra = {"cost_model": outcome.cost_model} if outcome.cost_model is not None else {}
        for report in outcome.reports:
            emit_json({**report.model_dump(mode="json"), **extra})
    else:
        for report in outcome.reports:
            if outcome.how != "versus":
                print_host(report)
            print_bench_report(report)
        info = outcome.cost_model
        if info is not None:
            click.echo(f"  cost model {info['name']} ({info['source']}): {info['params']}")
    if not outcome.verified:
        raise SystemExit(1)


def _print_comparison(result: Any, versus: str, as_json: bool) -> None:
    if as_json:
        emit_json(result.model_dump(mode="json"))
        return
    print_host(result.b if versus == "numpy" else result.a)  # numpy's side names its BLAS
    print_bench_report(result.a)
    print_bench_report(result.b)
    print_ratio(result)
