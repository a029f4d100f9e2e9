"""``stagegraph tune``: search a graph's params for a workload, every candidate isolated."""

from __future__ import annotations

from typing import Any

import click

from stagegraph.cli.options import (
    cache_trace_options,
    inspection_options,
    parse_assignments,
    session_request,
    target_option,
)
from stagegraph.cli.output import emit_json


@click.command()
@click.argument("graph")
@click.argument("workload")
@click.option(
    "--budget",
    type=click.IntRange(min=1),
    default=12,
    show_default=True,
    help="Candidates to consider (reused ones from --db count).",
)
@click.option(
    "--jobs",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Isolated local workers measuring at once (without --cluster).",
)
@click.option("--cluster", metavar="ADDRESS", help="tcp://HOST:PORT (a Dask scheduler) or local:N.")
@click.option(
    "--db",
    default="stagegraph-tune.db",
    show_default=True,
    type=click.Path(dir_okay=False),
    help="Tuning database (resumable).",
)
@click.option(
    "--strategy",
    type=click.Choice(["random", "model", "evolve"]),
    default="model",
    show_default=True,
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--threads", type=click.IntRange(min=1), help="Threads (default: all cores).")
@click.option(
    "--cost-model",
    "cost_model",
    metavar="NAME",
    help="The baseline's cost model (default: the graph's own).",
)
@click.option(
    "--fix", "fixes", multiple=True, metavar="FIELD=VALUE", help="Pin a tunable field in the space."
)
@click.option(
    "--per-op",
    is_flag=True,
    help="Give every distinct non-matmul op its own params (default: one set shared by all).",
)
@click.option(
    "--measure",
    metavar="STAGE",
    help="A registered stage of kind measure that times candidates (default: the interleaved "
    "timer); bring your own with --plugin.",
)
@click.option("--batch-size", type=click.IntRange(min=1), help="Candidates per isolated child.")
@click.option("--samples", type=click.IntRange(min=4), default=20, show_default=True)
@click.option(
    "--compile-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=60.0,
    show_default=True,
)
@click.option(
    "--run-timeout", type=click.FloatRange(min=0, min_open=True), default=60.0, show_default=True
)
@click.option(
    "--memory",
    "memory_gb",
    type=click.FloatRange(min=0, min_open=True),
    default=4.0,
    show_default=True,
    help="Address-space limit per worker child (GiB).",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON report (no progress bar).")
@click.option("--explain", is_flag=True, help="Print the space and its size; measure nothing.")
@click.option(
    "--dump-ir",
    type=click.Path(file_okay=False),
    help="Write each candidate's IR after every stage that changed it, in DIR/HASH.",
)
@inspection_options
@target_option
@cache_trace_options
def tune(**options: Any) -> None:
    """Search params for WORKLOAD through GRAPH; every candidate isolated, recorded in --db.

    Test-only: STAGEGRAPH_TUNE_FAULT="KIND@HASH,..." (KIND segfault|hang|oom|wrong; HASH a
    params-hash prefix or *) makes those candidates fail that way in the worker.
    """
    import os

    from stagegraph.tune.runner import TuneOptions
    from stagegraph.tune.runner import explain as explain_space
    from stagegraph.tune.runner import tune as run_tune

    if options["print_ir_after"] and not options["dump_ir"]:
        from stagegraph.errors import ConfigError

        raise ConfigError("tune --print-ir-after writes each candidate's IR to "
                          "DIR/<params hash>/printed.mlir: give --dump-ir DIR")  # fmt: skip
    faults = {}
    for item in filter(None, os.environ.get("STAGEGRAPH_TUNE_FAULT", "").split(",")):
        kind, _, key = item.partition("@")
        faults[key or "*"] = kind
    session = session_request({**options, "db": None, "compile_timeout": None,
                               "run_timeout": None})  # fmt: skip
    tune_options = TuneOptions(
        session=session,
        budget=options["budget"],
        jobs=options["jobs"],
        cluster=options["cluster"],
        db=options["db"],
        strategy=options["strategy"],
        seed=options["seed"],
        fixes=parse_assignments(options["fixes"]),
        per_op=options["per_op"],
        measure=options["measure"],
        batch_size=options["batch_size"],
        samples=options["samples"],
        compile_timeout_s=options["compile_timeout"],
        run_timeout_s=options["run_timeout"],
        memory_bytes=int(options["memory_gb"] * 2**30),
        faults=faults,
    )
    as_json, graph = options["as_json"], options["graph"]
    if options["explain"]:
        info = explain_space(tune_options)
        if as_json:
            emit_json(info)
            return
        click.echo(f"search space of {graph} on {info['workload']}:")
        for site, kinds in info["sites"].items():
            click.echo(f"  site {site}: ops {', '.join(kinds) or 'none'}")
        width = max(map(len, info["fields"]), default=16)
        for name, dom in info["fields"].items():
            values = ("{" + ",".join(map(str, dom["choices"])) + "}" if "choices" in dom
                      else f"{dom['low']}..{dom['high']}")  # fmt: skip
            click.echo(f"  {name:<{width}} {values}")
        click.echo("  fixed: " + ", ".join(f"{k}={v}" for k, v in info["fixed"].items()))
        click.echo("  constraints:")
        for name in info["constraints"]:
            click.echo(f"    {name}")
        size = f"{info['size']}" if info["size_exact"] else f">= {info['size']} (z3 count stopped)"
        click.echo(f"  size: {size}; product of domains {info['product_of_domains']:.3g}")
        return
    report = run_tune(tune_options, progress=not as_json)
    if as_json:
        emit_json(report.model_dump(mode="json"))
    else:
        _print_report(report)
    if report.interrupted:
        raise click.exceptions.Exit(130)


def _print_report(report: Any) -> None:
    base = report.baseline
    click.echo(f"tuned {report.graph} on {report.workload} ({report.strategy}, db {report.db})")
    click.echo(f"  measured {report.measured}, failed {report.failed}, reused {report.reused}")
    if base["median_s"] is not None:
        click.echo(f"  baseline median {base['median_s'] * 1e3:.4f} ms")
    if report.best is not None:
        click.echo(f"  best median {report.best.median_s * 1e3:.4f} ms: {report.best.params}")
    for failure in report.failures:
        click.echo(f"  failed {failure.params_hash}: {failure.reason}: {failure.detail}")
    click.echo(f"  {report.message}")
    if report.interrupted:
        click.echo("  interrupted: the best so far is above; every finished candidate is in the DB")
    if report.tuned_ops:
        click.echo(f"  tuned values stored for {len(report.tuned_ops)} ops, found by op kind, "
                   "shape, dtypes and target in any payload")  # fmt: skip
    if report.winner:
        click.echo(f"  use it:  {report.commands['use']}")
    click.echo(f"  resume:  {report.commands['resume']}")
