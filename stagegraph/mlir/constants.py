"""Zero constants: make a splat zero vector, and recognise a constant that is all zero.

Rewrites that start a value from zero (an accumulator, a polynomial's sum) build it here, and
rewrites that may skip adding a zero ask here, so "zero" means the same thing everywhere:
``arith.constant`` with a splat 0 (integer or float; a float -0.0 counts, as it adds nothing).
"""

from __future__ import annotations

from typing import Any

from stagegraph.mlir.walk import defining_op


def zeros(shaped_type: Any) -> Any:
    """An ``arith.constant`` splat 0 of ``shaped_type`` (a vector or tensor type of integers
    or floats), built at the current insertion point; returns its value."""
    from stagegraph.mlir.bindings import arith, ir

    element = shaped_type.element_type
    zero = (
        ir.FloatAttr.get(element, 0.0)
        if isinstance(element, ir.FloatType)
        else ir.IntegerAttr.get(element, 0)
    )
    return arith.ConstantOp(shaped_type, ir.DenseElementsAttr.get_splat(shaped_type, zero)).result


def is_zero(value: Any) -> bool:
    """Whether ``value`` is an ``arith.constant`` whose every element (or itself, a scalar)
    is 0."""
    op = defining_op(value)
    return op is not None and is_zero_constant(op)


def is_zero_constant(op: Any) -> bool:
    """Whether ``op`` is an ``arith.constant`` whose every element (or itself, a scalar) is
    0: for a caller that found the defining op itself (a ``DefUse`` map, say)."""
    from stagegraph.mlir.bindings import ir

    if op.name != "arith.constant":
        return False
    attr = op.attributes["value"]
    if isinstance(attr, ir.DenseElementsAttr):
        if not attr.is_splat:
            return False
        attr = attr.get_splat_value()
    if isinstance(attr, ir.FloatAttr):
        return attr.value == 0.0
    if isinstance(attr, ir.IntegerAttr):
        return attr.value == 0
    return False
