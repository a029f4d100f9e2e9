"""Finding the zero fill a matmul's output gets before a kernel that writes all of it.

A payload's matmul accumulates into a zero-filled tensor (``linalg.fill`` of 0.0), which
the GPU graph runs as its own kernel before the matmul's. A wgmma block writes every
element of its C tile, so when the only thing that touched C before is such a fill, the
fill kernel is dead (one pass over C less) and the block stores its accumulator instead of
adding it to C (no read of C). This module recognises that fill at buffer level: the
nearest top-level op before the block loop that touches C must be a block loop whose only
memory writes are zeros into views of C.
"""

from __future__ import annotations

from typing import Any

#: Ops a zero-fill kernel may hold besides its writes (index math, views, its loops).
_NEUTRAL = frozenset({
    "affine.apply", "arith.constant", "memref.subview", "scf.forall", "scf.forall.in_parallel",
    "scf.in_parallel", "arith.addi", "arith.muli",
})  # fmt: skip
_WRITES = frozenset({"vector.transfer_write", "linalg.fill", "memref.store"})


def _is_zero(value: Any) -> bool:
    """Whether ``value`` is an ``arith.constant`` 0.0 (a scalar or a splat)."""
    from stagegraph.mlir.bindings import ir

    owner = value.owner
    if isinstance(owner, ir.Block) or owner.name != "arith.constant":
        return False
    attr = owner.attributes["value"]
    if isinstance(attr, ir.FloatAttr):
        return attr.value == 0.0
    if isinstance(attr, ir.DenseFPElementsAttr) and attr.is_splat:
        return ir.FloatAttr(attr.get_splat_value()).value == 0.0
    return False


def _views_of(value: Any, root: Any) -> bool:
    """Whether ``value`` is ``root`` or a chain of subviews of it."""
    while value != root:
        owner = value.owner
        if not hasattr(owner, "name") or owner.name != "memref.subview":
            return False
        value = owner.operands[0]
    return True


def _touches(op: Any, root: Any) -> bool:
    """Whether ``op`` or an op nested in it has ``root`` as an operand."""
    from stagegraph.mlir.walk import collect

    return any(root == v for inner in [op, *collect(op)] for v in inner.operands)


def _fills_zeros(loop: Any, root: Any) -> bool:
    """Whether the block loop ``loop`` only writes zeros into views of ``root``."""
    from stagegraph.mlir.walk import collect

    if loop.name != "scf.forall":
        return False
    writes = 0
    for op in collect(loop):
        if op.name in _WRITES:
            value, target = op.operands[0], op.operands[1]
            if not (_is_zero(value) and _views_of(target, root)):
                return False
            writes += 1
        elif op.name not in _NEUTRAL:
            return False
    return writes > 0


def dead_zero_fill(root: Any, forall: Any) -> Any:
    """The zero-fill loop of ``root`` right before ``forall`` (no op between touches
    ``root``), or None."""
    earlier = []
    for op in forall.operation.block.operations:
        if op.operation == forall.operation:
            break
        earlier.append(op.operation)
    for op in reversed(earlier):
        if _touches(op, root):
            return op if _fills_zeros(op, root) else None
    return None
