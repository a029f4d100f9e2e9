"""Command options declared once, on the models that carry them.

A field of a request model (``SessionRequest``, ``BenchOptions``, ``TuneOptions``, ...)
becomes a user-facing option by an :class:`Option` in its ``Annotated`` metadata::

    warmup: Annotated[int, Option("--warmup")] = Field(3, ge=0, description="Untimed calls.")

The field owns the type, the bounds, the default and the help (its ``description``); the
:class:`Option` only adds how a user spells it (the flag, the Python keyword, a metavar)
and how a typed value becomes the field's value (``parse``, ``scale``). The command line
(click options) and the Python API (keyword arguments) are both derived from these
:class:`OptionSpec` objects, so a default or a help text exists in one place.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined


@dataclass(frozen=True)
class Option:
    """How a model field is spelled as an option.

    Args:
        flag: the command-line flag (``--compile-timeout``); also names the keyword
            (``compile_timeout``) unless ``keyword`` is given.
        keyword: the Python API keyword and click destination.
        metavar: what the value looks like in help (``KEY=VALUE``).
        parse: turns the option's value into the field's (``KEY=VALUE`` strings to a dict).
        scale: the field holds ``value * scale`` (``--memory`` in GiB, the field in bytes).
        cli_default: a default for the command line only, where it differs on purpose from
            the library's (time limits are on for commands, off for library calls).
        short: a short flag (``-o``).
        path: ``"file"`` or ``"dir"`` for a value that names one (the command line checks
            it is not the other kind).
    """

    flag: str
    keyword: str | None = None
    metavar: str | None = None
    parse: Callable[[Any], Any] | None = None
    scale: float | None = None
    cli_default: Any = None
    short: str | None = None
    path: str | None = None

    @property
    def name(self) -> str:
        return self.keyword or self.flag.lstrip("-").replace("-", "_")


@dataclass(frozen=True)
class OptionSpec:
    """One option of one command: the model field it sets and everything derived from it."""

    option: Option
    model: type[BaseModel]
    path: tuple[str, ...]  # field names from the model down to the value (nested models)
    info: FieldInfo

    @property
    def keyword(self) -> str:
        return self.option.name

    @property
    def flag(self) -> str:
        return self.option.flag

    @property
    def help(self) -> str:
        return self.info.description or ""

    @property
    def annotation(self) -> Any:
        """The field's type, ``X | None`` narrowed to ``X``."""
        hint = self.info.annotation
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if typing.get_origin(hint) in (typing.Union, types.UnionType):
            return args[0] if len(args) == 1 else hint
        return hint

    @property
    def default(self) -> Any:
        """The library default, in the option's unit."""
        if self.info.default_factory is not None:
            value = self.info.default_factory()
        else:
            value = None if self.info.default is PydanticUndefined else self.info.default
        if value is not None and self.option.scale:
            return value / self.option.scale
        return value

    @property
    def cli_default(self) -> Any:
        """The command line's default (the library's unless the option says otherwise)."""
        given = self.option.cli_default
        return self.default if given is None else given

    @property
    def multiple(self) -> bool:
        """Whether the option repeats (a tuple, list or dict field)."""
        return typing.get_origin(self.annotation) in (tuple, list, dict) or self.annotation in (
            dict,
            tuple,
            list,
        )

    def bounds(self) -> dict[str, float]:
        """``ge``/``gt``/``le``/``lt`` of the field, in the option's unit."""
        found: dict[str, float] = {}
        for item in self.info.metadata:
            for name in ("ge", "gt", "le", "lt"):
                value = getattr(item, name, None)
                if value is not None:
                    found[name] = value / self.option.scale if self.option.scale else value
        return found

    def value_for_field(self, value: Any) -> Any:
        """The option's value as the field holds it."""
        if value is None:
            return None
        if self.option.parse is not None:
            value = self.option.parse(value)
        if self.option.scale:
            value = value * self.option.scale
            if self.annotation is int:
                value = int(value)
        return value


def option_specs(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> dict[str, OptionSpec]:
    """Every option a model declares, nested request models included, by keyword (a
    model's own field wins over a nested model's of the same keyword when it comes later,
    as ``TuneOptions.db`` after ``TuneOptions.session``)."""
    specs: dict[str, OptionSpec] = {}
    for name, info in model.model_fields.items():
        option = next((m for m in info.metadata if isinstance(m, Option)), None)
        if option is not None:
            specs[option.name] = OptionSpec(option, model, (*prefix, name), info)
            continue
        nested = info.annotation
        if isinstance(nested, type) and issubclass(nested, BaseModel):
            specs.update(option_specs(nested, (*prefix, name)))
    return specs


def select(specs: Mapping[str, OptionSpec], keywords: Iterable[str]) -> dict[str, OptionSpec]:
    """The specs of ``keywords``, in that order (a command's options).

    Raises:
        KeyError: a keyword no model declares (a programming error, caught by the tests).
    """
    return {keyword: specs[keyword] for keyword in keywords}


def model_values(specs: Mapping[str, OptionSpec], values: Mapping[str, Any]) -> dict[str, Any]:
    """The nested field values of ``values`` (by keyword) for the models of ``specs``:
    ``{"inspection": {"dump_ir": "d"}, "threads": 2}``. Keywords not given (or ``None`` for
    a field whose default is ``None``) keep the model default."""
    result: dict[str, Any] = {}
    for keyword, spec in specs.items():
        if keyword not in values:
            continue
        value = spec.value_for_field(values[keyword])
        if value is None and spec.info.default is not None:
            continue  # None on the command line means "not given"
        target = result
        for part in spec.path[:-1]:
            target = target.setdefault(part, {})
        target[spec.path[-1]] = value
    return result
