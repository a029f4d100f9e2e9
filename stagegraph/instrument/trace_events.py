"""Chrome trace events of every stage of every process (``--trace FILE.json``).

Each process that opens a session with a ``trace_file`` appends one complete event
(``"ph": "X"``) per stage to its own part file, ``FILE.json.parts/<pid>.jsonl``, as the stage
ends: the isolated child, tune workers and MPI ranks write theirs beside the parent's, and
a crashing child keeps what it finished. The command that started them merges the parts
into ``FILE.json`` (``{"traceEvents": [...]}``, which Perfetto and ``chrome://tracing``
open). Timestamps are wall-clock microseconds, so processes line up.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from stagegraph.core.engine import Hook, StageEvent, StageRecord, Trace

#: Set by a command with ``--trace`` for the processes it starts that take no session
#: request (MPI ranks); they add their own :class:`TraceEvents`.
TRACE_ENV = "STAGEGRAPH_TRACE"


def env_hook(label: str | None = None) -> TraceEvents | None:
    """A :class:`TraceEvents` for ``$STAGEGRAPH_TRACE``, or None when it is not set."""
    path = os.environ.get(TRACE_ENV)
    return TraceEvents(path, label) if path else None


def parts_folder(trace_file: str | Path) -> Path:
    return Path(f"{trace_file}.parts")


def _now_us() -> float:
    return time.time_ns() / 1000.0


class TraceEvents(Hook):
    """Records stage begin/end as Chrome trace events in this process's part file.

    Args:
        trace_file: the merged file the command writes at the end.
        label: the process's name in the viewer (default ``stagegraph <pid>``; MPI ranks
            say ``rank N``).
    """

    def __init__(self, trace_file: str | Path, label: str | None = None) -> None:
        self.trace_file = str(trace_file)
        self.label = label
        self._begin: dict[tuple[int, str], float] = {}
        self._named = False

    def _write(self, events: list[dict[str, Any]]) -> None:
        pid = os.getpid()
        folder = parts_folder(self.trace_file)
        if not self._named:
            self._named = True
            label = self.label or f"stagegraph {pid}"
            events = [
                {"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                 "args": {"name": label}},
                *events,
            ]  # fmt: skip
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with open(folder / f"{pid}.jsonl", "a", encoding="utf-8") as handle:
                handle.write("".join(json.dumps(e) + "\n" for e in events))
        except OSError:
            pass  # tracing never fails a run; the merge reports a missing file

    def before_stage(self, event: StageEvent) -> None:
        self._begin[(threading.get_ident(), event.stage.name)] = _now_us()

    def _event(self, event: StageEvent, args: dict[str, Any]) -> dict[str, Any]:
        end = _now_us()
        start = self._begin.pop((threading.get_ident(), event.stage.name), end)
        return {
            "name": event.stage.name,
            "cat": event.stage.kind,
            "ph": "X",
            "ts": start,
            "dur": max(end - start, 0.0),
            "pid": os.getpid(),
            "tid": threading.get_native_id(),
            "args": {
                "graph": event.graph.name,
                "factory": event.stage.factory_name,
                "inputs": sorted(
                    f"{e.src}.{e.src_port}" for e in event.graph.in_edges(event.stage.name)
                ),
                **args,
            },
        }

    def after_stage(self, event: StageEvent) -> None:
        record = event.record
        args: dict[str, Any] = {"cached": bool(record and record.cached)}
        if record is not None:
            args |= {"level_in": record.level_in, "level_out": record.level_out}
        self._write([self._event(event, args)])

    def on_failure(self, event: StageEvent, error: BaseException) -> str | None:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        self._write([self._event(event, {"failed": reason})])
        return None


def merge(trace_file: str | Path) -> int:
    """Merge every process's part file into ``trace_file``; returns the event count."""
    folder = parts_folder(trace_file)
    events: list[dict[str, Any]] = []
    for part in sorted(folder.glob("*.jsonl")) if folder.is_dir() else []:
        for line in part.read_text(encoding="utf-8").splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                continue  # a line cut short by a killed child
    events.sort(key=lambda e: (e.get("ph") != "M", e.get("ts", 0)))
    Path(trace_file).write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
    shutil.rmtree(folder, ignore_errors=True)
    return sum(1 for e in events if e.get("ph") == "X")


@contextmanager
def collecting(trace_file: str | None) -> Iterator[None]:
    """Around a command: clear stale parts, then merge whatever the processes wrote."""
    if not trace_file:
        yield
        return
    shutil.rmtree(parts_folder(trace_file), ignore_errors=True)
    previous = os.environ.get(TRACE_ENV)
    os.environ[TRACE_ENV] = str(trace_file)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(TRACE_ENV, None)
        else:
            os.environ[TRACE_ENV] = previous
        merge(trace_file)


def _read_events(path: str | Path) -> list[dict[str, Any]]:
    from stagegraph.errors import StagegraphError

    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise StagegraphError(f"cannot read trace {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise StagegraphError(f"trace {path} is not JSON: {exc}") from None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise StagegraphError(f"trace {path} has no traceEvents list (Chrome trace format)")
    return [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and "name" in e]


def executed_graph(graph: Any, path: str | Path) -> Any:
    """``graph`` with the stages a run added to it put back where they ran: a stage of the
    trace the graph lacks (the benchmark wrapper ``bench``), from a registered factory and
    fed by one node of the graph, is spliced after that node (with its default config)."""
    from stagegraph.core.stage import get_factory
    from stagegraph.errors import StagegraphError

    added: dict[str, dict[str, Any]] = {}
    for e in _read_events(path):
        args = e.get("args") or {}
        if e["name"] not in graph.stages and e["name"] not in graph.inputs and args.get("inputs"):
            added.setdefault(e["name"], args)
    for name, args in added.items():
        sources = {i.partition(".")[0] for i in args["inputs"]}
        if len(sources) != 1 or not (sources <= {*graph.stages, *graph.inputs}):
            continue
        try:
            stage = get_factory(str(args.get("factory")))(name)
            graph = graph.splice(after=sources.pop(), stage=stage)
        except StagegraphError:
            continue  # drawn without it
    return graph


def load_trace(path: str | Path, graph: str) -> Trace:
    """A :class:`Trace` of the stage events in a Chrome trace file, one record per stage
    name (the mean time over the processes and runs that executed it; ``cached`` when every
    one was served from the cache), for drawing timings on ``graph``."""
    by_stage: dict[str, list[dict[str, Any]]] = {}
    for e in _read_events(path):
        by_stage.setdefault(e["name"], []).append(e)
    records = [
        StageRecord(
            name=name,
            kind=str(found[0].get("cat", "")),
            seconds=sum(float(e.get("dur", 0)) for e in found) / len(found) / 1e6,
            cached=all((e.get("args") or {}).get("cached") for e in found),
        )
        for name, found in by_stage.items()
    ]
    return Trace(graph=graph, records=tuple(records))
