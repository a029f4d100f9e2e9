"""benchmarks/conv_vs_torch.py: PyTorch runs the problem file at the manifest's scaled
sizes, and a row compares the two sides on the same shapes."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import kernelbench_or_skip

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "conv_vs_torch.py"


def _script():
    spec = importlib.util.spec_from_file_location("conv_vs_torch", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_problem_file_is_found_by_number_and_every_conv_payload_is_listed():
    folder = kernelbench_or_skip()
    script = _script()
    payloads = script.conv_payloads(folder, None)
    assert payloads and all("conv" in e["stem"] for e in payloads)
    for entry in payloads:
        problem = script.problem_file(folder, entry["stem"])
        assert problem.name.startswith("_".join(entry["stem"].split("_")[:2]) + "_")
    with pytest.raises(FileNotFoundError, match="l1_999"):
        script.problem_file(folder, "l1_999_nothing")


@pytest.mark.slow
def test_a_row_compares_both_sides_on_the_payload_shapes():
    pytest.importorskip("torch")
    folder = kernelbench_or_skip()
    out = subprocess.run(
        [sys.executable, str(SCRIPT), str(folder), "--match", "l1_067", "--budget", "0.3",
         "--json"],
        capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    row = json.loads(out.stdout.splitlines()[0])
    assert row["payload"].startswith("l1_067") and row["verified"] is True
    assert row["x86_s"] > 0 and row["torch_s"] > 0
    assert row["ratio"] == pytest.approx(row["torch_s"] / row["x86_s"], rel=0.5)
    assert "torch/x86" in out.stdout and "FMA peak" in out.stdout


def test_the_torch_model_is_built_at_the_scaled_sizes():
    torch = pytest.importorskip("torch")
    folder = kernelbench_or_skip()
    script = _script()
    entry = next(e for e in script.conv_payloads(folder, "l1_067"))

    class Workload:  # the two things TorchMeasurement reads of a workload
        spec = "l1_067"

        @staticmethod
        def inputs():
            import numpy as np

            return [np.ones(i["shape"], dtype=np.float32) for i in entry["inputs"]]

    problem = script.problem_file(folder, entry["stem"])
    peer = script.TorchMeasurement(problem, entry["scaled_constants"], 1, Workload)
    with torch.inference_mode():
        result = peer.model(*peer.inputs)
    assert list(result.shape) == entry["outputs"][0]["shape"]
    assert peer.measure(2, warmup=1).shape == (2,)
