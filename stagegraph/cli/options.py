"""Click options shared by ``run``, ``bench`` and ``tune``, and their translation into a
:class:`~stagegraph.app.session.SessionRequest`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import click


def _apply(command: Callable, options: Sequence[Callable]) -> Callable:
    for option in reversed(options):
        command = option(command)
    return command


def isolation_options(command: Callable) -> Callable:
    """``--isolate`` with its ``--timeout`` and ``--memory`` limits, shared by run/bench."""
    return _apply(command, [
        click.option("--isolate", is_flag=True,
                     help="Compile and run in a child process with limits."),
        click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=300.0,
                     show_default=True, help="With --isolate: wall-clock limit (s)."),
        click.option("--memory", "memory_gb", type=click.FloatRange(min=0, min_open=True),
                     default=8.0, show_default=True,
                     help="With --isolate: address-space limit (GiB)."),
    ])  # fmt: skip


def inspection_options(command: Callable) -> Callable:
    """``--print-ir-after``, ``--verify-each`` and ``--repro-dir``, shared by run/bench/tune."""
    return _apply(command, [
        click.option("--print-ir-after", "print_ir_after", multiple=True,
                     metavar="STAGE|TAG|all", help="Print the IR after these stages."),
        click.option("--verify-each", is_flag=True, help="Verify the IR after every stage."),
        click.option("--repro-dir", type=click.Path(file_okay=False),
                     help="Where failing stages write reproducers (default: a temp dir)."),
    ])  # fmt: skip


def time_limit_options(command: Callable) -> Callable:
    """``--compile-timeout`` and ``--run-timeout`` for in-process run/bench (see watchdog)."""
    return _apply(command, [
        click.option("--compile-timeout", type=click.FloatRange(min=0, min_open=True),
                     default=600.0, show_default=True,
                     help="Without --isolate: end the run if compiling takes longer (s)."),
        click.option("--run-timeout", type=click.FloatRange(min=0, min_open=True),
                     default=300.0, show_default=True,
                     help="Without --isolate: end the run if running or timing the compiled "
                          "code takes longer (s; bench adds --budget)."),
    ])  # fmt: skip


def target_option(command: Callable) -> Callable:
    """``--target``, shared by run/bench/tune."""
    return click.option(
        "--target",
        metavar="NAME",
        help="host (default, or $STAGEGRAPH_TARGET), x86-64-v2|v3|v4, or an LLVM CPU name "
        "(znver3, skylake-avx512, sapphirerapids, ...).",
    )(command)


def cost_model_options(command: Callable) -> Callable:
    """``--cost-model``, ``--db`` and ``--params-file``, shared by run/bench."""
    return _apply(command, [
        click.option("--cost-model", "cost_model", metavar="NAME",
                     help="heuristic (default), analytical, tuned (needs --db) or fixed "
                          "(needs --params-file)."),
        click.option("--db", "db", type=click.Path(dir_okay=False),
                     help="Tuning database (SQLite) for --cost-model tuned and tune."),
        click.option("--params-file", type=click.Path(dir_okay=False),
                     help="JSON params for --cost-model fixed."),
    ])  # fmt: skip


def cache_trace_options(command: Callable) -> Callable:
    """``--cache DIR`` and ``--trace FILE.json``, shared by run/bench/tune; with ``--trace``
    the command merges every process's stage events into FILE.json when it ends."""
    import functools

    @functools.wraps(command)
    def traced(**options: Any) -> Any:
        from stagegraph.app.session import absolute_path
        from stagegraph.instrument.trace_events import collecting

        with collecting(absolute_path(options.get("trace"))):
            return command(**options)

    return _apply(traced, [
        click.option("--cache", "cache", type=click.Path(file_okay=False), metavar="DIR",
                     help="Keep stage results in DIR: a later run replays unchanged stages."),
        click.option("--trace", "trace", type=click.Path(dir_okay=False), metavar="FILE.json",
                     help="Write every stage of every process as Chrome trace events "
                          "(open in Perfetto or chrome://tracing; 'stagegraph show GRAPH "
                          "--trace FILE.json' draws the timings on the graph)."),
    ])  # fmt: skip


def param_option(command: Callable) -> Callable:
    return click.option(
        "--param",
        "params",
        multiple=True,
        metavar="KEY=VALUE",
        help="Override a field of the cost model's params (validated).",
    )(command)


def parse_assignments(items: Sequence[str]) -> dict[str, Any]:
    """``KEY=VALUE`` strings to a dict (see :func:`stagegraph.app.session.parse_assignments`)."""
    from stagegraph.app.session import parse_assignments as parse

    return parse(items)


def session_request(options: dict[str, Any]) -> Any:
    """The :class:`SessionRequest` for a command's keyword arguments (the click values)."""
    from stagegraph.app.session import request_from_options

    return request_from_options(options["graph"], options["workload"], options)


def progress_hooks(as_json: bool) -> list:
    """A progress line for long compiles, on a terminal and without ``--json`` only."""
    import sys

    if as_json or not sys.stderr.isatty():
        return []
    from stagegraph.instrument.progress import Progress

    return [Progress(sys.stderr)]


def print_ir(text: str) -> None:
    """Where ``--print-ir-after`` text goes: stderr, so ``--json`` output stays clean."""
    click.echo(text, err=True)
