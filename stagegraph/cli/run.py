"""``stagegraph run``: compile a workload through a graph, run it once and verify it. The
options and what they do come from :mod:`stagegraph.app.commands`; this module prints."""

from __future__ import annotations

from typing import Any

import click

from stagegraph.app.commands import run_options
from stagegraph.cli.options import console, json_option, model_options
from stagegraph.cli.output import emit_json, print_run_report


@click.command()
@click.argument("graph")
@click.argument("workload")
@model_options(run_options())
@json_option
def run(graph: str, workload: str, as_json: bool, **options: Any) -> None:
    """Compile WORKLOAD through GRAPH, run it and verify it against the reference."""
    from stagegraph.app import commands

    outcome = commands.run(graph, workload, options, console(as_json))
    if outcome.how == "ranks":
        from stagegraph.cli.mpi_commands import print_mpi_run

        print_mpi_run(outcome.result, as_json)
    elif outcome.how == "until":
        _print_until(outcome, options["until"], as_json)
    else:
        info = outcome.cost_model
        print_run_report(outcome.result, as_json, {"cost_model": info} if info else None)


def _print_until(outcome: Any, until: str, as_json: bool) -> None:
    """The IR after the stage tagged ``until``."""
    module = outcome.result.module
    if as_json:
        emit_json(
            {
                "graph": outcome.graph,
                "workload": outcome.workload,
                "until": until,
                "level": module.level if module else None,
                "ir": module.text() if module else None,
            }
        )
    else:
        click.echo(module.text() if module else "(no module at that point)")
