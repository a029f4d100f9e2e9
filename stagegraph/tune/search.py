"""Search strategies: which candidates of the space to measure next.

* ``random``: the space's seeded solution stream, in order (deterministic per seed, so a
  resumed run proposes the same candidates and finds them in the DB);
* ``model``: a learned ranking, as TVM's MetaSchedule and Ansor do: random solutions and
  neighbours of the baseline and of the fastest candidates are ranked by a regression of
  the measured log-speedups on the candidates' values (refit after every batch of
  measurements; failures count as very slow), and most of each batch is the predicted
  best, the rest random to keep exploring;
* ``evolve``: mutations of the fastest measured candidates (one variable moved, the
  others repaired by the solver), topped up from the stream.

Strategies see only the space's variables and domains: they work for any params model.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator
from itertools import islice
from typing import Any

import numpy as np

from stagegraph.core.search_space import SearchSpace
from stagegraph.core.tunable import Choice
from stagegraph.stages.common.tuning_db import CandidateResult

STRATEGIES = ("random", "model", "evolve")


def _params_stream(space: SearchSpace, seed: int) -> Iterator[Any]:
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

    def propose(self, n: int, seen: set[str], history: dict[str, CandidateResult]) -> list[Any]:
        return _take(self.stream, n, seen)


def _take(source: Iterator[Any], n: int, seen: set[str]) -> list[Any]:
    out: list[Any] = []
    if n <= 0:
        return out
    for params in source:
        h = params.content_hash()[:16]
        if h in seen:
            continue
        seen.add(h)
        out.append(params)
        if len(out) >= n:
            break
    return out


def log_speedup(result: CandidateResult) -> float | None:
    """log(baseline median / candidate median) of a measured candidate (None if failed)."""
    if result.status != "ok" or not result.samples or not result.baseline_samples:
        return None
    return math.log(float(np.median(result.baseline_samples)) / float(np.median(result.samples)))


class LearnedRanking:
    """Ridge regression of log-speedup on features of a candidate's values.

    Features per variable: its value scaled to its domain, the log of it, and (for a
    choice) a one-hot of its position, plus pairwise products of the scaled values of the
    same site (tiles interact). Refit from scratch on every call: histories are small.
    """

    def __init__(self, space: SearchSpace, alpha: float = 1.0) -> None:
        self.space, self.alpha = space, alpha
        self.names = list(space.variables)
        self.weights: np.ndarray | None = None

    def features(self, values: dict[str, int]) -> np.ndarray:
        scaled, extra = [], []
        for name in self.names:
            dom = self.space.variables[name].domain
            value = values.get(name, 0)
            if isinstance(dom, Choice):
                low, high = (dom.values[0], dom.values[-1]) if dom.values else (0, 1)
                extra += [1.0 if value == v else 0.0 for v in dom.values]
            else:
                low, high = dom.low, dom.high
            scaled.append((value - low) / max(1, high - low))
            extra.append(math.log2(1 + max(0, value)))
        pairs = [a * b for i, a in enumerate(scaled) for b in scaled[i + 1 :]]
        return np.array([1.0, *scaled, *extra, *pairs])

    def fit(self, rows: list[tuple[dict[str, int], float]]) -> bool:
        if len(rows) < 3:
            self.weights = None
            return False
        x = np.stack([self.features(v) for v, _ in rows])
        y = np.array([s for _, s in rows])
        ridge = self.alpha * np.eye(x.shape[1])
        ridge[0, 0] = 0.0  # no penalty on the intercept
        self.weights = np.linalg.solve(x.T @ x + ridge, x.T @ y)
        return True

    def predict(self, values: dict[str, int]) -> float:
        return 0.0 if self.weights is None else float(self.features(values) @ self.weights)


class Mutator:
    """Neighbours of a solution: one variable moved (to an adjacent choice, or halved,
    doubled, stepped), the others repaired by the solver to the nearest valid values."""

    def __init__(self, space: SearchSpace, rng: random.Random) -> None:
        self.space, self.rng = space, rng

    def step(self, name: str, value: int) -> int:
        dom = self.space.variables[name].domain
        if isinstance(dom, Choice):
            if not dom.values:
                return value
            i = min(range(len(dom.values)), key=lambda j: abs(dom.values[j] - value))
            return dom.values[max(0, min(len(dom.values) - 1, i + self.rng.choice([-1, 1])))]
        moved = self.rng.choice([value // 2, value * 2, value - 1, value + 1, value - 2, value + 2])
        return min(dom.high, max(dom.low, moved))

    def mutants(self, parents: list[Any], tries: int) -> Iterator[Any]:
        for _ in range(tries):
            parent = self.rng.choice(parents)
            values = self.space.values_of(parent)
            name = self.rng.choice(list(values))
            moved = self.step(name, values[name])
            if moved == values[name]:
                continue
            repaired = self.space.repair(values, {name: moved})
            if repaired is None:
                continue
            try:
                yield self.space.to_params(repaired)
            except ValueError:
                continue


def _fastest(history: dict[str, CandidateResult], model: type, count: int) -> list[Any]:
    """The ``count`` measured candidates with the best speedup over the baseline."""
    ranked = sorted(
        (r for r in history.values() if log_speedup(r) is not None),
        key=lambda r: -(log_speedup(r) or 0.0),
    )
    return [model.model_validate(r.params) for r in ranked[:count]]


class ModelStrategy(Strategy):
    """Measure what the learned ranking predicts fastest among random solutions and
    neighbours of the baseline and of the fastest candidates; explore with the rest.

    Before any measurement the ranking knows nothing, so the first batch is half
    neighbours of the baseline (the cost model's choice is a good place to start) and
    half random solutions."""

    #: Share of each batch drawn at random (exploration), once the ranking has data.
    EXPLORE = 0.25

    def __init__(self, space: SearchSpace, seed: int = 0, budget: int = 0) -> None:
        super().__init__(space, seed, budget)
        self.rng = random.Random(seed)
        self.mutator = Mutator(space, self.rng)
        self.ranking = LearnedRanking(space)
        self.pool: list[Any] = list(islice(self.stream, max(32, 4 * budget)))

    def _training_rows(self, history: dict[str, CandidateResult]) -> list[tuple[dict, float]]:
        rows, failed = [], []
        model = type(self.space.base)
        for result in history.values():
            try:
                values = self.space.values_of(model.model_validate(result.params))
            except ValueError:
                continue
            gain = log_speedup(result)
            (rows if gain is not None else failed).append((values, gain))
        if rows:
            worst = min(g for _, g in rows) - math.log(2.0)  # a failure: worse than any
            rows += [(v, worst) for v, _ in failed]
        return rows

    def propose(self, n, seen, history):  # type: ignore[override]
        trained = self.ranking.fit(self._training_rows(history))
        parents = [self.space.base, *_fastest(history, type(self.space.base), 3)]
        neighbours = [p for p in self.mutator.mutants(parents, 6 * n)
                      if p.content_hash()[:16] not in seen]  # fmt: skip
        fresh = [p for p in self.pool if p.content_hash()[:16] not in seen]
        if not trained:
            picked = _take(iter(neighbours), (n + 1) // 2, seen)
        else:
            explore = max(1, round(n * self.EXPLORE)) if n > 1 else 0
            candidates = neighbours + fresh
            ranked = sorted(
                candidates, key=lambda p: -self.ranking.predict(self.space.values_of(p))
            )
            picked = _take(iter(ranked), n - explore, seen)
        rest = [p for p in fresh if p.content_hash()[:16] not in seen]
        self.rng.shuffle(rest)
        picked += _take(iter(rest), n - len(picked), seen)
        chosen = {p.content_hash()[:16] for p in picked}
        self.pool = [p for p in self.pool if p.content_hash()[:16] not in chosen]
        self.pool += list(islice(self.stream, len(picked)))  # keep the pool full
        return picked + _take(self.stream, n - len(picked), seen)


class EvolveStrategy(Strategy):
    """Mutate the best measured candidates; random solutions until there are some."""

    def __init__(self, space: SearchSpace, seed: int = 0, budget: int = 0) -> None:
        super().__init__(space, seed, budget)
        self.mutator = Mutator(space, random.Random(seed))

    def propose(self, n, seen, history):  # type: ignore[override]
        parents = _fastest(history, type(self.space.base), 3)
        out = _take(self.mutator.mutants(parents, 40 * len(parents)), n, seen) if parents else []
        return out + _take(self.stream, n - len(out), seen) if len(out) < n else out


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
