"""Default time limits without --isolate: a hang ends the run naming the stage (or the run)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from stagegraph.instrument.watchdog import EXIT_CODE, Watchdog

HANGING = str(Path(__file__).parent / "data" / "hanging_graphs.py")


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    code = "from stagegraph.cli.main import run_main; run_main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize("command", ["run", "bench"])
def test_hanging_stage_is_named_and_stopped(command):
    start = time.monotonic()
    done = _cli(command, HANGING, "matmul:m=4,n=4,k=4", "--compile-timeout", "1")
    assert done.returncode == EXIT_CODE
    assert "stage 'sleepy' of graph 'hanging' did not finish" in done.stderr
    assert "compile time limit (1 s, --compile-timeout)" in done.stderr
    assert time.monotonic() - start < 60  # not the stage's hour


def test_hanging_run_is_named_and_stopped():
    done = _cli("run", HANGING, "matmul:m=4,n=4,k=4", "--run-timeout", "1",
                env={"STAGEGRAPH_TEST_HANG": "run"})  # fmt: skip
    assert done.returncode == EXIT_CODE
    assert "running the code compiled by graph 'hanging' did not finish" in done.stderr
    assert "run time limit (1 s, --run-timeout)" in done.stderr


def _event(stage: str, kind: str) -> SimpleNamespace:
    return SimpleNamespace(
        graph=SimpleNamespace(name="g"), stage=SimpleNamespace(name=stage, kind=kind)
    )


def test_compile_limit_spans_the_stages_of_one_compilation():
    """The compile deadline starts at the first stage, not at each one; emit starts the run."""
    lines: list[str] = []
    exits: list[int] = []
    dog = Watchdog(0.4, 30.0, write=lines.append, exit=exits.append)
    try:
        dog.before_stage(_event("a", "passes"))
        time.sleep(0.25)
        dog.before_stage(_event("b", "passes"))  # same compilation: the clock keeps running
        time.sleep(0.4)
        assert exits == [EXIT_CODE] and "stage 'b' of graph 'g'" in lines[0]
    finally:
        dog.stop()


def test_finished_commands_are_never_stopped():
    exits: list[int] = []
    dog = Watchdog(0.1, 0.1, write=lambda _: None, exit=exits.append)
    dog.before_stage(_event("a", "passes"))
    dog.after_stage(_event("emit", "emit"))
    dog.stop()
    time.sleep(0.3)
    assert exits == []
