"""Search strategies: which candidates of the space to measure next.

* ``random``: the space's seeded solution stream, in order (deterministic per seed, so a
  resumed run proposes the same candidates and finds them in the DB);
* ``model``: a pool from the stream ranked by the analytical (roofline) estimate, best first;
* ``evolve``: mutations of the fastest measured candidates (one field at a time, kept only
  when the solver says they are in the space), topped up from the stream.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from itertools import islice

from stagegraph.stages.common.tuning_db import CandidateResult
from stagegraph.stages.x86.space import SearchSpace
from stagegraph.stages.x86.stages import X86Params

STRATEGIES = ("random", "model", "evolve")


def _params_stream(space: SearchSpace, seed: int) -> Iterator[X86Params]:
    for values in space.stream(seed):
        try:
            yield space.to_params(values)
        except ValueError:  # the model rejects what the declared constraints missed
            continue


class Strategy:
    """Proposes up to ``n`` params not yet ``seen`` (by hash); fewer when the space runs dry."""

    def __init__(self, space: SearchSpace, seed: int = 0, budget: int = 0) -> None:
        self.space, self.seed, self.budget = space, seed, budget
        self.stream = _params_stream(space, seed)

    def propose(
        self, n: int, seen: set[str], history: dict[str, CandidateResult]
    ) -> list[X86Params]:
        return _take(self.stream, n, seen)


def _take(source: Iterator[X86Params], n: int, seen: set[str]) -> list[X86Params]:
    out: list[X86Params] = []
    for params in source:
        h = params.content_hash()[:16]
        if h in seen:
            continue
        seen.add(h)
        out.append(params)
        if len(out) >= n:
            break
    return out


class ModelStrategy(Strategy):
    """Rank a pool of solutions with the roofline estimate; measure the most promising."""

    def __init__(self, space: SearchSpace, seed: int = 0, budget: int = 0) -> None:
        super().__init__(space, seed, budget)
        from stagegraph.stages.x86.roofline import estimate_seconds

        def cost(p: X86Params) -> float:
            return sum(
                estimate_seconds(mm, s.m, s.n, s.k, s.elem, space.target)
                for mm, s in zip(p.matmul, space.sites, strict=True)
            )

        pool = list(islice(self.stream, max(64, 8 * budget)))
        self.ranked = iter(sorted(pool, key=cost))

    def propose(self, n, seen, history):  # type: ignore[override]
        return _take(self.ranked, n, seen) or _take(self.stream, n, seen)


class EvolveStrategy(Strategy):
    """Mutate the best measured candidates; random solutions until there are some."""

    def __init__(self, space: SearchSpace, seed: int = 0, budget: int = 0) -> None:
        super().__init__(space, seed, budget)
        self.rng = random.Random(seed)

    def propose(self, n, seen, history):  # type: ignore[override]
        ok = sorted(
            (r for r in history.values() if r.status == "ok" and r.median_s),
            key=lambda r: r.median_s,
        )
        parents = [X86Params.model_validate(r.params) for r in ok[:3]]
        out = _take(self._mutants(parents), n, seen) if parents else []
        return out + _take(self.stream, n - len(out), seen) if len(out) < n else out

    def _mutants(self, parents: list[X86Params]) -> Iterator[X86Params]:
        for _ in range(40 * len(parents)):
            parent = self.rng.choice(parents)
            values = self.space.values_of(parent)
            name = self.rng.choice(list(values))
            dom = self.space.domains[name]
            step = self.rng.choice([0.5, 2.0, -1, 1])
            new = int(values[name] * step) if step in (0.5, 2.0) else values[name] + int(step)
            values[name] = min(dom.high, max(dom.low, new))
            if self.space.contains(values):
                try:
                    yield self.space.to_params(values)
                except ValueError:
                    continue


def make_strategy(name: str, space: SearchSpace, seed: int, budget: int) -> Strategy:
    from stagegraph.errors import ConfigError, unknown_name_message

    makers: dict[str, Callable[..., Strategy]] = {
        "random": Strategy,
        "model": ModelStrategy,
        "evolve": EvolveStrategy,
    }
    if name not in makers:
        raise ConfigError(unknown_name_message("search strategy", name, makers))
    return makers[name](space, seed, budget)
