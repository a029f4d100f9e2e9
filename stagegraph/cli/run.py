"""``stagegraph run``: compile a workload through a graph, run it once and verify it."""

from __future__ import annotations

from typing import Any

import click

from stagegraph.cli.options import (
    cache_trace_options,
    cost_model_options,
    inspection_options,
    isolation_options,
    param_option,
    print_ir,
    progress_hooks,
    session_request,
    target_option,
    time_limit_options,
)
from stagegraph.cli.output import emit_json, print_run_report, report_cost_model


@click.command()
@inspection_options
@click.argument("graph")
@click.argument("workload")
@param_option
@click.option("--until", metavar="TAG", help="Stop after the stage tagged TAG and print the IR.")
@click.option("--dump-ir", type=click.Path(file_okay=False), help="Write the IR after every stage.")
@click.option(
    "--emit", type=click.Choice(["jit", "object", "shared"]), default="jit", show_default=True
)
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False), help="Path for --emit object|shared."
)
@click.option("--threads", type=click.IntRange(min=1), help="Threads (default: all cores).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON report.")
@click.option("--save-payload", type=click.Path(file_okay=False), metavar="DIR",
              help="Write a PyTorch workload's imported .mlir and .npz to DIR.")
@isolation_options
@click.option("--ranks", type=click.IntRange(min=1), help="Run on N MPI ranks (sharded workloads).")
@cost_model_options
@target_option
@time_limit_options
@cache_trace_options
def run(**options: Any) -> None:
    """Compile WORKLOAD through GRAPH, run it and verify it against the reference."""
    if options["ranks"] is not None:
        from stagegraph.cli.mpi_commands import mpi_run_command

        unsupported = {
            flag: options[key]
            for flag, key in (("--param", "params"), ("--until", "until"),
                              ("--dump-ir", "dump_ir"), ("--threads", "threads"),
                              ("--target", "target"))
        }  # fmt: skip
        unsupported["--emit"] = options["emit"] != "jit"
        return mpi_run_command(options["graph"], options["workload"], options["ranks"],
                               options["as_json"], unsupported)  # fmt: skip
    request = session_request(options)
    if options["isolate"]:
        from stagegraph.cli.isolated import run_isolated

        report = run_isolated(request, options["timeout"], options["memory_gb"])
        print_run_report(report, options["as_json"])
        return
    from stagegraph.app.run import run_report
    from stagegraph.app.session import Session

    with Session(
        request, write=print_ir, extra_hooks=progress_hooks(options["as_json"])
    ) as session:
        if options["until"]:
            _print_until(session, options["until"], options["as_json"])
            return
        info = report_cost_model(session, options["cost_model"])
        report = run_report(session)
    print_run_report(report, options["as_json"], {"cost_model": info} if info else None)


def _print_until(session: Any, until: str, as_json: bool) -> None:
    """The IR after the stage tagged ``until``."""
    module = session.compile(until=until).module
    if as_json:
        emit_json(
            {
                "graph": session.graph.name,
                "workload": session.workload.spec,
                "until": until,
                "level": module.level if module else None,
                "ir": module.text() if module else None,
            }
        )
    else:
        click.echo(module.text() if module else "(no module at that point)")
