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
from stagegraph.core.ports import Schema
from stagegraph.stages.common.tuning_db import CandidateResult, TuneKey

FAULTS = ("segfault", "hang", "oom", "wrong")


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
    compile_timeout_s: float = 60.0
    run_timeout_s: float = 60.0
    memory_bytes: int | None = 4 * 2**30
    samples: int = 20
    faults: dict[str, str] = Field(default_factory=dict)

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
        while True:
            hoard.append(bytearray(256 * 2**20))


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


def _interleaved(base: Any, cand: Any, samples: int) -> tuple[list[float], list[float]]:
    """Alternate chunks of baseline and candidate so machine noise hits both alike."""
    import numpy as np

    base.measure(1, warmup=2)
    cand.measure(1, warmup=2)
    chunk = max(1, samples // 4)
    bs, cs = [], []
    for _ in range(4):
        bs.append(base.measure(chunk))
        cs.append(cand.measure(chunk))
    return np.concatenate(bs).tolist(), np.concatenate(cs).tolist()


def run_batch(task: BatchTask, work: str) -> int:
    """Child entry: evaluate every candidate of ``task``; results go to ``work``/results."""
    from stagegraph.app.bench import prepare
    from stagegraph.app.graph_options import with_fixed_params
    from stagegraph.app.session import Session

    out = Path(work)
    inspection = CandidateInspection(task)
    # Dumps and printed IR go to one folder per candidate (CandidateInspection), not one.
    request = task.session.model_copy(
        update={"inspection": Inspection(verify_each=task.session.inspection.verify_each,
                                         repro_dir=task.session.inspection.repro_dir)}
    )  # fmt: skip
    session = Session(request, extra_hooks=inspection.hooks())
    db = None
    if task.db:
        from stagegraph.stages.common.tuning_db import TuneDB

        db = TuneDB(task.db)

    def compile_params(params: dict[str, Any]) -> Any:
        inspection.start(params)
        graph = with_fixed_params(session.graph, params)
        return prepare(session.engine, graph, session.workload, None)

    _mark(out, "baseline", "compile")
    _alarm(task.compile_timeout_s)
    base = compile_params(task.baseline)
    _alarm(0)
    if not base.verdict.ok:
        from stagegraph.errors import BaselineError

        raise BaselineError(f"the baseline does not verify: {base.verdict.message}")
    import numpy as np

    _mark(out, "baseline", "run")
    _alarm(task.run_timeout_s)
    limit = run_limit(float(np.median(base.measure(3, warmup=1))), task.samples,
                      task.run_timeout_s)  # fmt: skip
    _alarm(0)
    for params in task.candidates:
        result = _evaluate(task, out, params, base, compile_params, limit)
        with (out / "results.jsonl").open("a") as handle:
            handle.write(result.model_dump_json() + "\n")
        if db is not None:
            db.record(task.key, result)
    _alarm(0)
    return len(task.candidates)


class CandidateInspection:
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

    def on_failure(self, event: Any, error: BaseException) -> str | None:
        return None


def _evaluate(
    task: BatchTask, out: Path, params: dict, base: Any, compile_params: Any, run_s: float
) -> Any:
    from stagegraph.errors import StageFailed

    phash = task.hash_of(params)
    common = {"params_hash": phash, "params": params}
    _mark(out, phash, "compile")
    measurement = None
    try:
        _alarm(task.compile_timeout_s)
        measurement = compile_params(params)
        _alarm(0)
        trace = measurement.result.trace
        timing = {"compile_s": trace.compile_seconds(), "executed": trace.executed()}
        fault = fault_for(task.faults, phash)
        if not measurement.verdict.ok or fault == "wrong":
            message = measurement.verdict.message if fault != "wrong" else "injected wrong result"
            return CandidateResult(
                status="failed", reason="wrong result", detail=message, **common, **timing
            )
        _mark(out, phash, "run")
        _alarm(run_s)
        if fault:
            _inject(fault)
        base_samples, samples = _interleaved(base, measurement, task.samples)
        _alarm(0)
        import numpy as np

        return CandidateResult(
            status="ok",
            samples=samples,
            baseline_samples=base_samples,
            median_s=float(np.median(samples)),
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
        del measurement
        with contextlib.suppress(Exception):
            import gc

            gc.collect()
