"""What ``--cost-model NAME`` chose and where it came from (printed by run and bench)."""

from __future__ import annotations

from typing import Any

from stagegraph.core.ports import Params
from stagegraph.stages.target import Target


def describe_cost_model(engine: Any, graph: Any, workload: Any, name: str) -> dict[str, Any]:
    """Which cost model chose the params, where they came from, and the params themselves
    (runs the graph up to its params stage; the engine's memo cache keeps that cheap).

    ``fallback`` is True when a ``tuned`` model found nothing for this payload and fell back
    to the heuristic; ``note`` says why.
    """
    from stagegraph.stages.x86.costmodels import TunedConfig, lookup_tuned

    select, _ = graph.params_output()
    result = engine.run(graph, workload, until=select.name)
    port = next(p for p in select.outputs.values() if issubclass(p.type, Params))
    params = result.value(select.name, port.name)
    info: dict[str, Any] = {"name": name, "stage": select.factory.name, "source": name}
    info["fallback"] = False
    if isinstance(select.config, TunedConfig):
        target_port = next(p for p in select.inputs.values() if issubclass(p.type, Target))
        edge = next(e for e in graph.in_edges(select.name) if e.dst_port == target_port.name)
        found, why = lookup_tuned(select.config, result.value(edge.src, edge.src_port))
        info["fallback"] = found is None
        info["source"] = "db" if found is not None else "heuristic (fallback)"
        info["note"] = why if found is not None else f"{why}; falling back to 'heuristic'"
    info["params"] = params.model_dump(mode="json")
    return info
