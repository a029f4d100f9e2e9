"""Visible progress for long compiles: after ``delay_s`` in one stage, a status line on the
terminal names the stage and how long it has run (and, where a stage reports it, how many of
its ops are done). Only the CLI installs it, only when stderr is a terminal and no
``--json`` was asked for, so scripts and JSON output see nothing extra.
"""

from __future__ import annotations

import threading
import time
from typing import TextIO

from stagegraph.core.engine import Hook, StageEvent

_POLL_S = 0.25


class Progress(Hook):
    """An engine hook drawing ``compiling <graph>: stage 'X' (kind) 12.3 s`` on ``stream``."""

    def __init__(self, stream: TextIO, delay_s: float = 2.0) -> None:
        self.stream, self.delay_s = stream, delay_s
        self._lock = threading.Lock()
        self._label: str | None = None
        self._started = 0.0
        self._done: tuple[int, int] | None = None
        self._shown = False
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._draw, name="stagegraph-progress", daemon=True)
        self._thread.start()

    def before_stage(self, event: StageEvent) -> None:
        with self._lock:
            self._label = (
                f"compiling {event.graph.name}: stage {event.stage.name!r} ({event.stage.kind})"
            )
            self._started = time.monotonic()
            self._done = None

    def preparing(self, what: str) -> None:
        """Work before the first stage (importing a PyTorch model) shows as ``what``."""
        with self._lock:
            self._label = what
            self._started = time.monotonic()
            self._done = None

    def after_stage(self, event: StageEvent) -> None:
        with self._lock:
            self._label = None
        self._clear()

    def ops_done(self, done: int, total: int) -> None:
        """A stage working op by op reports how far it is."""
        with self._lock:
            self._done = (done, total)

    def stop(self) -> None:
        self._stopped.set()
        self._clear()

    def _clear(self) -> None:
        with self._lock:
            if self._shown:
                self.stream.write("\r\x1b[2K")
                self.stream.flush()
                self._shown = False

    def _draw(self) -> None:
        while not self._stopped.wait(_POLL_S):
            with self._lock:
                if self._label is None:
                    continue
                elapsed = time.monotonic() - self._started
                if elapsed < self.delay_s:
                    continue
                ops = f", ops {self._done[0]}/{self._done[1]}" if self._done else ""
                self.stream.write(f"\r\x1b[2K{self._label} {elapsed:.0f} s{ops}")
                self.stream.flush()
                self._shown = True
