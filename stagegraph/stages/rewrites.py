"""IR rewrites the pass registry lacks, done through the bindings.

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
