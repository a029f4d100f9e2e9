"""Transposes of constant weights, done once at compile time on the GPU graph.

PyTorch's ``nn.Linear`` imports as ``x @ transpose(W)`` with ``W`` a constant: a kernel of
its own that rewrites all of W on every call, before the matmul's kernel reads it (for a
1024x1024 bf16 Linear, as many bytes moved as the matmul reads). The transposed constant
is computed here instead, from the constant's value (``dense_resource`` blobs are read by
evaluating them: :func:`~stagegraph.stages.common.constant_gathers.evaluate_constants`),
and the transpose's result is that new constant. Weights larger than
:data:`MAX_ELEMENTS` are left to the kernel (the probe would copy them).
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: Constants above this many elements (all folded ones together) are not evaluated.
MAX_ELEMENTS = 1 << 24


def fold_constant_transposes(module: Any) -> int:
    """Replace each ``linalg.transpose`` of an ``arith.constant`` tensor by the transposed
    constant; returns how many."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import collect
    from stagegraph.stages.common.constant_gathers import evaluate_constants

    found, total = [], 0
    for op in collect(module, "linalg.transpose"):
        source = op.operands[0].owner
        if not isinstance(source, ir.Operation | ir.OpView) or source.name != "arith.constant":
            continue
        size = int(np.prod(ir.RankedTensorType(op.operands[0].type).shape))
        if total + size > MAX_ELEMENTS:
            continue
        total += size
        found.append((op, source))
    if not found:
        return 0
    values = evaluate_constants(module, [source for _, source in found])
    for (op, _), value in zip(found, values, strict=True):
        permutation = list(ir.DenseI64ArrayAttr(op.attributes["permutation"]))
        folded = np.ascontiguousarray(np.transpose(value, permutation))
        result_type = op.results[0].type
        with ir.InsertionPoint(op), op.location:
            attr = ir.DenseResourceElementsAttr.get_from_buffer(
                memoryview(folded), f"stagegraph_transposed_{id(op):x}", result_type
            )
            made = ir.Operation.create("arith.constant", results=[result_type],
                                       attributes={"value": attr})  # fmt: skip
        op.results[0].replace_all_uses_with(made.results[0])
        op.erase()
    return len(found)
