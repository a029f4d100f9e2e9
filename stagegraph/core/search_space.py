"""A search space built from the declarations of a params model, solved lazily with z3.

:func:`build_space` asks the params value for its tuning sites
(:func:`~stagegraph.core.tunable.tuning_sites`) and, per site, every declaration of the
site's model for the kinds of the ops it governs on this target. Each varied field becomes
a z3 integer ``<site>.<field>`` whose domain is the intersection of the declared ones; the
constraints are the declarations' named rules, evaluated per op (so an empty space can say
which ones clash, as an unsat core). Solutions come one at a time (a blocking clause after
each), so a huge space is never enumerated; a seeded random bound per solution spreads them
over the space. Nothing here names a field: a user's params model is tuned the same way.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from stagegraph.core.tunable import (
    ANY_OP,
    Choice,
    Domain,
    Range,
    SpaceDeclaration,
    TuningSite,
    declarations_for,
    declared_kinds,
    tuning_sites,
)
from stagegraph.errors import ConfigError, EmptySearchSpaceError, did_you_mean


@dataclass(frozen=True)
class Variable:
    """One varied field of one site."""

    name: str
    site: TuningSite
    field: str
    domain: Domain


@dataclass
class SearchSpace:
    """Variables, their domains, named constraints, and the base params they vary."""

    base: Any
    target: Any
    sites: list[TuningSite]
    variables: dict[str, Variable]
    rules: list[tuple[TuningSite, SpaceDeclaration, Any]]
    fixes: dict[str, Any] = field(default_factory=dict)
    constraints: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        import z3

        self._z3 = z3
        _, self.constraints = self._build(z3.main_ctx())

    # -- building ---------------------------------------------------------------------------

    def _build(self, ctx: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """Variables and named constraints in z3 context ``ctx``.

        Each stream gets a fresh context: z3 term ids (and so its choices) depend on every
        term a context has seen, and a stream must be reproducible for resumed runs.
        """
        z3 = self._z3
        zvars = {name: z3.Int(name, ctx) for name in self.variables}
        constraints: dict[str, Any] = {}
        for name, var in self.variables.items():
            dom, z = var.domain, zvars[name]
            if isinstance(dom, Range):
                constraints[f"domain {name} in {dom.low}..{dom.high}"] = z3.And(
                    z >= dom.low, z <= dom.high
                )
            else:
                allowed = ",".join(map(str, dom.values))
                constraints[f"domain {name} in {{{allowed}}}"] = z3.Or(
                    [z == v for v in dom.values] or [z3.BoolVal(False, ctx)]
                )
        many = {id(site): sum(1 for s, _, _ in self.rules if s is site) > 1 for site in self.sites}
        for site, declaration, op in self.rules:
            if declaration.constraints is None:
                continue
            names = _Namespace(self._site_values(site, zvars))
            where = site.label
            if op is not None and many[id(site)]:
                where += f".op{getattr(op, 'index', '?')}"
            for rule, expr in declaration.constraints(names, op, self.target, z3).items():
                constraints[f"{where}.{rule}"] = _as_bool(z3, expr, ctx)
        constraints.update(self._exclusive_rules(zvars, ctx))
        for key, value in self.fixes.items():
            for name, var in self.variables.items():
                if var.field == key:
                    constraints[f"fixed {name}={value}"] = zvars[name] == int(value)
        return zvars, constraints

    def _exclusive_rules(self, zvars: Mapping[str, Any], ctx: Any) -> dict[str, Any]:
        """``<site>.alone``: a site of an ``exclusive`` declaration keeps the base's values,
        or every site of no exclusive declaration does (exclusive sites move together; see
        :class:`~stagegraph.core.tunable.SpaceDeclaration`)."""
        z3 = self._z3
        exclusive = {id(s) for s, d, _ in self.rules if d.exclusive}
        if not exclusive:
            return {}
        base = self.values_of(self.base)

        def at_base(names: list[str]) -> Any:
            return z3.And([zvars[n] == base[n] for n in names] or [z3.BoolVal(True, ctx)])

        rules = {}
        for site in self.sites:
            if id(site) not in exclusive:
                continue
            mine = [n for n, v in self.variables.items() if v.site is site]
            others = [n for n, v in self.variables.items() if id(v.site) not in exclusive]
            if mine and others:
                rules[f"{site.label}.alone"] = z3.Or(at_base(mine), at_base(others))
        return rules

    def _site_values(self, site: TuningSite, zvars: Mapping[str, Any]) -> dict[str, Any]:
        """The site's fields: solver variables where varied, base values elsewhere."""
        values = dict(site_values(self.base, site))
        for name, var in self.variables.items():
            if var.site is site:
                values[var.field] = zvars[name]
        return values

    # -- solving ----------------------------------------------------------------------------

    def _solver(self, seed: int, track: bool = False) -> tuple[Any, dict[str, Any]]:
        z3 = self._z3
        ctx = z3.Context()
        zvars, constraints = self._build(ctx)
        solver = z3.Solver(ctx=ctx)
        solver.set("random_seed", seed)
        solver.set("phase_selection", 5)  # random phase: different seeds, different corners
        solver.set("ctrl_c", False)  # else z3 takes SIGINT for itself: Ctrl-C must stop us
        for name, expr in constraints.items():
            if track:
                solver.assert_and_track(expr, z3.Bool(name, ctx))
            else:
                solver.add(expr)
        return solver, zvars

    def conflicts(self) -> list[str]:
        """Names of constraints that cannot hold together (an unsat core), [] if satisfiable."""
        z3 = self._z3
        plain, _ = self._solver(0)
        if plain.check() != z3.unsat:  # tracked assertions check ~3x slower: only on unsat
            return []
        solver, _ = self._solver(0, track=True)
        if solver.check() != z3.unsat:
            return []
        return sorted(str(b) for b in solver.unsat_core())

    def require_nonempty(self) -> None:
        """Raises: EmptySearchSpaceError naming the conflicting constraints."""
        if not self.variables:
            raise EmptySearchSpaceError(
                "nothing to tune: no declared search space covers this payload's ops "
                f"(params model {type(self.base).__name__}, sites "
                f"{', '.join(s.label for s in self.sites) or 'none'})",
                ["no tunable fields"],
            )
        if self.contains(self.values_of(self.base)):
            return  # the baseline is a solution: fast, where a free check of a space with
            # products of variables (several matmul sites) can take z3 a second
        conflicts = self.conflicts()
        if conflicts:
            raise EmptySearchSpaceError(
                "the search space is empty: these constraints conflict: " + "; ".join(conflicts),
                conflicts,
            )

    def stream(self, seed: int = 0, deadline: float | None = None) -> Iterator[dict[str, int]]:
        """Distinct solutions, lazily: each check finds one, a blocking clause excludes it.
        With a ``deadline`` (``time.monotonic()``), each check is limited to the time left and
        the stream ends when it runs out."""
        z3 = self._z3
        rng = random.Random(seed)
        solver, zvars = self._solver(seed)
        names = list(zvars)
        if not names:
            return

        def check() -> Any:
            if deadline is not None:
                left_ms = int((deadline - time.monotonic()) * 1000)
                if left_ms <= 0:
                    return z3.unknown
                solver.set("timeout", left_ms)
            return solver.check()

        while True:
            solver.push()
            name = rng.choice(names)
            pivot = _pivot(self.variables[name].domain, rng)
            var = zvars[name]
            solver.add(var <= pivot if rng.random() < 0.5 else var >= pivot)
            verdict = check()
            model = solver.model() if verdict == z3.sat else None
            solver.pop()
            if verdict == z3.unknown:
                return
            if model is None:
                if check() != z3.sat:
                    return
                model = solver.model()
            solution = {n: model.eval(v, model_completion=True).as_long() for n, v in zvars.items()}
            solver.add(z3.Or([zvars[n] != x for n, x in solution.items()]))
            yield solution

    def contains(self, values: Mapping[str, int]) -> bool:
        """Do these values satisfy every constraint? (a z3 check under equalities)."""
        z3 = self._z3
        solver, zvars = self._solver(0)
        solver.add(*[zvars[n] == int(v) for n, v in values.items() if n in zvars])
        return solver.check() == z3.sat

    def repair(self, values: Mapping[str, int], pinned: Mapping[str, int]) -> dict[str, int] | None:
        """The solution nearest ``values`` (fewest other variables changed) with the
        ``pinned`` values, or None: how a search moves one variable (reg_m 6 -> 4) and lets
        the solver fix what depends on it (tile_m to a multiple of 4)."""
        z3 = self._z3
        ctx = z3.Context()
        zvars, constraints = self._build(ctx)
        opt = z3.Optimize(ctx=ctx)
        opt.set("ctrl_c", False)
        opt.add(*constraints.values())
        opt.add(*[zvars[n] == int(v) for n, v in pinned.items() if n in zvars])
        moves = [
            z3.If(zvars[n] >= int(v), zvars[n] - int(v), int(v) - zvars[n])
            for n, v in values.items()
            if n in zvars and n not in pinned
        ]
        for name, value in values.items():  # first keep as many as possible, then stay near
            if name in zvars and name not in pinned:
                opt.add_soft(zvars[name] == int(value))
        if moves:
            opt.minimize(z3.Sum(moves))
        if opt.check() != z3.sat:
            return None
        model = opt.model()
        return {n: model.eval(v, model_completion=True).as_long() for n, v in zvars.items()}

    def violated(self, values: Mapping[str, int]) -> list[str]:
        """Names of the constraints ``values`` break (the baseline must break none)."""
        z3 = self._z3
        ctx = z3.Context()
        zvars, constraints = self._build(ctx)
        out = []
        for name, expr in constraints.items():
            solver = z3.Solver(ctx=ctx)
            solver.add(*[zvars[n] == int(v) for n, v in values.items() if n in zvars])
            solver.add(expr)
            if solver.check() != z3.sat:
                out.append(name)
        return out

    def count(self, cap: int = 1000, seconds: float | None = None) -> tuple[int, bool]:
        """Number of solutions, counted up to ``cap`` (for at most ``seconds``); (n, exact)."""
        deadline = time.monotonic() + seconds if seconds is not None else None
        seen = 0
        for _ in self.stream(0, deadline):
            seen += 1
            if seen >= cap:
                return seen, False
        if deadline is not None and time.monotonic() >= deadline:
            return seen, False
        return seen, True

    def product_size(self) -> int:
        """Product of the domain sizes (the space before constraints)."""
        total = 1
        for var in self.variables.values():
            total *= var.domain.size
        return total

    # -- params -----------------------------------------------------------------------------

    def to_params(self, values: Mapping[str, int]) -> Any:
        """Solver values on top of the base params, validated by the params model.

        Raises:
            ValueError: the model rejects the values (a rule the declarations missed).
        """
        data = self.base.model_dump(mode="json")
        for name, var in self.variables.items():
            if name not in values:
                continue
            holder = _site_dict(data, var.site)
            kind = type(holder.get(var.field, getattr(var.site.model, var.field, None)))
            info = getattr(var.site.model, "model_fields", {}).get(var.field)
            is_bool = (info is not None and info.annotation is bool) or kind is bool
            holder[var.field] = bool(values[name]) if is_bool else int(values[name])
        return type(self.base).model_validate(data)

    def values_of(self, params: Any) -> dict[str, int]:
        """The variables' values in ``params`` (booleans as 0/1)."""
        out = {}
        for name, var in self.variables.items():
            out[name] = int(site_values(params, var.site)[var.field])
        return out

    def describe(self, cap: int = 1000, seconds: float = 0.03) -> dict[str, Any]:
        """What ``tune --explain`` prints: variables, domains, constraints and the size (z3
        counts solutions for at most ``seconds``: an explanation answers at once)."""
        # A space of a few dozen points is counted exactly whatever the time (a loaded
        # machine must not turn 3 into ">= 2"); larger ones for at most ``seconds``.
        small = self.product_size() <= EXACT_COUNT_BELOW
        count, exact = self.count(cap, None if small else seconds)
        if not exact and count == 0 and self.contains(self.values_of(self.base)):
            count = 1  # no solution found in time, but the baseline is one
        fixed = {}
        for site in self.sites:
            varied = {v.field for v in self.variables.values() if v.site is site}
            for key, value in site_values(self.base, site).items():
                if key not in varied and isinstance(value, (int, float, bool, str)):
                    fixed[f"{site.label}.{key}"] = value
        return {
            "sites": {s.label: sorted({s.op_kind(op) for op in s.ops}) for s in self.sites},
            "fields": {n: v.domain.describe() for n, v in self.variables.items()},
            "fixed": fixed,
            "constraints": [n for n in self.constraints if not n.startswith("domain ")],
            "product_of_domains": self.product_size(),
            "size": count,
            "size_exact": exact,
            "size_cap": cap,
        }


#: Spaces with at most this many points (product of the domains) are counted exactly.
EXACT_COUNT_BELOW = 64


class _Namespace:
    def __init__(self, values: Mapping[str, Any]) -> None:
        self.__dict__.update(values)


def _pivot(dom: Domain, rng: random.Random) -> int:
    """A random value of ``dom`` to bound a variable by (spreads solutions out)."""
    if isinstance(dom, Choice):
        return rng.choice(dom.values) if dom.values else 0
    return rng.randint(dom.low, max(dom.low, dom.high))


def _as_bool(z3: Any, expr: Any, ctx: Any) -> Any:
    """A rule may compare only constants (a Python bool): make it a z3 term."""
    return z3.BoolVal(bool(expr), ctx) if isinstance(expr, bool) else expr


def _site_dict(data: dict[str, Any], site: TuningSite) -> dict[str, Any]:
    """The dict of ``site`` inside a dumped params value (created from its default)."""
    holder: Any = data
    for i, step in enumerate(site.path):
        last = i == len(site.path) - 1
        if isinstance(holder, dict) and step not in holder and last:
            holder[step] = dict(site.default or {})
        holder = holder[step]
    return holder


def site_values(params: Any, site: TuningSite) -> dict[str, Any]:
    """The field values of ``site`` in ``params`` (its default where the path is missing)."""
    value: Any = params
    for step in site.path:
        if isinstance(step, int):
            value = value[step]
        elif isinstance(value, Mapping):
            if step not in value:
                return dict(site.default or {})
            value = value[step]
        else:
            value = getattr(value, step)
    return value.model_dump() if hasattr(value, "model_dump") else dict(value)


def build_space(
    base: Any,
    facts: Any,
    target: Any,
    fixes: Mapping[str, Any] | None = None,
    per_op: bool = False,
    only: Callable[[TuningSite], bool] | None = None,
) -> SearchSpace:
    """The space around ``base`` (the cost model's choice) for this payload on this target
    (``only``: the sites to vary; the others keep the base's values).

    Raises:
        ConfigError: a ``--fix`` names no varied field.
        EmptySearchSpaceError: no declaration covers the payload's ops.
    """
    sites = [s for s in tuning_sites(base, facts, per_op) if only is None or only(s)]
    variables: dict[str, Variable] = {}
    rules: list[tuple[TuningSite, SpaceDeclaration, Any]] = []
    for site in sites:
        domains: dict[str, Domain] = {}
        scopes = [(ANY_OP, None)] + [(site.op_kind(op), op) for op in site.ops]
        for kind, op in scopes:
            for declaration in declarations_for(site.model, kind, target):
                rules.append((site, declaration, op))
                for name in declaration.fields:
                    dom = declaration.domain(name, op, target)
                    domains[name] = domains[name].intersect(dom) if name in domains else dom
        for name, dom in domains.items():
            var = f"{site.label}.{name}"
            variables[var] = Variable(var, site, name, dom)
    fields = sorted({v.field for v in variables.values()})
    for key in fixes or {}:
        if key not in fields:
            raise ConfigError(
                f"--fix {key!r} is not a tunable field of this payload{did_you_mean(key, fields)}; "
                f"tunable: {', '.join(fields) or 'none'}"
            )
    if not variables:
        kinds = sorted({site.op_kind(op) for site in sites for op in site.ops})
        declared = sorted({k for site in sites for k in declared_kinds(site.model)})
        raise EmptySearchSpaceError(
            f"nothing to tune: the payload's ops are {', '.join(kinds) or 'none'}, and the "
            f"params model {type(base).__name__} declares search spaces for "
            f"{', '.join(declared) or 'no op kind'} on this target",
            ["no declared space covers the payload"],
        )
    return SearchSpace(base, target, sites, variables, rules, dict(fixes or {}))
