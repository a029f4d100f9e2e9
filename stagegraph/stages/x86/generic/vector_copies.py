"""Copies bufferization leaves (a ``tensor.pad``'s image copy, a concatenation) vectorized
row by row, in ``x86.lower``: as loops they move one scalar at a time."""

from __future__ import annotations

from typing import Any

from stagegraph.stages.x86.generic.params import GenericParams, largest_divisor_at_most
from stagegraph.stages.x86.generic.schedule import OpSequenceBuilder

COPY_ATTR = "stagegraph.vector_copy"


#: Shortest row a copy is vectorized for (one 128-bit vector of f32): as scalar loops, LLVM
#: vectorized a pooling's padding copy (rows of 8 on AVX-512) into masked scatters.
MIN_COPY_ROW = 4


def _row_copy_tiles(op: Any, max_row: int, lanes: int) -> list[int] | None:
    """Tile sizes that make a ``linalg.copy`` on memrefs a loop of whole-row copies (every
    dim 1 but the innermost, which is whole or a static divisor of at most ``max_row``);
    None when a shape is dynamic, a row is shorter than both ``lanes`` and
    :data:`MIN_COPY_ROW`, or an operand is not contiguous along its innermost dim (its rows
    would be gathered element by element)."""
    from stagegraph.mlir.bindings import ir

    types = [v.type for v in op.operands]
    if not all(isinstance(t, ir.MemRefType) for t in types):
        return None
    shape = list(ir.MemRefType(types[0]).shape)
    if not shape or any(ir.ShapedType.is_dynamic_size(s) for s in shape):
        return None
    if any(ir.MemRefType(t).get_strides_and_offset()[0][-1] != 1 for t in types):
        return None
    row = shape[-1]
    if row < min(lanes, MIN_COPY_ROW):
        return None  # shorter rows: scalar loops move them as fast
    inner = 0 if row <= max_row else largest_divisor_at_most(row, max_row)
    return [1] * (len(shape) - 1) + [inner]


def vectorize_copies(module: Any, max_row: int, lanes: int) -> int:
    """Vectorize the ``linalg.copy`` ops of a bufferized ``module`` row by row (rows of
    ``lanes`` to ``max_row`` elements, contiguous operands); returns how many were.

    Copies are what bufferization leaves for a ``tensor.pad`` (the image copied into the
    padded buffer) or a concatenation; as loops they move one scalar at a time: LLVM does
    not vectorize them, as the buffers' aligned pointers hide that they do not alias (a
    max pooling's padding copy took a fifth of its time).
    """
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import collect, strip_attributes
    from stagegraph.stages.common.transform import apply_schedule_module, new_schedule

    module = getattr(module, "ir", module)
    plans = []
    i64 = ir.IntegerType.get_signless(64)
    for op in collect(module.operation, "linalg.copy"):
        sizes = _row_copy_tiles(op, max_row, lanes)
        if sizes is not None:
            op.attributes[COPY_ATTR] = ir.IntegerAttr.get(i64, len(plans))
            plans.append(sizes)
    if not plans:
        return 0
    builder = OpSequenceBuilder(GenericParams())
    schedule, main = new_schedule()
    with ir.InsertionPoint(main.body):
        for index, sizes in enumerate(plans):
            seq, root = builder.suppressed(main.bodyTarget)
            with ir.InsertionPoint(seq.body):
                target = builder.match(root, COPY_ATTR, index)
                if len(sizes) > 1 or sizes[-1]:
                    tiled = builder.structured.TileUsingForOp(target, sizes=sizes)
                    target = tiled.results[0]
                builder.structured.VectorizeOp(target)
                builder.transform.YieldOp([])
        builder.transform.YieldOp([])
    apply_schedule_module(module, schedule)
    strip_attributes(module, COPY_ATTR)
    return len(plans)
