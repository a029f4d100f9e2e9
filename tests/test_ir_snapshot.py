"""benchmarks/ir_snapshot.py: the scheduled and lowered IR of each payload, written by a child
process per payload, the same on a second run, and ``--compare`` naming what differs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "ir_snapshot.py"

MATMUL_RELU = """
func.func @main(%a: tensor<16x32xf32>, %b: tensor<32x24xf32>) -> tensor<16x24xf32> {
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<16x24xf32>
  %init = linalg.fill ins(%zero : f32) outs(%empty : tensor<16x24xf32>) -> tensor<16x24xf32>
  %mm = linalg.matmul ins(%a, %b : tensor<16x32xf32>, tensor<32x24xf32>)
                      outs(%init : tensor<16x24xf32>) -> tensor<16x24xf32>
  %relu = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>,
                                           affine_map<(i, j) -> (i, j)>],
                          iterator_types = ["parallel", "parallel"]}
      ins(%mm : tensor<16x24xf32>) outs(%empty : tensor<16x24xf32>) {
  ^bb0(%x: f32, %out: f32):
    %y = arith.maximumf %x, %zero : f32
    linalg.yield %y : f32
  } -> tensor<16x24xf32>
  return %relu : tensor<16x24xf32>
}
"""


def _script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600
    )


def test_snapshots_are_reproducible_and_compare_names_differences(tmp_path):
    payloads = tmp_path / "payloads"
    payloads.mkdir()
    (payloads / "mm_relu.mlir").write_text(MATMUL_RELU)
    (payloads / "broken.mlir").write_text("func.func @main( {")
    first, second = tmp_path / "first", tmp_path / "second"
    for out in (first, second):
        done = _script("--target", "x86-64-v3", "--out", str(out), str(payloads))
        assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in first.iterdir()) == [
        "broken.error.txt",
        "mm_relu.lowered.mlir",
        "mm_relu.scheduled.mlir",
    ]
    assert "llvm.func" in (first / "mm_relu.lowered.mlir").read_text()
    assert "linalg.matmul" not in (first / "mm_relu.lowered.mlir").read_text()
    same = _script("--compare", str(first), str(second))
    assert same.returncode == 0 and "3 identical, 0 differ" in same.stdout

    (second / "mm_relu.scheduled.mlir").write_text("changed\n")
    (second / "broken.error.txt").unlink()
    changed = _script("--compare", str(first), str(second))
    assert changed.returncode == 1
    assert "differs: mm_relu.scheduled.mlir" in changed.stdout
    assert f"only in {first}: broken.error.txt" in changed.stdout
