"""``stagegraph compile`` (an artifact folder) and ``stagegraph exec`` (run one, no compiler)."""

from __future__ import annotations

from typing import Any

import click

from stagegraph.cli.options import session_options, session_request
from stagegraph.cli.output import emit_json


@click.command("compile")
@click.argument("graph")
@click.argument("workload")
@click.option(
    "-o",
    "--output",
    "directory",
    required=True,
    type=click.Path(file_okay=False),
    help="The artifact folder to write (created; its parent must exist).",
)
@click.option(
    "--entry-symbol",
    metavar="NAME",
    help="The exported C function (default: stagegraph_ + the workload's name).",
)
@session_options("param", "threads", "cost_model", "db", "params_file", "target", "cache", "trace")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON report.")
def compile_command(**options: Any) -> None:
    """Compile WORKLOAD through GRAPH into a folder a C program links and `exec` runs:
    lib<name>.so, <name>.o, <name>.h and manifest.json (plus the OpenMP runtime when the
    code is multi-threaded)."""
    from stagegraph.app.artifact import build_artifact

    directory = options.pop("directory")
    report = build_artifact(
        session_request(options), directory, entry_symbol=options["entry_symbol"]
    )
    if options["as_json"]:
        emit_json(report.model_dump(mode="json"))
        return
    click.echo(f"{report.graph} on {report.workload}: wrote {report.directory}")
    click.echo(f"  entry    {report.entry_symbol} / {report.ciface_symbol}")
    click.echo(f"  target   {report.target}, {report.threads} thread(s)")
    click.echo(f"  files    {', '.join(report.files)}")


@click.command("exec")
@click.argument("directory", type=click.Path())
@click.option(
    "--input",
    "inputs",
    multiple=True,
    metavar="FILE.npy",
    help="One array per argument, in order (default: in0, in1, ... of --check).",
)
@click.option(
    "--output",
    "outputs",
    multiple=True,
    metavar="FILE.npy",
    help="Where to save each result, in order.",
)
@click.option(
    "--check",
    metavar="REF.npz",
    help="Compare the results with out0, out1, ... of this file (exit 1 if wrong).",
)
@click.option("--bench", is_flag=True, help="Time the call (median and 95%% interval).")
@click.option(
    "--budget",
    type=click.FloatRange(min=0, min_open=True),
    default=10.0,
    show_default=True,
    help="With --bench: longest time spent sampling (s).",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON report.")
def exec_command(**options: Any) -> None:
    """Run the artifact folder DIRECTORY (from `stagegraph compile`, or the gpu graph's
    --emit folder, which needs an NVIDIA GPU) on your arrays; needs no compiler and loads
    no MLIR."""
    from stagegraph.app.bench_options import BenchOptions
    from stagegraph.app.exec_artifact import execute_artifact

    report = execute_artifact(
        options["directory"],
        options["inputs"],
        output_files=options["outputs"],
        check=options["check"],
        bench=BenchOptions(budget_s=options["budget"]) if options["bench"] else None,
    )
    if options["as_json"]:
        emit_json(report.model_dump(mode="json"))
    else:
        _print_exec(report)
    if report.verified is False:
        raise SystemExit(1)


def _print_exec(report: Any) -> None:
    verdict = {True: "VERIFIED", False: "WRONG RESULT", None: "RAN"}[report.verified]
    click.echo(f"{report.name} ({report.directory}): {verdict}")
    if report.message:
        click.echo(f"  {report.message}")
    for path in report.outputs:
        click.echo(f"  wrote {path}")
    click.echo(f"  run      {report.run_seconds * 1e3:9.3f} ms (first call)")
    if report.timing is not None:
        t = report.timing
        click.echo(
            f"  median   {t.median_s * 1e3:9.3f} ms  [{t.ci_low_s * 1e3:.3f}, "
            f"{t.ci_high_s * 1e3:.3f}] over {t.samples} calls"
        )
        if report.warning:
            click.echo(f"  warning: {report.warning}")
