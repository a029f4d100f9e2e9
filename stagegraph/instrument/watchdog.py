"""Default time limits for in-process runs: a hang ends the process, naming where it hung.

An MLIR transform, LLVM's code generation or the generated code itself can loop forever
inside native code, where no Python exception can reach it. The CLI's ``run`` and ``bench``
(without ``--isolate``, which has its own child-process limits) therefore install a
:class:`Watchdog`: a daemon thread that knows which stage (or which run of the compiled
code) is in progress and, when its deadline passes, writes one line naming it and the limit,
and ends the process with exit code 2. Only the command line installs it: a library caller's
process is never ended.

Compile time is measured from the first stage of a compilation to its emit stage; run time
from the end of emit (verification, then timing) until the command finishes or another
compilation starts.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable

from stagegraph.core.engine import Hook, StageEvent

EXIT_CODE = 2
_POLL_S = 0.1


class Watchdog(Hook):
    """An engine hook that bounds compile and run time (see the module docstring)."""

    def __init__(
        self,
        compile_s: float,
        run_s: float,
        write: Callable[[str], None] | None = None,
        exit: Callable[[int], None] = os._exit,
    ) -> None:
        self.compile_s, self.run_s = compile_s, run_s
        self._write = write or (lambda text: (sys.stderr.write(text + "\n"), sys.stderr.flush()))
        self._exit = exit
        self._lock = threading.Lock()
        self._what: str | None = None
        self._limit = ""
        self._deadline = float("inf")
        self._phase = "idle"
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="stagegraph-watchdog", daemon=True)
        self._thread.start()

    # -- phases ------------------------------------------------------------------------------

    def _arm(self, what: str, seconds: float, limit: str, keep_deadline: bool = False) -> None:
        with self._lock:
            self._what = what
            self._limit = limit
            if not keep_deadline:
                self._deadline = time.monotonic() + seconds

    def before_stage(self, event: StageEvent) -> None:
        what = f"stage {event.stage.name!r} of graph {event.graph.name!r}"
        limit = f"the compile time limit ({self.compile_s:g} s, --compile-timeout)"
        fresh = self._phase != "compile"
        self._phase = "compile"
        self._arm(what, self.compile_s, limit, keep_deadline=not fresh)

    def preparing(self, what: str) -> None:
        """Start the compile phase before the first stage: ``what`` (importing a PyTorch
        model) counts against the compile time limit, and the first stage keeps its
        deadline."""
        self._phase = "compile"
        limit = f"the compile time limit ({self.compile_s:g} s, --compile-timeout)"
        self._arm(what, self.compile_s, limit)

    def after_stage(self, event: StageEvent) -> None:
        if event.stage.kind == "emit":
            self.running(f"the code compiled by graph {event.graph.name!r}")

    def running(self, what: str) -> None:
        """Start the run phase: ``what`` is being verified or timed."""
        self._phase = "run"
        limit = f"the run time limit ({self.run_s:g} s, --run-timeout)"
        self._arm(f"running {what}", self.run_s, limit)

    def stop(self) -> None:
        """Disarm and end the thread (the command finished)."""
        self._stopped.set()
        with self._lock:
            self._deadline = float("inf")

    # -- the thread ----------------------------------------------------------------------------

    def _watch(self) -> None:
        while not self._stopped.wait(_POLL_S):
            with self._lock:
                expired = time.monotonic() > self._deadline
                what, limit = self._what, self._limit
            if expired:
                self._write(
                    f"error: {what} did not finish within {limit}; it was stopped. Rerun "
                    "with --isolate to run it in a child process with a reproducer of the "
                    "stage, or raise the limit."
                )
                self._stopped.set()
                self._exit(EXIT_CODE)
