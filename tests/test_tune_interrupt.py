"""Ctrl-C during tuning is never lost, even when its KeyboardInterrupt is raised inside a
destructor (z3 frees ASTs in ``__del__``), where Python prints and drops it."""

from __future__ import annotations

import signal

import pytest

from stagegraph.app.session import SessionRequest
from stagegraph.tune.interrupt import catch_interrupt

SMALL = "matmul:m=64,n=64,k=64"


class InterruptsInDestructor:
    """Deleting it delivers SIGINT while ``__del__`` runs (the handler runs there too)."""

    def __del__(self) -> None:
        signal.raise_signal(signal.SIGINT)
        for _ in range(100):  # bytecodes for the handler to run in, still inside __del__
            pass


def _lose_an_interrupt() -> None:
    InterruptsInDestructor()  # freed at once: its KeyboardInterrupt is "ignored"


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_flag_keeps_an_interrupt_lost_in_a_destructor():
    with catch_interrupt() as stop:
        try:
            _lose_an_interrupt()
        except KeyboardInterrupt:  # pragma: no cover - the premise of the test failed
            pytest.fail("the interrupt was raised outside __del__")
        # Python dropped the exception (pytest reports it as an unraisable exception) ...
        assert stop.requested
        with pytest.raises(KeyboardInterrupt):  # ... and the flag raises it again
            stop.check()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_tune_stops_at_an_interrupt_lost_while_proposing(monkeypatch, tmp_path):
    """The tuner checks the flag after proposing: it reports the run as interrupted instead
    of measuring its whole budget."""
    import importlib

    from stagegraph.tune.runner import TuneOptions, tune

    search = importlib.import_module("stagegraph.tune.search")

    real = search.make_strategy

    class LosesAnInterrupt:
        def __init__(self, *args) -> None:
            self.inner = real(*args)

        def propose(self, *args):
            _lose_an_interrupt()
            return self.inner.propose(*args)

    monkeypatch.setattr(search, "make_strategy", LosesAnInterrupt)
    options = TuneOptions(
        session=SessionRequest(graph="x86", workload=SMALL),
        budget=3,
        db=str(tmp_path / "i.db"),
        samples=4,
        strategy="random",
    )
    report = tune(options)
    assert report.interrupted
    assert report.measured + report.failed == 0
