"""Search spaces over x86 params, derived from the params model and solved lazily with z3.

Each tunable :class:`MatmulParams` field of each matmul site becomes a z3 integer whose
domain is the field's own ``ge``/``le`` range; the constraints are the model's declared rules
(``tuning_constraints``) plus shape bounds from the payload facts and cache capacities from
the target, each under a name so an empty space can say which ones clash (unsat core).
Solutions come one at a time (a blocking clause after each), so a huge space is never
enumerated; a seeded random bound per solution spreads them over the space.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from stagegraph.dtypes import byte_size
from stagegraph.errors import ConfigError, EmptySearchSpaceError
from stagegraph.stages.analysis import PayloadFacts
from stagegraph.stages.target import Target
from stagegraph.stages.x86.matmul_params import TUNABLE_FIELDS, MatmulParams, tuning_constraints
from stagegraph.stages.x86.stages import X86Params, compute_dtype, matmul_ops

_FIXED_FIELDS = ("vector_width", "vector_registers")


@dataclass(frozen=True)
class Domain:
    """Integer range of one variable (``pack`` is 0..1)."""

    low: int
    high: int

    @property
    def size(self) -> int:
        return self.high - self.low + 1


@dataclass(frozen=True)
class Site:
    """One matmul of the payload: its shape and element size."""

    m: int
    n: int
    k: int
    elem: int


def field_domain(name: str) -> Domain:
    """The ``ge``/``le`` range declared on a MatmulParams field (bools: 0..1)."""
    info = MatmulParams.model_fields[name]
    if info.annotation is bool:
        return Domain(0, 1)
    low = next((m.ge for m in info.metadata if hasattr(m, "ge")), 0)
    high = next((m.le for m in info.metadata if hasattr(m, "le")), 1 << 16)
    return Domain(int(low), int(high))


@dataclass
class SearchSpace:
    """Variables ``mm<i>.<field>``, their domains, named constraints, and the base params."""

    base: X86Params
    sites: list[Site]
    target: Target
    fixes: dict[str, Any] = field(default_factory=dict)
    domains: dict[str, Domain] = field(init=False)
    constraints: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        import z3

        from stagegraph.errors import did_you_mean

        self._z3 = z3
        self.domains = {
            f"mm{i}.{name}": field_domain(name)
            for i in range(len(self.sites))
            for name in TUNABLE_FIELDS
        }
        for key in self.fixes:
            if key not in TUNABLE_FIELDS:
                raise ConfigError(
                    f"--fix {key!r} is not a tunable field{did_you_mean(key, TUNABLE_FIELDS)}; "
                    f"tunable: {', '.join(TUNABLE_FIELDS)}"
                )
        self.vars, self.constraints = self._build(z3.main_ctx())

    def _build(self, ctx: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """Variables and named constraints in z3 context ``ctx``.

        Each stream gets a fresh context: z3 term ids (and so its choices) depend on every
        term a context has seen, and a stream must be reproducible for resumed runs.
        """
        z3 = self._z3
        variables = {name: z3.Int(name, ctx) for name in self.domains}
        constraints: dict[str, Any] = {}
        for name, dom in self.domains.items():
            var = variables[name]
            constraints[f"domain {name} in {dom.low}..{dom.high}"] = z3.And(
                var >= dom.low, var <= dom.high
            )
        for i, site in enumerate(self.sites):
            constraints.update(self._site_constraints(i, site, variables))
        for key, value in self.fixes.items():
            for i in range(len(self.sites)):
                constraints[f"fixed mm{i}.{key}={value}"] = variables[f"mm{i}.{key}"] == int(value)
        return variables, constraints

    def _site_constraints(self, i: int, site: Site, variables: dict[str, Any]) -> dict[str, Any]:
        """The model's declared rules for site ``i``, then shape bounds and cache capacities."""
        z3 = self._z3
        base = self.base.matmul[i]
        names: dict[str, Any] = {f: variables[f"mm{i}.{f}"] for f in TUNABLE_FIELDS}
        names.update({f: getattr(base, f) for f in _FIXED_FIELDS})
        p = _Namespace(names)
        rules = {f"mm{i}.{rule}": expr for rule, expr in tuning_constraints(p, z3).items()}
        kc = z3.If(p.tile_k == 0, site.k, p.tile_k)
        l2 = self.target.l2_bytes
        rules.update({
            f"mm{i}.tile_m_within_m={site.m}": p.tile_m < site.m + p.reg_m,
            f"mm{i}.tile_n_within_n={site.n}": p.tile_n < site.n + p.reg_n,
            f"mm{i}.reg_m_within_m={site.m}": p.reg_m <= max(site.m, 1),
            f"mm{i}.tile_k_divides_k={site.k}": z3.Or(p.tile_k == 0, site.k % p.tile_k == 0),
            f"mm{i}.tile_k_below_k={site.k}": p.tile_k < site.k,
            f"mm{i}.k_unroll_divides_k={site.k}": site.k % p.k_unroll == 0,
            f"mm{i}.a_block_fits_l2={l2}B": p.tile_m * kc * site.elem <= l2,
            f"mm{i}.b_panel_fits_half_l2": kc * p.reg_n * site.elem <= l2 // 2,
        })  # fmt: skip
        return rules

    # -- solving --------------------------------------------------------------------------

    def _solver(self, seed: int, track: bool = False) -> tuple[Any, dict[str, Any]]:
        z3 = self._z3
        ctx = z3.Context()
        variables, constraints = self._build(ctx)
        solver = z3.Solver(ctx=ctx)
        solver.set("random_seed", seed)
        solver.set("phase_selection", 5)  # random phase: different seeds, different corners
        for name, expr in constraints.items():
            if track:
                solver.assert_and_track(expr, z3.Bool(name, ctx))
            else:
                solver.add(expr)
        return solver, variables

    def conflicts(self) -> list[str]:
        """Names of constraints that cannot hold together (an unsat core), [] if satisfiable."""
        z3 = self._z3
        solver, _ = self._solver(0, track=True)
        if solver.check() != z3.unsat:
            return []
        return sorted(str(b) for b in solver.unsat_core())

    def require_nonempty(self) -> None:
        """Raises: EmptySearchSpaceError naming the conflicting constraints."""
        conflicts = self.conflicts()
        if conflicts:
            raise EmptySearchSpaceError(
                "the search space is empty: these constraints conflict: " + "; ".join(conflicts),
                conflicts,
            )

    def stream(self, seed: int = 0) -> Iterator[dict[str, int]]:
        """Distinct solutions, lazily: each check finds one, a blocking clause excludes it."""
        z3 = self._z3
        rng = random.Random(seed)
        solver, variables = self._solver(seed)
        names = list(variables)
        while True:
            solver.push()
            name = rng.choice(names)
            dom = self.domains[name]
            pivot = rng.randint(dom.low, min(dom.high, self._soft_high(name)))
            var = variables[name]
            solver.add(var <= pivot if rng.random() < 0.5 else var >= pivot)
            found = solver.check() == z3.sat
            model = solver.model() if found else None
            solver.pop()
            if not found:
                if solver.check() != z3.sat:
                    return
                model = solver.model()
            values = {
                n: model.eval(v, model_completion=True).as_long() for n, v in variables.items()
            }
            solver.add(z3.Or([variables[n] != x for n, x in values.items()]))
            yield values

    def _soft_high(self, name: str) -> int:
        """A shape-aware upper end for picking random pivots (the domain may be far wider)."""
        site = self.sites[int(name[2 : name.index(".")])]
        field_name = name.split(".", 1)[1]
        return {"tile_m": site.m, "tile_n": site.n, "tile_k": site.k}.get(field_name, 1 << 16)

    def contains(self, values: Mapping[str, int]) -> bool:
        """Do these values satisfy every constraint? (a z3 check under equalities)."""
        z3 = self._z3
        solver, variables = self._solver(0)
        solver.add(*[variables[n] == int(v) for n, v in values.items() if n in variables])
        return solver.check() == z3.sat

    def count(self, cap: int = 1000, seconds: float | None = None) -> tuple[int, bool]:
        """Number of solutions, counted with z3 up to ``cap`` (and for at most ``seconds``);
        (count, exact)."""
        import time

        deadline = time.monotonic() + seconds if seconds is not None else float("inf")
        seen = 0
        for _ in self.stream(0):
            seen += 1
            if seen >= cap or time.monotonic() > deadline:
                return seen, False
        return seen, True

    def product_size(self) -> int:
        """Product of the domain sizes (the space before constraints)."""
        total = 1
        for dom in self.domains.values():
            total *= dom.size
        return total

    # -- params ----------------------------------------------------------------------------

    def to_params(self, values: Mapping[str, int]) -> X86Params:
        """Solver values on top of the base params (validated by the model)."""
        sites = []
        for i, site in enumerate(self.base.matmul):
            mine = {f: values[f"mm{i}.{f}"] for f in TUNABLE_FIELDS}
            mine["pack"] = bool(mine["pack"])
            sites.append(MatmulParams(**{**site.model_dump(), **mine}))
        return X86Params(matmul=tuple(sites), generic=self.base.generic)

    def values_of(self, params: X86Params) -> dict[str, int]:
        return {
            f"mm{i}.{f}": int(getattr(site, f))
            for i, site in enumerate(params.matmul)
            for f in TUNABLE_FIELDS
        }

    def describe(self, cap: int = 1000, seconds: float = 0.25) -> dict[str, Any]:
        """What ``tune --explain`` prints: variables, domains, constraints and the size (z3
        counts solutions for at most ``seconds``: an explanation answers at once)."""
        count, exact = self.count(cap, seconds)
        return {
            "fields": {n: {"low": d.low, "high": d.high} for n, d in self.domains.items()},
            "fixed": {
                f"mm{i}.{f}": getattr(s, f)
                for i, s in enumerate(self.base.matmul)
                for f in (*_FIXED_FIELDS, "threads")
            },
            "constraints": [n for n in self.constraints if not n.startswith("domain ")],
            "product_of_domains": self.product_size(),
            "size": count,
            "size_exact": exact,
            "size_cap": cap,
        }


class _Namespace:
    def __init__(self, values: Mapping[str, Any]) -> None:
        self.__dict__.update(values)


def sites_of(facts: PayloadFacts) -> list[Site]:
    """The matmul sites (shape, element size) the x86 params describe, in walk order."""
    sites = []
    for op in matmul_ops(facts):
        c = op.contraction
        dtype = compute_dtype(op)
        sites.append(Site(c.m, c.n, c.k, byte_size(dtype, default=4)))
    return sites


def build_space(
    facts: PayloadFacts, target: Target, base: X86Params, fixes: Mapping[str, Any] | None = None
) -> SearchSpace:
    """The space for this payload on this target around ``base`` (the default choice)."""
    sites = sites_of(facts)
    if len(sites) != len(base.matmul):
        raise ConfigError(
            f"base params describe {len(base.matmul)} matmuls but the payload has {len(sites)}"
        )
    if not sites:
        raise EmptySearchSpaceError(
            "the payload has no linalg.matmul: nothing to tune", ["no tunable sites"]
        )
    return SearchSpace(base, sites, target, dict(fixes or {}))
