"""pad_transposes: which transposes of A's packing become padded 8x8 ones, and the values."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from stagegraph.stages.x86.matmul.pad_transposes import PAD_TRANSPOSES_ATTR


def _func(name: str, rows: int, cols: int, dtype: str = "f32", marked: bool = True) -> str:
    mark = f" attributes {{{PAD_TRANSPOSES_ATTR}}}" if marked else ""
    src, dst = f"vector<1x{rows}x{cols}x{dtype}>", f"vector<1x{cols}x{rows}x{dtype}>"
    return f"""
func.func @{name}(%x: {src}) -> {dst}{mark} {{
  %t = vector.transpose %x, [0, 2, 1] : {src} to {dst}
  return %t : {dst}
}}"""


def _rewrite(text: str) -> tuple[int, str, list]:
    from stagegraph.mlir.bindings import ir, new_context
    from stagegraph.mlir.walk import collect
    from stagegraph.stages.x86.matmul.pad_transposes import pad_transposes

    with new_context():
        module = ir.Module.parse(text)
        count = pad_transposes(module)
        assert module.operation.verify()
        shapes = [
            ir.VectorType(op.operands[0].type).shape for op in collect(module, "vector.transpose")
        ]
        return count, str(module), shapes


@pytest.mark.parametrize("rows", [5, 6, 7])
def test_five_to_seven_rows_of_eight_floats_transpose_as_eight_by_eight(rows):
    count, text, shapes = _rewrite(_func("t", rows, 8))
    assert count == 1
    assert shapes == [[8, 8]]
    assert PAD_TRANSPOSES_ATTR not in text  # the mark is stripped


@pytest.mark.parametrize(
    ("rows", "cols", "dtype", "marked"),
    [
        (4, 8, "f32", True),  # upstream's 4x8 sequence applies
        (8, 8, "f32", True),  # and its 8x8 one
        (2, 8, "f32", True),  # cheap as it is
        (6, 16, "f32", True),  # 16 lanes: AVX-512's packing
        (6, 8, "f64", True),
        (6, 8, "f32", False),  # a function the schedule did not mark
    ],
)
def test_other_transposes_are_left_alone(rows, cols, dtype, marked):
    count, _, shapes = _rewrite(_func("t", rows, cols, dtype, marked))
    assert count == 0
    assert shapes == [[1, rows, cols]]


def test_padded_transpose_gives_the_transposed_values():
    """Through the JIT: a 6x8 block read from memory comes out as its 8x6 transpose."""
    from stagegraph.mlir.bindings import execution_engine, ir, new_context, passmanager, runtime
    from stagegraph.stages.common import lowering
    from stagegraph.stages.x86.matmul.pad_transposes import pad_transposes

    text = f"""
func.func @t(%a: memref<6x8xf32>, %b: memref<8x6xf32>) attributes {{{PAD_TRANSPOSES_ATTR}, llvm.emit_c_interface}} {{
  %c0 = arith.constant 0 : index
  %p = arith.constant 0.0 : f32
  %x = vector.transfer_read %a[%c0, %c0], %p {{in_bounds = [true, true]}} : memref<6x8xf32>, vector<6x8xf32>
  %t = vector.transpose %x, [1, 0] : vector<6x8xf32> to vector<8x6xf32>
  vector.transfer_write %t, %b[%c0, %c0] {{in_bounds = [true, true]}} : vector<8x6xf32>, memref<8x6xf32>
  return
}}"""  # noqa: E501
    a = np.arange(48, dtype=np.float32).reshape(6, 8)
    b = np.full((8, 6), np.nan, np.float32)
    with new_context():
        module = ir.Module.parse(text)
        assert pad_transposes(module) == 1
        pm = passmanager.PassManager.parse(f"builtin.module({lowering.LOWER_TO_LLVM})")
        pm.run(module.operation)
        engine = execution_engine.ExecutionEngine(module, opt_level=2)
        engine.invoke(
            "t",
            *[
                ctypes.pointer(ctypes.pointer(runtime.get_ranked_memref_descriptor(x)))
                for x in (a, b)
            ],
        )
    np.testing.assert_array_equal(b, a.T)
