"""The isolated side of tuning: one child compiles, verifies and times a batch of candidates.

The child keeps one :class:`~stagegraph.core.engine.Engine` for the whole batch, so the stages
upstream of the params (load, analysis, target) run once and are served from the memo
cache for every candidate; only ``select`` and what follows it re-run. The baseline is
compiled once and timed interleaved with each candidate (paired samples). Each phase has
its own alarm (compile / run timeout), and the child writes which candidate and phase it is
in, so when it dies the parent knows whom to blame. Each result is appended to a file (and
to the DB when it is on this host) the moment it is known.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import signal
from pathlib import Path
from typing import Any

from pydantic import Field

from stagegraph.app.session import Inspection, SessionRequest
from stagegraph.core.engine import Hook
from stagegraph.core.ports import Schema
from stagegraph.stages.common.tuning_db import CandidateResult, TuneKey
from stagegraph.tune.options import TuneOptions

FAULTS = ("segfault", "hang", "oom", "wrong")
_TUNE = TuneOptions.model_fields  # a task's limits default to the tune command's


class BatchTask(Schema):
    """Everything a worker needs to evaluate candidates (picklable, JSON-safe): the session
    whose graph and workload every candidate compiles, the params model (``module:Class``)
    candidates are validated and hashed with, and the measuring limits."""

    session: SessionRequest
    params_model: str
    key: TuneKey
    baseline: dict[str, Any]
    candidates: list[dict[str, Any]]
    db: str | None = None
    compile_timeout_s: float = _TUNE["compile_timeout_s"].default
    run_timeout_s: float = _TUNE["run_timeout_s"].default
    memory_bytes: int | None = _TUNE["memory_bytes"].default
    samples: int = _TUNE["samples"].default
    faults: dict[str, str] = Field(default_factory=dict)
    #: A registered stage of kind ``measure`` to time candidates with (default: the
    #: interleaved timer of :mod:`stagegraph.stages.common.measure`).
    measure: str | None = None

    def hash_of(self, params: dict[str, Any]) -> str:
        """The key of a candidate in the DB: its params' content hash (16 hex digits)."""
        return params_hash(params, self.params_model)


def params_hash(params: dict[str, Any], model: str) -> str:
    """Content hash of ``params`` validated by the params model ``module:Class``."""
    import importlib

    module, _, name = model.partition(":")
    cls = getattr(importlib.import_module(module), name)
    return cls.model_validate(params).content_hash()[:16]


def fault_for(faults: dict[str, str], phash: str) -> str | None:
    """The injected fault of a candidate: keyed by params-hash prefix, or ``*`` for all."""
    for key, kind in faults.items():
        if key == "*" or phash.startswith(key):
            return kind
    return None


def _inject(kind: str) -> None:
    """Test-only faults, triggered where the JIT-compiled code would run."""
    if kind == "segfault":
        ctypes.string_at(0)
    elif kind == "hang":
        while True:
            pass
    elif kind == "oom":
        hoard = []
        while True:  # bytes(n) maps zero pages untouched: hits RLIMIT_AS at once, even on a
            hoard.append(bytes(256 * 2**20))  # loaded machine (no run-time limit first)


def _mark(work: Path, phash: str, phase: str) -> None:
    (work / "progress").write_text(json.dumps({"params_hash": phash, "phase": phase}))


def _alarm(seconds: float) -> None:
    signal.alarm(max(1, math.ceil(seconds)) if seconds else 0)


#: A candidate's run phase may take this many times what the baseline's would (plus a floor
#: for process noise) before it is cut: a candidate that slow loses anyway, and a hang is
#: found in seconds, not at the fixed --run-timeout.
RUN_LIMIT_FACTOR = 10.0
RUN_LIMIT_FLOOR_S = 2.0


def run_limit(baseline_call_s: float, samples: int, cap_s: float) -> float:
    """Seconds a candidate's run phase may take: :data:`RUN_LIMIT_FACTOR` times the
    baseline's time for the same calls (warm-up and the interleaved samples of both
    variants), plus :data:`RUN_LIMIT_FLOOR_S`, never more than ``cap_s``."""
    calls = 2 * (samples + 3)
    return min(cap_s, RUN_LIMIT_FLOOR_S + RUN_LIMIT_FACTOR * baseline_call_s * calls)


class Candidate:
    """One candidate's run of the measuring graph: the graph's own stages with its params,
    then ``check`` and ``measure`` (:mod:`stagegraph.stages.common.measure`)."""

    def __init__(self, result: Any) -> None:
        from stagegraph.stages.common.measure import CHECK, MEASURE

        self.result = result
        self.verdict = result.value(CHECK, "verdict")
        self.binary = result.binary
        timing = result.values.get((MEASURE, "timing"))
        self.samples = list(timing.samples) if timing is not None else []
        self.baseline_samples = list(timing.baseline_samples) if timing is not None else []


class Measuring:
    """Compiles and measures candidates of one batch through the measuring graph, in one
    engine (stages upstream of the params are memoized), with the phase alarms."""

    def __init__(self, task: BatchTask, out: Path, inspection: CandidateInspection) -> None:
        from stagegraph.app.session import Session
        from stagegraph.core.ports import WorkloadRef

        request = task.session.model_copy(
            update={"inspection": Inspection(verify_each=task.session.inspection.verify_each,
                                             repro_dir=task.session.inspection.repro_dir)}
        )  # fmt: skip
        self.task, self.out, self.inspection = task, out, inspection
        self.phases = _Phases(task, out)
        self.session = Session(request, extra_hooks=[*inspection.hooks(), self.phases])
        self.workload = WorkloadRef(self.session.workload)
        self.timer = None
        if task.measure:
            from stagegraph.core.stage import get_factory

            self.timer = get_factory(task.measure)

    def graph(self, params: dict[str, Any]) -> Any:
        from stagegraph.app.bench import spliced
        from stagegraph.app.graph_options import with_candidate_params
        from stagegraph.stages.common.measure import measuring_graph

        fixed = with_candidate_params(self.session.graph, params, self.task.baseline)
        bench_graph, _ = spliced(fixed, None, self.session.workload.entry)
        return measuring_graph(bench_graph, self.timer, self.task.samples)

    def inputs(self, graph: Any, baseline: Any = None) -> dict[str, Any]:
        from stagegraph.core.ports import Module
        from stagegraph.stages.common.measure import BASELINE_INPUT, WORKLOAD_INPUT

        engine = self.session.engine
        module_input = next(n for n, i in graph.inputs.items() if issubclass(i.type, Module))
        values = {module_input: self.session.workload.payload(engine.context),
                  WORKLOAD_INPUT: self.workload}  # fmt: skip
        if baseline is not None and BASELINE_INPUT in graph.inputs:
            values[BASELINE_INPUT] = baseline
        return values

    def compile_baseline(self) -> Candidate:
        from stagegraph.stages.common.measure import CHECK

        self.inspection.start(self.task.baseline)
        graph = self.graph(self.task.baseline)
        self.phases.start("baseline", None)
        result = self.session.engine.run(graph, self.inputs(graph), until=CHECK)
        self.base_graph = graph
        return Candidate(result)

    def run(self, params: dict[str, Any], phash: str, baseline: Candidate, run_s: float) -> Any:
        """Compile, check and measure ``params``; a timer that measured no baseline is run
        again on the baseline, so both are timed by the same stage."""
        self.inspection.start(params)
        graph = self.graph(params)
        self.phases.start(phash, run_s)
        candidate = Candidate(self.session.engine.run(graph, self.inputs(graph, baseline.binary)))
        if candidate.verdict.ok and not candidate.baseline_samples:
            again = self.session.engine.run(
                self.base_graph, self.inputs(self.base_graph, baseline.binary)
            )
            candidate.baseline_samples = Candidate(again).samples
        _alarm(0)
        return candidate


class _Phases(Hook):
    """Engine hook: the compile alarm until the graph's ``measure`` stage, then the run
    alarm (and, in tests, the injected fault); marks the phase for the parent to blame."""

    def __init__(self, task: BatchTask, out: Path) -> None:
        self.task, self.out = task, out
        self.phash, self.run_s = "baseline", None

    def start(self, phash: str, run_s: float | None) -> None:
        self.phash, self.run_s = phash, run_s
        _mark(self.out, phash, "compile")
        _alarm(self.task.compile_timeout_s)

    def before_stage(self, event: Any) -> None:
        from stagegraph.stages.common.measure import MEASURE

        if event.stage.name != MEASURE or self.run_s is None:
            return
        _mark(self.out, self.phash, "run")
        _alarm(self.run_s)
        fault = fault_for(self.task.faults, self.phash)
        if fault and fault != "wrong":
            _inject(fault)


def run_batch(task: BatchTask, work: str) -> int:
    """Child entry: evaluate every candidate of ``task``; results go to ``work``/results."""
    from stagegraph.stages.common.bench_harness import bench_entry_name, run_benchmark

    out = Path(work)
    measuring = Measuring(task, out, CandidateInspection(task))
    db = None
    if task.db:
        from stagegraph.stages.common.tuning_db import TuneDB

        db = TuneDB(task.db)
    base = measuring.compile_baseline()
    _alarm(0)
    if not base.verdict.ok:
        from stagegraph.errors import BaselineError

        raise BaselineError(f"the baseline does not verify: {base.verdict.message}")
    import numpy as np

    _mark(out, "baseline", "run")
    _alarm(task.run_timeout_s)
    workload = measuring.session.workload
    calls = run_benchmark(base.binary, bench_entry_name(workload.entry), workload.inputs(), 1, 3)
    limit = run_limit(float(np.median(calls)), task.samples, task.run_timeout_s)
    _alarm(0)
    for params in task.candidates:
        result = _evaluate(task, out, params, base, measuring, limit)
        with (out / "results.jsonl").open("a") as handle:
            handle.write(result.model_dump_json() + "\n")
        if db is not None:
            db.record(task.key, result)
    _alarm(0)
    return len(task.candidates)


class CandidateInspection(Hook):
    """``--dump-ir``/``--print-ir-after`` in a tuning worker: the same hooks as ``run`` and
    ``bench``, writing into one folder per candidate (``DIR/<params hash>``)."""

    def __init__(self, task: BatchTask) -> None:
        from stagegraph.instrument.ir_hooks import DumpIR, PrintIR

        self.task = task
        self.inspection = task.session.inspection
        self._hooks: list[Any] = []
        self.dump: DumpIR | None = None
        self.printed: Path | None = None
        if self.inspection.print_ir_after:
            self._hooks.append(PrintIR(list(self.inspection.print_ir_after), self._write))
        self._dump_class = DumpIR

    def _write(self, text: str) -> None:
        if self.printed is not None:
            with self.printed.open("a") as handle:
                handle.write(text)

    def hooks(self) -> list[Any]:
        return [*self._hooks, self]

    def start(self, params: dict[str, Any]) -> None:
        if self.inspection.dump_ir is None:
            return
        folder = Path(self.inspection.dump_ir) / self.task.hash_of(params)
        self.dump = self._dump_class(folder)
        self.printed = folder / "printed.mlir" if self.inspection.print_ir_after else None

    # Hook protocol: forward to the current candidate's IR dump.
    def before_stage(self, event: Any) -> None:
        if self.dump is not None:
            self.dump.before_stage(event)

    def after_stage(self, event: Any) -> None:
        if self.dump is not None:
            self.dump.after_stage(event)


def _evaluate(
    task: BatchTask, out: Path, params: dict, base: Candidate, measuring: Measuring, run_s: float
) -> Any:
    from stagegraph.errors import StageFailed

    phash = task.hash_of(params)
    common = {"params_hash": phash, "params": params}
    candidate = None
    try:
        candidate = measuring.run(params, phash, base, run_s)
        records = [r for r in candidate.result.trace.records if r.kind != "measure"]
        timing = {"compile_s": sum(r.seconds for r in records),
                  "executed": [r.name for r in records if not r.cached]}  # fmt: skip
        fault = fault_for(task.faults, phash)
        if not candidate.verdict.ok or fault == "wrong":
            message = candidate.verdict.message if fault != "wrong" else "injected wrong result"
            return CandidateResult(
                status="failed", reason="wrong result", detail=message, **common, **timing
            )
        if not candidate.samples or not candidate.baseline_samples:
            return CandidateResult(status="failed", reason="not measured",
                                   detail="the measure stage returned no samples",
                                   **common, **timing)  # fmt: skip
        import numpy as np

        return CandidateResult(
            status="ok",
            samples=candidate.samples,
            baseline_samples=candidate.baseline_samples,
            median_s=float(np.median(candidate.samples)),
            **common,
            **timing,
        )
    except MemoryError:
        _alarm(0)
        return CandidateResult(status="failed", reason="memory", detail="MemoryError", **common)
    except StageFailed as exc:
        _alarm(0)
        reason = "invalid IR" if exc.diagnostics else "compile error"
        detail = f"stage {exc.stage!r}: {exc.reason.splitlines()[0] if exc.reason else ''}"
        return CandidateResult(status="failed", reason=reason, detail=detail, **common)
    except Exception as exc:
        _alarm(0)
        detail = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return CandidateResult(status="failed", reason="exception", detail=detail, **common)
    finally:
        del candidate
        with contextlib.suppress(Exception):
            import gc

            gc.collect()
