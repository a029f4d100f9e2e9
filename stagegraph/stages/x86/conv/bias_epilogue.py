"""A convolution's bias added in each GEMM block's epilogue, not broadcast over its output
first.

PyTorch's biased convolutions arrive with their init a ``linalg.broadcast`` of the bias
over the whole ``[N, F, O...]`` output. The implicit GEMM in blocks of output rows
(:mod:`.gemm_blocks`) accumulated into that: one pass writing the whole output with the
bias before any block ran, and every block reading its part back as the matmul's initial
C (AlexNet's first layer, l1_050: 2.3 MB written and read back, 9 MB at the 16x size).
Here the blocks' loop starts from the broadcast's empty destination instead; each block's
matmul accumulates from zero and one all-parallel ``linalg.generic`` adds ``bias[f]`` to
its ``[F, columns]`` result, written into the block's rows of the output: the matmul's
elementwise consumer, which the packed kernel computes in the pass that writes C. The sum
is the same up to the order of one addition (the bias added after the products).
"""

from __future__ import annotations

from typing import Any

from stagegraph.mlir.build import generic, named_structured_op


def bias_of(init: Any) -> tuple[Any, Any] | None:
    """(the ``[F]`` bias, the broadcast's destination) when ``init`` (a convolution's
    ``[N, F, O...]`` init) is a ``linalg.broadcast`` of a 1-D tensor along the filters
    (every dim added but dim 1) that the convolution alone reads; else None."""
    from stagegraph.mlir.bindings import ir

    owner = getattr(init.owner, "operation", None)  # (a block argument's owner is a block)
    if owner is None or owner.name != "linalg.broadcast" or len(owner.operands) != 2:
        return None
    rank = ir.RankedTensorType(init.type).rank
    added = sorted(ir.DenseI64ArrayAttr(owner.attributes["dimensions"]))
    if added != [d for d in range(rank) if d != 1] or len(list(init.uses)) != 1:
        return None
    return owner.operands[0], owner.operands[1]


def erase_if_unused(owner: Any) -> None:
    """Erase ``owner`` (an init's defining op, or a block argument's block) when it is a
    ``linalg.broadcast`` nothing reads any more: the bias :func:`bias_of` found, once its
    convolution is gone."""
    op = getattr(owner, "operation", owner)
    if getattr(op, "name", None) == "linalg.broadcast" and not list(op.results[0].uses):
        op.erase()


def biased_block(weights: Any, patches: Any, bias: Any, into: Any, attributes: dict) -> Any:
    """``W @ P + bias[f]`` of one block, written into ``into`` (the block's ``[F, columns]``
    rows of the output): the matmul from a zero fill, the add its epilogue."""
    from stagegraph.mlir.bindings import arith, dialect, ir

    result = ir.RankedTensorType(into.type)
    empty = dialect("tensor").EmptyOp(result.shape, result.element_type).result
    zero = arith.ConstantOp(result.element_type, 0.0).result
    zeros = named_structured_op("linalg.fill", [zero], [empty])
    made = named_structured_op("linalg.matmul", [weights, patches], [zeros], attributes)
    identity = ir.AffineMap.get_identity(2)
    rows = ir.AffineMap.get(2, 0, [ir.AffineDimExpr.get(0)])
    return generic(
        [made, bias],
        [into],
        [identity, rows, identity],
        ["parallel", "parallel"],
        lambda product, b, _: arith.AddFOp(product, b).result,
    )
