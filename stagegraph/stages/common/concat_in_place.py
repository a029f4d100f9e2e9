"""Concatenations written in place by their producers.

``tensor.concat`` bufferizes to a new buffer and one copy per operand: each producer
(a convolution's epilogue, an Inception branch, a DenseNet layer) first writes its own
buffer, which is then copied into its slice of the result, one pass over memory per
operand for nothing. Here each concatenation becomes ``tensor.insert_slice`` ops into a
``tensor.empty`` of the result, each operand inserted without the unit-dim
``tensor.expand_shape`` the importer put between it and its producer (a rank-reducing
insert reads the producer's own result). One-shot bufferization, preceded by
``eliminate-empty-tensors`` (:data:`stagegraph.stages.common.lowering.BUFFERIZE`), then
lets each producer whose init is a ``tensor.empty`` write straight into its slice of the
concatenation's buffer: the copies disappear. An operand that is a function argument or is
read elsewhere is still copied once, as it must be.
"""

from __future__ import annotations

from typing import Any

from stagegraph.mlir.walk import collect


def concatenations_in_place(module: Any) -> int:
    """Rewrite every ``tensor.concat`` of ``module`` with static shapes as insertions into
    an empty tensor (see the module doc); returns how many were rewritten."""
    from stagegraph.mlir.bindings import ir

    rewritten = 0
    for op in collect(module.operation, "tensor.concat"):
        result = ir.RankedTensorType(op.results[0].type)
        if not result.has_static_shape or not all(
            ir.RankedTensorType(v.type).has_static_shape for v in op.operands
        ):
            continue
        _rewrite(op, result)
        rewritten += 1
    return rewritten


def _rewrite(op: Any, result: Any) -> None:
    from stagegraph.mlir.bindings import dialect, ir

    tensor = dialect("tensor")
    axis = ir.IntegerAttr(op.attributes["dim"]).value
    with ir.InsertionPoint(op), op.location:
        dest = tensor.EmptyOp(result.shape, result.element_type).result
        offset = 0
        for operand in list(op.operands):
            shape = list(ir.RankedTensorType(operand.type).shape)
            source = _without_unit_expansion(operand)
            offsets = [0] * len(shape)
            offsets[axis] = offset
            dest = tensor.InsertSliceOp(
                source, dest, [], [], [], offsets, shape, [1] * len(shape)
            ).result
            offset += shape[axis]
    op.results[0].replace_all_uses_with(dest)
    op.erase()


def _without_unit_expansion(value: Any) -> Any:
    """The source of a ``tensor.expand_shape`` that only adds unit dims (its only use being
    the concatenation), so the insertion reads the producer's result; else ``value``."""
    from stagegraph.mlir.bindings import ir

    owner = value.owner
    if isinstance(owner, ir.Block) or owner.operation.name != "tensor.expand_shape":
        return value
    source = owner.operation.operands[0]
    expanded = list(ir.RankedTensorType(value.type).shape)
    original = list(ir.RankedTensorType(source.type).shape)
    if [s for s in expanded if s != 1] != [s for s in original if s != 1] or 1 in original:
        return value
    if len(list(value.uses)) != 1:
        return value
    return source
