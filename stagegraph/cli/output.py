"""How reports look on a terminal: the one place run and bench results are printed."""

from __future__ import annotations

import json
from typing import Any

import click


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


def print_run_report(report: Any, as_json: bool, extra: dict[str, Any] | None = None) -> None:
    """A run's verdict and stage times; exit 1 on a wrong result."""
    note_cost_model((extra or {}).get("cost_model"))
    if as_json:
        emit_json({**report.model_dump(mode="json"), **(extra or {})})
    else:
        verdict = {True: "VERIFIED", False: "WRONG RESULT", None: "NOT RUN"}[report.verified]
        if report.verified is None and report.run_seconds is not None:
            verdict = "RAN, NOT VERIFIED"
        against = f" against {report.reference}" if report.verified is not None else ""
        click.echo(f"{report.graph} on {report.workload}: {verdict}{against}")
        click.echo(f"  {report.message}")
        for stage in report.stages:
            click.echo(f"  {stage.name:<14} {stage.kind:<9} {stage.seconds * 1e3:9.2f} ms")
        if report.run_seconds is not None:
            click.echo(f"  run            {report.run_seconds * 1e3:9.2f} ms{_threads(report)}")
        if getattr(report, "memory_passes", None) is not None:
            click.echo(f"  passes over memory: {report.memory_passes}")
    if report.verified is False:
        raise SystemExit(1)


def print_host(report: Any) -> None:
    """The machine, the ISA tier and numpy's BLAS: a number means little without them."""
    from stagegraph.app.host import describe

    if report.host is not None:
        threads = report.host.blas.num_threads if report.host.blas else None
        pinned = f", BLAS threads {threads}" if report.graph == "numpy" else ""
        click.echo(describe(report.host) + pinned)


def print_bench_report(report: Any) -> None:
    from stagegraph.app.bench import rough

    head = f"{report.graph} on {report.workload} (spliced at {report.splice_at})"
    if not report.verified:
        click.echo(f"{head}: WRONG RESULT, not timed\n  {report.message}")
        return
    if report.trustworthy is False:  # no precise-looking number for a run this noisy
        click.echo(
            f"{head}: NOT TRUSTWORTHY, median roughly {rough(report.median_s * 1e3)} ms "
            f"(p10 {rough(report.p10_s * 1e3)}, p90 {rough(report.p90_s * 1e3)} ms) over "
            f"{report.samples} samples; compile {report.compile_seconds:.3f} s\n"
            f"  warning: {report.warning}; rerun with a larger --budget on a quieter machine"
        )
        return
    speed = f", {report.gflops:.1f} GFLOP/s" if report.gflops else ""
    click.echo(
        f"{head}: median {report.median_s * 1e3:.4f} ms [{report.ci_low_s * 1e3:.4f}, "
        f"{report.ci_high_s * 1e3:.4f}] over {report.samples} samples{speed}; "
        f"min {report.min_s * 1e3:.4f} ms, cv {report.cv:.3f}, "
        f"compile {report.compile_seconds:.3f} s{_threads(report)}"
    )


def _threads(report: Any) -> str:
    """`` on N of M threads``: what the payload ran on, of what it was granted."""
    ran, granted = getattr(report, "payload_threads", None), report.threads
    if ran is None or granted is None:
        return ""
    return f" on {ran} of {granted} threads" if ran != granted else f" on {ran} threads"


def print_ratio(result: Any) -> None:
    from stagegraph.app.bench import rough

    names = f"{result.a.graph}/{result.b.graph}"
    if result.trustworthy is False:
        click.echo(
            f"ratio {names} time: NOT TRUSTWORTHY, roughly {rough(result.ratio)} "
            f"[{rough(result.ratio_low)}, {rough(result.ratio_high)}]\n  warning: {result.warning}"
        )
        return
    click.echo(
        f"ratio {names} time: {result.ratio:.3f} [{result.ratio_low:.3f}, "
        f"{result.ratio_high:.3f}]  (speedup of {result.a.graph}: {1 / result.ratio:.2f}x)"
    )


def note_cost_model(info: dict | None) -> None:
    """Say on stderr when the ``tuned`` cost model fell back to the heuristic."""
    if info is not None and info["fallback"]:
        click.echo(f"cost model 'tuned': {info['note']}", err=True)


def print_warnings() -> None:
    """Print the library's warnings (:class:`~stagegraph.errors.StagegraphWarning`, e.g. an
    ignored cache entry) as ``warning: ...`` on stderr, every time they happen."""
    import warnings

    from stagegraph.errors import StagegraphWarning

    original = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, StagegraphWarning):
            click.echo(f"warning: {message}", err=True)
        else:
            original(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    warnings.simplefilter("always", StagegraphWarning)
