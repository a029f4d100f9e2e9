"""Swappable x86 cost models: every one is a params stage ``(facts, target) -> X86Params``.

They share the heuristic's ports, so ``graph.replace("select", analytical("select"))`` (or
``--cost-model NAME``) swaps one for another:

* ``x86.analytical`` ranks candidates of the search space with a roofline/cache model;
* ``x86.tuned`` looks the best measured params up in a tuning DB (else the heuristic);
* ``x86.fixed`` reads params from a JSON file (or takes them inline).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, ValidationError

from stagegraph.core.ports import GRAPH_PATH
from stagegraph.core.stage import stage
from stagegraph.errors import ConfigError, validation_details
from stagegraph.stages.analysis import PayloadFacts
from stagegraph.stages.common.costmodel import (
    CostModelConfig,
    apply_overrides,
    check_param_keys,
)
from stagegraph.stages.target import Target
from stagegraph.stages.x86.conv.path_params import cost_model_paths
from stagegraph.stages.x86.params_stage import X86Params, heuristic

log = logging.getLogger("stagegraph.tune")


def _heuristic(facts: PayloadFacts, target: Target, config: CostModelConfig) -> X86Params:
    return heuristic.fn(facts, target, CostModelConfig(threads=config.threads))


class AnalyticalConfig(CostModelConfig):
    """How many candidates of the space to rank (streamed lazily, seeded)."""

    candidates: int = Field(200, ge=1)
    seed: int = 0


@stage("params", name="x86.analytical")
def analytical(facts: PayloadFacts, target: Target, config: AnalyticalConfig) -> X86Params:
    """Rank the heuristic's choice and ``candidates`` solutions of the search space by an
    estimated time (roofline + cache traffic) and keep the best, without running any."""
    from itertools import islice

    from stagegraph.core.search_space import build_space
    from stagegraph.stages.x86.matmul.params import MatmulParams, matmul_shape
    from stagegraph.stages.x86.matmul.roofline import estimate_seconds
    from stagegraph.stages.x86.params_stage import matmul_ops

    base = _heuristic(facts, target, config)
    if not base.matmul:
        return apply_overrides(base, config.overrides)
    space = build_space(base, facts, target, only=lambda site: site.model is MatmulParams)
    shapes = [matmul_shape(op) for op in matmul_ops(facts)]

    def cost(params: X86Params) -> float:
        return sum(
            estimate_seconds(p, *shape, target)
            for p, shape in zip(params.matmul, shapes, strict=True)
        )

    best, best_cost = base, cost(base)
    for values in islice(space.stream(config.seed), config.candidates):
        try:
            candidate = space.to_params(values)
        except ValueError:
            continue
        estimate = cost(candidate)
        if estimate < best_cost:
            best, best_cost = candidate, estimate
    return apply_overrides(best, config.overrides)


class TunedConfig(CostModelConfig):
    """Where to look: the DB file and the workload/graph the measurements were made for."""

    db: Annotated[str | None, GRAPH_PATH] = None
    workload: str = ""
    graph: str = ""


def lookup_tuned(config: TunedConfig, target: Target) -> tuple[X86Params | None, str]:
    """The best measured params for this workload + graph + target, or None and why not.

    Only a candidate whose speedup interval over the baseline excludes 1 counts as tuned.
    """
    if not config.db:
        return None, "no --db given"
    if not Path(config.db).exists():
        return None, f"tuning database {config.db} does not exist"
    from stagegraph.stages.common.tuning_db import TuneDB, TuneKey, best_result, target_key

    db = TuneDB(config.db)
    try:
        key = TuneKey(workload=config.workload, graph=config.graph, target=target_key(target))
        found = best_result(db.results(key))
    finally:
        db.close()
    if found is None:
        return None, f"no measured candidate for {config.workload} on {config.graph} here"
    best, speedup = found
    if speedup.low <= 1.0:
        return None, (
            f"no tuned candidate beats the heuristic beyond the noise (best speedup "
            f"{speedup.ratio:.3f} [{speedup.low:.3f}, {speedup.high:.3f}])"
        )
    return X86Params.model_validate(
        best.params
    ), f"tuned params {best.params_hash} from {config.db}"


def lookup_by_ops(
    config: TunedConfig, facts: PayloadFacts, target: Target, base: X86Params
) -> tuple[X86Params, list[str], list[str]]:
    """The heuristic's params with the tuned values of every op the DB knows by its
    signature (kind, shape, dtypes) on this graph and target, whatever payload it was
    tuned in; returns (params, tuned ops, ops left to the heuristic)."""
    from stagegraph.stages.common.tuning_db import TuneDB, target_key
    from stagegraph.stages.x86.generic.params import GenericParams
    from stagegraph.stages.x86.matmul.params import MatmulParams
    from stagegraph.stages.x86.params_stage import matmul_ops

    def model_name(model: type) -> str:
        return f"{model.__module__}:{model.__qualname__}"

    found, missing = [], []
    matmul, op_params = list(base.matmul), dict(base.op_params)
    db = TuneDB(config.db)
    try:
        key = (target_key(target), config.graph)

        def lookup(op: Any, model: type, start: Any) -> Any:
            row = db.tuned_site(*key, model_name(model), op.signature())
            if row is None:
                missing.append(op.signature())
                return None
            try:
                tuned_values = model.model_validate({**start.model_dump(), **row.site_values})
            except ValueError:
                missing.append(op.signature())
                return None
            found.append(op.signature())
            return tuned_values

        mm = matmul_ops(facts)
        for i, op in enumerate(mm):
            matmul[i] = lookup(op, MatmulParams, matmul[i]) or matmul[i]
        taken = {op.index for op in mm}
        for op in facts.ops:
            if op.index in taken or op.op_class == "other" or op.signature() in op_params:
                continue
            tuned_generic = lookup(op, GenericParams, base.generic)
            if tuned_generic is not None:
                op_params[op.signature()] = tuned_generic
    finally:
        db.close()
    params = base.model_copy(update={"matmul": tuple(matmul), "op_params": op_params})
    return X86Params.model_validate(params.model_dump()), found, missing


@stage("params", name="x86.tuned", cacheable=False)
def tuned(facts: PayloadFacts, target: Target, config: TunedConfig) -> X86Params:
    """The tuning DB's best params for this workload, graph and machine; else, op by op,
    the values tuned for the same op (kind, shape, dtypes) in any payload, and the
    heuristic's choice for the others (a warning names them). Never cached: the DB grows."""
    params, why = lookup_tuned(config, target)
    if params is not None and params.moves_upstream(
        params.model_copy(update={"conv_paths": cost_model_paths(facts)})
    ):
        # the winner took other convolution paths than the cost model (x86.normalize ran
        # them, see ConvGemmConfig.tuned) and was measured with the heuristic's params for
        # the ops they make: the same again
        params = _heuristic(facts, target, config)
    if params is None:
        base = _heuristic(facts, target, config)
        params, found, missing = base, [], []
        if config.db and Path(config.db).exists():
            params, found, missing = lookup_by_ops(config, facts, target, base)
        if missing or not found:
            unknown = "; ".join(sorted(set(missing))) or "every op"
            _warn(f"cost model 'tuned': {why}; tuned values for {len(found)} ops by their "
                  f"signature; the heuristic's for: {unknown}")  # fmt: skip
    return apply_overrides(params, config.overrides)


def _warn(message: str) -> None:
    """A warning the CLI prints and a run report records (falling back is not an error)."""
    import warnings

    from stagegraph.errors import StagegraphWarning

    log.info(message)
    warnings.warn(message, StagegraphWarning, stacklevel=3)


class FixedConfig(CostModelConfig):
    """Params from a JSON file (``path``) or inline (``params``)."""

    path: Annotated[str | None, GRAPH_PATH] = None
    params: dict[str, Any] | None = None

    def check_for(self, factory: Any) -> None:
        """Inline ``params`` are a whole X86Params (``matmul``/``generic``) or parameters of
        it, checked like ``overrides``."""
        super().check_for(factory)
        if self.params is None:
            return
        if "matmul" in self.params or "generic" in self.params:
            X86Params.model_validate(self.params)  # a ValidationError is a ValueError
        else:
            check_param_keys(factory, self.params, "params")


def read_params_file(path: str) -> dict[str, Any]:
    """An X86Params dump, a tune report (its ``best.params``) or matmul field overrides."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read params file {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"params file {path} is not JSON: {exc}") from None
    if isinstance(data, dict) and isinstance(data.get("best"), dict):
        data = data["best"].get("params", data)
    if not isinstance(data, dict):
        raise ConfigError(f"params file {path} must hold a JSON object")
    return data


@stage("params", name="x86.fixed")
def fixed(facts: PayloadFacts, target: Target, config: FixedConfig) -> X86Params:
    """Exactly the given params (a full X86Params), or the heuristic's with given fields."""
    data = config.params if config.params is not None else None
    if data is None:
        if not config.path:
            raise ConfigError("cost model 'fixed' needs a params file (--params-file)")
        data = read_params_file(config.path)
    if "matmul" in data or "generic" in data:
        try:
            params = X86Params.model_validate(data)
        except ValidationError as exc:
            raise ConfigError(f"invalid fixed params: {validation_details(exc)}") from None
    else:
        params = apply_overrides(_heuristic(facts, target, config), data)
    return apply_overrides(params, config.overrides)
