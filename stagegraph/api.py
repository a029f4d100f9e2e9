"""The Python API: ``run``, ``bench`` and ``tune`` as functions, with the command line's
options under the command line's names, returning the report objects the CLI prints.

``stagegraph run x86 matmul --param tile_m=32 --threads 1`` is
``sg.run("x86", "matmul", param={"tile_m": 32}, threads=1)``; ``--vs numpy`` is
``vs="numpy"``, ``--memory 4`` is ``memory=4``. Every function opens the same
:class:`~stagegraph.app.session.Session` as the CLI, so a name resolves (plugins included)
and a run is checked exactly as on the command line. Nothing here prints.

``graph`` is a graph name, a graph file, or a :class:`~stagegraph.core.graph.Graph` built
in Python. A Graph object lives in this process only: what runs elsewhere (``isolate``,
``ranks``, ``tune``'s workers) rebuilds the graph by name, so register it first
(:func:`stagegraph.register_graph` in a plugin module) and pass the name.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from stagegraph.core.graph import Graph
from stagegraph.errors import ConfigError

if TYPE_CHECKING:
    from stagegraph.app.bench import BenchReport, Comparison
    from stagegraph.app.run import RunReport
    from stagegraph.app.session import SessionRequest
    from stagegraph.core.engine import RunResult
    from stagegraph.tune.runner import TuneReport

Assignments = Mapping[str, Any] | Sequence[str] | None


def _request(graph: str | Graph, workload: str, **options: Any) -> SessionRequest:
    from stagegraph.app.session import request_from_options

    name = graph.name if isinstance(graph, Graph) else str(graph)
    return request_from_options(name, workload, options)


def _by_name(graph: str | Graph, option: str) -> str:
    """The graph's name for an option that rebuilds it in another process."""
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


def run(
    graph: str | Graph,
    workload: str,
    *,
    param: Assignments = None,
    threads: int | None = None,
    target: str | None = None,
    cost_model: str | None = None,
    db: str | None = None,
    params_file: str | None = None,
    until: str | None = None,
    emit: str = "jit",
    output: str | None = None,
    dump_ir: str | None = None,
    print_ir_after: Sequence[str] = (),
    verify_each: bool = False,
    repro_dir: str | None = None,
    isolate: bool = False,
    timeout: float = 300.0,
    memory: float = 8.0,
    ranks: int | None = None,
    compile_timeout: float | None = None,
    run_timeout: float | None = None,
) -> RunReport | RunResult | Any:
    """``stagegraph run``: compile ``workload`` through ``graph``, run it once and verify.

    Returns the :class:`~stagegraph.app.run.RunReport` (``report.verified``); with
    ``until=TAG`` the engine's :class:`~stagegraph.core.engine.RunResult` after that tag
    (``result.module.text()`` is the IR); with ``ranks`` the MPI report. ``param`` is
    ``{"tile_m": 32}`` or ``["tile_m=32"]``; time limits are off unless given.

    Raises:
        StagegraphError: as the CLI reports it (unknown names, bad params, a failing
            stage, a crash in the ``isolate`` child).
    """
    if ranks is not None:
        from stagegraph.app.mpi_launch import run_on_ranks

        return run_on_ranks(_by_name(graph, "ranks"), workload, ranks)
    request = _request(
        graph, workload, param=param, threads=threads, target=target, cost_model=cost_model,
        db=db, params_file=params_file, emit=emit, output=output, dump_ir=dump_ir,
        print_ir_after=print_ir_after, verify_each=verify_each, repro_dir=repro_dir,
        compile_timeout=compile_timeout, run_timeout=run_timeout,
    )  # fmt: skip
    if isolate:
        request = request.model_copy(update={"graph": _by_name(graph, "isolate")})
        return _isolated(request, timeout, memory)
    from stagegraph.app.run import run_report
    from stagegraph.app.session import Session

    with Session(request, graph=graph if isinstance(graph, Graph) else None) as session:
        if until is not None:
            return session.compile(until=until)
        return run_report(session)


def bench(
    graph: str | Graph,
    workload: str,
    *,
    splice_at: str | None = None,
    warmup: int = 3,
    repeat: int = 10,
    min_time: float = 0.0,
    budget: float = 10.0,
    vs: str | None = None,
    param: Assignments = None,
    threads: int | None = None,
    target: str | None = None,
    cost_model: str | None = None,
    db: str | None = None,
    params_file: str | None = None,
    csv: str | None = None,
    dump_ir: str | None = None,
    print_ir_after: Sequence[str] = (),
    verify_each: bool = False,
    repro_dir: str | None = None,
    isolate: bool = False,
    timeout: float = 300.0,
    memory: float = 8.0,
    ranks: int | None = None,
    compile_timeout: float | None = None,
    run_timeout: float | None = None,
) -> BenchReport | Comparison | Any:
    """``stagegraph bench``: verify, then time ``workload`` through ``graph`` with the
    wrapper spliced after ``splice_at`` (default: the graph's own choice).

    Returns a :class:`~stagegraph.app.bench.BenchReport`; with ``vs`` (a graph name or
    ``"numpy"``) a :class:`~stagegraph.app.bench.Comparison` of both, measured interleaved
    (``.ratio`` with ``.ratio_low``/``.ratio_high``); with ``ranks`` the MPI report. A
    variant that does not verify is not timed: its report (``verified`` false) is
    returned. ``csv`` appends one row per report.
    """
    from stagegraph.app.bench import BenchOptions, append_csv

    options = BenchOptions(warmup=warmup, repeat=repeat, min_time_s=min_time, budget_s=budget)
    if ranks is not None:
        from stagegraph.app.mpi_launch import bench_on_ranks

        result = bench_on_ranks(_by_name(graph, "ranks"), workload, ranks, splice_at, options)
        reports = [result]
    else:
        request = _request(
            graph, workload, param=param, threads=threads, target=target,
            cost_model=cost_model, db=db, params_file=params_file, dump_ir=dump_ir,
            print_ir_after=print_ir_after, verify_each=verify_each, repro_dir=repro_dir,
            compile_timeout=compile_timeout, run_timeout=run_timeout,
        )  # fmt: skip
        if isolate:
            if vs is not None:
                raise ConfigError("bench isolate measures one variant; drop vs")
            request = request.model_copy(update={"graph": _by_name(graph, "isolate")})
            result = _isolated(request, timeout, memory, options, splice_at)
        else:
            result = _bench_in_process(graph, request, options, splice_at, vs)
        reports = [result.a, result.b] if hasattr(result, "ratio") else [result]
    if csv:
        for report in reports:
            append_csv(csv, report)
    return result


def _bench_in_process(
    graph: str | Graph, request: Any, options: Any, splice_at: str | None, vs: str | None
) -> Any:
    from stagegraph.app.bench import benchmark, compare
    from stagegraph.app.run import check_single_process
    from stagegraph.app.session import Session
    from stagegraph.app.versus import versus_measurements

    own = graph if isinstance(graph, Graph) else None
    with Session(request, graph=own, run_budget_s=options.budget_s) as session:
        check_single_process(session.workload)
        threads = request.threads
        if vs is None:
            return benchmark(
                session.engine, session.graph, session.workload, splice_at, options, threads
            )
        first, second = versus_measurements(session, vs, splice_at)
        failed = [m for m in (first, second) if hasattr(m, "verdict") and not m.verdict.ok]
        if failed:  # nothing is timed: the variant that does not verify, as the CLI shows it
            return failed[0].report(None, threads)
        return compare(first, second, options, threads)


def _isolated(
    request: Any, timeout: float, memory: float, bench: Any = None, splice_at: str | None = None
) -> Any:
    from stagegraph.app.isolated import run_in_child

    request = request.model_copy(update={"bench": bench, "splice_at": splice_at})
    return run_in_child(request, timeout, memory)


def tune(
    graph: str | Graph,
    workload: str,
    *,
    budget: int = 12,
    jobs: int = 1,
    cluster: str | None = None,
    db: str = "stagegraph-tune.db",
    strategy: str = "model",
    seed: int = 0,
    cost_model: str | None = None,
    fix: Assignments = None,
    per_op: bool = False,
    measure: str | None = None,
    threads: int | None = None,
    batch_size: int | None = None,
    samples: int = 20,
    compile_timeout: float = 60.0,
    run_timeout: float = 60.0,
    memory: float = 4.0,
    explain: bool = False,
    dump_ir: str | None = None,
    print_ir_after: Sequence[str] = (),
    verify_each: bool = False,
    repro_dir: str | None = None,
    target: str | None = None,
    progress: bool = False,
) -> TuneReport | dict[str, Any]:
    """``stagegraph tune``: search the graph's params for ``workload``; every candidate is
    compiled, verified and timed in an isolated child, and recorded in ``db``.

    Returns the :class:`~stagegraph.tune.runner.TuneReport` (``report.best``,
    ``report.winner``), or with ``explain=True`` the search space as a dict. ``fix`` pins
    fields (``{"tile_m": 32}``); ``per_op`` gives each distinct op its own params;
    ``measure`` names a registered stage of kind measure to time candidates with.
    ``graph`` must be a name: workers rebuild it.
    """
    from stagegraph.app.session import parse_assignments
    from stagegraph.tune.runner import TuneOptions
    from stagegraph.tune.runner import explain as explain_space
    from stagegraph.tune.runner import tune as run_tune

    if print_ir_after and not dump_ir:
        raise ConfigError("tune print_ir_after writes each candidate's IR to "
                          "DIR/<params hash>/printed.mlir: give dump_ir=DIR")  # fmt: skip
    session = _request(
        _by_name(graph, "tune"), workload, target=target, cost_model=cost_model,
        dump_ir=dump_ir, print_ir_after=print_ir_after, verify_each=verify_each,
        repro_dir=repro_dir, threads=threads,
    )  # fmt: skip
    options = TuneOptions(
        session=session,
        budget=budget,
        jobs=jobs,
        cluster=cluster,
        db=db,
        strategy=strategy,
        seed=seed,
        fixes=parse_assignments(fix or ()),
        per_op=per_op,
        measure=measure,
        batch_size=batch_size,
        samples=samples,
        compile_timeout_s=compile_timeout,
        run_timeout_s=run_timeout,
        memory_bytes=int(memory * 2**30),
    )
    if explain:
        return explain_space(options)
    return run_tune(options, progress=progress)


# PyTorch in (the ``torch`` extra): a model as a workload, compiled for PyTorch callers.
from stagegraph.app.torch_compiled import compile_model as compile  # noqa: E402
from stagegraph.app.torch_compiled import torch_backend  # noqa: E402
from stagegraph.workload.torch_model import from_torch  # noqa: E402

__all__ = ["bench", "compile", "from_torch", "run", "torch_backend", "tune"]
