"""The tuning database: every candidate, recorded durably the moment it finishes.

SQLite (stdlib) in WAL mode, so isolated workers on this host can each insert their result
as soon as they have it while the tuner reads; a row's key is (workload spec, graph, target
hash, params hash), so a resumed run finds what was measured and measures nothing twice.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

from pydantic import Field

from stagegraph.core.ports import Schema
from stagegraph.errors import TuneDBError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS candidates (
    workload TEXT NOT NULL,
    graph TEXT NOT NULL,
    target TEXT NOT NULL,
    params_hash TEXT NOT NULL,
    params TEXT NOT NULL,
    status TEXT NOT NULL,
    reason TEXT,
    detail TEXT,
    samples TEXT NOT NULL,
    baseline_samples TEXT NOT NULL,
    median_s REAL,
    compile_s REAL,
    executed TEXT NOT NULL,
    created REAL NOT NULL,
    PRIMARY KEY (workload, graph, target, params_hash)
)
"""


def target_key(target: Any) -> str:
    """The part of a tuning DB key that names the machine, stable across processes: the
    target's fields with sets sorted (a frozenset dumps in hash-randomized order) and
    without the frequency, which /proc/cpuinfo reports as the current (fluctuating) clock
    on many hosts. ``"any"`` for a graph without a target stage."""
    import hashlib

    if target is None:
        return "any"
    fields = target.model_dump(mode="json", exclude={"frequency_ghz"})
    fields = {k: sorted(v) if isinstance(v, list) else v for k, v in fields.items()}
    data = json.dumps(fields, sort_keys=True)
    return hashlib.sha256(data.encode()).hexdigest()[:16]


_SITES_SCHEMA = """
CREATE TABLE IF NOT EXISTS tuned_sites (
    target TEXT NOT NULL,
    graph TEXT NOT NULL,
    model TEXT NOT NULL,
    signature TEXT NOT NULL,
    site_values TEXT NOT NULL,
    speedup REAL NOT NULL,
    speedup_low REAL NOT NULL,
    speedup_high REAL NOT NULL,
    workload TEXT NOT NULL,
    params_hash TEXT NOT NULL,
    created REAL NOT NULL,
    PRIMARY KEY (target, graph, model, signature)
)
"""


class TunedSite(Schema):
    """The tuned values of one op's params, found again by what the op is.

    ``signature`` says what the op is (kind, shape, element types: ``OpFacts.signature``),
    ``model`` which params model the values are fields of (``module:Class``); the values
    are only the fields the tuner varied, so the cost model's choice of the rest (threads,
    vector width) still applies. ``workload`` and ``params_hash`` say where they won, by
    ``speedup`` [``speedup_low``, ``speedup_high``] over the heuristic.
    """

    target: str
    graph: str
    model: str
    signature: str
    site_values: dict[str, Any]
    speedup: float
    speedup_low: float
    speedup_high: float
    workload: str
    params_hash: str


class TuneKey(Schema):
    """What a measurement is valid for."""

    workload: str
    graph: str
    target: str


class CandidateResult(Schema):
    """One candidate's outcome: ``status`` "ok" with paired samples, or "failed" with why."""

    params_hash: str
    params: dict[str, Any]
    status: str
    reason: str | None = None
    detail: str | None = None
    samples: list[float] = Field(default_factory=list)
    baseline_samples: list[float] = Field(default_factory=list)
    median_s: float | None = None
    compile_s: float | None = None
    executed: list[str] = Field(default_factory=list)


class TuneDB:
    """A handle on one database file (opened per process; cheap)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self.conn = sqlite3.connect(str(self.path), timeout=60, isolation_level=None)
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=FULL")
            self.conn.execute(_SCHEMA)
            self.conn.execute(_SITES_SCHEMA)
        except sqlite3.Error as exc:
            raise TuneDBError(f"cannot open tuning database {self.path}: {exc}") from None

    def close(self) -> None:
        self.conn.close()

    def record(self, key: TuneKey, result: CandidateResult) -> None:
        """Insert (first writer wins: a result already recorded is never replaced)."""
        row = (
            key.workload,
            key.graph,
            key.target,
            result.params_hash,
            json.dumps(result.params, sort_keys=True),
            result.status,
            result.reason,
            result.detail,
            json.dumps(result.samples),
            json.dumps(result.baseline_samples),
            result.median_s,
            result.compile_s,
            json.dumps(result.executed),
            time.time(),
        )
        try:
            self.conn.execute(
                "INSERT OR IGNORE INTO candidates VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)", row
            )
        except sqlite3.Error as exc:
            raise TuneDBError(f"cannot write to tuning database {self.path}: {exc}") from None

    def record_site(self, site: TunedSite) -> bool:
        """Keep ``site`` unless the op already has tuned values with a higher lower bound
        of the speedup; returns whether it was stored."""
        where = (site.target, site.graph, site.model, site.signature)
        try:
            found = self.conn.execute(
                "SELECT speedup_low FROM tuned_sites WHERE target = ? AND graph = ? AND "
                "model = ? AND signature = ?",
                where,
            ).fetchone()
            if found is not None and found[0] >= site.speedup_low:
                return False
            self.conn.execute(
                "INSERT OR REPLACE INTO tuned_sites VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (*where, json.dumps(site.site_values, sort_keys=True), site.speedup,
                 site.speedup_low, site.speedup_high, site.workload, site.params_hash,
                 time.time()),
            )  # fmt: skip
        except sqlite3.Error as exc:
            raise TuneDBError(f"cannot write to tuning database {self.path}: {exc}") from None
        return True

    def tuned_site(self, target: str, graph: str, model: str, signature: str) -> TunedSite | None:
        """The tuned values for an op with this signature, or None."""
        try:
            row = self.conn.execute(
                "SELECT site_values, speedup, speedup_low, speedup_high, workload, params_hash "
                "FROM tuned_sites WHERE target = ? AND graph = ? AND model = ? AND signature = ?",
                (target, graph, model, signature),
            ).fetchone()
        except sqlite3.Error as exc:
            raise TuneDBError(f"cannot read tuning database {self.path}: {exc}") from None
        if row is None:
            return None
        values, speedup, low, high, workload, params_hash = row
        return TunedSite(target=target, graph=graph, model=model, signature=signature,
                         site_values=json.loads(values), speedup=speedup, speedup_low=low,
                         speedup_high=high, workload=workload, params_hash=params_hash)  # fmt: skip

    def get(self, key: TuneKey, params_hash: str) -> CandidateResult | None:
        rows = self._select(key, "AND params_hash = ?", (params_hash,))
        return rows[0] if rows else None

    def results(self, key: TuneKey) -> list[CandidateResult]:
        return self._select(key, "", ())

    def _select(self, key: TuneKey, extra: str, args: tuple) -> list[CandidateResult]:
        query = (
            "SELECT params_hash, params, status, reason, detail, samples, baseline_samples, "
            "median_s, compile_s, executed FROM candidates "
            f"WHERE workload = ? AND graph = ? AND target = ? {extra} ORDER BY created"
        )
        try:
            rows = self.conn.execute(query, (key.workload, key.graph, key.target, *args))
            return [_result(r) for r in rows.fetchall()]
        except sqlite3.Error as exc:
            raise TuneDBError(f"cannot read tuning database {self.path}: {exc}") from None


def _result(row: tuple) -> CandidateResult:
    h, params, status, reason, detail, samples, base, median, compile_s, executed = row
    return CandidateResult(
        params_hash=h,
        params=json.loads(params),
        status=status,
        reason=reason,
        detail=detail,
        samples=json.loads(samples),
        baseline_samples=json.loads(base),
        median_s=median,
        compile_s=compile_s,
        executed=json.loads(executed),
    )


def best_result(results: list[CandidateResult]) -> tuple[CandidateResult, Any] | None:
    """The candidate with the highest paired speedup over the baseline measured beside it
    (robust to batches that ran while the machine was busier), and that speedup (a stats
    Ratio of medians baseline/candidate with its bootstrap interval)."""
    import numpy as np

    from stagegraph.runtime.stats import ratio

    ok = [r for r in results if r.status == "ok" and r.samples and r.baseline_samples]
    if not ok:
        return None
    best = max(ok, key=lambda r: float(np.median(r.baseline_samples) / np.median(r.samples)))
    return best, ratio(best.baseline_samples, best.samples, paired=True)
