"""Ctrl-C that a long tuning run cannot lose.

Python turns SIGINT into a ``KeyboardInterrupt`` raised wherever the main thread happens to
be. When that is inside a ``__del__`` (z3 frees its ASTs there while the search space
proposes candidates), the exception is printed as "Exception ignored" and dropped, and the
run carries on to the end of its budget. :func:`catch_interrupt` also records the signal in
a flag that the tuner checks between steps, so the interrupt takes effect at the next one.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class InterruptFlag:
    """Whether SIGINT arrived since :func:`catch_interrupt` began."""

    def __init__(self) -> None:
        self.requested = False

    def check(self) -> None:
        """Raise ``KeyboardInterrupt`` if SIGINT arrived (even if its exception was lost)."""
        if self.requested:
            raise KeyboardInterrupt


@contextmanager
def catch_interrupt() -> Iterator[InterruptFlag]:
    """Record SIGINT in the yielded flag, then handle it as before (Python's handler raises
    ``KeyboardInterrupt``).

    Off the main thread (where no handler can be set) and where SIGINT is ignored (a
    shell's background job), the flag just stays down and nothing else changes.
    """
    flag = InterruptFlag()
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or previous is signal.SIG_IGN:
        yield flag
        return

    def record(number: int, frame: object) -> None:
        flag.requested = True
        if callable(previous):
            previous(number, frame)  # Python's default_int_handler raises KeyboardInterrupt
        else:  # SIG_DFL: what Python does when it has no handler of its own
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, record)
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)
