"""Software prefetch ahead of packing reads (stagegraph/stages/x86/matmul/prefetch_rows.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("stagegraph.mlir.bindings")

# A packing step loop reading a 6 x 8 block of rows (of a 2-D memref) per step; ``{mark}``
# is the loop's attribute dictionary, ``{map}`` the read's permutation map.
_LOOP = """
func.func @f(%a: memref<64x512xf32>, %out: memref<64x8xf32>) {{
  %c0 = arith.constant 0 : index
  %c8 = arith.constant 8 : index
  %c512 = arith.constant 512 : index
  %pad = arith.constant 0.0 : f32
  scf.for %k = %c0 to %c512 step %c8 {{
    %v = vector.transfer_read %a[%c8, %k], %pad
        {{in_bounds = [true, true], permutation_map = {map}}}
        : memref<64x512xf32>, vector<6x8xf32>
    vector.transfer_write %v, %out[%c0, %c0] {{in_bounds = [true, true]}}
        : vector<6x8xf32>, memref<64x8xf32>
  }} {mark}
  return
}}
"""
_ROWS = "affine_map<(d0, d1) -> (d0, d1)>"
_COLUMNS = "affine_map<(d0, d1) -> (d1, d0)>"


def _prefetched(mark: bool, permutation: str = _ROWS) -> tuple[int, list[tuple[int, ...]], bool]:
    """(prefetches inserted, each prefetch's (row offset, column offset) from the read's
    indices, whether any mark is left)."""
    from stagegraph.mlir.bindings import ir, new_context
    from stagegraph.mlir.walk import collect
    from stagegraph.stages.x86.matmul.prefetch_rows import PREFETCH_ROWS_ATTR, prefetch_rows

    text = _LOOP.format(mark="{stagegraph.prefetch_rows}" if mark else "", map=permutation)
    with new_context(), ir.Location.unknown():
        module = ir.Module.parse(text)
        count = prefetch_rows(module)
        module.operation.verify()
        offsets = [
            tuple(_offset(index) for index in op.operands[1:])
            for op in collect(module, "memref.prefetch")
        ]
        left = any(PREFETCH_ROWS_ATTR in op.attributes for op in collect(module))
        return count, offsets, left


def _offset(index) -> tuple[str, int]:
    """An index as (the value it offsets, by how much): a block argument or constant and
    the sum of the constants added to it."""
    from stagegraph.mlir.bindings import ir

    total = 0
    while isinstance(index.owner, ir.Operation | ir.OpView) and index.owner.name == "arith.addi":
        lhs, rhs = index.owner.operands
        total += ir.IntegerAttr(rhs.owner.attributes["value"]).value
        index = lhs
    if isinstance(index.owner, ir.Operation | ir.OpView):  # a constant index
        return ("constant", ir.IntegerAttr(index.owner.attributes["value"]).value + total)
    return ("k", total)


def test_each_row_of_a_marked_read_is_prefetched_256_bytes_ahead():
    """Six rows read 8 floats at a time: six prefetches, rows 8..13, 64 floats ahead of k."""
    count, offsets, left = _prefetched(mark=True)
    assert count == 6 and not left
    assert offsets == [(("constant", 8 + row), ("k", 64)) for row in range(6)]


def test_unmarked_loops_and_permuted_reads_get_none():
    assert _prefetched(mark=False)[:2] == (0, [])
    count, offsets, left = _prefetched(mark=True, permutation=_COLUMNS)
    assert (count, offsets, left) == (0, [], False)
