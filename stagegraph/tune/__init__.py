"""Autotuning: cost models by name, search spaces, the tuning DB, search and executors.

This module stays light (no z3, no Dask, no MLIR on import): the CLI asks it for a cost
model's stage by name; :mod:`stagegraph.tune.runner` holds the tuner itself.
"""

from __future__ import annotations

from typing import Any

from stagegraph.errors import UnknownCostModelError, unknown_name_message

#: ``--cost-model`` name → the params stage factory (``module:attribute``) that implements it.
COST_MODELS = {
    "heuristic": "stagegraph.stages.x86.stages:heuristic",
    "analytical": "stagegraph.stages.x86.costmodels:analytical",
    "tuned": "stagegraph.stages.x86.costmodels:tuned",
    "fixed": "stagegraph.stages.x86.costmodels:fixed",
}
DEFAULT_COST_MODEL = "heuristic"


def cost_model_names() -> list[str]:
    return list(COST_MODELS)


def cost_model_factory(name: str) -> Any:
    """The stage factory registered under ``name``.

    Raises:
        UnknownCostModelError: ``name`` is not registered (with a "did you mean").
    """
    if name not in COST_MODELS:
        raise UnknownCostModelError(unknown_name_message("cost model", name, COST_MODELS))
    from stagegraph.core.stage import get_factory

    return get_factory(COST_MODELS[name])


__all__ = ["COST_MODELS", "DEFAULT_COST_MODEL", "cost_model_factory", "cost_model_names"]


def describe_cost_model(engine: Any, graph: Any, workload: Any, name: str) -> dict[str, Any]:
    """Which cost model chose the params, where they came from, and the params themselves
    (runs the graph up to its params stage; the engine's memo cache keeps that cheap)."""
    from stagegraph.stages.x86.costmodels import TunedConfig, lookup_tuned

    select = next(s for s in graph.stages.values() if s.kind == "params")
    result = engine.run(graph, workload, until=select.name)
    params = result.value(select.name, "params")
    info: dict[str, Any] = {"name": name, "stage": select.factory.name, "source": name}
    if isinstance(select.config, TunedConfig):
        edge = next(e for e in graph.in_edges(select.name) if e.dst_port == "target")
        found, why = lookup_tuned(select.config, result.value(edge.src, edge.src_port))
        info["source"] = "db" if found is not None else "heuristic (fallback)"
        info["note"] = why if found is not None else f"{why}; falling back to 'heuristic'"
    info["params"] = params.model_dump(mode="json")
    return info
