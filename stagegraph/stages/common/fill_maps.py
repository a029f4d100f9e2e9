"""A buffer filled with one value is filled as one flat row.

Bufferization lowers a ``tensor.pad`` to a ``linalg.map`` with no inputs that yields the
padding value into every element of the new buffer, then copies the image into its
interior. As loops, that map is a nest as deep as the buffer's rank; LLVM's loop vectorizer
vectorized an outer loop of it into masked scatters of four lanes (a 3-D max pooling's
padding, 8x16x10x10x10, took four fifths of its run time). A buffer with the identity
layout is contiguous, so :func:`constant_maps_to_fills` fills it as a ``linalg.fill`` of
its collapsed 1-D view instead: one loop of contiguous stores, which LLVM vectorizes and
unrolls. Run on the buffer-level module before linalg becomes loops.
"""

from __future__ import annotations

from typing import Any

from stagegraph.mlir.walk import collect


def constant_maps_to_fills(module: Any) -> int:
    """Replace every input-less ``linalg.map`` that yields a value from outside its body
    into a static, identity-layout memref by a fill of its flat view; returns how many."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.build import named_structured_op

    module = getattr(module, "ir", module)
    count = 0
    with module.context:
        for op in collect(module.operation, "linalg.map"):
            value = _filled_value(op)
            if value is None:
                continue
            target = op.operands[0]
            with ir.InsertionPoint(op), op.location:
                named_structured_op("linalg.fill", [value], [_flat_view(target)])
            op.erase()
            count += 1
    return count


def _filled_value(op: Any) -> Any | None:
    """The value an input-less map on a contiguous static memref yields, else None."""
    from stagegraph.mlir.bindings import ir

    if len(op.operands) != 1 or len(op.results) != 0:
        return None
    memref = op.operands[0].type
    if not isinstance(memref, ir.MemRefType) or not ir.MemRefType(memref).has_static_shape:
        return None
    kind = ir.MemRefType(memref)
    if ir.AffineMapAttr(kind.layout).value != ir.AffineMap.get_identity(kind.rank):
        return None
    body = op.regions[0].blocks[0]
    inner = [child.operation for child in body.operations]
    if len(inner) != 1 or inner[0].name != "linalg.yield" or len(inner[0].operands) != 1:
        return None
    value = inner[0].operands[0]
    if isinstance(value.owner, ir.Block):  # the block argument: the buffer's own element
        return None
    return value


def _flat_view(target: Any) -> Any:
    """``target`` (contiguous, static) collapsed to one dimension."""
    from stagegraph.mlir.bindings import dialect, ir

    memref = dialect("memref")
    kind = ir.MemRefType(target.type)
    if kind.rank <= 1:
        return target
    size = 1
    for extent in kind.shape:
        size *= extent
    flat = ir.MemRefType.get([size], kind.element_type, memory_space=kind.memory_space)
    return memref.collapse_shape(flat, target, [list(range(kind.rank))])
