"""Dilated poolings of a padded image read the image itself, skipping the padding.

torch-mlir pads a pooling's image with the combiner's identity (-inf for a max pooling)
into a new tensor: a fill of the whole padded tensor and a copy of the image, 12 MB of
traffic for l1_043's MaxPool3d at the 16x size (8 MB padded from 4 MB), which PyTorch
does not spend. A pooling with a dilated window runs as loops anyway (the generic
schedule does not vectorize it: ``plan.convolution_plan``), each window element one load.
Here such a pooling becomes a ``linalg.generic`` over the same loops that reads each
window element from the unpadded image with ``tensor.extract`` at its position less the
low padding (clamped into the image) and takes the identity where the position falls in
the padding: the same values, and no padded tensor.
"""

from __future__ import annotations

import math
from typing import Any

from stagegraph.mlir.bindings import arith, dialect, ir
from stagegraph.mlir.build import generic
from stagegraph.mlir.walk import children, top_level_ops
from stagegraph.stages.analysis import declared_iterator_types
from stagegraph.stages.x86.generic.linalg_parts import result_owner
from stagegraph.stages.x86.generic.transpose_fusion import _pad_value

#: The combiners whose identity padding can be skipped, with that identity.
_IDENTITIES = {"arith.maximumf": -math.inf, "arith.minimumf": math.inf, "arith.addf": 0.0}


def dilated_pools_read_unpadded(fn: Any) -> int:
    """Rewrite every top-level dilated pooling of ``fn`` over a padded image, as above;
    returns how many."""
    rewritten = 0
    for op in top_level_ops(fn):
        match = _match(op)
        if match is None:
            continue
        pad, combiner = match
        with ir.InsertionPoint(op), op.location:
            pooled = _unpadded(op, pad, combiner)
        op.results[0].replace_all_uses_with(pooled)
        op.erase()
        if not list(pad.results[0].uses):
            pad.erase()
        rewritten += 1
    return rewritten


def _match(op: Any) -> tuple[Any, str] | None:
    """(the pad, the combiner's name) of a pooling ``linalg.generic``: an image and a
    window in, one result, a body that combines the image's element with the result's,
    an image padded (statically) with the combiner's identity, a dilated window."""
    if op.name != "linalg.generic" or len(op.operands) != 3 or len(op.results) != 1:
        return None
    body = children(op)
    if len(body) != 2 or body[0].name not in _IDENTITIES:
        return None
    args = list(op.regions[0].blocks[0].arguments)
    if {v for v in body[0].operands} != {args[0], args[2]} or body[1].operands[0] != body[
        0
    ].results[0]:
        return None
    pad = result_owner(op.operands[0])
    if pad is None or pad.name != "tensor.pad" or len(pad.operands) != 1:
        return None
    if not ir.RankedTensorType(pad.operands[0].type).has_static_shape:
        return None
    value = _pad_value(pad)
    if (
        value is None
        or ir.FloatAttr(result_owner(value).attributes["value"]).value != _IDENTITIES[body[0].name]
    ):
        return None
    return (pad, body[0].name) if _dilated(op) else None


def _maps(op: Any) -> list[Any]:
    return [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(op.attributes["indexing_maps"])]


def _dilated(op: Any) -> bool:
    """Whether a reduction loop steps the image's position by more than 1 in some dim."""
    image = _maps(op)[0]
    kinds = declared_iterator_types(op)
    for loop, kind in enumerate(kinds):
        if kind != "reduction":
            continue
        unit = [1 if d == loop else 0 for d in range(image.n_dims)]
        point = ir.AffineMap.get(0, 0, [ir.AffineConstantExpr.get(v) for v in unit])
        origin = ir.AffineMap.get(0, 0, [ir.AffineConstantExpr.get(0)] * image.n_dims)
        for expr in image.results:
            step = ir.AffineConstantExpr(expr.compose(point)).value
            if step - ir.AffineConstantExpr(expr.compose(origin)).value > 1:
                return True
    return False


def _unpadded(op: Any, pad: Any, combiner: str) -> Any:
    """The pooling ``op`` reading ``pad``'s source with bounds checks (see the module)."""
    maps = _maps(op)
    image = pad.operands[0]
    shape = ir.RankedTensorType(image.type).shape
    low = list(ir.DenseI64ArrayAttr(pad.attributes["static_low"]))
    high = list(ir.DenseI64ArrayAttr(pad.attributes["static_high"]))
    element = ir.RankedTensorType(image.type).element_type
    kinds = list(declared_iterator_types(op))
    index = ir.IndexType.get()
    affine, tensor = dialect("affine"), dialect("tensor")

    def body(_window: Any, out: Any) -> Any:
        loops = [
            ir.Operation.create(
                "linalg.index", results=[index],
                attributes={"dim": ir.IntegerAttr.get(ir.IntegerType.get_signless(64), d)},
            ).result
            for d in range(maps[0].n_dims)
        ]  # fmt: skip
        positions, inside = [], None
        for dim, expr in enumerate(maps[0].results):
            shifted = ir.AffineMap.get(maps[0].n_dims, 0, [expr - low[dim]])
            position = affine.AffineApplyOp(shifted, loops).result
            if low[dim] or high[dim]:
                zero = arith.ConstantOp(index, 0).result
                last = arith.ConstantOp(index, shape[dim] - 1).result
                within = arith.AndIOp(
                    arith.CmpIOp(arith.CmpIPredicate.sge, position, zero).result,
                    arith.CmpIOp(arith.CmpIPredicate.sle, position, last).result,
                ).result
                inside = within if inside is None else arith.AndIOp(inside, within).result
                position = arith.MaxSIOp(arith.MinSIOp(position, last).result, zero).result
            positions.append(position)
        read = tensor.ExtractOp(image, positions).result
        if inside is not None:
            identity = arith.ConstantOp(element, _IDENTITIES[combiner]).result
            read = arith.SelectOp(inside, read, identity).result
        return ir.Operation.create(combiner, results=[element], operands=[read, out]).result

    return generic([op.operands[1]], [op.operands[2]], maps[1:], kinds, body)
