"""A's packing transposes with 5-7 rows become 8x8 transposes: AVX2 has a short sequence for those.

On AVX2 the register tile has 6 rows, so every step of A's packing reads a 6x8 block (six rows
of A, eight k) and transposes it into eight 6-wide columns of the panel. Upstream's AVX2
transpose sequence (in-lane unpacks and shuffles, ``avx2_lowering_strategy``) covers 4x8 and
8x8 f32 only; a 6x8 transpose became one flat 48-element shuffle, which LLVM turned into about
90 permutes, blends, inserts and partial stores per step. Padded to 8x8 (two rows of zeros),
the transpose takes the 24-instruction sequence, and the eight 6-wide columns are slices of its
rows: LLVM folds the zero rows away and a step is about 50 instructions, its row masks kept in
registers (measured: docs/measurements.md, "Design decisions: the packed matmul kernel").

The schedule marks the functions whose transposes it lowers with the AVX2 sequence
(:data:`PAD_TRANSPOSES_ATTR`); :func:`pad_transposes` runs between vectorization and vector
lowering (``matmul.schedule.apply_schedule``).
"""

from __future__ import annotations

from typing import Any

from stagegraph.mlir.bindings import ir, vector
from stagegraph.mlir.constants import zeros
from stagegraph.mlir.walk import collect

#: Set by the matmul schedule on a function whose transposes get the AVX2 lowering.
PAD_TRANSPOSES_ATTR = "stagegraph.pad_transposes"
#: The transpose the AVX2 sequence handles: LANES x LANES f32.
LANES = 8
#: Row counts padded: 4 and 8 have sequences of their own; 1-3 rows transpose cheaply as is.
PADDED_ROWS = frozenset({5, 6, 7})


def pad_transposes(payload: Any) -> int:
    """Pad every qualifying transpose in the marked functions of ``payload`` (see the module
    docstring) and strip the marks; returns how many were rewritten. A transpose qualifies
    when it swaps the two innermost dimensions of an f32 vector ``[1, ..., 1, R, 8]`` with R
    in :data:`PADDED_ROWS`."""
    rewritten = 0
    for func in collect(payload, lambda op: PAD_TRANSPOSES_ATTR in op.attributes):
        del func.attributes[PAD_TRANSPOSES_ATTR]
        for transpose in collect(func, "vector.transpose"):
            if _qualifies(transpose):
                _pad(transpose)
                rewritten += 1
    return rewritten


def _qualifies(transpose: Any) -> bool:
    source = ir.VectorType(transpose.operands[0].type)
    shape = source.shape
    if not isinstance(source.element_type, ir.F32Type) or len(shape) < 2 or source.scalable:
        return False
    rank = len(shape)
    swap_innermost = [*range(rank - 2), rank - 1, rank - 2]
    permutation = list(ir.DenseI64ArrayAttr(transpose.attributes["permutation"]))
    return (
        permutation == swap_innermost
        and all(size == 1 for size in shape[:-2])
        and shape[-1] == LANES
        and shape[-2] in PADDED_ROWS
    )


def _pad(transpose: Any) -> None:
    """rows x 8 -> (insert into zeros) 8 x 8 -> transpose -> 8 x rows (a slice of its rows)."""
    rows = ir.VectorType(transpose.operands[0].type).shape[-2]
    with ir.InsertionPoint(transpose), transpose.location:
        f32 = ir.F32Type.get()
        square = ir.VectorType.get([LANES, LANES], f32)
        block = vector.ShapeCastOp(ir.VectorType.get([rows, LANES], f32), transpose.operands[0])
        padded = vector.InsertStridedSliceOp(block.result, zeros(square), [0, 0], [1, 1])
        swapped = vector.TransposeOp(square, padded.result, [1, 0])
        columns = vector.ExtractStridedSliceOp(
            ir.VectorType.get([LANES, rows], f32), swapped.result, [0, 0], [LANES, rows], [1, 1]
        )
        result = vector.ShapeCastOp(transpose.results[0].type, columns.result)
    transpose.results[0].replace_all_uses_with(result.result)
    transpose.erase()
