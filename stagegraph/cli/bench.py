"""``stagegraph bench``: time a workload with the wrapper spliced at a tag, alone or against
a second variant (another graph, or numpy) measured interleaved."""

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
from stagegraph.cli.output import (
    emit_json,
    print_bench_report,
    print_host,
    print_ratio,
    report_cost_model,
    warn_openblas_overrides,
)


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
    metavar="GRAPH|numpy|iree|torch|torch-compile",
    help="Measure a second variant interleaved and report the ratio (iree: the same payload "
    "compiled by IREE for llvm-cpu; needs pip install 'stagegraph[peers]'; torch, "
    "torch-compile: a PyTorch workload's model, eager or inductor; needs the torch extra).",
)
@param_option
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
@cache_trace_options
def bench(**options: Any) -> None:  # fmt: skip
    """Benchmark WORKLOAD through GRAPH with the timing wrapper spliced at a tag."""
    from stagegraph.app.bench import BenchOptions, append_csv

    bench_options = BenchOptions(
        warmup=options["warmup"],
        repeat=options["repeat"],
        min_time_s=options["min_time"],
        budget_s=options["budget"],
    )
    if options["ranks"] is not None:
        from stagegraph.cli.mpi_commands import mpi_bench_command

        unsupported = {
            flag: options[key]
            for flag, key in (("--vs", "versus"), ("--param", "params"), ("--threads", "threads"),
                              ("--dump-ir", "dump_ir"), ("--print-ir-after", "print_ir_after"),
                              ("--verify-each", "verify_each"), ("--repro-dir", "repro_dir"),
                              ("--target", "target"))
        }  # fmt: skip
        return mpi_bench_command(options["graph"], options["workload"], options["ranks"],
                                 options["splice_at"], bench_options, options["as_json"],
                                 options["csv_path"], unsupported)  # fmt: skip
    request = session_request(options)
    if options["isolate"]:
        reports = [_bench_isolated(request, bench_options, options)]
    else:
        reports = _bench_in_process(request, bench_options, options)
    if options["csv_path"]:
        for report in reports:
            append_csv(options["csv_path"], report)
    if not all(r.verified for r in reports):
        raise SystemExit(1)


def _bench_isolated(request: Any, bench_options: Any, options: dict[str, Any]) -> Any:
    from stagegraph.app.run import check_single_process
    from stagegraph.app.session import open_workload
    from stagegraph.cli.isolated import run_isolated
    from stagegraph.errors import ConfigError

    check_single_process(open_workload(request.workload))
    if (
        options["versus"]
        or options["cost_model"]
        or options["print_ir_after"]
        or (options["dump_ir"])
    ):
        raise ConfigError(
            "bench --isolate measures one variant with the default cost model; "
            "drop --vs/--cost-model/--print-ir-after/--dump-ir"
        )
    report = run_isolated(request, options["timeout"], options["memory_gb"], bench=bench_options,
                          splice_at=options["splice_at"])  # fmt: skip
    if options["as_json"]:
        emit_json(report.model_dump(mode="json"))
    else:
        print_host(report)
        print_bench_report(report)
    return report


def _bench_in_process(request: Any, bench_options: Any, options: dict[str, Any]) -> list:
    """Measure (or compare) in this process, print, and return the reports."""
    from stagegraph.app.run import check_single_process
    from stagegraph.app.session import Session

    hooks = progress_hooks(options["as_json"])
    with Session(request, write=print_ir, run_budget_s=bench_options.budget_s,
                 extra_hooks=hooks) as session:  # fmt: skip
        check_single_process(session.workload)
        info = report_cost_model(session, options["cost_model"])
        if options["versus"] is None:
            return [_bench_one(session, bench_options, options, info)]
        return _bench_versus(session, bench_options, options)


def _bench_one(session: Any, bench_options: Any, options: dict[str, Any], info: Any) -> Any:
    from stagegraph.app.bench import benchmark

    report = benchmark(session.engine, session.graph, session.workload, options["splice_at"],
                       bench_options, options["threads"])  # fmt: skip
    if options["as_json"]:
        extra = {"cost_model": info} if info is not None else {}
        emit_json({**report.model_dump(mode="json"), **extra})
    else:
        print_host(report)
        print_bench_report(report)
        if info is not None:
            click.echo(f"  cost model {info['name']} ({info['source']}): {info['params']}")
    return report


def _bench_versus(session: Any, bench_options: Any, options: dict[str, Any]) -> list:
    from stagegraph.app.bench import compare
    from stagegraph.app.versus import versus_measurements

    threads, versus = options["threads"], options["versus"]
    if versus == "iree":
        from stagegraph.app.iree import import_iree

        import_iree()  # a missing extra fails before anything compiles
    if versus == "numpy":
        warn_openblas_overrides()
    first, second = versus_measurements(session, versus, options["splice_at"])
    unverified = [m for m in (first, second) if hasattr(m, "verdict") and not m.verdict.ok]
    if unverified:
        reports = [m.report(None, threads) for m in unverified]
        for r in reports:
            print_bench_report(r) if not options["as_json"] else emit_json(
                r.model_dump(mode="json")
            )
        raise SystemExit(1)
    result = compare(first, second, bench_options, threads)
    if options["as_json"]:
        emit_json(result.model_dump(mode="json"))
    else:
        print_host(result.b if versus == "numpy" else result.a)
        print_bench_report(result.a)
        print_bench_report(result.b)
        print_ratio(result)
    return [result.a, result.b]
