"""Stages: named, typed, configured nodes of a graph.

A stage *factory* is declared once from a plain function (or a class with a ``run``
method): its parameters' type hints are the input ports, its return hint the output ports,
and a parameter named ``config`` (a :class:`~stagegraph.core.ports.Config` subclass) its
configuration. Calling the factory makes a :class:`Stage`: a name, tags and a frozen config.
"""

from __future__ import annotations

import hashlib
import inspect
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from stagegraph.core.ports import (
    Binary,
    Config,
    Facts,
    Module,
    Params,
    WorkloadRef,
    compatible,
    is_port_type,
    port_name,
)
from stagegraph.core.registry import Registry, import_entry, origin_of
from stagegraph.core.versioning import source_version
from stagegraph.errors import (
    ConfigError,
    StageDefinitionError,
    StageOutputError,
    UnknownStageError,
)

KINDS = ("analysis", "params", "schedule", "passes", "wrapper", "emit", "measure")
MUTATING_KINDS = frozenset({"schedule", "passes", "wrapper"})
_DEFAULT_OUTPUT = (
    (Module, "module"),
    (Params, "params"),
    (Facts, "facts"),
    (Binary, "binary"),
    (WorkloadRef, "workload"),
)


@dataclass(frozen=True)
class Port:
    """One typed input or output of a stage."""

    name: str
    type: type
    optional: bool = False

    def __str__(self) -> str:
        return f"{self.name}: {port_name(self.type)}"


def _default_output_name(port_type: type) -> str:
    return next(name for base, name in _DEFAULT_OUTPUT if issubclass(port_type, base))


def _ports_from_hints(fn: Callable, owner: str) -> tuple[tuple[Port, ...], tuple[Port, ...], type]:
    try:
        hints = typing.get_type_hints(fn)
    except Exception as exc:  # unresolved forward references
        raise StageDefinitionError(f"stage {owner!r}: cannot resolve type hints: {exc}") from exc
    signature = inspect.signature(fn)
    inputs: list[Port] = []
    config_model: type[Config] = Config
    for pname, param in signature.parameters.items():
        if pname == "self":
            continue
        hint = hints.get(pname)
        if pname == "config":
            if not (isinstance(hint, type) and issubclass(hint, Config)):
                raise StageDefinitionError(
                    f"stage {owner!r}: parameter 'config' must be hinted with a Config subclass"
                )
            config_model = hint
            continue
        optional = param.default is None
        if optional and typing.get_origin(hint) in (typing.Union, types.UnionType):
            hint = next(a for a in typing.get_args(hint) if a is not type(None))
        if not is_port_type(hint):
            raise StageDefinitionError(
                f"stage {owner!r}: input {pname!r} needs a port type hint "
                f"(Module[level], a Params/Facts model or Binary), got {hint!r}"
            )
        inputs.append(Port(pname, hint, optional))
    ret = hints.get("return")
    outputs: list[Port] = []
    if ret is None or ret is type(None):
        pass
    elif is_port_type(ret):
        outputs.append(Port(_default_output_name(ret), ret))
    elif isinstance(ret, type) and issubclass(ret, tuple) and hasattr(ret, "_fields"):
        for oname, ohint in typing.get_type_hints(ret).items():
            if not is_port_type(ohint):
                raise StageDefinitionError(f"stage {owner!r}: output {oname!r} is not a port type")
            outputs.append(Port(oname, ohint))
    else:
        raise StageDefinitionError(
            f"stage {owner!r}: return hint must be a port type or a NamedTuple of them"
        )
    return tuple(inputs), tuple(outputs), config_model


@dataclass(frozen=True, eq=False)
class StageFactory:
    """A registered stage definition; calling it makes a configured :class:`Stage`."""

    name: str
    kind: str
    fn: Callable[..., Any]
    inputs: tuple[Port, ...]
    outputs: tuple[Port, ...]
    config_model: type[Config]
    mutates: bool
    cacheable: bool = True
    doc: str = ""
    version: str = ""
    takes_config: bool = True
    #: ``describe(inputs, config) -> str``: what the stage applies to these inputs, as text
    #: (a schedule built from its inputs), for a reproducer; None when its config says it.
    describe: Callable[[dict[str, Any], Config], str] | None = None

    def __call__(
        self,
        name: str | None = None,
        *,
        tags: Iterable[str] = (),
        config: Config | Mapping[str, Any] | None = None,
        **config_fields: Any,
    ) -> Stage:
        stage_name = name or self.name.rsplit(".", 1)[-1]
        values = dict(config.model_dump() if isinstance(config, Config) else config or {})
        values.update(config_fields)
        return Stage(stage_name, self, self.make_config(values, stage_name), frozenset(tags))

    @property
    def code_version(self) -> str:
        """``version`` if given, else the hash of the stage's code and its in-project
        imports (:func:`~stagegraph.core.versioning.source_version`): part of every memo key."""
        return self.version or source_version(self.fn)

    def make_config(self, values: Mapping[str, Any], stage_name: str) -> Config:
        try:
            config = self.config_model.model_validate(dict(values))
        except ValidationError as exc:
            raise ConfigError(
                f"stage {stage_name!r} ({self.name}): invalid config: "
                f"{_brief(exc, list(self.config_model.model_fields))}"
            ) from exc
        try:
            config.check_for(self)
        except ValueError as exc:
            raise ConfigError(
                f"stage {stage_name!r} ({self.name}): invalid config: {exc}"
            ) from None
        return config


def _brief(exc: ValidationError, fields: list[str] | None = None) -> str:
    """One line per error; an unknown key gets a did-you-mean and the known keys."""
    from stagegraph.errors import did_you_mean

    parts = []
    for e in exc.errors():
        where = ".".join(str(p) for p in e["loc"]) or "config"
        message = e["msg"]
        if e["type"] == "extra_forbidden" and fields is not None and len(e["loc"]) == 1:
            message += f"{did_you_mean(str(e['loc'][0]), fields)}; its keys: {', '.join(fields)}"
        parts.append(f"{where}: {message}")
    return "; ".join(parts)


@dataclass(frozen=True)
class Stage:
    """A node of a graph: a factory with a name, tags and a frozen config."""

    name: str
    factory: StageFactory = field(compare=False)
    config: Config
    tags: frozenset[str] = frozenset()
    factory_name: str = field(default="", init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "factory_name", self.factory.name)

    @property
    def kind(self) -> str:
        return self.factory.kind

    @property
    def inputs(self) -> dict[str, Port]:
        """The factory's input ports, ``Module["any"]`` narrowed by the config's levels."""
        return {p.name: _narrow(p, self.config.port_levels()[0]) for p in self.factory.inputs}

    @property
    def outputs(self) -> dict[str, Port]:
        """The factory's output ports, ``Module["any"]`` narrowed by the config's levels."""
        return {p.name: _narrow(p, self.config.port_levels()[1]) for p in self.factory.outputs}

    def with_config(self, **changes: Any) -> Stage:
        values = {**self.config.model_dump(), **changes}
        return Stage(
            self.name, self.factory, self.factory.make_config(values, self.name), self.tags
        )

    def renamed(self, name: str) -> Stage:
        return Stage(name, self.factory, self.config, self.tags)

    def with_tags(self, *tags: str) -> Stage:
        return Stage(self.name, self.factory, self.config, self.tags | frozenset(tags))

    def spec_hash(self, code: bool = True) -> str:
        """Identity of what this stage computes: factory, its code version and config.

        Without ``code`` the code version is left out: within one process a factory's code
        cannot change, and hashing it parses every module the stage imports (over half a
        second per process); only keys that outlive the process need it."""
        version = self.factory.code_version if code else ""
        data = f"{self.factory.name}:{version}:{self.config.content_hash()}"
        return hashlib.sha256(data.encode()).hexdigest()

    def run(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """Call the stage function and return its outputs keyed by port name."""
        if self.factory.takes_config:
            result = self.factory.fn(**inputs, config=self.config)
        else:
            result = self.factory.fn(**inputs)
        ports = tuple(self.outputs.values())
        if not ports:
            return {}
        named = isinstance(result, tuple) and hasattr(result, "_fields")  # NamedTuple outputs
        if len(ports) > 1 and not (isinstance(result, tuple) and len(result) == len(ports)):
            raise StageOutputError(
                f"stage {self.name!r} ({self.factory.name}) returned {_describe(result)}; "
                f"expected a tuple of {len(ports)} values for its outputs "
                + ", ".join(f"{p.name!r} ({port_name(p.type)})" for p in ports)
            )
        values = list(result) if len(ports) > 1 or named else [result]
        return {p.name: self._coerce(p, v) for p, v in zip(ports, values, strict=True)}

    def _coerce(self, port: Port, value: Any) -> Any:
        """Wrap bare ``ir.Module`` results and stamp the output level onto modules.

        Raises:
            StageOutputError: ``value`` is not of the port's type (a stage whose body is
                ``...`` returns None), named here rather than as an AttributeError in a
                later stage.
        """
        if value is None and port.optional:
            return None
        if issubclass(port.type, Module):
            if not isinstance(value, Module):
                if not hasattr(value, "operation"):  # an ir.Module (no bindings import here)
                    raise self._wrong_output(port, value, "a Module or an MLIR ir.Module")
                value = port.type(value)
            if port.type.level != "any":
                value.level = port.type.level
        elif isinstance(port.type, type) and not isinstance(value, port.type):
            raise self._wrong_output(port, value, f"a {port_name(port.type)}")
        return value

    def _wrong_output(self, port: Port, value: Any, expected: str) -> StageOutputError:
        return StageOutputError(
            f"stage {self.name!r} ({self.factory.name}) returned {_describe(value)} for its "
            f"output {port.name!r} ({port_name(port.type)}); expected {expected}"
        )


def _describe(value: Any) -> str:
    """``None`` or ``a str ('abc')``: what a stage returned, for errors."""
    if value is None:
        return "None"
    shown = repr(value)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    return f"a {type(value).__name__} ({shown})"


def _narrow(port: Port, level: str | None) -> Port:
    if level is None or not issubclass(port.type, Module) or port.type.level != "any":
        return port
    return Port(port.name, Module[level], port.optional)


def _load_stage_modules() -> None:
    """Import every module of the stage library (registered by the stage packages)."""
    for name in STAGE_MODULES.names():
        STAGE_MODULES.get(name)


#: The modules that declare the built-in stages, registered by the stage packages
#: (``stagegraph/stages/__init__.py`` and each target package): only these are imported to
#: list or look up factories; they load MLIR lazily, inside stage functions, so
#: ``validate`` and ``list stages`` never pay for the bindings.
STAGE_MODULES: Registry[Any] = Registry("stage-library module", plural="stage-modules")
#: Stage factories by registry name (``@stage`` registers each).
STAGES: Registry[StageFactory] = Registry(
    "stage",
    plural="stages",
    error=UnknownStageError,
    discover=_load_stage_modules,
    unknown_as="stage factory",
)


def register_stage_module(module: str) -> None:
    """Make ``module`` part of the stage library (imported before stages are looked up)."""
    STAGE_MODULES.register(module, module)


def stage(
    kind: str,
    *,
    name: str | None = None,
    mutates: bool | None = None,
    cacheable: bool = True,
    describe: Callable[[dict[str, Any], Config], str] | None = None,
) -> Callable[[Any], StageFactory]:
    """Declare a stage factory from a function or a class with a ``run`` method.

    Args:
        kind: one of ``analysis, params, schedule, passes, wrapper, emit, measure``.
        name: registry name (default: the function or class name).
        mutates: whether the stage changes its input modules in place (default: by kind).
        cacheable: whether the engine may serve its outputs from the memo cache.
        describe: ``describe(inputs, config)``, the text of what the stage applies to those
            inputs (a schedule it builds from them), written into reproducers.
    """
    if kind not in KINDS:
        raise StageDefinitionError(f"unknown stage kind {kind!r}; kinds are {', '.join(KINDS)}")

    def declare(obj: Any) -> StageFactory:
        reg_name = name or obj.__name__
        if inspect.isclass(obj):
            instance = obj()
            fn = instance.run
        else:
            fn = obj
        inputs, outputs, config_model = _ports_from_hints(fn, reg_name)
        factory = StageFactory(
            name=reg_name,
            kind=kind,
            fn=fn,
            inputs=inputs,
            outputs=outputs,
            config_model=config_model,
            mutates=kind in MUTATING_KINDS if mutates is None else mutates,
            cacheable=cacheable,
            doc=inspect.getdoc(obj) or "",
            version="",  # computed on first use (see code_version): imports stay cheap
            takes_config="config" in inspect.signature(fn).parameters,
            describe=describe,
        )
        STAGES.register(reg_name, factory, origin=origin_of(fn))
        return factory

    return declare


def registered() -> dict[str, StageFactory]:
    """All registered factories, the stage library (and plugins) loaded first."""
    return dict(STAGES.items())


def get_factory(name: str) -> StageFactory:
    """Look a factory up by registry name or by ``module:attribute`` import path (how a
    graph file names a stage of a plugin or user module).

    Raises:
        UnknownStageError: no such name (with a "did you mean"), or the import path fails.
    """
    if ":" not in name:
        return STAGES.get(name)
    try:
        obj = import_entry(name)
    except (ImportError, AttributeError) as exc:
        raise UnknownStageError(
            f"cannot import stage factory {name!r}: {exc} (load the code that declares it "
            f"with --plugin or STAGEGRAPH_PLUGINS, or put its module beside the graph file)"
        ) from exc
    if not isinstance(obj, StageFactory):
        raise UnknownStageError(f"{name!r} is not a stage factory (declare it with @stage)")
    return obj


def check_compatible(produced: Port, expected: Port) -> bool:
    return compatible(produced.type, expected.type)
