"""Parallel loops too small for their threads run serially (``serial_loops``)."""

from __future__ import annotations

import numpy as np
import pytest

import stagegraph as sg
from stagegraph.mlir.walk import collect

# A matmul worth two threads beside a 16x16 elementwise op that is not.
PAYLOAD = """
func.func @main(%a: tensor<256x256xf32>, %b: tensor<256x256xf32>, %s: tensor<16x16xf32>)
    -> (tensor<256x256xf32>, tensor<16x16xf32>) {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<256x256xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<256x256xf32>) -> tensor<256x256xf32>
  %mm = linalg.matmul ins(%a, %b : tensor<256x256xf32>, tensor<256x256xf32>)
      outs(%f : tensor<256x256xf32>) -> tensor<256x256xf32>
  %es = tensor.empty() : tensor<16x16xf32>
  %sq = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>,
      affine_map<(i, j) -> (i, j)>], iterator_types = ["parallel", "parallel"]}
      ins(%s : tensor<16x16xf32>) outs(%es : tensor<16x16xf32>) {
    ^bb0(%x: f32, %o: f32):
      %y = arith.mulf %x, %x : f32
      linalg.yield %y : f32
  } -> tensor<16x16xf32>
  return %mm, %sq : tensor<256x256xf32>, tensor<16x16xf32>
}
"""


@pytest.fixture
def payload(tmp_path):
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((256, 256), dtype=np.float32) for _ in range(2))
    s = rng.standard_normal((16, 16), dtype=np.float32)
    (tmp_path / "p.mlir").write_text(PAYLOAD)
    np.savez(tmp_path / "p.npz", in0=a, in1=b, in2=s, out0=a @ b, out1=s * s)
    return str(tmp_path / "p.mlir")


def test_only_the_loop_worth_its_threads_stays_parallel(payload):
    pytest.importorskip("stagegraph.runtime.openmp").library_path()
    result = sg.run("x86", payload, threads=2, until="lower")
    module = result.module.ir
    assert len(collect(module, "omp.wsloop")) == 1  # the matmul's block loop
    assert sg.run("x86", payload, threads=2).verified is True


def test_loop_work_counts_vector_lanes_times_trips(payload):
    from stagegraph.stages.common.serial_loops import loop_work

    module = sg.run("x86", payload, threads=2, until="bufferized").module.ir
    foralls = collect(module, "scf.forall")
    work = sorted(loop_work(op) for op in foralls)
    # The elementwise loop: 256 elements' loads, multiplies and stores, a few ops each; the
    # matmul's: 2 * 256^3 / 8 lanes... of FMAs alone, far above it.
    assert work[0] < 10_000 < 2 * 256**3 // 8 <= work[-1]


NESTED = """
func.func @main(%m: memref<4x8xf32>) {
  %one = arith.constant 1.0 : f32
  scf.forall (%i) in (4) {
    scf.forall (%j) in (8) {
      memref.store %one, %m[%i, %j] : memref<4x8xf32>
    }
  }
  return
}
"""


def test_the_loops_inside_a_serialized_loop_are_serialized_too():
    """Left parallel, an inner loop would fork once per trip of the now serial outer one."""
    from stagegraph.mlir.diagnostics import parse_payload
    from stagegraph.stages.common.serial_loops import serialize_small_parallel_loops

    module = parse_payload(NESTED)
    assert serialize_small_parallel_loops(module, min_work=1 << 20) == 2
    assert not collect(module, "scf.forall")
    assert len(collect(module, "scf.for")) == 2
