"""Grouped block order for tiled matmuls: consecutive blocks share rows of A and columns
of B in L2.

The hardware starts blocks in linear order (x fastest). Mapped plainly, one wave of blocks
covers a few rows of C tiles across all of its columns, so every wave streams all of B
from memory. Renumbering the tiles in groups of ``group`` tile rows (the order Triton's
matmul tutorial calls ``GROUP_SIZE_M``) makes a wave cover a near-square patch of C: it
reads ``group`` row panels of A and ``wave / group`` column panels of B, which L2 can hold.
Blocks are independent, so any bijection of the tiles keeps the result.
"""

from __future__ import annotations

import math
from typing import Any


def grouped_tile(linear: int, rows: int, cols: int, group: int) -> tuple[int, int]:
    """The (row, column) tile of block ``linear`` of a ``rows x cols`` grid in groups of
    ``group`` rows (the model :func:`regroup_blocks` builds as IR)."""
    width = group * cols
    first = (linear // width) * group
    height = min(rows - first, group)
    return first + (linear % width) % height, (linear % width) // height


def group_rows(sm_count: int, tile_m: int, tile_n: int, rows: int, cols: int) -> int:
    """Tile rows per group: a wave of ``sm_count`` blocks as square in bytes of A and B
    as whole tiles allow; 0 (plain order) for a grid of one wave or one tile row."""
    if rows * cols <= sm_count or rows == 1:
        return 0
    return max(1, min(rows, round(math.sqrt(sm_count * tile_n / tile_m))))


def regroup_blocks(forall: Any, group: int) -> bool:
    """Renumber the tiles of a 2-D block ``forall`` (induction variables: tile row, tile
    column; static bounds) in groups of ``group`` rows, by rewriting the uses of its
    induction variables; False where the loop is not such a loop."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.stages.gpu.mma import _Builder

    body = forall.regions[0].blocks[0]
    bounds = list(ir.DenseI64ArrayAttr(forall.attributes["staticUpperBound"]))
    if group <= 0 or len(bounds) != 2 or len(body.arguments) < 2 or min(bounds) < 1:
        return False
    rows, cols = bounds
    row, col = body.arguments[0], body.arguments[1]
    build = _Builder(body.operations[0])
    index = build.index
    scaled = build.op("arith.muli", [index], [row, build.const(cols)])
    linear = build.op("arith.addi", [index], [scaled, col])
    width = build.const(group * cols)
    first = build.op("arith.muli", [index], [build.op("arith.divui", [index], [linear, width]),
                                              build.const(group)])  # fmt: skip
    left = build.op("arith.subi", [index], [build.const(rows), first])
    height = build.op("arith.minui", [index], [left, build.const(group)])
    within = build.op("arith.remui", [index], [linear, width])
    new_row = build.op("arith.addi", [index], [first, build.op("arith.remui", [index],
                                                               [within, height])])  # fmt: skip
    new_col = build.op("arith.divui", [index], [within, height])
    row.replace_all_uses_except(new_row, scaled.owner.operation)
    col.replace_all_uses_except(new_col, linear.owner.operation)
    return True
