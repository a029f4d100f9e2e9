"""The ``stagegraph`` command line. User errors exit with code 2 and one paragraph."""

from __future__ import annotations

import sys
import traceback

import click

from stagegraph.cli.output import emit_json, print_warnings
from stagegraph.errors import StagegraphError

EXIT_USER_ERROR = 2


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.option(
    "--plugin",
    "plugins",
    multiple=True,
    metavar="FILE.py|MODULE",
    help="Import this code first (repeatable; also $STAGEGRAPH_PLUGINS): the graphs, "
    "workloads, stages and cost models it registers work by name.",
)
@click.pass_context
def cli(ctx: click.Context, debug: bool, plugins: tuple[str, ...]) -> None:
    """Lower MLIR payloads through typed graphs of named stages."""
    from stagegraph.core.plugins import ensure_plugins, load_plugins

    ctx.obj = {"debug": debug}
    load_plugins(plugins)
    ensure_plugins()


@cli.command("list")
@click.argument("kind", metavar="KIND")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def list_command(kind: str, as_json: bool) -> None:
    """List the names of one registry: graphs, workloads, stages, cost-models, targets,
    peers, stage-modules, runtime-libraries (every registry of one mechanism)."""
    from stagegraph.app.registries import registry

    found = registry(kind)
    if kind == "stages":
        from stagegraph.core.render import first_sentence

        rows = [
            {
                "name": f.name,
                "kind": f.kind,
                "inputs": [str(p) for p in f.inputs],
                "outputs": [str(p) for p in f.outputs],
                "doc": first_sentence(f.doc),
                "origin": found.origin(f.name),
            }
            for f in sorted((f for _, f in found.items()), key=lambda f: (f.kind, f.name))
        ]
    else:
        rows = [{"name": n, "origin": found.origin(n)} for n in found.names()]
    if as_json:
        emit_json(rows)
        return
    for row in rows:
        if kind == "stages":
            click.echo(
                f"{row['name']:<24} {row['kind']:<9} ({', '.join(row['inputs'])}) -> "
                f"({', '.join(row['outputs'])})  {row['doc']}"
            )
        else:
            click.echo(row["name"])


@cli.command()
@click.argument("graph")
@click.option("--format", "fmt", type=click.Choice(["dot", "text"]), default="dot")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Render to a file (svg...).")
@click.option(
    "--trace",
    "trace_file",
    type=click.Path(dir_okay=False, exists=True),
    metavar="FILE.json",
    help="Label each stage with its time from a --trace file of run/bench/tune.",
)
def show(graph: str, fmt: str, output: str | None, trace_file: str | None) -> None:
    """Print GRAPH as DOT (or text); -o renders an image with Graphviz."""
    from stagegraph.core.catalog import load_graph
    from stagegraph.core.render import render_file, to_dot, to_text

    loaded = load_graph(graph)
    trace = None
    if trace_file:
        from stagegraph.instrument.trace_events import executed_graph, load_trace

        loaded = executed_graph(loaded, trace_file)  # with the stages the run spliced in
        trace = load_trace(trace_file, loaded.name)
    if output:
        render_file(loaded, output, trace)
        click.echo(f"wrote {output}")
    else:
        click.echo(to_dot(loaded, trace) if fmt == "dot" else to_text(loaded, trace), nl=False)


@cli.command()
@click.argument("file")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def validate(file: str, as_json: bool) -> None:
    """Check a graph file (or graph name) and summarise it."""
    from stagegraph.core.catalog import load_graph
    from stagegraph.core.static_check import check_statics

    graph = load_graph(file)
    check_statics(graph, file)
    summary = {
        "graph": graph.name,
        "valid": True,
        "stages": len(graph.stages),
        "edges": len(graph.edges),
        "tags": graph.tags,
        "default_splice": graph.default_splice,
    }
    if as_json:
        emit_json(summary)
    else:
        click.echo(
            f"{file}: graph {graph.name!r} is valid: {len(graph.stages)} stages, "
            f"{len(graph.edges)} edges, tags: {', '.join(sorted(graph.tags)) or 'none'}"
        )


@cli.command()
@click.argument("graph")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False),
    help="Write to FILE.yaml or FILE.json (default: YAML on stdout).",
)
def export(graph: str, output: str | None) -> None:
    """Write GRAPH (a name, a file, or one a plugin registered) as a graph file.

    Loading the file gives an equal graph: user stages are written as ``module:attribute``.
    """
    from stagegraph.core.catalog import load_graph
    from stagegraph.core.graphfile import dump_graph, graph_text

    loaded = load_graph(graph)
    if output:
        dump_graph(loaded, output)
        click.echo(f"wrote {output}", err=True)
    else:
        click.echo(graph_text(loaded, "yaml"), nl=False)


@cli.command()
def schema() -> None:
    """Print the JSON Schema of graph files."""
    from stagegraph.core.graphfile import json_schema

    emit_json(json_schema())


def _register_extensions() -> None:
    """Commands that live in their own modules (run, bench, tune, repro, compile, exec)."""
    from stagegraph.cli.artifact import compile_command, exec_command
    from stagegraph.cli.bench import bench
    from stagegraph.cli.repro import repro
    from stagegraph.cli.run import run
    from stagegraph.cli.tune import tune

    for command in (run, bench, repro, tune, compile_command, exec_command):
        if command.name not in cli.commands:
            cli.add_command(command)


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the CLI, turning user errors into exit code 2 without a traceback."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    try:
        _register_extensions()
        print_warnings()
        code = cli.main(args=args, prog_name="stagegraph", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return EXIT_USER_ERROR
    except click.exceptions.Abort as exc:  # Ctrl-C, or an EOFError click folded into it
        if debug:
            traceback.print_exception(exc.__context__ or exc)
        cause = exc.__context__
        detail = f": {type(cause).__name__}: {cause}" if isinstance(cause, EOFError) else ""
        click.echo(f"aborted{detail}", err=True)
        return 1
    except StagegraphError as exc:
        if debug:
            traceback.print_exc()
        click.echo(f"error: {exc}", err=True)
        return EXIT_USER_ERROR
    return code if isinstance(code, int) else 0  # a command's own exit code (tune: 130)


if __name__ == "__main__":
    sys.exit(main())


def run_main() -> None:
    """Console-script entry point."""
    sys.exit(main())
