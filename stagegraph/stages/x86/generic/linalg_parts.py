"""Readers of a linalg op's parts shared by the prepare rewrites (:mod:`.prepare`,
:mod:`.elementwise_fusion`): its body, its inputs, the op a value comes from."""

from __future__ import annotations

from typing import Any

from stagegraph.mlir.bindings import ir, linalg_native
from stagegraph.mlir.walk import children


def is_contraction(op: Any) -> bool:
    """A named linalg op, or a generic that is a contraction: never rewritten here."""
    return op.name != "linalg.generic" or bool(linalg_native.isa_contraction_op(op))


def input_count(op: Any) -> int:
    """How many of a linalg op's operands are inputs (the rest are inits)."""
    return int(next(iter(op.attributes["operandSegmentSizes"])))


def body_block(op: Any) -> Any:
    """The single block of a linalg op's body."""
    return op.regions[0].blocks[0]


def body_yield(op: Any) -> Any:
    """The ``linalg.yield`` ending a linalg op's body."""
    return children(op)[-1]


def result_owner(value: Any) -> Any | None:
    """The op whose result ``value`` is; None for a block argument."""
    owner = value.owner
    return owner.operation if isinstance(owner, ir.Operation | ir.OpView) else None


def is_bool_tensor(value_type: Any) -> bool:
    """A ranked tensor of ``i1`` (bit-packed as a vector: the schedule leaves these alone)."""
    if not isinstance(value_type, ir.RankedTensorType):
        return False
    element = ir.RankedTensorType(value_type).element_type
    return isinstance(element, ir.IntegerType) and ir.IntegerType(element).width == 1
