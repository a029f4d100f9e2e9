"""``bench --vs iree``: IREE compiles and runs the same payload (needs the ``peers`` extra;
the tests that run IREE skip without it, the others run everywhere)."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from stagegraph.cli.main import main


@pytest.fixture
def iree() -> None:
    pytest.importorskip("iree.compiler")
    pytest.importorskip("iree.runtime")


class FakeClock:
    """A clock that the fake calls advance: no real time, so the arithmetic is exact."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def test_overhead_timer_subtracts_the_noop_median():
    from stagegraph.app.iree import OverheadTimer

    clock = FakeClock()
    overheads = iter(np.tile([9e-6, 10e-6, 11e-6, 10e-6, 50e-6], 1000))  # median 10 us
    noop = lambda: clock.advance(next(overheads))  # noqa: E731
    call = lambda: clock.advance(10e-6 + 40e-6)  # noqa: E731
    timer = OverheadTimer(call, noop, clock=clock, calls=101)
    assert timer.overhead_s == pytest.approx(10e-6)
    samples = timer.measure(7, warmup=2)
    assert samples.shape == (7,)
    assert samples == pytest.approx(np.full(7, 40e-6))


def test_overhead_timer_never_reports_a_negative_time():
    from stagegraph.app.iree import OverheadTimer

    clock = FakeClock()
    timer = OverheadTimer(lambda: clock.advance(1e-6), lambda: clock.advance(5e-6), clock, 11)
    assert (timer.measure(3) > 0).all()


def test_missing_extra_is_a_clear_error(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "iree.compiler", None)  # import raises ImportError
    code = main(["bench", "x86", "matmul:m=16,n=16,k=16", "--vs", "iree", "--budget", "0.1"])
    err = capsys.readouterr().err
    assert code == 2
    assert "pip install 'stagegraph[peers]'" in err


def test_target_flags_map_levels_to_cpu_and_exact_features():
    from stagegraph.app.iree import target_flags

    assert target_flags("host") == ["--iree-llvmcpu-target-cpu=host"]
    flags = target_flags("x86-64-v3")
    assert "--iree-llvmcpu-target-cpu=x86-64-v3" in flags
    features = next(f for f in flags if f.startswith("--iree-llvmcpu-target-cpu-features="))
    assert "+avx2" in features and "+fma" in features and "-avx512f" in features


def test_iree_matmul_verifies(iree):
    from stagegraph.app.iree import IreeMeasurement
    from stagegraph.app.session import open_workload

    measurement = IreeMeasurement(open_workload("matmul:m=32,n=48,k=16"), threads=1)
    assert measurement.verdict.ok, measurement.verdict.message
    assert 0 < measurement.overhead_s < 1e-3
    samples = measurement.measure(5, warmup=1)
    report = measurement.report(samples, 1)
    assert report.graph == "iree" and report.verified and report.samples == 5


def test_bench_vs_iree_reports_ratio(iree, capsys):
    code = main(["bench", "x86", "matmul:m=64,n=64,k=64", "--vs", "iree", "--json",
                 "--budget", "0.5"])  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert report["a"]["graph"] == "x86" and report["b"]["graph"] == "iree"
    assert report["a"]["verified"] and report["b"]["verified"]
    assert report["ratio_low"] <= report["ratio"] <= report["ratio_high"]


def test_iree_bf16_matmul_verifies(iree):
    """bf16 travels as uint16 bits in stagegraph and as ml_dtypes.bfloat16 in IREE."""
    from stagegraph.app.iree import IreeMeasurement
    from stagegraph.app.session import open_workload

    workload = open_workload("matmul:m=16,n=8,k=24,dtype=bf16")
    measurement = IreeMeasurement(workload, threads=1)
    assert measurement.verdict.ok, measurement.verdict.message
