"""Elementwise ops that read through a window map (an implicit GEMM's patch copy,
``P[t, o] = X[o*s + t]``) fold their unit dims after tiling, so their tiles become row
copies instead of scalar loop nests (:mod:`stagegraph.stages.x86.generic.schedule`)."""

from __future__ import annotations

import numpy as np

from stagegraph.mlir.diagnostics import parse_payload
from stagegraph.stages.analysis import analyze
from tests.test_generic_schedule import _jit, _scheduled_op_names

PATCHES = """
#window = affine_map<(t, o) -> (o * STRIDE + t)>
#id = affine_map<(t, o) -> (t, o)>
func.func @main(%x: tensor<SIZExf32>) -> tensor<3x40xf32> {
  %e = tensor.empty() : tensor<3x40xf32>
  %p = linalg.generic {indexing_maps = [#window, #id], iterator_types = ["parallel", "parallel"]}
      ins(%x : tensor<SIZExf32>) outs(%e : tensor<3x40xf32>) {
  ^bb0(%a: f32, %o: f32):
    linalg.yield %a : f32
  } -> tensor<3x40xf32>
  return %p : tensor<3x40xf32>
}
"""


def _patches(stride: int) -> str:
    size = 39 * stride + 3
    return PATCHES.replace("STRIDE", str(stride)).replace("SIZE", str(size))


def test_the_analysis_marks_window_reads_only():
    """The patch copy reads through ``o*s + t``; a plain elementwise op does not."""
    (copy,) = analyze(parse_payload(_patches(1))).ops
    assert copy.op_class == "elementwise" and copy.window_reads
    plain = _patches(1).replace("affine_map<(t, o) -> (o * 1 + t)>", "affine_map<(t, o) -> (o)>")
    plain = plain.replace("tensor<42xf32>", "tensor<40xf32>")
    (op,) = analyze(parse_payload(plain)).ops
    assert op.op_class == "elementwise" and not op.window_reads


def test_a_patch_copy_leaves_no_scalar_generic_and_copies_the_windows():
    """Scheduled, a unit-stride window leaves no ``linalg.generic`` (each tile is a slice
    copy of a row; a strided one keeps its strided map: the vectorizer takes none); unit
    and strided windows copy ``X[o*s + t]``."""
    for stride in (1, 2):
        text = _patches(stride)
        assert ("linalg.generic" in _scheduled_op_names(text)) == (stride > 1)
        x = np.arange(39 * stride + 3, dtype=np.float32)
        (out,) = _jit(text).call("main", [x])
        taps, outs = np.meshgrid(np.arange(3), np.arange(40), indexing="ij")
        np.testing.assert_array_equal(out, x[outs * stride + taps])
