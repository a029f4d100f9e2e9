"""CLI commands that compile and run payloads (``run``; ``bench`` and others as they land)."""

from __future__ import annotations

import click

from stagegraph.cli import emit_json

COMMANDS: list[click.Command] = []


def _register(command: click.Command) -> click.Command:
    COMMANDS.append(command)
    return command


def load_inputs(graph_name: str, workload_spec: str):  # noqa: ANN201 - (Graph, Workload)
    from stagegraph.catalog import load_graph
    from stagegraph.execute import install_reference_runner
    from stagegraph.workload import parse_workload

    install_reference_runner()
    return load_graph(graph_name), parse_workload(workload_spec)


@_register
@click.command()
@click.argument("graph")
@click.argument("workload")
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE",
              help="Override a field of the cost model's params (validated).")
@click.option("--until", metavar="TAG", help="Stop after the stage tagged TAG and print the IR.")
@click.option("--dump-ir", type=click.Path(file_okay=False), help="Write the IR after every stage.")
@click.option("--emit", type=click.Choice(["jit", "object", "shared"]), default="jit",
              show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Path for --emit object|shared.")
@click.option("--threads", type=click.IntRange(min=1), help="Threads (default: all cores).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON report.")
def run(graph: str, workload: str, params: tuple[str, ...], until: str | None,
        dump_ir: str | None, emit: str, output: str | None, threads: int | None,
        as_json: bool) -> None:
    """Compile WORKLOAD through GRAPH, run it and verify it against the reference."""
    from stagegraph.engine import Engine
    from stagegraph.execute import parse_assignments, run_report, with_emit, with_params
    from stagegraph.hooks import DumpIR

    loaded, work = load_inputs(graph, workload)
    loaded = with_params(loaded, parse_assignments(params), threads)
    loaded = with_emit(loaded, emit, output)
    hooks = [DumpIR(dump_ir)] if dump_ir else []
    engine = Engine(hooks)
    if until:
        result = engine.run(loaded, work, until=until)
        module = result.module
        if as_json:
            emit_json({"graph": loaded.name, "workload": work.spec, "until": until,
                       "level": module.level if module else None,
                       "ir": module.text() if module else None})
        else:
            click.echo(module.text() if module else "(no module at that point)")
        return
    report = run_report(loaded, work, engine=engine, threads=threads)
    if as_json:
        emit_json(report.model_dump(mode="json"))
    else:
        click.echo(f"{report.graph} on {report.workload}: "
                   + {True: "VERIFIED", False: "WRONG RESULT", None: "NOT RUN"}[report.verified])
        click.echo(f"  {report.message}")
        for stage in report.stages:
            click.echo(f"  {stage.name:<14} {stage.kind:<9} {stage.seconds * 1e3:9.2f} ms")
        if report.run_seconds is not None:
            click.echo(f"  run            {report.run_seconds * 1e3:9.2f} ms")
    if report.verified is False:
        raise SystemExit(1)
