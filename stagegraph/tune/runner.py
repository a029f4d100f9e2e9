"""The tuner: propose candidates, measure them isolated (locally or on Dask), record each
in the DB as it finishes, and report the best against an interleaved baseline."""

from __future__ import annotations

import math
import sys
import time
from typing import Any

import numpy as np
from pydantic import Field

from stagegraph.app.session import Inspection
from stagegraph.core.ports import Schema
from stagegraph.stages.common.tuning_db import (
    CandidateResult,
    TuneDB,
    TuneKey,
    best_result,
    target_key,
)
from stagegraph.tune.options import TuneOptions


class Failure(Schema):
    params_hash: str
    reason: str | None
    detail: str | None


class Best(Schema):
    params: dict[str, Any]
    params_hash: str
    median_s: float
    #: The baseline's median measured beside this candidate (what ``speedup`` compares).
    baseline_median_s: float | None = None
    speedup: float
    speedup_low: float
    speedup_high: float
    confidence: float


class TuneReport(Schema):
    """What ``stagegraph tune --json`` prints."""

    graph: str
    workload: str
    target: str
    strategy: str
    cost_model: str
    db: str
    budget: int
    baseline: dict[str, Any]
    best: Best | None
    winner: bool
    message: str
    measured: int
    failed: int
    reused: int
    exhausted: bool = False
    interrupted: bool = False
    failures: list[Failure] = Field(default_factory=list)
    seconds: float
    #: The exact command lines to use the result (``use``) and to go on tuning (``resume``).
    commands: dict[str, str] = Field(default_factory=dict)
    #: Ops whose tuned values the ``tuned`` cost model now finds by their signature.
    tuned_ops: list[str] = Field(default_factory=list)


class Problem:
    """The payload's facts, the machine, the baseline params and the space around them.

    The params stage is found by its output type, its facts and target inputs by theirs:
    any graph with one cost-model stage can be tuned.
    """

    def __init__(self, options: TuneOptions) -> None:
        from stagegraph.app.session import Session
        from stagegraph.core.search_space import build_space
        from stagegraph.stages.analysis import PayloadFacts
        from stagegraph.stages.target import Target

        request = options.session
        session = Session(request.model_copy(update={"inspection": Inspection()}), cache=False)
        self.request = request
        self.graph, self.workload = session.graph, session.workload
        select, port = self.graph.params_output()
        result = session.compile(until=select.name)
        edges = self.graph.in_edges(select.name)
        inputs = {e.dst_port: result.value(e.src, e.src_port) for e in edges}
        self.facts = next((v for v in inputs.values() if isinstance(v, PayloadFacts)), None)
        # A CPU Target, else what the params stage takes as ``target`` (the GPU's facts).
        self.target = next((v for v in inputs.values() if isinstance(v, Target)),
                           inputs.get("target"))  # fmt: skip
        self.base = result.value(select.name, port.name)
        self.params_model = f"{port.type.__module__}:{port.type.__qualname__}"
        self.space = build_space(
            self.base, self.facts, self.target, options.fixes, per_op=options.per_op
        )
        self.key = TuneKey(
            workload=self.workload.spec, graph=request.graph, target=target_key(self.target)
        )


def explain(options: TuneOptions) -> dict[str, Any]:
    """The space (fields, domains, constraints) and its size; measures nothing."""
    problem = Problem(options)
    problem.space.require_nonempty()
    return {
        "graph": options.session.graph,
        "workload": problem.workload.spec,
        "baseline": problem.base.model_dump(mode="json"),
        **problem.space.describe(),
    }


def tune(options: TuneOptions, progress: bool = False) -> TuneReport:
    """Run the tuner; see the module docstring.

    Raises:
        EmptySearchSpaceError: the constraints conflict (named).
        ClusterUnreachableError: ``options.cluster`` cannot be reached (before the DB opens).
    """
    from stagegraph.tune.executor import make_executor
    from stagegraph.tune.interrupt import catch_interrupt
    from stagegraph.tune.search import make_strategy

    start = time.perf_counter()
    problem = Problem(options)
    problem.space.require_nonempty()
    strategy = make_strategy(options.strategy, problem.space, options.seed, options.budget)
    executor = make_executor(options.cluster, options.jobs)
    db = TuneDB(options.db)
    bar = _progress(options.budget, enabled=progress)
    counts = {"measured": 0, "failed": 0, "reused": 0}
    history: dict[str, CandidateResult] = {}
    seen: set[str] = set()
    exhausted = interrupted = False
    with catch_interrupt() as stop:
        try:
            workers = options.jobs if options.cluster is None else max(1, options.jobs)
            size = options.batch_size or max(1, min(4, math.ceil(options.budget / workers)))
            while sum(counts.values()) < options.budget:
                stop.check()
                want = min(options.budget - sum(counts.values()), size * workers)
                proposals = strategy.propose(want, seen, history)
                stop.check()  # a Ctrl-C during proposing may have been lost in a __del__
                if not proposals:
                    exhausted = True
                    break
                fresh = []
                for params in proposals:
                    h = params.content_hash()[:16]
                    known = db.get(problem.key, h)
                    if known is not None:
                        history[h] = known
                        counts["reused"] += 1
                        _tick(bar, counts, history)
                    else:
                        fresh.append(params.model_dump(mode="json"))
                tasks = _batch_tasks(options, problem, fresh, size, db, executor)
                for results in executor.run(tasks):
                    for result in results:
                        db.record(problem.key, result)
                        history[result.params_hash] = result
                        counts["measured" if result.status == "ok" else "failed"] += 1
                        _tick(bar, counts, history)
                    stop.check()
        except KeyboardInterrupt:
            interrupted = True  # every finished candidate is in the DB: report the best so far
        finally:
            if bar is not None:
                bar.close()
            try:
                executor.close()
            except KeyboardInterrupt:
                interrupted = True
            interrupted = interrupted or stop.requested
            if interrupted:  # workers record as they finish: results we had not collected yet
                for result in db.results(problem.key):
                    if result.params_hash not in history and result.params_hash in seen:
                        history[result.params_hash] = result
                        counts["measured" if result.status == "ok" else "failed"] += 1
            tuned_ops = _record_tuned_sites(db, problem, history)
            db.close()
    report = _report(options, problem, history, counts, exhausted, time.perf_counter() - start)
    return report.model_copy(update={"interrupted": interrupted, "tuned_ops": tuned_ops})


def _batch_tasks(
    options: TuneOptions,
    problem: Problem,
    fresh: list[dict[str, Any]],
    size: int,
    db: TuneDB,
    executor: Any,
) -> list[Any]:
    """The worker tasks measuring ``fresh`` candidates, ``size`` per task; a worker that
    shares this filesystem records its results in the DB itself."""
    from stagegraph.tune.worker import BatchTask

    return [
        BatchTask(
            session=problem.request.model_copy(update={"cost_model": None}),
            params_model=problem.params_model,
            key=problem.key,
            baseline=problem.base.model_dump(mode="json"),
            candidates=fresh[i : i + size],
            db=str(db.path) if executor.shares_filesystem else None,
            compile_timeout_s=options.compile_timeout_s,
            run_timeout_s=options.run_timeout_s,
            memory_bytes=options.memory_bytes,
            samples=options.samples,
            faults=options.faults,
            measure=options.measure,
        )
        for i in range(0, len(fresh), size)
    ]


def _record_tuned_sites(
    db: TuneDB, problem: Problem, history: dict[str, CandidateResult]
) -> list[str]:
    """Store the winner's values of every site under each op's signature, so the ``tuned``
    cost model finds them for the same op in any payload; [] without a winner."""
    found = best_result(list(history.values()))
    if found is None or found[1].low <= 1.0:
        return []
    from stagegraph.stages.common.tuning_db import TunedSite

    best, speedup = found
    space = problem.space
    params = type(space.base).model_validate(best.params)
    moves = getattr(params, "moves_upstream", None)
    if moves is not None and moves(space.base):
        return []  # measured on other ops than its sites describe (see with_candidate_params)
    values = space.values_of(params)
    # an exclusive site (a convolution's path) replays with its payload only: the stage
    # before the analysis that reads it looks the whole payload's winner up
    exclusive = {id(site) for site, declaration, _ in space.rules if declaration.exclusive}
    stored = []
    for site in space.sites:
        if id(site) in exclusive:
            continue
        varied = {v.field: values[n] for n, v in space.variables.items() if v.site is site}
        model = f"{site.model.__module__}:{site.model.__qualname__}"
        for op in site.ops:
            signature = op.signature() if hasattr(op, "signature") else None
            if not varied or signature is None:
                continue
            db.record_site(
                TunedSite(target=problem.key.target, graph=problem.key.graph, model=model,
                          signature=signature, site_values=varied, speedup=speedup.ratio,
                          speedup_low=speedup.low, speedup_high=speedup.high,
                          workload=problem.key.workload, params_hash=best.params_hash)
            )  # fmt: skip
            stored.append(signature)
    return stored


def commands_for(options: TuneOptions) -> dict[str, str]:
    """The command lines to use a tuning result and to resume the search (the DB keeps
    what was measured, and a seeded strategy proposes the same candidates again)."""
    import shlex

    request = options.session
    plugins = [arg for plugin in request.plugins for arg in ("--plugin", plugin)]
    common = []
    if request.target:
        common += ["--target", request.target]
    if request.threads:
        common += ["--threads", str(request.threads)]
    db = ["--db", options.db]
    use = ["stagegraph", *plugins, "bench", request.graph, request.workload, *common,
           "--cost-model", "tuned", *db]  # fmt: skip
    resume = ["stagegraph", *plugins, "tune", request.graph, request.workload, *common, *db,
              "--budget", str(options.budget), "--strategy", options.strategy,
              "--seed", str(options.seed), "--samples", str(options.samples)]  # fmt: skip
    if options.per_op:
        resume.append("--per-op")
    if options.measure:
        resume += ["--measure", options.measure]
    for key, value in options.fixes.items():
        resume += ["--fix", f"{key}={value}"]
    return {"use": shlex.join(use), "resume": shlex.join(resume)}


def _progress(total: int, enabled: bool) -> Any:
    if not enabled or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="tune", unit="cand", file=sys.stderr, leave=True)


def _tick(bar: Any, counts: dict[str, int], history: dict[str, CandidateResult]) -> None:
    if bar is None:
        return
    ok = [r.median_s for r in history.values() if r.status == "ok" and r.median_s]
    bar.update(1)
    bar.set_postfix(
        done=counts["measured"] + counts["reused"],
        failed=counts["failed"],
        best=f"{min(ok) * 1e3:.3f}ms" if ok else "-",
    )


def _report(
    options: TuneOptions,
    problem: Problem,
    history: dict[str, CandidateResult],
    counts: dict[str, int],
    exhausted: bool,
    seconds: float,
) -> TuneReport:
    results = list(history.values())
    base_samples = [x for r in results for x in r.baseline_samples]
    baseline = {
        "params": problem.base.model_dump(mode="json"),
        "params_hash": problem.base.content_hash()[:16],
        "median_s": float(np.median(base_samples)) if base_samples else None,
    }
    found = best_result(results)
    best, winner = None, False
    if found is None:
        message = "no candidate was measured successfully"
    else:
        result, r = found
        best = Best(
            params=result.params,
            params_hash=result.params_hash,
            median_s=result.median_s,
            baseline_median_s=float(np.median(result.baseline_samples)),
            speedup=r.ratio,
            speedup_low=r.low,
            speedup_high=r.high,
            confidence=r.confidence,
        )
        winner = r.low > 1.0
        message = (
            f"best candidate is {r.ratio:.3f}x the baseline's speed [{r.low:.3f}, {r.high:.3f}]"
            + ("" if winner else "; not better beyond the noise: keep the baseline")
        )
    failures = [
        Failure(params_hash=r.params_hash, reason=r.reason, detail=r.detail)
        for r in results
        if r.status != "ok"
    ]
    return TuneReport(
        graph=options.session.graph,
        workload=problem.workload.spec,
        target=problem.key.target,
        strategy=options.strategy,
        cost_model=problem.request.cost_model or "the graph's own",
        db=options.db,
        budget=options.budget,
        baseline=baseline,
        best=best,
        winner=winner,
        message=message,
        exhausted=exhausted,
        failures=failures,
        seconds=seconds,
        commands=commands_for(options),
        **counts,
    )
