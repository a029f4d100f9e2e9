"""CLI commands that compile and run payloads (``run``; ``bench`` and others as they land)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click

from stagegraph.cli.main import emit_json

if TYPE_CHECKING:
    from stagegraph.app.run import RunReport
    from stagegraph.core.engine import Hook
    from stagegraph.core.graph import Graph

COMMANDS: list[click.Command] = []


def _register(command: click.Command) -> click.Command:
    COMMANDS.append(command)
    return command


def load_inputs(graph_name: str, workload_spec: str):
    from stagegraph.app.run import install_reference_runner
    from stagegraph.core.catalog import load_graph
    from stagegraph.workload import parse_workload

    install_reference_runner()
    return load_graph(graph_name), parse_workload(workload_spec)


def isolation_options(command: click.Command) -> click.Command:
    """``--isolate`` with its ``--timeout`` and ``--memory`` limits, shared by run/bench."""
    options = [
        click.option("--isolate", is_flag=True,
                     help="Compile and run in a child process with limits."),
        click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=300.0,
                     show_default=True, help="With --isolate: wall-clock limit (s)."),
        click.option("--memory", "memory_gb", type=click.FloatRange(min=0, min_open=True),
                     default=8.0, show_default=True,
                     help="With --isolate: address-space limit (GiB)."),
    ]  # fmt: skip
    for option in reversed(options):
        command = option(command)
    return command


def inspection_options(command: click.Command) -> click.Command:
    """``--print-ir-after``, ``--verify-each`` and ``--repro-dir``, shared by run/bench."""
    options = [
        click.option("--print-ir-after", "print_ir_after", multiple=True,
                     metavar="STAGE|TAG|all", help="Print the IR after these stages."),
        click.option("--verify-each", is_flag=True, help="Verify the IR after every stage."),
        click.option("--repro-dir", type=click.Path(file_okay=False),
                     help="Where failing stages write reproducers (default: a temp dir)."),
    ]  # fmt: skip
    for option in reversed(options):
        command = option(command)
    return command


def time_limit_options(command: click.Command) -> click.Command:
    """``--compile-timeout`` and ``--run-timeout`` for in-process run/bench (see watchdog)."""
    options = [
        click.option("--compile-timeout", type=click.FloatRange(min=0, min_open=True),
                     default=600.0, show_default=True,
                     help="Without --isolate: end the run if compiling takes longer (s)."),
        click.option("--run-timeout", type=click.FloatRange(min=0, min_open=True),
                     default=300.0, show_default=True,
                     help="Without --isolate: end the run if running or timing the compiled "
                          "code takes longer (s; bench adds --budget)."),
    ]  # fmt: skip
    for option in reversed(options):
        command = option(command)
    return command


def watched(hooks: list[Hook], compile_timeout: float, run_timeout: float) -> list[Hook]:
    """``hooks`` plus a :class:`~stagegraph.instrument.watchdog.Watchdog` with these limits."""
    from stagegraph.instrument.watchdog import Watchdog

    return [*hooks, Watchdog(compile_timeout, run_timeout)]


def stop_watchdogs(hooks: Sequence[Hook]) -> None:
    from stagegraph.instrument.watchdog import Watchdog

    for hook in hooks:
        if isinstance(hook, Watchdog):
            hook.stop()


def target_option(command: click.Command) -> click.Command:
    """``--target``, shared by run/bench/tune."""
    return click.option(
        "--target",
        metavar="NAME",
        help="host (default, or $STAGEGRAPH_TARGET), x86-64-v2|v3|v4, or an LLVM CPU name "
        "(znver3, skylake-avx512, sapphirerapids, ...).",
    )(command)


def cost_model_options(command: click.Command) -> click.Command:
    """``--cost-model``, ``--db`` and ``--params-file``, shared by run/bench/tune."""
    options = [
        click.option("--cost-model", "cost_model", metavar="NAME",
                     help="heuristic (default), analytical, tuned (needs --db) or fixed "
                          "(needs --params-file)."),
        click.option("--db", "db", type=click.Path(dir_okay=False),
                     help="Tuning database (SQLite) for --cost-model tuned and tune."),
        click.option("--params-file", type=click.Path(dir_okay=False),
                     help="JSON params for --cost-model fixed."),
    ]  # fmt: skip
    for option in reversed(options):
        command = option(command)
    return command


def swap_cost_model(graph: Graph, work, cost_model: str | None, db: str | None,
                    params_file: str | None) -> Graph:  # fmt: skip
    from stagegraph.app.run import with_cost_model

    return with_cost_model(graph, cost_model, workload=work.spec, db=db, params_file=params_file)


def report_cost_model(engine, graph: Graph, work, cost_model: str | None) -> dict | None:
    """Describe the cost model's choice; say on stderr when ``tuned`` fell back."""
    if cost_model is None:
        return None
    from stagegraph.tune import describe_cost_model

    info = describe_cost_model(engine, graph, work, cost_model)
    if info.get("source") == "heuristic (fallback)":
        click.echo(f"cost model 'tuned': {info['note']}", err=True)
    return info


def build_hooks(
    graph: Graph,
    print_ir_after: Sequence[str],
    verify_each: bool,
    repro_dir: str | None,
    dump_ir: str | None = None,
) -> list[Hook]:
    """The engine hooks the inspection options ask for (reproducers are always on)."""
    from stagegraph.instrument.ir_hooks import DumpIR, PrintIR, VerifyEach, check_selectors
    from stagegraph.instrument.repro import ReproducerHook

    hooks = [ReproducerHook(repro_dir)]
    if verify_each:
        hooks.append(VerifyEach())
    if print_ir_after:
        check_selectors(graph, list(print_ir_after))
        hooks.append(PrintIR(list(print_ir_after), lambda text: click.echo(text, err=True)))
    if dump_ir:
        hooks.append(DumpIR(dump_ir))
    return hooks


@_register
@click.command()
@inspection_options
@click.argument("graph")
@click.argument("workload")
@click.option(
    "--param",
    "params",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a field of the cost model's params (validated).",
)
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
@isolation_options
@click.option("--ranks", type=click.IntRange(min=1), help="Run on N MPI ranks (sharded workloads).")
@cost_model_options
@target_option
@time_limit_options
def run(
    graph: str,
    workload: str,
    params: tuple[str, ...],
    until: str | None,
    dump_ir: str | None,
    emit: str,
    output: str | None,
    threads: int | None,
    as_json: bool,
    ranks: int | None,
    isolate: bool = False,
    timeout: float = 300.0,
    memory_gb: float = 8.0,
    print_ir_after: tuple[str, ...] = (),
    verify_each: bool = False,
    repro_dir: str | None = None,
    cost_model: str | None = None,
    db: str | None = None,
    params_file: str | None = None,
    target: str | None = None,
    compile_timeout: float = 600.0,
    run_timeout: float = 300.0,
) -> None:
    """Compile WORKLOAD through GRAPH, run it and verify it against the reference."""
    if ranks is not None:
        from stagegraph.app.mpi_launch import run_command

        unsupported = {"--param": params, "--until": until, "--dump-ir": dump_ir,
                       "--emit": emit != "jit", "--threads": threads,
                       "--target": target}  # fmt: skip
        return run_command(graph, workload, ranks, as_json, unsupported)
    from stagegraph.app.run import (
        parse_assignments,
        with_emit,
        with_params,
        with_target,
    )
    from stagegraph.core.engine import Engine

    loaded, work = load_inputs(graph, workload)
    loaded = swap_cost_model(loaded, work, cost_model, db, params_file)
    loaded = with_params(loaded, parse_assignments(params), threads)
    loaded = with_target(loaded, target)
    loaded = with_emit(loaded, emit, output)
    if isolate and cost_model is not None:
        from stagegraph.errors import ConfigError

        raise ConfigError("--isolate does not take --cost-model yet; run without --isolate")
    if isolate:
        report = _run_isolated(graph, workload, params, threads, emit, output, verify_each,
                               repro_dir, timeout, memory_gb, target=target)  # fmt: skip
        _print_run_report(report, as_json)
        return
    hooks = build_hooks(loaded, print_ir_after, verify_each, repro_dir, dump_ir)
    engine = Engine(watched(hooks, compile_timeout, run_timeout))
    try:
        _run_in_process(engine, loaded, work, until, as_json, cost_model, threads)
    finally:
        stop_watchdogs(engine.hooks)


def _run_in_process(engine, loaded: Graph, work, until: str | None, as_json: bool,
                    cost_model: str | None, threads: int | None) -> None:  # fmt: skip
    """The in-process part of ``run``: print the IR at ``until``, or run and report."""
    from stagegraph.app.run import run_report

    if until:
        result = engine.run(loaded, work, until=until)
        module = result.module
        if as_json:
            emit_json(
                {
                    "graph": loaded.name,
                    "workload": work.spec,
                    "until": until,
                    "level": module.level if module else None,
                    "ir": module.text() if module else None,
                }
            )
        else:
            click.echo(module.text() if module else "(no module at that point)")
        return
    info = report_cost_model(engine, loaded, work, cost_model)
    report = run_report(loaded, work, engine=engine, threads=threads)
    if info is not None and as_json:
        emit_json({**report.model_dump(mode="json"), "cost_model": info})
        if report.verified is False:
            raise SystemExit(1)
        return
    _print_run_report(report, as_json)


def _run_isolated(graph: str, workload: str, params: Sequence[str], threads: int | None,
                  emit: str, output: str | None, verify_each: bool, repro_dir: str | None,
                  timeout: float, memory_gb: float, bench: dict | None = None,
                  target: str | None = None) -> Any:  # fmt: skip
    import tempfile

    from stagegraph.app.isolate import Limits
    from stagegraph.app.run import IsolatedRun, parse_assignments, run_isolated_report

    with tempfile.TemporaryDirectory(prefix="stagegraph-crumb-") as scratch:
        request = IsolatedRun(graph=graph, workload=workload, params=parse_assignments(params),
                              threads=threads, target=target, emit=emit, output=output,
                              breadcrumb=f"{scratch}/current", verify_each=verify_each,
                              bench=bench)  # fmt: skip
        limits = Limits(timeout_s=timeout, memory_bytes=int(memory_gb * 2**30))
        return run_isolated_report(request, limits, repro_dir)


def _print_run_report(report: RunReport, as_json: bool) -> None:
    if as_json:
        emit_json(report.model_dump(mode="json"))
    else:
        click.echo(
            f"{report.graph} on {report.workload}: "
            + {True: "VERIFIED", False: "WRONG RESULT", None: "NOT RUN"}[report.verified]
        )
        click.echo(f"  {report.message}")
        for stage in report.stages:
            click.echo(f"  {stage.name:<14} {stage.kind:<9} {stage.seconds * 1e3:9.2f} ms")
        if report.run_seconds is not None:
            click.echo(f"  run            {report.run_seconds * 1e3:9.2f} ms")
    if report.verified is False:
        raise SystemExit(1)


@_register
@click.command()
@click.argument("graph")
@click.argument("workload")
@click.option(
    "--splice-at",
    metavar="TAG",
    help="Tag after which the wrapper is spliced (default: the graph's own choice).",
)
@click.option("--warmup", type=click.IntRange(min=0), default=3, show_default=True)
@click.option(
    "--repeat",
    type=click.IntRange(min=2),
    default=10,
    show_default=True,
    help="Minimum number of timed samples.",
)
@click.option(
    "--min-time",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Keep sampling at least this long (seconds).",
)
@click.option(
    "--budget",
    type=click.FloatRange(min=0),
    default=10.0,
    show_default=True,
    help="Stop sampling after this long even if the interval is wider than ±2%.",
)
@click.option(
    "--vs",
    "versus",
    metavar="GRAPH|numpy",
    help="Measure a second variant interleaved and report the ratio.",
)
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE")
@click.option("--threads", type=click.IntRange(min=1), help="Threads (default: all cores).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON report.")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False), help="Append a CSV row.")
@click.option("--dump-ir", type=click.Path(file_okay=False), help="Write the IR after each stage.")
@click.option("--ranks", type=click.IntRange(min=1), help="Time on N MPI ranks (sharded).")
@inspection_options
@isolation_options
@cost_model_options
@target_option
@time_limit_options
def bench(
    graph: str,
    workload: str,
    splice_at: str | None,
    warmup: int,
    repeat: int,
    min_time: float,
    budget: float,
    versus: str | None,
    params: tuple[str, ...],
    threads: int | None,
    as_json: bool,
    csv_path: str | None,
    dump_ir: str | None = None,
    ranks: int | None = None,
    print_ir_after: tuple[str, ...] = (),
    verify_each: bool = False,
    repro_dir: str | None = None,
    cost_model: str | None = None,
    db: str | None = None,
    params_file: str | None = None,
    isolate: bool = False,
    timeout: float = 300.0,
    memory_gb: float = 8.0,
    target: str | None = None,
    compile_timeout: float = 600.0,
    run_timeout: float = 300.0,
) -> None:
    """Benchmark WORKLOAD through GRAPH with the timing wrapper spliced at a tag."""
    from stagegraph.app.bench import BenchOptions, append_csv
    from stagegraph.app.run import (
        check_single_process,
        parse_assignments,
        with_params,
        with_target,
    )
    from stagegraph.core.engine import Engine

    options = BenchOptions(warmup=warmup, repeat=repeat, min_time_s=min_time, budget_s=budget)
    if ranks is not None:
        from stagegraph.app.mpi_launch import bench_command

        unsupported = {"--vs": versus, "--param": params, "--threads": threads,
                       "--dump-ir": dump_ir, "--print-ir-after": print_ir_after,
                       "--verify-each": verify_each, "--repro-dir": repro_dir,
                       "--target": target}  # fmt: skip
        return bench_command(graph, workload, ranks, splice_at, options, as_json, csv_path,
                             unsupported)  # fmt: skip
    loaded, work = load_inputs(graph, workload)
    check_single_process(work)
    loaded = with_target(loaded, target)
    if isolate:
        from stagegraph.errors import ConfigError

        if versus or cost_model or print_ir_after or dump_ir:
            raise ConfigError(
                "bench --isolate measures one variant with the default cost model; "
                "drop --vs/--cost-model/--print-ir-after/--dump-ir"
            )
        bench_options = {**options.model_dump(), "splice_at": splice_at}
        report = _run_isolated(graph, workload, params, threads, "jit", None, verify_each,
                               repro_dir, timeout, memory_gb, bench=bench_options,
                               target=target)  # fmt: skip
        if as_json:
            emit_json(report.model_dump(mode="json"))
        else:
            _print_host(report)
            _print_report(report)
        if csv_path:
            append_csv(csv_path, report)
        if not report.verified:
            raise SystemExit(1)
        return
    loaded = swap_cost_model(loaded, work, cost_model, db, params_file)
    loaded = with_params(loaded, parse_assignments(params), threads)
    hooks = build_hooks(loaded, print_ir_after, verify_each, repro_dir, dump_ir)
    engine = Engine(watched(hooks, compile_timeout, run_timeout + budget))
    try:
        reports = _bench_in_process(engine, loaded, work, splice_at, options, threads, versus,
                                    params, target, as_json, cost_model)  # fmt: skip
    finally:
        stop_watchdogs(engine.hooks)
    if csv_path:
        for r in reports:
            append_csv(csv_path, r)
    if not all(r.verified for r in reports):
        raise SystemExit(1)


def _bench_in_process(engine, loaded: Graph, work, splice_at: str | None, options, threads,
                      versus: str | None, params: Sequence[str], target: str | None,
                      as_json: bool, cost_model: str | None) -> list:  # fmt: skip
    """The in-process part of ``bench``: measure (or compare), print, return the reports."""
    from stagegraph.app.bench import NumpyMeasurement, benchmark, compare, prepare
    from stagegraph.app.run import parse_assignments, with_params, with_target
    from stagegraph.core.catalog import load_graph

    info = report_cost_model(engine, loaded, work, cost_model)
    if versus is None:
        report = benchmark(engine, loaded, work, splice_at, options, threads)
        reports = [report]
        if as_json:
            extra = {"cost_model": info} if info is not None else {}
            emit_json({**report.model_dump(mode="json"), **extra})
        else:
            _print_host(report)
            _print_report(report)
            if info is not None:
                click.echo(f"  cost model {info['name']} ({info['source']}): {info['params']}")
    else:
        first = prepare(engine, loaded, work, splice_at)
        if versus == "numpy":
            _warn_openblas_overrides()
            second = NumpyMeasurement(work, threads)
        else:
            other = with_params(load_graph(versus), parse_assignments(params), threads)
            other = with_target(other, target) if target and versus != "naive" else other
            second = prepare(engine, other, work, splice_at)
        unverified = [m for m in (first, second) if hasattr(m, "verdict") and not m.verdict.ok]
        if unverified:
            reports = [m.report(None, threads) for m in unverified]
            for r in reports:
                _print_report(r) if not as_json else emit_json(r.model_dump(mode="json"))
            raise SystemExit(1)
        result = compare(first, second, options, threads)
        reports = [result.a, result.b]
        if as_json:
            emit_json(result.model_dump(mode="json"))
        else:
            _print_host(result.b if versus == "numpy" else result.a)
            _print_report(result.a)
            _print_report(result.b)
            _print_ratio(result)
    return reports


def _warn_openblas_overrides() -> None:
    """Say on stderr when OpenBLAS runs forced kernels: ``--vs numpy`` then undersells numpy."""
    from stagegraph.app.host import openblas_overrides

    found = openblas_overrides()
    if found:
        names = ", ".join(f"{k}={v}" for k, v in found.items())
        click.echo(
            f"warning: {names} set: OpenBLAS runs those kernels instead of the ones for this "
            "CPU, so the numpy numbers are not representative (unset it to compare fairly)",
            err=True,
        )


def _print_host(report) -> None:
    """The machine, the ISA tier and numpy's BLAS: a number means little without them."""
    from stagegraph.app.host import describe

    if report.host is not None:
        threads = report.host.blas.num_threads if report.host.blas else None
        pinned = f", BLAS threads {threads}" if report.graph == "numpy" else ""
        click.echo(describe(report.host) + pinned)


def _print_report(report) -> None:
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
        f"compile {report.compile_seconds:.3f} s"
    )


def _print_ratio(result) -> None:
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


@_register
@click.command()
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def repro(directory: str, as_json: bool) -> None:
    """Re-run the failing stage recorded in a reproducer DIRECTORY on its input."""
    from stagegraph.instrument.repro import replay

    result = replay(directory)
    if as_json:
        emit_json(result)
    else:
        click.echo(f"stage {result['stage']!r} ran without error (the failure did not reproduce)")


@_register
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
    default="random",
    show_default=True,
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--cost-model",
    "cost_model",
    default="heuristic",
    show_default=True,
    metavar="NAME",
    help="The baseline's cost model.",
)
@click.option(
    "--fix", "fixes", multiple=True, metavar="FIELD=VALUE", help="Pin a tunable field in the space."
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
def tune(graph: str, workload: str, budget: int, jobs: int, cluster: str | None, db: str,
         strategy: str, seed: int, cost_model: str, fixes: tuple[str, ...],
         batch_size: int | None, samples: int, compile_timeout: float, run_timeout: float,
         memory_gb: float, as_json: bool, explain: bool, dump_ir: str | None = None,
         print_ir_after: tuple[str, ...] = (), verify_each: bool = False,
         repro_dir: str | None = None, target: str | None = None) -> None:  # fmt: skip
    """Search params for WORKLOAD through GRAPH; every candidate isolated, recorded in --db.

    Test-only: STAGEGRAPH_TUNE_FAULT="KIND@HASH,..." (KIND segfault|hang|oom|wrong; HASH a
    params-hash prefix or *) makes those candidates fail that way in the worker.
    """
    import os

    from stagegraph.app.run import parse_assignments
    from stagegraph.tune.runner import TuneOptions
    from stagegraph.tune.runner import explain as explain_space
    from stagegraph.tune.runner import tune as run_tune

    if print_ir_after and not dump_ir:
        from stagegraph.errors import ConfigError

        raise ConfigError("tune --print-ir-after writes each candidate's IR to "
                          "DIR/<params hash>/printed.mlir: give --dump-ir DIR")  # fmt: skip
    faults = {}
    for item in filter(None, os.environ.get("STAGEGRAPH_TUNE_FAULT", "").split(",")):
        kind, _, key = item.partition("@")
        faults[key or "*"] = kind
    options = TuneOptions(graph=graph, workload=workload, budget=budget, jobs=jobs,
                          cluster=cluster, db=db, strategy=strategy, seed=seed,
                          cost_model=cost_model, fixes=parse_assignments(fixes),
                          batch_size=batch_size, samples=samples,
                          compile_timeout_s=compile_timeout, run_timeout_s=run_timeout,
                          memory_bytes=int(memory_gb * 2**30), faults=faults,
                          dump_ir=dump_ir, print_ir_after=list(print_ir_after),
                          verify_each=verify_each, repro_dir=repro_dir,
                          target=target)  # fmt: skip
    if explain:
        info = explain_space(options)
        if as_json:
            emit_json(info)
            return
        click.echo(f"search space of {graph} on {info['workload']}:")
        for name, dom in info["fields"].items():
            click.echo(f"  {name:<16} {dom['low']}..{dom['high']}")
        click.echo("  fixed: " + ", ".join(f"{k}={v}" for k, v in info["fixed"].items()))
        click.echo("  constraints:")
        for name in info["constraints"]:
            click.echo(f"    {name}")
        size = f"{info['size']}" if info["size_exact"] else f">= {info['size']} (z3 count capped)"
        click.echo(f"  size: {size}; product of domains {info['product_of_domains']:.3g}")
        return
    report = run_tune(options, progress=not as_json)
    if as_json:
        emit_json(report.model_dump(mode="json"))
        return
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
