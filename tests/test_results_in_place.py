"""Results returned through reshapes are written straight into their out-parameters
(``rewrites.write_results_in_place``), not computed into a buffer and copied there."""

from __future__ import annotations

import numpy as np

from stagegraph.mlir.diagnostics import parse_payload

# PyTorch's InstanceNorm views N x C x H x W as 1 x NC x H x W and back around its ops.
RESHAPED = """
#id = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>
func.func @main(%a: tensor<2x3x4x8xf32>) -> tensor<2x3x4x8xf32> {
  %c = tensor.collapse_shape %a [[0, 1], [2], [3]] : tensor<2x3x4x8xf32> into tensor<6x4x8xf32>
  %x = tensor.expand_shape %c [[0, 1], [2], [3]] output_shape [1, 6, 4, 8]
      : tensor<6x4x8xf32> into tensor<1x6x4x8xf32>
  %e = tensor.empty() : tensor<1x6x4x8xf32>
  %n = linalg.generic {indexing_maps = [#id, #id],
                       iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%x : tensor<1x6x4x8xf32>) outs(%e : tensor<1x6x4x8xf32>) {
  ^bb0(%v: f32, %o: f32):
    %y = arith.negf %v : f32
    linalg.yield %y : f32
  } -> tensor<1x6x4x8xf32>
  %rc = tensor.collapse_shape %n [[0, 1], [2], [3]] : tensor<1x6x4x8xf32> into tensor<6x4x8xf32>
  %r = tensor.expand_shape %rc [[0, 1], [2], [3]] output_shape [2, 3, 4, 8]
      : tensor<6x4x8xf32> into tensor<2x3x4x8xf32>
  return %r : tensor<2x3x4x8xf32>
}
"""

# The same result returned twice: the second out-parameter is still a copy (of the first).
TWICE = RESHAPED.replace(
    "-> tensor<2x3x4x8xf32> {", "-> (tensor<2x3x4x8xf32>, tensor<2x3x4x8xf32>) {"
).replace(
    "return %r : tensor<2x3x4x8xf32>",
    "return %r, %r : tensor<2x3x4x8xf32>, tensor<2x3x4x8xf32>",
)


def _bufferized(text: str):
    from stagegraph.core.ports import Module
    from stagegraph.mlir.bindings import ir
    from stagegraph.stages.common.lowering import BUFFERIZE
    from stagegraph.stages.common.passes import record_public_signatures, run_pipeline

    port = Module["tensor"](parse_payload(text))
    with port.ir.context, ir.Location.unknown():
        record_public_signatures(port)
        run_pipeline(port, BUFFERIZE)
    return port


def _names(module, name: str) -> int:
    from stagegraph.mlir.walk import collect

    return len(collect(module.operation, name))


def _run(port, *inputs: np.ndarray) -> list[np.ndarray]:
    from stagegraph.mlir.bindings import ir
    from stagegraph.runtime.jit import JitBinary
    from stagegraph.stages.common import lowering
    from stagegraph.stages.common.passes import run_pipeline
    from stagegraph.stages.common.rewrites import copies_to_linalg

    with port.ir.context, ir.Location.unknown():
        copies_to_linalg(port.ir)
        run_pipeline(port, lowering.LINALG_TO_LOOPS)  # nothing was scheduled: plain loops
        run_pipeline(port, lowering.LOWER_TO_LLVM)
        return JitBinary(port.ir, opt_level=2).call("main", list(inputs))


def test_result_behind_reshapes_is_written_in_place():
    from stagegraph.mlir.bindings import ir
    from stagegraph.stages.common.rewrites import write_results_in_place

    port = _bufferized(RESHAPED)
    assert _names(port.ir, "memref.copy") == 1  # what buffer-results-to-out-params left
    with port.ir.context, ir.Location.unknown():
        assert write_results_in_place(port.ir) == 1
        assert port.ir.operation.verify()
    assert _names(port.ir, "memref.copy") == 0
    assert _names(port.ir, "memref.alloc") == 0
    a = np.random.default_rng(0).standard_normal((2, 3, 4, 8), dtype=np.float32)
    (out,) = _run(port, a)
    np.testing.assert_array_equal(out, -a)


def test_a_result_returned_twice_keeps_its_second_copy():
    from stagegraph.mlir.bindings import ir
    from stagegraph.stages.common.rewrites import write_results_in_place

    port = _bufferized(TWICE)
    with port.ir.context, ir.Location.unknown():
        write_results_in_place(port.ir)
        assert port.ir.operation.verify()
    assert _names(port.ir, "memref.copy") >= 1
    a = np.random.default_rng(1).standard_normal((2, 3, 4, 8), dtype=np.float32)
    first, second = _run(port, a)
    np.testing.assert_array_equal(first, -a)
    np.testing.assert_array_equal(second, -a)


def test_bufferize_stage_writes_reshaped_results_in_place():
    from stagegraph.core.ports import Module
    from stagegraph.mlir.bindings import ir
    from stagegraph.stages.common.passes import BufferizeConfig, bufferize

    module = parse_payload(RESHAPED)
    with module.context, ir.Location.unknown():
        port = bufferize.fn(Module["tensor"](module), BufferizeConfig())
    assert _names(port.ir, "memref.copy") == 0
