"""A matmul's initial C added in its epilogue: accumulate from zero, then ``C + A @ B``.

A ``linalg.matmul`` whose ``outs`` holds values (a convolution's bias broadcast, which the
implicit GEMM's blocks accumulate into: ``conv/gemm_blocks.py``; ``C += A @ B`` payloads)
reached the packed kernel as its accumulators' initial values. Fused into the register
tiles' loops, that packed init reads the tile from the block's original tensor while the
loop writes the tile into the loop-carried one: a read after the first write, which
bufferization resolves by copying the whole block in (and the result back out). On
AlexNet's first convolution (l1_050) those copies were about 10% of the run time.

Here such a matmul accumulates from a zero fill instead, and a new all-parallel
``linalg.generic`` adds its result to C, with C as that generic's ``outs``: it is the
matmul's first elementwise consumer (``canonical._elementwise_chain``), fused into the
pass that writes C, and tiling it makes its tiles slices of the loop-carried C, so C is
read and written in place. The sum is the same up to the order of one addition (C added
after the products rather than before them).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from stagegraph.mlir.bindings import arith, ir
from stagegraph.mlir.build import generic, named_structured_op
from stagegraph.mlir.walk import collect
from stagegraph.stages.x86.matmul.canonical import SOURCE_ATTR, _zero_fill


def init_as_epilogue(payload: Any, sources: Collection[int]) -> int:
    """Rewrite every ``linalg.matmul`` of ``payload`` on float tensors made from one of the
    ops ``sources`` (``SOURCE_ATTR``: those the matmul schedule takes; another would run
    its new adds as loops) whose ``outs`` is not a zero fill, as described above; returns
    how many."""
    rewritten = 0
    for op in collect(payload.operation, "linalg.matmul"):
        if SOURCE_ATTR not in op.attributes or len(op.results) != 1:
            continue
        if ir.IntegerAttr(op.attributes[SOURCE_ATTR]).value not in sources:
            continue
        if _zero_fill(op.operands[2]):
            continue
        result = ir.RankedTensorType(op.results[0].type)
        if not isinstance(result.element_type, ir.FloatType):
            continue
        _rewrite(op, result)
        rewritten += 1
    return rewritten


def _rewrite(op: Any, result: Any) -> None:
    from stagegraph.mlir.bindings import dialect

    tensor = dialect("tensor")
    initial = op.operands[2]
    with ir.InsertionPoint(op), op.location:
        empty = tensor.EmptyOp(result.shape, result.element_type).result
        zero = arith.ConstantOp(result.element_type, 0.0).result
        zeros = named_structured_op("linalg.fill", [zero], [empty])
    op.operands[2] = zeros
    with ir.InsertionPoint(op), op.location:  # (moved after the matmul below)
        identity = ir.AffineMap.get_identity(result.rank)
        summed = generic(
            [op.results[0]],
            [initial],
            [identity, identity],
            ["parallel"] * result.rank,
            lambda product, c: arith.AddFOp(c, product).result,
        )
    adder = summed.owner
    adder.move_after(op.operation)
    for use in list(op.results[0].uses):
        if use.owner.operation != adder:
            use.owner.operation.operands[use.operand_number] = summed
