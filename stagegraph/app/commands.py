"""``run`` and ``bench`` as one function each, called identically by the command line and
the Python API: the options (declared once on the request models), the refusals, and the
branching on ``ranks``, ``isolate``, ``until`` and ``vs``.

The CLI passes its click values, the API its keyword arguments, both under the same
keywords (:func:`run_options`, :func:`bench_options`); each gets an :class:`Outcome` back.
The API returns ``outcome.result``; the CLI prints the outcome. Nothing here prints.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field

from stagegraph.app.bench_options import BenchOptions
from stagegraph.app.session import SessionRequest
from stagegraph.core.graph import Graph
from stagegraph.core.options import Option, OptionSpec, model_values, option_specs, select
from stagegraph.core.ports import Schema
from stagegraph.errors import ConfigError

if TYPE_CHECKING:
    from stagegraph.app.session import Session
    from stagegraph.core.engine import Hook


class Launch(Schema):
    """Where and how far a run or benchmark goes: the options that pick a way of running
    rather than describe the compilation."""

    until: Annotated[str | None, Option("--until", metavar="TAG")] = Field(
        None, description="Stop after the stage tagged TAG and give its IR."
    )
    isolate: Annotated[bool, Option("--isolate")] = Field(
        False, description="Compile and run in a child process with limits."
    )
    timeout: Annotated[float, Option("--timeout")] = Field(
        300.0, gt=0, description="With --isolate: wall-clock limit (s)."
    )
    memory: Annotated[float, Option("--memory")] = Field(
        8.0, gt=0, description="With --isolate: address-space limit (GiB)."
    )
    ranks: Annotated[int | None, Option("--ranks")] = Field(
        None, ge=1, description="Run on N MPI ranks (sharded workloads)."
    )
    vs: Annotated[str | None, Option("--vs", metavar="GRAPH|PEER")] = Field(
        None,
        description="Measure a second variant interleaved and report the ratio: a graph or a "
        "peer (numpy; iree: the payload compiled by IREE for llvm-cpu, needs pip install "
        "'stagegraph[peers]'; 'stagegraph list peers').",
    )
    csv: Annotated[str | None, Option("--csv", path="file")] = Field(
        None, description="Append one CSV row per report."
    )


_COMPILE = ("param", "threads", "target", "cost_model", "db", "params_file")
_INSPECT = ("dump_ir", "print_ir_after", "verify_each", "repro_dir")
_LIMITS = ("isolate", "timeout", "memory", "ranks", "compile_timeout", "run_timeout")
_RECORD = ("cache", "trace")
#: The options of ``stagegraph run`` / ``sg.run``, in help order.
RUN = (
    *_COMPILE, "until", "emit", "output", "reference", "save_payload", *_INSPECT, *_LIMITS,
    *_RECORD,
)  # fmt: skip
#: The options of ``stagegraph bench`` / ``sg.bench``, in help order.
BENCH = (
    "splice_at", "warmup", "repeat", "min_time", "budget", "vs", *_COMPILE, "csv", *_INSPECT,
    *_LIMITS, *_RECORD,
)  # fmt: skip

#: What a multi-rank job honours (``trace``: every rank writes its stages); any other
#: option given with ``ranks`` is refused.
RANKS_HONOUR = {
    "run": {"ranks", "trace"},
    "bench": {"ranks", "splice_at", "warmup", "repeat", "min_time", "budget", "csv", "trace"},
}
#: What an isolated child cannot honour, and why.
ISOLATE_REFUSES = {
    "run": (("until", "print_ir_after", "compile_timeout", "run_timeout"),
            "the child returns only the report, under --timeout"),
    "bench": (("vs", "cost_model", "print_ir_after", "dump_ir", "compile_timeout", "run_timeout"),
              "it measures one variant with the default cost model, under --timeout"),
}  # fmt: skip


def _specs(keywords: Sequence[str]) -> dict[str, OptionSpec]:
    specs = {
        **option_specs(SessionRequest),
        **option_specs(BenchOptions),
        **option_specs(Launch),
    }
    return select(specs, keywords)


def run_options() -> dict[str, OptionSpec]:
    """``run``'s options by keyword: the fields of SessionRequest and Launch they set."""
    return _specs(RUN)


def bench_options() -> dict[str, OptionSpec]:
    """``bench``'s options by keyword: SessionRequest, BenchOptions and Launch fields."""
    return _specs(BENCH)


def given(spec: OptionSpec, value: Any) -> bool:
    """Whether an option was set to something other than its (library or CLI) default."""
    if value is None or value is False or (not isinstance(value, str | int) and not value):
        return False
    return value != spec.default and value != spec.cli_default


def refuse(command: str, values: Mapping[str, Any]) -> None:
    """Options that cannot combine are an error, never silently dropped.

    Raises:
        ConfigError: ``ranks`` or ``isolate`` with an option that way of running ignores.
    """
    specs = _specs(RUN if command == "run" else BENCH)

    def flags(keywords: Sequence[str]) -> list[str]:
        return [specs[k].flag for k in keywords if k in values and given(specs[k], values[k])]

    if values.get("ranks") is not None:
        clash = flags([k for k in specs if k not in RANKS_HONOUR[command]])
        if clash:
            raise ConfigError(f"--ranks cannot be combined with {', '.join(clash)}")
    elif values.get("isolate"):
        refused, why = ISOLATE_REFUSES[command]
        clash = flags(refused)
        if clash:
            raise ConfigError(
                f"{command} --isolate cannot be combined with {', '.join(clash)} ({why})"
            )


@dataclass
class Outcome:
    """What a command produced: ``result`` is what the API returns; ``reports`` every
    report made (for ``--csv``, printing and the exit code); ``how`` the way it ran
    (``ranks``, ``isolate``, ``until``, ``process`` or ``versus``)."""

    result: Any
    how: str
    reports: list[Any] = field(default_factory=list)
    cost_model: dict[str, Any] | None = None
    graph: str = ""
    workload: str = ""

    @property
    def verified(self) -> bool:
        return all(getattr(r, "verified", True) is not False for r in self.reports)


def graph_name(graph: str | Graph, option: str) -> str:
    """The graph's name for an option that rebuilds it in another process.

    Raises:
        ConfigError: a Graph object that no registered name rebuilds.
    """
    if not isinstance(graph, Graph):
        return str(graph)
    from stagegraph.core.catalog import load_graph

    with contextlib.suppress(Exception):  # not loadable under its name: refused below
        if load_graph(graph.name) == graph:
            return graph.name
    raise ConfigError(
        f"graph {graph.name!r}: {option} rebuilds the graph by name in another process, and "
        f"a Graph object cannot cross; register it (stagegraph.register_graph in a plugin "
        f"module) and pass its name"
    )


@dataclass
class Console:
    """What only a terminal asks for: where ``--print-ir-after`` text goes, extra hooks
    (a progress line), and whether to describe the cost model's choice."""

    write: Callable[[str], None] | None = None
    hooks: Sequence[Hook] = ()
    describe_cost_model: bool = False


def _request(
    graph: str | Graph, workload: str, values: Mapping[str, Any], keys: Sequence[str]
) -> SessionRequest:
    name = graph.name if isinstance(graph, Graph) else str(graph)
    fields = model_values(select(option_specs(SessionRequest), [*keys]), values)
    return SessionRequest(graph=name, workload=workload, **fields)


def _session_keys(command: str) -> list[str]:
    session = option_specs(SessionRequest)
    return [k for k in (RUN if command == "run" else BENCH) if k in session]


def merged_trace(values: Mapping[str, Any]) -> contextlib.AbstractContextManager[None]:
    """Around a whole command: with ``trace``, every process's stage events (children,
    ranks, workers) are merged into that file when the command ends."""
    from stagegraph.app.session import absolute_path
    from stagegraph.instrument.trace_events import collecting

    return collecting(absolute_path(values.get("trace")))


def run(
    graph: str | Graph, workload: str, values: Mapping[str, Any], console: Console | None = None
) -> Outcome:
    """``stagegraph run`` / ``sg.run``: on ranks, isolated, up to a tag, or in process.

    Raises:
        ConfigError: options that cannot combine (see :func:`refuse`), and what resolving
            or running the request raises.
    """
    with merged_trace(values):
        return _run(graph, workload, values, console or Console())


def _run(graph: str | Graph, workload: str, values: Mapping[str, Any], console: Console) -> Outcome:
    refuse("run", values)
    if values.get("ranks") is not None:
        from stagegraph.app.mpi_launch import run_on_ranks

        report = run_on_ranks(graph_name(graph, "ranks"), workload, values["ranks"])
        return Outcome(report, "ranks", [report])
    request = _request(graph, workload, values, _session_keys("run"))
    if values.get("isolate"):
        from stagegraph.app.isolated_session import run_in_child

        request = request.model_copy(update={"graph": graph_name(graph, "isolate")})
        report = run_in_child(request, _launch(values).timeout, _launch(values).memory)
        return Outcome(report, "isolate", [report])
    from stagegraph.app.run import run_report
    from stagegraph.app.session import Session

    own = graph if isinstance(graph, Graph) else None
    with Session(request, graph=own, write=console.write, extra_hooks=console.hooks) as session:
        names = {"graph": session.graph.name, "workload": session.workload.spec}
        if values.get("until") is not None:
            return Outcome(session.compile(until=values["until"]), "until", **names)
        info = _cost_model_info(session, request, console)
        report = run_report(session)
    return Outcome(report, "process", [report], info, **names)


def _launch(values: Mapping[str, Any]) -> Launch:
    return Launch(**model_values(option_specs(Launch), values))


def _cost_model_info(session: Session, request: Any, console: Console) -> dict | None:
    if not console.describe_cost_model or request.cost_model is None:
        return None
    from stagegraph.app.cost_model_info import describe_cost_model

    return describe_cost_model(session.engine, session.graph, session.workload,
                               request.cost_model)  # fmt: skip


def bench(
    graph: str | Graph, workload: str, values: Mapping[str, Any], console: Console | None = None
) -> Outcome:
    """``stagegraph bench`` / ``sg.bench``: verify, then time; on ranks, isolated, alone or
    against ``vs`` (measured interleaved). A variant that does not verify is not timed.
    ``csv`` gets one row per report.

    Raises:
        ConfigError: options that cannot combine (see :func:`refuse`), a sharded workload
            outside ``ranks``, and what resolving or running the request raises.
    """
    with merged_trace(values):
        return _bench(graph, workload, values, console or Console())


def _bench(
    graph: str | Graph, workload: str, values: Mapping[str, Any], console: Console
) -> Outcome:
    from stagegraph.app.bench import append_csv

    refuse("bench", values)
    options = BenchOptions(**model_values(option_specs(BenchOptions), values))
    if values.get("ranks") is not None:
        from stagegraph.app.mpi_launch import bench_on_ranks

        report = bench_on_ranks(graph_name(graph, "ranks"), workload, values["ranks"],
                                values.get("splice_at"), options)  # fmt: skip
        outcome = Outcome(report, "ranks", [report])
    else:
        request = _request(graph, workload, values, _session_keys("bench"))
        if values.get("isolate"):
            outcome = _bench_isolated(graph, request, options, _launch(values))
        else:
            outcome = _bench_in_process(graph, request, options, values.get("vs"), console)
    if values.get("csv"):
        for report in outcome.reports:
            append_csv(values["csv"], report)
    return outcome


def _bench_isolated(graph: str | Graph, request: Any, options: Any, launch: Launch) -> Outcome:
    from stagegraph.app.isolated_session import run_in_child
    from stagegraph.app.run import check_single_process
    from stagegraph.app.session import open_workload

    check_single_process(open_workload(request.workload))
    request = request.model_copy(update={"graph": graph_name(graph, "isolate"), "bench": options})
    report = run_in_child(request, launch.timeout, launch.memory)
    return Outcome(report, "isolate", [report])


def _bench_in_process(
    graph: str | Graph, request: Any, options: Any, versus: str | None, console: Console
) -> Outcome:
    from stagegraph.app.bench import benchmark, compare
    from stagegraph.app.run import check_single_process
    from stagegraph.app.session import Session
    from stagegraph.app.versus import check_versus, versus_measurements

    if versus is not None:
        check_versus(versus)  # a missing peer extra fails before anything compiles
    own = graph if isinstance(graph, Graph) else None
    with Session(request, graph=own, write=console.write, extra_hooks=console.hooks,
                 run_budget_s=options.budget_s) as session:  # fmt: skip
        check_single_process(session.workload)
        session.prepare_workload()  # a PyTorch import, under the compile time limit
        info = _cost_model_info(session, request, console)
        threads, splice_at = request.threads, request.splice_at
        if versus is None:
            report = benchmark(session.engine, session.graph, session.workload, splice_at,
                               options, threads)  # fmt: skip
            return Outcome(report, "process", [report], info)
        first, second = versus_measurements(session, versus, splice_at)
        failed = [m for m in (first, second) if hasattr(m, "verdict") and not m.verdict.ok]
        if failed:  # nothing is timed: the variants that do not verify
            reports = [m.report(None, threads) for m in failed]
            return Outcome(reports[0], "versus", reports, info)
        result = compare(first, second, options, threads)
        return Outcome(result, "versus", [result.a, result.b], info)
