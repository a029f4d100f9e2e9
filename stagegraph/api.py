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

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from stagegraph.app.commands import bench_options, run_options
from stagegraph.core.graph import Graph
from stagegraph.tune.command import tune_options

if TYPE_CHECKING:
    from stagegraph.app.bench import BenchReport, Comparison
    from stagegraph.app.run import RunReport
    from stagegraph.core.engine import RunResult
    from stagegraph.tune.runner import TuneReport

Assignments = Mapping[str, Any] | Sequence[str] | None

# The defaults below are the request models' (SessionRequest, BenchOptions, TuneOptions,
# Launch): written there once; tests/test_options.py checks every signature against them.
_RUN = {keyword: spec.default for keyword, spec in run_options().items()}
_BENCH = {keyword: spec.default for keyword, spec in bench_options().items()}
_TUNE = {keyword: spec.default for keyword, spec in tune_options().items()}


def run(
    graph: str | Graph,
    workload: str,
    *,
    param: Assignments = None,
    threads: int | None = _RUN["threads"],
    target: str | None = _RUN["target"],
    cost_model: str | None = _RUN["cost_model"],
    db: str | None = _RUN["db"],
    params_file: str | None = _RUN["params_file"],
    until: str | None = _RUN["until"],
    emit: str = _RUN["emit"],
    output: str | None = _RUN["output"],
    dump_ir: str | None = _RUN["dump_ir"],
    print_ir_after: Sequence[str] = _RUN["print_ir_after"],
    verify_each: bool = _RUN["verify_each"],
    repro_dir: str | None = _RUN["repro_dir"],
    isolate: bool = _RUN["isolate"],
    timeout: float = _RUN["timeout"],
    memory: float = _RUN["memory"],
    ranks: int | None = _RUN["ranks"],
    compile_timeout: float | None = _RUN["compile_timeout"],
    run_timeout: float | None = _RUN["run_timeout"],
    cache: str | None = _RUN["cache"],
    trace: str | None = _RUN["trace"],
    reference: str | None = _RUN["reference"],
    save_payload: str | None = _RUN["save_payload"],
) -> RunReport | RunResult | Any:
    """``stagegraph run``: compile ``workload`` through ``graph``, run it once and verify.

    Returns the :class:`~stagegraph.app.run.RunReport` (``report.verified``); with
    ``until=TAG`` the engine's :class:`~stagegraph.core.engine.RunResult` after that tag
    (``result.module.text()`` is the IR); with ``ranks`` the MPI report. ``param`` is
    ``{"tile_m": 32}`` or ``["tile_m=32"]``; time limits are off unless given. Options
    that cannot combine (``ranks`` with ``threads``, ``isolate`` with ``until``, ...) are
    refused exactly as on the command line (:func:`stagegraph.app.commands.refuse`).

    Raises:
        StagegraphError: as the CLI reports it (unknown names, bad params, options that
            cannot combine, a failing stage, a crash in the ``isolate`` child).
    """
    from stagegraph.app import commands

    options = {k: v for k, v in locals().items() if k in _RUN}
    return commands.run(graph, workload, options).result


def bench(
    graph: str | Graph,
    workload: str,
    *,
    splice_at: str | None = _BENCH["splice_at"],
    warmup: int = _BENCH["warmup"],
    repeat: int = _BENCH["repeat"],
    min_time: float = _BENCH["min_time"],
    budget: float = _BENCH["budget"],
    vs: str | None = _BENCH["vs"],
    param: Assignments = None,
    threads: int | None = _BENCH["threads"],
    target: str | None = _BENCH["target"],
    cost_model: str | None = _BENCH["cost_model"],
    db: str | None = _BENCH["db"],
    params_file: str | None = _BENCH["params_file"],
    csv: str | None = _BENCH["csv"],
    dump_ir: str | None = _BENCH["dump_ir"],
    print_ir_after: Sequence[str] = _BENCH["print_ir_after"],
    verify_each: bool = _BENCH["verify_each"],
    repro_dir: str | None = _BENCH["repro_dir"],
    isolate: bool = _BENCH["isolate"],
    timeout: float = _BENCH["timeout"],
    memory: float = _BENCH["memory"],
    ranks: int | None = _BENCH["ranks"],
    compile_timeout: float | None = _BENCH["compile_timeout"],
    run_timeout: float | None = _BENCH["run_timeout"],
    cache: str | None = _BENCH["cache"],
    trace: str | None = _BENCH["trace"],
) -> BenchReport | Comparison | Any:
    """``stagegraph bench``: verify, then time ``workload`` through ``graph`` with the
    wrapper spliced after ``splice_at`` (default: the graph's own choice).

    Returns a :class:`~stagegraph.app.bench.BenchReport`; with ``vs`` (a graph name or a
    peer: ``"numpy"``, ``"iree"``) a :class:`~stagegraph.app.bench.Comparison` of both,
    measured interleaved (``.ratio`` with ``.ratio_low``/``.ratio_high``); with ``ranks``
    the MPI report. A variant that does not verify is not timed: its report (``verified``
    false) is returned. ``csv`` appends one row per report. Options that cannot combine
    are refused exactly as on the command line.
    """
    from stagegraph.app import commands

    options = {k: v for k, v in locals().items() if k in _BENCH}
    return commands.bench(graph, workload, options).result


def tune(
    graph: str | Graph,
    workload: str,
    *,
    budget: int = _TUNE["budget"],
    jobs: int = _TUNE["jobs"],
    cluster: str | None = _TUNE["cluster"],
    db: str = _TUNE["db"],
    strategy: str = _TUNE["strategy"],
    seed: int = _TUNE["seed"],
    cost_model: str | None = _TUNE["cost_model"],
    fix: Assignments = None,
    per_op: bool = _TUNE["per_op"],
    measure: str | None = _TUNE["measure"],
    threads: int | None = _TUNE["threads"],
    batch_size: int | None = _TUNE["batch_size"],
    samples: int = _TUNE["samples"],
    compile_timeout: float = _TUNE["compile_timeout"],
    run_timeout: float = _TUNE["run_timeout"],
    memory: float = _TUNE["memory"],
    explain: bool = False,
    dump_ir: str | None = _TUNE["dump_ir"],
    print_ir_after: Sequence[str] = _TUNE["print_ir_after"],
    verify_each: bool = _TUNE["verify_each"],
    repro_dir: str | None = _TUNE["repro_dir"],
    target: str | None = _TUNE["target"],
    cache: str | None = _TUNE["cache"],
    trace: str | None = _TUNE["trace"],
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
    from stagegraph.app.commands import graph_name
    from stagegraph.tune import command

    options = {k: v for k, v in locals().items() if k in _TUNE}
    name = graph_name(graph, "tune")
    return command.tune(name, workload, options, explain=explain, progress=progress)


def build_artifact(
    graph: str | Graph,
    workload: str,
    directory: str,
    *,
    entry_symbol: str | None = None,
    param: Assignments = None,
    threads: int | None = None,
    target: str | None = None,
    cost_model: str | None = None,
    db: str | None = None,
    params_file: str | None = None,
) -> Any:
    """``stagegraph compile GRAPH WORKLOAD -o DIRECTORY``: write an artifact folder (shared
    library, object file, C header, ``manifest.json``) that C programs link and
    ``stagegraph exec`` runs. Returns the :class:`~stagegraph.app.artifact.ArtifactReport`.

    Raises:
        StagegraphError: as the CLI reports it (unknown names, a bad entry symbol, a
            missing C compiler or binutils).
    """
    from stagegraph.app.artifact import build_artifact as build
    from stagegraph.app.session import request_from_options

    name = graph.name if isinstance(graph, Graph) else str(graph)
    request = request_from_options(name, workload, {
        "param": param, "threads": threads, "target": target, "cost_model": cost_model,
        "db": db, "params_file": params_file,
    })  # fmt: skip
    return build(request, directory, entry_symbol=entry_symbol,
                 graph=graph if isinstance(graph, Graph) else None)  # fmt: skip


# PyTorch in (the ``torch`` extra): a model as a workload, compiled for PyTorch callers.
from stagegraph.app.torch_compiled import compile_model as compile  # noqa: E402
from stagegraph.app.torch_compiled import torch_backend  # noqa: E402
from stagegraph.workload.torch_model import from_torch  # noqa: E402

__all__ = [
    "bench", "build_artifact", "compile", "from_torch", "run", "torch_backend", "tune",
]  # fmt: skip
