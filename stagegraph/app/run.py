"""Compile, run and verify a workload through a graph: what ``stagegraph run`` does."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field

from stagegraph.core.engine import Engine, Hook, RunResult
from stagegraph.core.graph import Graph
from stagegraph.core.ports import Params, Schema
from stagegraph.core.stage import Stage
from stagegraph.errors import ConfigError, StagegraphError


class StageTime(Schema):
    name: str
    kind: str
    seconds: float
    cached: bool = False


class RunReport(Schema):
    """The result of ``stagegraph run`` (its ``--json`` output)."""

    graph: str
    workload: str
    verified: bool | None
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    message: str = ""
    stages: list[StageTime]
    compile_seconds: float
    run_seconds: float | None = None
    threads: int | None = None
    params: dict[str, Any] | None = None
    emitted: str | None = None


def effective_threads(threads: int | None) -> int:
    """What ``--threads`` means when not given: all usable cores (as the cost models assume)."""
    if threads is not None:
        return threads
    from stagegraph.stages.target import usable_cores

    return usable_cores()


def parse_assignments(items: Sequence[str]) -> dict[str, Any]:
    """``KEY=VALUE`` strings to a dict; values read as YAML scalars (``8``, ``true``, ``[1,2]``)."""
    result: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--param {item!r} must look like KEY=VALUE")
        try:
            result[key.strip()] = yaml.safe_load(raw)
        except yaml.YAMLError:
            result[key.strip()] = raw
    return result


def params_stages(graph: Graph) -> list[Stage]:
    return [s for s in graph.stages.values() if s.kind == "params"]


def with_params(graph: Graph, overrides: dict[str, Any], threads: int | None = None) -> Graph:
    """Set ``--param`` overrides and ``--threads`` on the graph's cost-model stages.

    Raises:
        ConfigError: no cost-model stage, or a key that is no field of its params model.
    """
    if not overrides and threads is None:
        return graph
    from stagegraph.stages.common.costmodel import (
        CostModelConfig,
        override_keys,
        unknown_param_message,
    )

    stages = [s for s in params_stages(graph) if isinstance(s.config, CostModelConfig)]
    if not stages:
        raise ConfigError(f"graph {graph.name!r} has no cost-model stage to take --param/--threads")
    for stage in stages:
        model = next(p.type for p in stage.outputs.values() if issubclass(p.type, Params))
        for key in overrides:
            if key not in override_keys(model):
                raise ConfigError(
                    f"stage {stage.name!r} of graph {graph.name!r}: "
                    + unknown_param_message(model, key)
                )
        changes: dict[str, Any] = {"overrides": {**stage.config.overrides, **overrides}}
        if threads is not None:
            changes["threads"] = threads
        graph = graph.with_config(stage.name, **changes)
    return graph


def with_target(graph: Graph, name: str | None) -> Graph:
    """Set ``--target NAME`` on the graph's target stages (found by their ``Target`` output).

    Raises:
        UnknownTargetError: the name is not ``host``, an x86-64 level or a known CPU.
        ConfigError: a named target for a graph with no target stage (it builds for the host).
    """
    if name is None:
        return graph
    from stagegraph.stages.target import Target, TargetConfig, resolve_target

    resolve_target(name)  # an unknown name fails before anything compiles
    stages = [
        s
        for s in graph.stages.values()
        if isinstance(s.config, TargetConfig)
        and any(issubclass(p.type, Target) for p in s.outputs.values())
    ]
    if not stages:
        if name.strip().lower() == "host":
            return graph
        raise ConfigError(
            f"graph {graph.name!r} has no target stage (no stage produces Target): it builds "
            f"for the host only, so --target {name} cannot apply"
        )
    for stage in stages:
        graph = graph.replace(stage.name, stage.with_config(name=name))
    return graph


def with_emit(graph: Graph, kind: str, path: str | None) -> Graph:
    """Swap the graph's emit stage for ``jit``, ``object`` or ``shared`` (to ``path``)."""
    if kind == "jit":
        return graph
    from stagegraph.stages.common.emit import object_file, shared_library

    if not path:
        raise ConfigError(f"--emit {kind} needs -o PATH")
    emit = [s for s in graph.stages.values() if s.kind == "emit"]
    if len(emit) != 1:
        raise ConfigError(f"graph {graph.name!r} has {len(emit)} emit stages; expected one")
    target = Path(path)
    if not target.parent.exists() or not target.parent.is_dir():
        raise StagegraphError(f"cannot write {path}: directory {target.parent} does not exist")
    factory = object_file if kind == "object" else shared_library
    return graph.replace(emit[0].name, factory(emit[0].name, path=str(target)))


def compile_workload(
    engine: Engine, graph: Graph, workload: Any, until: str | None = None
) -> RunResult:
    return engine.run(graph, workload, until=until)


def check_single_process(workload: Any) -> None:
    """Refuse to run a sharded workload in this process: its code takes one rank's blocks.

    A workload with a device grid (a ``layout``) compiles to per-rank code that calls MPI;
    called here on the global arrays it would fail on shapes, far from the real cause.

    Raises:
        ConfigError: the workload is sharded; the message says which ``--ranks`` to pass.
    """
    layout = getattr(workload, "layout", None)
    if layout is not None:
        ranks = layout().ranks
        raise ConfigError(
            f"workload {workload.spec!r} is sharded over {ranks} ranks and runs only on MPI "
            f"ranks: add --ranks {ranks}"
        )


def execute(result: RunResult, workload: Any) -> tuple[list[Any], float]:
    """Call the binary's entry on the workload's inputs; returns outputs and seconds."""
    binary = result.binary
    start = time.perf_counter()
    outputs = binary.call(workload.entry, workload.inputs())
    return outputs, time.perf_counter() - start


def run_report(
    graph: Graph,
    workload: Any,
    *,
    hooks: Sequence[Hook] = (),
    engine: Engine | None = None,
    threads: int | None = None,
) -> RunReport:
    """Compile ``workload`` through ``graph``, run it once and verify the outputs."""
    check_single_process(workload)
    engine = engine or Engine(hooks)
    result = compile_workload(engine, graph, workload)
    stages = [
        StageTime(name=r.name, kind=r.kind, seconds=r.seconds, cached=r.cached)
        for r in result.trace.records
    ]
    common = {
        "graph": graph.name,
        "workload": workload.spec,
        "stages": stages,
        "compile_seconds": result.trace.compile_seconds(),
        "threads": effective_threads(threads),
        "params": result.params.model_dump(mode="json") if result.params else None,
    }
    binary = result.binary
    if binary is None or not hasattr(binary, "call"):
        path = getattr(binary, "path", None)
        return RunReport(
            verified=None,
            message=f"wrote {path}; not executed",
            emitted=str(path) if path else None,
            **common,
        )
    outputs, seconds = execute(result, workload)
    verdict = workload.verify(outputs)
    return RunReport(
        verified=verdict.ok,
        max_abs_error=verdict.max_abs_error,
        max_rel_error=verdict.max_rel_error,
        message=verdict.message,
        run_seconds=seconds,
        emitted=str(binary.path) if hasattr(binary, "path") else None,
        **common,
    )


def naive_reference(workload: Any) -> list[Any]:
    """Differential testing: the reference of a bare .mlir payload is the naive graph's output."""
    from stagegraph.core.catalog import load_graph

    result = Engine().run(load_graph("naive"), workload)
    return result.binary.call(workload.entry, workload.inputs())


def install_reference_runner() -> None:
    import stagegraph.workload as workload_module

    if workload_module.REFERENCE_RUNNER is None:
        workload_module.REFERENCE_RUNNER = naive_reference


class IsolatedRun(Schema):
    """What an isolated ``run`` needs to rebuild its graph and workload in the child."""

    graph: str
    workload: str
    params: dict[str, Any] = Field(default_factory=dict)
    threads: int | None = None
    target: str | None = None
    emit: str = "jit"
    output: str | None = None
    breadcrumb: str
    verify_each: bool = False
    bench: dict[str, Any] | None = None  # BenchOptions fields (+ splice_at): benchmark instead


def _isolated_child(request: IsolatedRun) -> Any:
    from stagegraph.core.catalog import load_graph
    from stagegraph.instrument.ir_hooks import VerifyEach
    from stagegraph.instrument.repro import CrashBreadcrumb
    from stagegraph.workload import parse_workload

    install_reference_runner()
    graph = with_params(load_graph(request.graph), request.params, request.threads)
    graph = with_target(graph, request.target)
    graph = with_emit(graph, request.emit, request.output)
    hooks: list[Hook] = [CrashBreadcrumb(request.breadcrumb)]
    if request.verify_each:
        hooks.append(VerifyEach())
    workload = parse_workload(request.workload)
    if request.bench is not None:
        from stagegraph.app.bench import BenchOptions, benchmark

        options = dict(request.bench)
        splice_at = options.pop("splice_at", None)
        return benchmark(Engine(hooks), graph, workload, splice_at, BenchOptions(**options),
                         request.threads)  # fmt: skip
    return run_report(graph, workload, hooks=hooks, threads=request.threads)


def run_isolated_report(request: IsolatedRun, limits: Any, repro_dir: str | None = None) -> Any:
    """Compile and run (or benchmark) in a child under ``limits``; a crash becomes a
    StageFailed naming the stage that was running, with a reproducer of its input.

    Raises:
        StageFailed: the child died in a stage (signal, timeout, memory) or a stage raised.
    """
    from stagegraph.errors import IsolatedFailure, StageFailed
    from stagegraph.instrument.repro import claim_breadcrumb

    breadcrumb = Path(request.breadcrumb)
    try:
        return limits.run(_isolated_child, request, label=f"{request.graph} on {request.workload}")
    except StageFailed as failed:  # a stage raised in the child: same error, plus a reproducer
        if failed.reproducer is None:
            claimed = claim_breadcrumb(breadcrumb, failed.reason, repro_dir, failed.diagnostics)
            if claimed is not None:
                raise claimed from failed
        raise
    except IsolatedFailure as failure:
        tail = failure.stderr_tail.splitlines()[-12:]
        error = claim_breadcrumb(breadcrumb, failure.detail, repro_dir, tail)
        if error is None:
            raise
        raise error from failure


def with_cost_model(
    graph: Graph,
    name: str | None,
    *,
    workload: str = "",
    db: str | None = None,
    params_file: str | None = None,
) -> Graph:
    """Swap the graph's cost model (its ``select`` params stage) for the one named ``name``.

    ``tuned`` looks ``workload`` on this graph up in ``db``; ``fixed`` reads ``params_file``.

    Raises:
        UnknownCostModelError: ``name`` is not a registered cost model (did you mean).
        ConfigError: the graph has no single params stage to swap.
    """
    from stagegraph.tune import DEFAULT_COST_MODEL, cost_model_factory

    if name is None:
        return graph
    factory = cost_model_factory(name)
    stages = params_stages(graph)
    if len(stages) != 1:
        raise ConfigError(f"graph {graph.name!r} has {len(stages)} params stages; need one")
    if name == DEFAULT_COST_MODEL and stages[0].factory is factory:
        return graph
    extra: dict[str, Any] = {
        "tuned": {"db": db, "workload": workload, "graph": graph.name},
        "fixed": {"path": params_file},
    }.get(name, {})
    return graph.replace(stages[0].name, factory(stages[0].name, **extra))
