"""Rewriting a graph for a request: cost model, ``--param`` overrides, threads, target and
emitter. Every rewrite finds its stages by type (a params stage by its Params output, a
target stage by its Target output, the emit stage by kind), never by name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field

from stagegraph.core.graph import Graph
from stagegraph.core.ports import Config, Params
from stagegraph.errors import ConfigError, StagegraphError


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

    stages = [s for s in graph.stages_of_kind("params") if isinstance(s.config, CostModelConfig)]
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
    from stagegraph.stages.gpu import is_gpu_target
    from stagegraph.stages.gpu.target import GpuTarget, resolve_gpu_target
    from stagegraph.stages.target import Target, TargetConfig, resolve_target

    stages = [
        s
        for s in graph.stages.values()
        if isinstance(s.config, TargetConfig)
        and any(issubclass(p.type, Target | GpuTarget) for p in s.outputs.values())
    ]
    gpu = any(issubclass(p.type, GpuTarget) for s in stages for p in s.outputs.values())
    if not gpu and is_gpu_target(name):
        raise ConfigError(
            f"graph {graph.name!r} builds for CPUs; {name!r} is a GPU target (compile for it "
            "with the gpu graph: stagegraph run gpu ...)"
        )
    (resolve_gpu_target if gpu else resolve_target)(name)  # unknown names fail here
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


def with_emit(graph: Graph, kind: str, path: str | None, workload: str = "") -> Graph:
    """Swap the graph's emit stage for ``jit``, ``object`` or ``shared`` (to ``path``,
    exporting the entry as the default symbol of the ``workload`` spec)."""
    gpu = [
        s for s in graph.stages.values()
        if s.kind == "emit" and "output" in type(s.config).model_fields
    ]  # fmt: skip
    if gpu and "workload" in type(gpu[0].config).model_fields:  # named in its manifest
        graph = graph.with_config(gpu[0].name, workload=workload)
    if kind == "jit":
        return graph
    if gpu and path:  # the GPU graph writes its artifact folder (PTX, plan) for any --emit
        return graph.with_config(gpu[0].name, output=str(Path(path)))
    from stagegraph.artifact.cabi import default_symbol
    from stagegraph.stages.common.emit import object_file, shared_library

    if not path:
        raise ConfigError(f"--emit {kind} needs -o PATH")
    emit = graph.one_stage_of_kind("emit")
    target = Path(path)
    if not target.parent.exists() or not target.parent.is_dir():
        raise StagegraphError(f"cannot write {path}: directory {target.parent} does not exist")
    factory = object_file if kind == "object" else shared_library
    return graph.replace(
        emit.name, factory(emit.name, path=str(target), symbol=default_symbol(workload))
    )


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
    from stagegraph.stages.common.costmodel import DEFAULT_COST_MODEL, cost_model_factory

    if name is None:
        return graph
    factory = cost_model_factory(name)
    select = graph.one_stage_of_kind("params")
    if name == DEFAULT_COST_MODEL and select.factory is factory:
        return graph
    check_cost_model_inputs(name, db, params_file)
    extra: dict[str, Any] = {
        "tuned": {"db": db, "workload": workload, "graph": graph.name},
        "fixed": {"path": params_file},
    }.get(name, {})
    graph = graph.replace(select.name, factory(select.name, **extra))
    return with_tuned_upstream(graph, db, workload) if name == "tuned" else graph


def with_tuned_upstream(graph: Graph, db: str | None, workload: str) -> Graph:
    """Point the stages before the params that replay tuned choices (a config field
    ``tuned``: ``x86.normalize``'s convolution paths) at the tuning DB ``db``; its size and
    time are part of the config, so a cached result never outlives a grown DB."""
    if not db:
        return graph
    stat = Path(db).stat()
    source = {"db": str(db), "workload": workload, "graph": graph.name,
              "version": f"{stat.st_size}-{stat.st_mtime_ns}"}  # fmt: skip
    for stage in list(graph.stages.values()):
        if stage.kind != "params" and "tuned" in type(stage.config).model_fields:
            graph = graph.with_config(stage.name, tuned=source)
    return graph


def check_cost_model_inputs(name: str, db: str | None, params_file: str | None) -> None:
    """Refuse missing inputs of ``tuned``/``fixed`` before anything compiles: they are the
    user's input, not a stage's failure (no reproducer), and ``tuned`` with no database to
    read would silently be the heuristic.

    Raises:
        ConfigError: ``fixed`` without a readable JSON params file; ``tuned`` without a
            ``--db`` that exists.
    """
    import json

    if name == "fixed":
        if not params_file:
            raise ConfigError("--cost-model fixed needs --params-file FILE.json")
        try:
            json.loads(Path(params_file).read_text())
        except OSError as exc:
            raise ConfigError(f"cannot read --params-file {params_file}: {exc.strerror}") from None
        except ValueError as exc:
            raise ConfigError(f"--params-file {params_file} is not JSON: {exc}") from None
    if name == "tuned" and not db:
        raise ConfigError("--cost-model tuned needs --db FILE (the database 'stagegraph tune' "
                          "writes)")  # fmt: skip
    if name == "tuned" and not Path(db).is_file():
        raise ConfigError(
            f"--db {db}: tuning database does not exist; create it with 'stagegraph tune "
            f"GRAPH WORKLOAD --db {db}', or drop --cost-model tuned"
        )


class FixedParamsConfig(Config):
    """The params to give, as the JSON of the graph's params model."""

    params: dict[str, Any] = Field(default_factory=dict)


def with_fixed_params(graph: Graph, params: dict[str, Any]) -> Graph:
    """The graph with its cost model replaced by a stage that gives exactly ``params``
    (validated by the graph's own params model): how a tuner compiles one candidate, for
    any graph whose params stage is found by type."""
    from stagegraph.core.stage import Port, StageFactory

    old, port = graph.params_output()
    model = port.type

    def fixed(config: FixedParamsConfig, **_inputs: Any) -> Params:
        return model.model_validate(config.params)

    factory = StageFactory(
        name=f"fixed[{model.__module__}.{model.__qualname__}]",
        kind="params",
        fn=fixed,
        inputs=tuple(Port(p.name, p.type, optional=True) for p in old.inputs.values()),
        outputs=(Port(port.name, model),),
        config_model=FixedParamsConfig,
        mutates=False,
        doc="Exactly the params in the config.",
    )
    return graph.replace(old.name, factory(old.name, params=params))


def with_upstream_choices(graph: Graph, params: Params) -> Graph:
    """The graph with the config ``params`` decides for stages before the params stage
    (its model's ``upstream_configs()``, by stage factory: the x86 params' convolution
    paths are ``x86.normalize``'s ``paths``); unchanged for a model without one."""
    configs = getattr(params, "upstream_configs", None)
    for factory_name, changes in (configs() if configs is not None else {}).items():
        for stage in list(graph.stages.values()):
            if stage.factory_name == factory_name:
                graph = graph.with_config(stage.name, **changes)
    return graph


def with_candidate_params(graph: Graph, params: dict[str, Any], baseline: dict[str, Any]) -> Graph:
    """How a tuner compiles one candidate: its upstream choices on their stages
    (:func:`with_upstream_choices`), then exactly its params (:func:`with_fixed_params`),
    unless the candidate moves an upstream choice away from the ``baseline``'s (its model's
    ``moves_upstream``): then the ops differ from those the params were made for, and the
    graph's own cost model gives the rest for the new ops."""
    _, port = graph.params_output()
    value = port.type.model_validate(params)
    chosen = with_upstream_choices(graph, value)
    moves = getattr(value, "moves_upstream", None)
    if moves is not None and moves(port.type.model_validate(baseline)):
        return chosen
    return with_fixed_params(chosen, params)
