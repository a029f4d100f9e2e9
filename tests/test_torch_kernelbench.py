"""KernelBench problem files from their ``.py`` (``benchmarks/kernelbench_torch_coverage.py``):
the spec each problem runs at, and (slow) every level-1 and dev level-2 file verifying at the
sizes of its shipped payload. Skips without ``../shared``."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SHARED

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "kernelbench_torch_coverage.py"
ROOT = SHARED / "kernelbench"


def coverage_module():
    spec = importlib.util.spec_from_file_location("kernelbench_torch_coverage", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_spec_syntax_of_manifest_constants():
    coverage = coverage_module()
    constants = {"batch_size": 2, "height=width": 16, "kernel_size": [3, 3, 3], "eps": 1e-5}
    assert coverage.problem_spec(Path("/p/l2_003.py"), constants) == (
        "/p/l2_003.py:batch_size=2,height=16,width=16,kernel_size=3x3x3,eps=1e-05"
    )
    # the scaler's later, separate values win over the chained one (l2_011's manifest)
    constants = {"height=width": 2048, "groups": 8, "height": 16, "width": 8}
    assert coverage.problem_spec(Path("/p/x.py"), constants) == (
        "/p/x.py:height=16,width=8,groups=8"
    )


def test_shipped_payloads_find_their_problem_file_and_sizes():
    if not (ROOT / "src" / "level2").is_dir():
        pytest.skip("no ../shared/kernelbench")
    coverage = coverage_module()
    payload = next((ROOT / "level2").glob("l2_011_*.mlir"))
    spec = coverage.payload_problem_spec(payload)
    path, _, constants = spec.partition(":")
    assert Path(path).name.startswith("l2_011_") and Path(path).is_file()
    sizes = coverage.manifest_sizes(ROOT, 2)["l2_011"]
    assert constants.split(",")[0] == f"batch_size={sizes['batch_size']}"
    from stagegraph.workload import parse_workload

    parse_workload(spec)  # every constant exists in the file


def test_a_payload_scaled_through_literals_gets_them_in_its_spec():
    """l3_021's images were scaled inside ``get_inputs`` (224 -> 14): its spec carries the
    manifest's ``lit:`` keys, so PyTorch runs the shipped shape, not the file's 224x224."""
    payload = ROOT / "level3" / "l3_021_EfficientNetMBConv.mlir"
    if not payload.is_file():
        pytest.skip("no ../shared/kernelbench")
    spec = coverage_module().payload_problem_spec(payload)
    assert "lit:get_inputs@68:48=14" in spec and "lit:get_inputs@68:53=14" in spec
    from stagegraph.workload import parse_workload

    parse_workload(spec)  # the literals exist where the keys say


def _problems() -> list:
    found = []
    for level in (1, 2):
        found += sorted((ROOT / "src" / f"level{level}").glob("*.py"))
    return [pytest.param(p.parent.name, p.stem, id=p.stem) for p in found] or [
        pytest.param(None, None, marks=pytest.mark.skip(reason="no ../shared/kernelbench"))
    ]


@pytest.mark.slow
@pytest.mark.parametrize(("level", "stem"), _problems())
def test_problem_file_verifies_from_its_py(level, stem):
    pytest.importorskip("torch")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(ROOT), "--levels", level.removeprefix("level"),
         "--only", stem, "--json", "--timeout", "600"],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    (row,) = json.loads(done.stdout)
    assert row["verified"], row["message"]
