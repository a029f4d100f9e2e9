"""What every cost-model (params) stage shares: a config with user overrides.

``stagegraph run --param KEY=VALUE`` sets ``overrides`` on the graph's params stages; the
cost model's choice is then validated again with the overrides applied, so a bad value is
reported with the field, the value and the rule it breaks.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import Field, ValidationError

from stagegraph.core.plugins import ensure_plugins
from stagegraph.core.ports import Config, Params
from stagegraph.core.stage import StageFactory, get_factory
from stagegraph.errors import (
    ConfigError,
    DuplicateNameError,
    UnknownCostModelError,
    unknown_name_message,
)

P = TypeVar("P", bound=Params)


class CostModelConfig(Config):
    """Overrides win over the model's choice; ``threads`` None means all cores."""

    overrides: dict[str, Any] = Field(default_factory=dict)
    threads: int | None = Field(None, ge=1)

    def check_for(self, factory: Any) -> None:
        """``overrides`` keys must be parameters of the params model the stage produces
        (a graph file's ``overrides: {tile_mm: 12}`` fails ``validate``, with a did-you-mean)."""
        check_param_keys(factory, self.overrides, "overrides")

    @classmethod
    def schema_for(cls, factory: Any, schema: dict[str, Any]) -> dict[str, Any]:
        """``overrides`` keys limited to the parameters of the produced params model."""
        model = produced_params(factory)
        properties = schema.get("properties", {})
        if model is not None and "overrides" in properties:
            keys = sorted(override_keys(model))
            properties["overrides"] = {**properties["overrides"], "propertyNames": {"enum": keys}}
        return schema


def produced_params(factory: Any) -> type[Params] | None:
    """The params model a cost-model factory produces (None if it produces none)."""
    return next(
        (
            p.type
            for p in factory.outputs
            if isinstance(p.type, type) and issubclass(p.type, Params)
        ),
        None,
    )


def check_param_keys(factory: Any, values: dict[str, Any], field: str) -> None:
    """Raise ``ValueError`` naming the first key of ``values`` the params model lacks."""
    model = produced_params(factory)
    if model is None or not values:
        return
    unknown = sorted(set(values) - override_keys(model))
    if unknown:
        raise ValueError(f"{field}: {unknown_param_message(model, unknown[0])}")


def apply_overrides(params: P, overrides: dict[str, Any]) -> P:
    """``params`` with ``overrides`` applied and re-validated."""
    if not overrides:
        return params
    custom = getattr(params, "with_overrides", None)
    if custom is not None:
        unknown = set(overrides) - override_keys(type(params))
        if unknown:
            raise ConfigError(unknown_param_message(type(params), sorted(unknown)[0]))
        return custom(overrides)
    unknown = set(overrides) - set(type(params).model_fields)
    if unknown:
        raise ConfigError(unknown_param_message(type(params), sorted(unknown)[0]))
    try:
        return type(params).model_validate({**params.model_dump(), **overrides})
    except ValidationError as exc:
        details = "; ".join(
            f"{'.'.join(map(str, e['loc']))}={e.get('input')!r}: {e['msg']}"
            if e["loc"]
            else e["msg"]
            for e in exc.errors()
        )
        raise ConfigError(f"invalid --param for {type(params).__name__}: {details}") from None


def override_keys(model: type[Params]) -> set[str]:
    """The ``--param`` keys a params model accepts (its fields, unless it says otherwise)."""
    custom = getattr(model, "override_keys", None)
    return set(custom()) if custom is not None else set(model.model_fields)


def unknown_param_message(model: type[Params], name: str) -> str:
    from stagegraph.errors import did_you_mean

    keys = sorted(override_keys(model))
    return (
        f"unknown parameter {name!r} for {model.__name__}{did_you_mean(name, keys)}; "
        f"its parameters: {', '.join(keys)}"
    )


# -- the cost models known by name (``--cost-model NAME``) -------------------------------

#: ``--cost-model`` name → the params stage factory (``module:attribute``, or the factory
#: itself for one registered with :func:`register_cost_model`) that implements it.
COST_MODELS: dict[str, str | StageFactory] = {
    "heuristic": "stagegraph.stages.x86.params_stage:heuristic",
    "analytical": "stagegraph.stages.x86.costmodels:analytical",
    "tuned": "stagegraph.stages.x86.costmodels:tuned",
    "fixed": "stagegraph.stages.x86.costmodels:fixed",
}
DEFAULT_COST_MODEL = "heuristic"


def register_cost_model(name: str, factory: StageFactory | str) -> StageFactory | str:
    """Make a params stage available as ``--cost-model NAME``.

    ``factory`` is a stage factory of kind ``params`` (declared with ``@stage("params")``)
    or its ``module:attribute`` / registered name; it replaces the graph's params stage
    under the same stage name, so its outputs must match the graph's params type. It is
    built without config, so every config field needs a default.

    Raises:
        DuplicateNameError: another factory has the name (the same one again is no clash).
        TypeError: ``factory`` is not a params stage factory.
    """
    if isinstance(factory, StageFactory) and factory.kind != "params":
        raise TypeError(f"cost model {name!r}: {factory.name!r} is a {factory.kind} stage, "
                        f"not a params stage")  # fmt: skip
    if not isinstance(factory, StageFactory | str):
        raise TypeError(f"cost model {name!r}: expected a stage factory, got {factory!r}")
    other = COST_MODELS.get(name)
    if other is not None and _spelling(other) != _spelling(factory):
        raise DuplicateNameError(
            f"cost model name {name!r} is already registered by {_spelling(other)}; "
            f"{_spelling(factory)} must use another name"
        )
    COST_MODELS[name] = factory
    return factory


def _spelling(factory: StageFactory | str) -> str:
    if isinstance(factory, str):
        return factory
    fn = getattr(factory.fn, "__func__", factory.fn)
    return f"{fn.__module__}.{fn.__qualname__} ({factory.name})"


def cost_model_names() -> list[str]:
    ensure_plugins()
    return list(COST_MODELS)


def cost_model_factory(name: str) -> Any:
    """The stage factory registered under ``name``.

    Raises:
        UnknownCostModelError: ``name`` is not registered (with a "did you mean").
    """
    ensure_plugins()
    if name not in COST_MODELS:
        raise UnknownCostModelError(unknown_name_message("cost model", name, COST_MODELS))
    factory = COST_MODELS[name]
    return factory if isinstance(factory, StageFactory) else get_factory(factory)
