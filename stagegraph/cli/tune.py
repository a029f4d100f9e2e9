"""``stagegraph tune``: search a graph's params for a workload, every candidate isolated."""

from __future__ import annotations

from typing import Any

import click

from stagegraph.cli.options import model_options
from stagegraph.cli.output import emit_json
from stagegraph.tune.command import tune_options


@click.command()
@click.argument("graph")
@click.argument("workload")
@model_options(tune_options())
@click.option("--json", "as_json", is_flag=True, help="Print a JSON report (no progress bar).")
@click.option("--explain", is_flag=True, help="Print the space and its size; measure nothing.")
def tune(graph: str, workload: str, as_json: bool, explain: bool, **options: Any) -> None:
    """Search params for WORKLOAD through GRAPH; every candidate isolated, recorded in --db.

    Test-only: STAGEGRAPH_TUNE_FAULT="KIND@HASH,..." (KIND segfault|hang|oom|wrong; HASH a
    params-hash prefix or *) makes those candidates fail that way in the worker.
    """
    from stagegraph.tune import command

    if explain:
        _print_space(graph, command.tune(graph, workload, options, explain=True), as_json)
        return
    report = command.tune(graph, workload, options, progress=not as_json)
    if as_json:
        emit_json(report.model_dump(mode="json"))
    else:
        _print_report(report)
    if report.interrupted:
        raise click.exceptions.Exit(130)


def _print_space(graph: str, info: dict[str, Any], as_json: bool) -> None:
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
