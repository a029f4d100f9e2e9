"""A ``linalg.generic`` read as a convolution: ``out += image * filter`` at stride 1, whose
last image dims read ``d_out + dilation * d_tap`` (how grouped 3-D convolutions are imported:
linalg has no named one). :mod:`.transposed` splits those into phases too."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stagegraph.mlir.walk import children


@dataclass(frozen=True)
class GenericConvolution:
    """A ``linalg.generic`` convolution (``out += image * filter``, stride 1) whose last
    image dims read ``d_out + dilation * d_tap`` and whose filter and output end with those
    taps and outputs: the loops (``pairs``: output loop, tap loop) and ``dilations`` per
    spatial dim."""

    pairs: list[tuple[int, int]]
    dilations: list[int]


def _term(expr: Any) -> tuple[int, int] | None:
    """``d_i`` or ``d_i * c`` (c > 0) as ``(i, c)``."""
    from stagegraph.mlir.bindings import ir

    if isinstance(expr, ir.AffineDimExpr):
        return expr.position, 1
    if isinstance(expr, ir.AffineMulExpr):
        dim, factor = expr.lhs, expr.rhs
        if isinstance(dim, ir.AffineDimExpr) and isinstance(factor, ir.AffineConstantExpr):
            return (dim.position, factor.value) if factor.value > 0 else None
    return None


def _multiply_accumulates(op: Any) -> bool:
    """Whether ``op``'s body is ``yield out + in0 * in1`` (operands in either order)."""
    body = children(op)  # plain ops: no dialect module imported to look
    if [o.name for o in body] != ["arith.mulf", "arith.addf", "linalg.yield"]:
        return False
    mul, add, end = body
    args = list(op.regions[0].blocks[0].arguments)
    if len(args) != 3 or len(end.operands) != 1 or end.operands[0] != add.results[0]:
        return False
    if {mul.operands[0], mul.operands[1]} != {args[0], args[1]}:
        return False
    return {add.operands[0], add.operands[1]} == {mul.results[0], args[2]}


def generic_convolution(op: Any) -> GenericConvolution | None:
    """``op`` (a ``linalg.generic``) as a stride-1 convolution with trailing spatial dims
    (grouped 3-D ones are imported this way), else ``None``."""
    from stagegraph.mlir.bindings import ir

    if not _multiply_accumulates(op):
        return None
    maps = [ir.AffineMapAttr(m).value for m in op.attributes["indexing_maps"]]
    image, kernel, out = (list(m.results) for m in maps)
    sums = 0
    while sums < len(image) and isinstance(image[-1 - sums], ir.AffineAddExpr):
        sums += 1
    if sums == 0 or sums > len(kernel) or sums > len(out):
        return None
    pairs, dilations = [], []
    for expr, tap, output in zip(image[-sums:], kernel[-sums:], out[-sums:], strict=True):
        terms = (_term(expr.lhs), _term(expr.rhs))
        if None in terms or not all(isinstance(e, ir.AffineDimExpr) for e in (tap, output)):
            return None
        found = dict(terms)
        if len(found) != 2 or found.get(output.position) != 1 or tap.position not in found:
            return None  # not d_out + dilation * d_tap at stride 1
        pairs.append((output.position, tap.position))
        dilations.append(found[tap.position])
    spatial = {d for pair in pairs for d in pair}
    if len(spatial) != 2 * sums:
        return None
    for expr in [*image[:-sums], *kernel[:-sums], *out[:-sums]]:
        if not isinstance(expr, ir.AffineDimExpr) or expr.position in spatial:
            return None  # the other dims: plain loops, none of the spatial ones
    return GenericConvolution(pairs, dilations)
