"""A pad's fill (an input-less ``linalg.map`` on a fresh buffer) becomes one flat
``linalg.fill`` (stagegraph.stages.common.fill_maps), and copies with rows of at least
``MIN_COPY_ROW`` are vectorized: the IR says so, and the padded result matches numpy."""

from __future__ import annotations

import numpy as np

from stagegraph.mlir.diagnostics import parse_payload
from tests.test_vector_copies import PAD

MAPS = """
func.func @f(%m: memref<4x8xf32>, %n: memref<4x8xf32>) {
  %c = arith.constant 2.0 : f32
  linalg.map outs(%m : memref<4x8xf32>) (%init: f32) {
    linalg.yield %c : f32
  }
  linalg.map outs(%n : memref<4x8xf32>) (%init: f32) {
    linalg.yield %init : f32
  }
  return
}
"""


def test_constant_map_becomes_a_flat_fill_and_others_stay():
    from stagegraph.mlir.bindings import ir, new_context
    from stagegraph.mlir.walk import collect
    from stagegraph.stages.common.fill_maps import constant_maps_to_fills

    with new_context(), ir.Location.unknown():
        module = ir.Module.parse(MAPS)
        assert constant_maps_to_fills(module) == 1  # the map yielding its own element stays
        assert module.operation.verify()
        (fill,) = collect(module.operation, "linalg.fill")
        assert ir.MemRefType(fill.operands[1].type).shape == [32]  # 4x8 as one row
        assert len(collect(module.operation, "memref.collapse_shape")) == 1
        assert len(collect(module.operation, "linalg.map")) == 1


def _bufferized(text: str):
    from stagegraph.core.ports import Module
    from stagegraph.mlir.bindings import ir
    from stagegraph.stages.common import lowering
    from stagegraph.stages.common.passes import record_public_signatures, run_pipeline

    port = Module["tensor"](parse_payload(text))
    with port.ir.context, ir.Location.unknown():
        record_public_signatures(port)
        run_pipeline(port, lowering.BUFFERIZE)
    return port


def test_padding_is_one_fill_and_right():
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import collect
    from stagegraph.runtime.jit import JitBinary
    from stagegraph.stages.common import lowering
    from stagegraph.stages.common.fill_maps import constant_maps_to_fills
    from stagegraph.stages.common.passes import run_pipeline
    from stagegraph.stages.common.rewrites import copies_to_linalg

    port = _bufferized(PAD)
    with port.ir.context, ir.Location.unknown():
        assert constant_maps_to_fills(port.ir) == 1
        (fill,) = collect(port.ir.operation, "linalg.fill")
        assert ir.MemRefType(fill.operands[1].type).shape == [3 * 7 * 22]
        copies_to_linalg(port.ir)  # the image copy: loops, not the runtime's memrefCopy
        run_pipeline(port, lowering.LINALG_TO_LOOPS)
        run_pipeline(port, lowering.LOWER_TO_LLVM)
        binary = JitBinary(port.ir, opt_level=2)
    a = np.random.default_rng(0).standard_normal((3, 5, 20), dtype=np.float32)
    (out,) = binary.call("main", [a])
    np.testing.assert_array_equal(out, np.pad(a, ((0, 0), (1, 1), (1, 1)), constant_values=-1))


def test_short_rows_are_copied_by_vectors_down_to_min_copy_row():
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import collect
    from stagegraph.stages.common.rewrites import copies_to_linalg
    from stagegraph.stages.x86.generic.vector_copies import MIN_COPY_ROW, _row_copy_tiles

    for row, tiles in [(MIN_COPY_ROW, [1, 1, 0]), (MIN_COPY_ROW - 1, None)]:
        text = PAD.replace("3x5x20", f"3x5x{row}").replace("3x7x22", f"3x7x{row}")
        port = _bufferized(text.replace("low[0, 1, 1] high[0, 1, 1]", "low[0, 1, 0] high[0, 1, 0]"))
        with port.ir.context, ir.Location.unknown():
            copies_to_linalg(port.ir)
            (copy,) = collect(port.ir.operation, "linalg.copy")
            assert _row_copy_tiles(copy, 64, 16) == tiles  # AVX-512's 16 lanes: rows shorter
