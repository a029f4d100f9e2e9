"""A long compile shows its stage on a terminal; quick ones and --json runs show nothing."""

from __future__ import annotations

import io
import time
from types import SimpleNamespace

from stagegraph.instrument.progress import Progress


def _event(stage: str) -> SimpleNamespace:
    return SimpleNamespace(graph=SimpleNamespace(name="x86"),
                           stage=SimpleNamespace(name=stage, kind="schedule"))  # fmt: skip


def test_a_slow_stage_is_named_with_its_time_and_ops():
    out = io.StringIO()
    progress = Progress(out, delay_s=0.1)
    try:
        progress.before_stage(_event("schedule"))
        progress.ops_done(3, 10)
        time.sleep(0.6)
        shown = out.getvalue()
        assert "compiling x86: stage 'schedule' (schedule)" in shown and "ops 3/10" in shown
        progress.after_stage(_event("schedule"))
        assert out.getvalue().endswith("\r\x1b[2K")  # the line is cleared afterwards
    finally:
        progress.stop()


def test_a_quick_stage_prints_nothing():
    out = io.StringIO()
    progress = Progress(out, delay_s=5.0)
    progress.before_stage(_event("load"))
    progress.after_stage(_event("load"))
    time.sleep(0.3)
    progress.stop()
    assert out.getvalue() == ""


def test_json_and_pipes_get_no_progress(monkeypatch):
    from stagegraph.cli.options import progress_hooks

    assert progress_hooks(as_json=True) == []
    monkeypatch.setattr("sys.stderr", io.StringIO())  # not a terminal
    assert progress_hooks(as_json=False) == []


def test_work_before_the_first_stage_is_named():
    stream = io.StringIO()
    progress = Progress(stream, delay_s=0.0)
    progress.preparing("importing the workload model.py")
    time.sleep(0.6)
    progress.stop()
    assert "importing the workload model.py" in stream.getvalue()
