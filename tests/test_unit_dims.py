"""Generic ops lose their unit dims before the analysis (``x86.normalize``), so their
vectors run along a real dim (GroupNorm's ``N x C x G x 1`` statistics and broadcasts)."""

from __future__ import annotations

import numpy as np

import stagegraph as sg
from stagegraph.mlir.diagnostics import parse_payload
from stagegraph.mlir.walk import collect

SHAPE, SCALE_SHAPE = (4, 8, 4, 1), (8, 4, 1)

PAYLOAD = """
#full = affine_map<(n, c, g, u) -> (n, c, g, u)>
#scale = affine_map<(n, c, g, u) -> (c, g, u)>
func.func @main(%x: tensor<4x8x4x1xf32>, %w: tensor<8x4x1xf32>) -> tensor<4x8x4x1xf32> {
  %e = tensor.empty() : tensor<4x8x4x1xf32>
  %r = linalg.generic {indexing_maps = [#full, #scale, #full],
      iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%x, %w : tensor<4x8x4x1xf32>, tensor<8x4x1xf32>) outs(%e : tensor<4x8x4x1xf32>) {
    ^bb0(%a: f32, %b: f32, %o: f32):
      %m = arith.mulf %a, %b : f32
      linalg.yield %m : f32
  } -> tensor<4x8x4x1xf32>
  return %r : tensor<4x8x4x1xf32>
}
"""


def _payload(tmp_path) -> str:
    rng = np.random.default_rng(0)
    x = rng.standard_normal(SHAPE, dtype=np.float32)
    w = rng.standard_normal(SCALE_SHAPE, dtype=np.float32)
    (tmp_path / "p.mlir").write_text(PAYLOAD)
    np.savez(tmp_path / "p.npz", in0=x, in1=w, out0=x * w)
    return str(tmp_path / "p.mlir")


def test_generic_ops_lose_their_unit_dims(tmp_path) -> None:
    from stagegraph.mlir.bindings import ir

    payload = _payload(tmp_path)
    normalized = sg.run("x86", payload, threads=1, until="normalize").module.ir
    (generic,) = collect(normalized, "linalg.generic")
    for result in generic.results:
        assert 1 not in ir.RankedTensorType(result.type).shape
    scheduled = sg.run("x86", payload, threads=1, until="scheduled").module.ir
    writes = collect(scheduled, "vector.transfer_write")
    assert writes
    for write in writes:  # whole vectors, not one lane along the unit dim
        assert ir.VectorType(write.operands[0].type).shape[-1] > 1
    assert sg.run("x86", payload, threads=1).verified is True


# A running sum over columns as a scan is lowered: a loop carrying the current column
# (4x1 would lose its unit dim) and updating it in place.
SCAN = """
#col = affine_map<(i, j) -> (i, j)>
func.func @main(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %c1 = arith.constant 1 : index
  %c8 = arith.constant 8 : index
  %e = tensor.empty() : tensor<4x8xf32>
  %first = tensor.extract_slice %x[0, 0] [4, 1] [1, 1] : tensor<4x8xf32> to tensor<4x1xf32>
  %init = tensor.insert_slice %first into %e[0, 0] [4, 1] [1, 1]
      : tensor<4x1xf32> into tensor<4x8xf32>
  %r:2 = scf.for %j = %c1 to %c8 step %c1 iter_args(%acc = %init, %run = %first)
      -> (tensor<4x8xf32>, tensor<4x1xf32>) {
    %col = tensor.extract_slice %x[0, %j] [4, 1] [1, 1] : tensor<4x8xf32> to tensor<4x1xf32>
    %next = linalg.generic {indexing_maps = [#col, #col], iterator_types = ["parallel", "parallel"]}
        ins(%col : tensor<4x1xf32>) outs(%run : tensor<4x1xf32>) {
      ^bb0(%a: f32, %s: f32):
        %t = arith.addf %a, %s : f32
        linalg.yield %t : f32
    } -> tensor<4x1xf32>
    %acc2 = tensor.insert_slice %next into %acc[0, %j] [4, 1] [1, 1]
        : tensor<4x1xf32> into tensor<4x8xf32>
    scf.yield %acc2, %next : tensor<4x8xf32>, tensor<4x1xf32>
  }
  return %r#0 : tensor<4x8xf32>
}
"""


def test_a_function_whose_loops_carry_tensors_keeps_its_unit_dims(tmp_path) -> None:
    """Folding there turned the in-place update of the carried column into a write to a
    fresh tensor, which bufferization rejects; the function is left alone and runs."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.stages.common.unit_dims import fold_unit_dims

    module = parse_payload(SCAN)
    with module.context, ir.Location.unknown():
        assert fold_unit_dims(module) == 0
    x = np.random.default_rng(0).standard_normal((4, 8), dtype=np.float32)
    (tmp_path / "scan.mlir").write_text(SCAN)
    np.savez(tmp_path / "scan.npz", in0=x, out0=np.cumsum(x, axis=1))
    assert sg.run("x86", str(tmp_path / "scan.mlir"), threads=1).verified is True
