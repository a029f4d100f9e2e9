"""Trim a generic op's input to the part it reads where dropping unit dims would otherwise
make the op invalid (the pooling/unit-dimension miscompile).

The mechanism: a pooling window reads input dim ``i`` at ``d_out * stride + d_win``. When
the output has a unit dim there (``d_out`` ranges over one value), upstream's
``linalg-fold-unit-extent-dims`` replaces ``d_out`` by 0 and the index becomes the bare
``d_win``. Linalg infers a loop's range from every operand dim indexed by that bare loop
dim, and now two disagree: the window operand says ``K`` (the window), the input says its
full extent ``D``. When the window covers only part of the input (``K < D``: a 3-D pool of
window 2 over a depth of 3), the rewritten ``linalg.generic`` does not verify. A
``D``-element input of which only ``K`` elements are read is legal before the fold, so the
fold is what breaks it, on every op of that shape (pools, strided convolutions).

The fix is exact, not a guard: before the fold, such an input is sliced
(``tensor.extract_slice`` at offset 0) to the extent the op reads along that dim, which is
the loop range the bare index will have. The op computes the same values (it never read the
rest), and the fold then has consistent shapes. Only inputs the fold would break are
touched, so other ops keep their IR byte for byte.
"""

from __future__ import annotations

from typing import Any

from stagegraph.mlir.walk import collect


def trim_unread_inputs(root: Any) -> int:
    """Slice, in every ``linalg.generic`` under ``root`` with static shapes, each input
    dim whose index becomes a bare loop dim of a smaller range once unit loop dims are
    dropped; returns how many inputs were sliced."""
    trimmed = 0
    for op in collect(root, "linalg.generic"):
        trimmed += _trim(op)
    return trimmed


def _trim(op: Any) -> int:
    from stagegraph.mlir.bindings import ir

    maps = [ir.AffineMapAttr(a).value for a in ir.ArrayAttr(op.attributes["indexing_maps"])]
    shapes = [_static_shape(v.type) for v in op.operands]
    if any(s is None for s in shapes) or len(maps) != len(shapes):
        return 0
    ranges = _loop_ranges(maps, shapes)
    if ranges is None:
        return 0
    inputs = len(op.operands) - len(op.results)  # generic on tensors: one init per result
    trimmed = 0
    for index in range(inputs):
        sizes = list(shapes[index])
        for dim, expr in enumerate(maps[index].results):
            bare = _bare_after_unit_drop(expr, ranges)
            if bare is not None and ranges[bare] < sizes[dim]:
                sizes[dim] = ranges[bare]
        if sizes != list(shapes[index]):
            _slice_operand(op, index, sizes)
            trimmed += 1
    return trimmed


def _static_shape(kind: Any) -> list[int] | None:
    from stagegraph.mlir.bindings import ir

    if isinstance(kind, ir.RankedTensorType) and kind.has_static_shape:
        return list(kind.shape)
    return None


def _loop_ranges(maps: list[Any], shapes: list[list[int]]) -> list[int] | None:
    """Each loop's range, from the operand dims indexed by the bare loop dim (None when a
    loop has none: the op is left alone)."""
    from stagegraph.mlir.bindings import ir

    ranges: dict[int, int] = {}
    for amap, shape in zip(maps, shapes, strict=True):
        for expr, size in zip(amap.results, shape, strict=True):
            if isinstance(expr, ir.AffineDimExpr):
                ranges.setdefault(expr.position, size)
    count = maps[0].n_dims
    if len(ranges) != count:
        return None
    return [ranges[i] for i in range(count)]


def _bare_after_unit_drop(expr: Any, ranges: list[int]) -> int | None:
    """The loop dim ``expr`` reduces to when unit loop dims become 0, if it is a compound
    index (``d_out * s + d_win``) that becomes a bare dim; else None."""
    from stagegraph.mlir.bindings import ir

    if isinstance(expr, ir.AffineDimExpr):
        return None
    terms = _linear_terms(expr)
    if terms is None:
        return None
    constant = terms.pop(None, 0)
    live = {d: c for d, c in terms.items() if ranges[d] != 1 and c != 0}
    if constant == 0 and len(live) == 1 and len(terms) > 1:
        ((dim, coefficient),) = live.items()
        return dim if coefficient == 1 else None
    return None


def _linear_terms(expr: Any) -> dict[int | None, int] | None:
    """``expr`` as {loop dim: coefficient, None: constant}, or None if it is not a
    non-negative linear combination (mod, floordiv, symbols, negative coefficients)."""
    from stagegraph.mlir.bindings import ir

    if isinstance(expr, ir.AffineDimExpr):
        return {expr.position: 1}
    if isinstance(expr, ir.AffineConstantExpr):
        return {None: expr.value} if expr.value >= 0 else None
    if isinstance(expr, ir.AffineAddExpr):
        left, right = _linear_terms(expr.lhs), _linear_terms(expr.rhs)
        if left is None or right is None:
            return None
        for key, value in right.items():
            left[key] = left.get(key, 0) + value
        return left
    if isinstance(expr, ir.AffineMulExpr):
        left, right = _linear_terms(expr.lhs), _linear_terms(expr.rhs)
        if left is None or right is None:
            return None
        factor, other = (right, left) if list(right) == [None] else (left, right)
        if list(factor) != [None]:
            return None
        return {key: value * factor[None] for key, value in other.items()}
    return None


def _slice_operand(op: Any, index: int, sizes: list[int]) -> None:
    """Feed operand ``index`` of ``op`` through a slice of ``sizes`` at offset 0."""
    from stagegraph.mlir.bindings import dialect, ir

    value = op.operands[index]
    source = ir.RankedTensorType(value.type)
    rank = len(sizes)
    with ir.InsertionPoint(op), op.location:
        result = ir.RankedTensorType.get(sizes, source.element_type, source.encoding)
        sliced = (
            dialect("tensor")
            .ExtractSliceOp(result, value, [], [], [], [0] * rank, sizes, [1] * rank)
            .result
        )
    op.operands[index] = sliced
