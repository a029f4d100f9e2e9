"""IR rewrites the pass registry lacks, done through the bindings.

``vector.reduction`` of floats is an ordered reduction unless it may reassociate: LLVM then
adds the lanes one after another (a chain of dependent adds as long as the vector), where a
reassociating reduction is a tree of vector adds. :func:`reassociate_reductions` allows it.

``memref.copy`` between strided buffers lowers to a call of ``memrefCopy`` from
``libmlir_c_runner_utils``, which the torch-mlir wheel does not ship (the JIT then fails to
resolve the symbol and crashes). Rewriting such copies as ``linalg.copy`` lets them lower to
plain loops instead.
"""

from __future__ import annotations

from typing import Any


def copies_to_linalg(module: Any) -> int:
    """Replace every ``memref.copy`` in ``module`` by ``linalg.copy``; returns the count."""
    from stagegraph.mlir import ir, linalg

    copies: list[Any] = []

    def collect(op: Any) -> Any:
        if op.name == "memref.copy":
            copies.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(collect)
    for op in copies:
        with ir.InsertionPoint(op), op.location:
            linalg.copy(op.operands[0], outs=[op.operands[1]])
        op.erase()
    return len(copies)


def reassociate_reductions(module: Any) -> int:
    """Let every float ``vector.reduction`` of ``module`` reassociate (the schedules made
    them from chunks of a row, whose order is no more meaningful than a tree's); returns
    the count. Every float combining kind (add, mul, min/max) is associative; sums then
    round differently, as any blocked or parallel sum does."""
    from stagegraph.mlir import ir

    changed = 0

    def visit(op: Any) -> Any:
        nonlocal changed
        if op.name != "vector.reduction" or not isinstance(
            ir.VectorType(op.operands[0].type).element_type, ir.FloatType
        ):
            return ir.WalkResult.ADVANCE
        op.attributes["fastmath"] = ir.Attribute.parse("#arith.fastmath<reassoc>")
        changed += 1
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return changed
