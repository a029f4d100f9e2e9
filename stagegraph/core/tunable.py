"""Search spaces declared beside params models: which fields a tuner may vary, and the rules.

A :class:`SpaceDeclaration` says, for one params model and one op kind (``matmul``,
``elementwise``, ``reduction``, ``convolution``, ``pooling``, or ``*`` for the whole
payload) on the targets it applies to:

* which fields vary, over which values (a :class:`Range` or a :class:`Choice`, given or
  computed from the op's facts and the target);
* named constraints over the fields and the facts (shapes, target), written once with a
  ``logic`` argument (``z3`` for the solver; the same expressions check a value);
* whether its sites are ``exclusive``: a candidate that moves one of them from the base
  keeps every other site's values (a choice that changes which ops the rest of the params
  describe, such as a convolution's direct or GEMM path).

A params model says where its parts sit and which ops each governs with a
``tuning_sites(facts, per_op)`` classmethod-like method returning :class:`TuningSite`; a
model without one is a single site over every op. The tuner reads only these declarations:
it never names a field, so a user's own params model and schedule are tunable by declaring
a space beside the model (:func:`declare_space`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: The op kind of a declaration that applies once per site, not per op.
ANY_OP = "*"


@dataclass(frozen=True)
class Range:
    """Every integer from ``low`` to ``high`` (inclusive)."""

    low: int
    high: int

    def intersect(self, other: Domain) -> Domain:
        if isinstance(other, Choice):
            return other.intersect(self)
        return Range(max(self.low, other.low), min(self.high, other.high))

    @property
    def size(self) -> int:
        return max(0, self.high - self.low + 1)

    def describe(self) -> dict[str, Any]:
        return {"low": self.low, "high": self.high}


@dataclass(frozen=True)
class Choice:
    """One of the listed integers (booleans are 0 and 1)."""

    values: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "values", tuple(sorted({int(v) for v in self.values})))

    def intersect(self, other: Domain) -> Domain:
        if isinstance(other, Range):
            return Choice(tuple(v for v in self.values if other.low <= v <= other.high))
        return Choice(tuple(v for v in self.values if v in other.values))

    @property
    def size(self) -> int:
        return len(self.values)

    def describe(self) -> dict[str, Any]:
        return {"choices": list(self.values)}


Domain = Range | Choice
#: A field's domain: fixed, or computed from ``(op facts or None, target)``.
DomainRule = Domain | Callable[[Any, Any], Domain]
#: Named constraints ``(fields, op facts or None, target, logic) -> {name: expression}``;
#: ``fields`` has an attribute per field of the model (a solver variable when it varies).
ConstraintRule = Callable[[Any, Any, Any, Any], Mapping[str, Any]]


@dataclass(frozen=True)
class SpaceDeclaration:
    """The tunable fields of ``model`` for ops of ``op_kind`` on targets ``applies_to``."""

    model: type
    op_kind: str
    fields: Mapping[str, DomainRule]
    constraints: ConstraintRule | None = None
    applies_to: Callable[[Any], bool] | None = None
    name: str = ""
    exclusive: bool = False

    def applies(self, target: Any) -> bool:
        return self.applies_to is None or bool(self.applies_to(target))

    def domain(self, field_name: str, op: Any, target: Any) -> Domain:
        rule = self.fields[field_name]
        return rule(op, target) if callable(rule) else rule


_DECLARATIONS: dict[tuple[type, str, str], SpaceDeclaration] = {}


def declare_space(
    model: type,
    op_kind: str,
    fields: Mapping[str, DomainRule],
    constraints: ConstraintRule | None = None,
    applies_to: Callable[[Any], bool] | None = None,
    name: str = "",
    exclusive: bool = False,
) -> SpaceDeclaration:
    """Declare (or redeclare, by ``model``, ``op_kind`` and ``name``) a search space.

    Raises:
        ValueError: a field is not a field of ``model``.
    """
    known = getattr(model, "model_fields", None)
    if known is not None:
        unknown = sorted(set(fields) - set(known))
        if unknown:
            raise ValueError(
                f"search space of {model.__name__} for {op_kind!r} names unknown fields "
                f"{', '.join(unknown)}"
            )
    declaration = SpaceDeclaration(
        model, op_kind, dict(fields), constraints, applies_to, name, exclusive
    )
    _DECLARATIONS[(model, op_kind, name)] = declaration
    return declaration


def declarations_for(model: type, op_kind: str, target: Any) -> list[SpaceDeclaration]:
    """The declarations of ``model`` for ``op_kind`` that apply on ``target``."""
    return [
        d
        for (m, kind, _), d in _DECLARATIONS.items()
        if m is model and kind == op_kind and d.applies(target)
    ]


def declared_kinds(model: type) -> list[str]:
    """Op kinds ``model`` declares spaces for (on any target)."""
    return sorted({kind for (m, kind, _) in _DECLARATIONS if m is model})


@dataclass(frozen=True)
class TuningSite:
    """A part of a params value that a tuner varies.

    ``path`` leads from the top-level params to it (field names and tuple indices or dict
    keys; empty for the whole value); ``default`` holds its values when the path does not
    exist yet in the base (a per-op entry the cost model left to its default); ``ops`` are
    the op facts it governs, and ``op_kind(op)`` names the kind a declaration is looked up
    by (default: the op's ``op_class``).
    """

    label: str
    path: tuple[str | int, ...]
    model: type
    ops: tuple[Any, ...] = ()
    default: Mapping[str, Any] | None = None
    kind_of: Callable[[Any], str] | None = field(default=None, compare=False)

    def op_kind(self, op: Any) -> str:
        if self.kind_of is not None:
            return self.kind_of(op)
        return str(getattr(op, "op_class", ANY_OP))


def tuning_sites(params: Any, facts: Any, per_op: bool = False) -> list[TuningSite]:
    """The sites of ``params`` for a payload with ``facts``: the model's own
    ``tuning_sites`` when it has one, else the whole value over every op."""
    own = getattr(params, "tuning_sites", None)
    if own is not None:
        return list(own(facts, per_op))
    ops = tuple(getattr(facts, "ops", ()) or ())
    return [TuningSite("params", (), type(params), ops)]
