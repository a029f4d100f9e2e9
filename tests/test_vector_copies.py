"""Copies left by bufferization (a ``tensor.pad``'s image copy, a strided slice returned) are
vectorized row by row when their rows are contiguous (``generic_schedule.vectorize_copies``)
and stay scalar loops otherwise; both compute the same as numpy."""

from __future__ import annotations

import numpy as np
import pytest

from stagegraph.mlir.diagnostics import parse_payload

# A pooling's padding: the image is copied into a buffer filled with the pad value.
PAD = """
func.func @main(%a: tensor<3x5x20xf32>) -> tensor<3x7x22xf32> {
  %z = arith.constant -1.0 : f32
  %p = tensor.pad %a low[0, 1, 1] high[0, 1, 1] {
  ^bb0(%i: index, %j: index, %k: index):
    tensor.yield %z : f32
  } : tensor<3x5x20xf32> to tensor<3x7x22xf32>
  return %p : tensor<3x7x22xf32>
}
"""

# Every other column: the copy into the out-parameter reads with an innermost stride of 2.
STRIDED = """
func.func @main(%a: tensor<4x16xf32>) -> tensor<4x8xf32> {
  %s = tensor.extract_slice %a[0, 0] [4, 8] [1, 2] : tensor<4x16xf32> to tensor<4x8xf32>
  return %s : tensor<4x8xf32>
}
"""


def _lowered(text: str) -> tuple[object, int, int]:
    """(JIT binary, copies vectorized, vector transfers after it) for ``text`` bufferized,
    its copies vectorized and lowered."""
    from stagegraph.core.ports import Module
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import collect
    from stagegraph.runtime.jit import JitBinary
    from stagegraph.stages.common import lowering
    from stagegraph.stages.common.passes import record_public_signatures, run_pipeline
    from stagegraph.stages.common.rewrites import copies_to_linalg
    from stagegraph.stages.x86.generic.vector_copies import vectorize_copies

    port = Module["tensor"](parse_payload(text))
    with port.ir.context, ir.Location.unknown():
        record_public_signatures(port)
        run_pipeline(port, lowering.BUFFERIZE)
        assert copies_to_linalg(port.ir) >= 1
        vectorized = vectorize_copies(port.ir, 64, 8)
        transfers = len(collect(port.ir.operation, "vector.transfer_write"))
        assert port.ir.operation.verify()
        run_pipeline(port, lowering.LINALG_TO_LOOPS)  # the pad's fill, unscheduled here
        run_pipeline(port, lowering.LOWER_TO_LLVM)
        return JitBinary(port.ir, opt_level=2), vectorized, transfers


def test_padding_copy_is_vectorized_by_rows():
    binary, vectorized, transfers = _lowered(PAD)
    assert vectorized == 1 and transfers >= 1
    a = np.random.default_rng(0).standard_normal((3, 5, 20), dtype=np.float32)
    (out,) = binary.call("main", [a])
    np.testing.assert_array_equal(out, np.pad(a, ((0, 0), (1, 1), (1, 1)), constant_values=-1))


@pytest.mark.parametrize(("max_row", "lanes", "tiles"), [(64, 8, [1, 1, 0]),
                                                         (8, 4, [1, 1, 5]),
                                                         (64, 32, [1, 1, 0])])  # fmt: skip
def test_row_tiles_are_whole_rows_or_static_divisors(max_row, lanes, tiles):
    """Rows of 20 are copied whole, or by static divisors of at most ``max_row``, also when
    shorter than a vector (32 lanes): only rows under ``MIN_COPY_ROW`` are left to the loops
    (tests/test_fill_maps.py)."""
    from stagegraph.core.ports import Module
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import collect
    from stagegraph.stages.common import lowering
    from stagegraph.stages.common.passes import run_pipeline
    from stagegraph.stages.common.rewrites import copies_to_linalg
    from stagegraph.stages.x86.generic.vector_copies import _row_copy_tiles

    port = Module["tensor"](parse_payload(PAD))
    with port.ir.context, ir.Location.unknown():
        run_pipeline(port, lowering.BUFFERIZE)
        copies_to_linalg(port.ir)
        (copy,) = collect(port.ir.operation, "linalg.copy")
        assert _row_copy_tiles(copy, max_row, lanes) == tiles


def test_strided_copy_stays_loops_and_is_right():
    binary, vectorized, transfers = _lowered(STRIDED)
    assert vectorized == 0 and transfers == 0
    a = np.random.default_rng(1).standard_normal((4, 16), dtype=np.float32)
    (out,) = binary.call("main", [a])
    np.testing.assert_array_equal(out, a[:, ::2])
