"""benchmarks/variants_vs_torch.py: what ``--before`` changes, the environment switch it
sets only while the before build compiles, and the calls per round."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

import numpy as np

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "variants_vs_torch.py"


def _script():
    sys.path.insert(0, str(SCRIPT.parent))  # (it imports its neighbours)
    spec = importlib.util.spec_from_file_location("variants_vs_torch", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_before_items_split_into_params_stage_configs_and_environment():
    params, stages = _script().parse_before(
        ["param:conv_nhwc_window_tile=0", "normalize:col2im=false", "env:SWITCH=1",
         "param:reg_n=16", "normalize:col2im_block_l2_fraction=64"]
    )  # fmt: skip
    assert params == {"conv_nhwc_window_tile": 0, "reg_n": 16}
    assert stages == {
        "normalize": {"col2im": False, "col2im_block_l2_fraction": 64},
        "env": {"SWITCH": "1"},
    }


class _Timed:
    """A measurement whose calls take ``seconds`` of this thread's CPU time each."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def measure(self, count: int) -> np.ndarray:
        for _ in range(count):
            end = time.thread_time() + self.seconds
            while time.thread_time() < end:
                pass
        return np.full(count, self.seconds)


def test_calls_per_round_make_the_slowest_side_take_the_block():
    script = _script()
    # 1 ms calls: 5 of them fill the 5 ms block; never fewer than asked for
    calls = script.calls_per_round({"a": _Timed(1e-3), "b": _Timed(2e-4)}, 2)
    assert 4 <= calls <= 6
    assert script.calls_per_round({"a": _Timed(1e-2)}, 3) == 3
    assert script.cpu_time(_Timed(1e-3), 3) >= 0.9e-3


def test_the_environment_switch_is_restored_after_the_build(monkeypatch):
    script = _script()
    seen = {}

    class _Session:
        def __init__(self, request):
            self.graph, self.engine, self.workload = _Graph(), None, None

    class _Graph:
        def with_config(self, stage, **fields):
            seen["config"] = (stage, fields)
            return self

    def prepare(engine, graph, workload, splice):
        seen["during"] = os.environ.get("LVL1_TEST_SWITCH")
        return "built"

    import stagegraph.app.bench as bench
    import stagegraph.app.session as session

    monkeypatch.setattr(session, "Session", _Session)
    monkeypatch.setattr(bench, "prepare", prepare)
    monkeypatch.delenv("LVL1_TEST_SWITCH", raising=False)
    args = type("Args", (), {"target": None})()
    stages = {"env": {"LVL1_TEST_SWITCH": "1"}, "normalize": {"col2im": False}}
    assert script.build("spec", args, {}, stages)[1] == "built"
    assert seen == {"config": ("normalize", {"col2im": False}), "during": "1"}
    assert "LVL1_TEST_SWITCH" not in os.environ
