"""Transposes of constant tensors, done once at compile time.

PyTorch's ``nn.Linear`` imports as ``x @ transpose(W)`` with ``W`` a constant. Left in the
payload, the transpose is a pass of its own that rewrites all of W on every call, before
the matmul reads the copy. The transposed constant is computed here instead, from the
constant's value (``dense_resource`` blobs are read by evaluating them:
:func:`~stagegraph.stages.common.constant_gathers.evaluate_constants`), and replaces the
transpose's result; the original constant goes once nothing else reads it, so the binary
holds one copy. Constants above ``max_elements`` (all folded ones together) are left to
run time: the evaluation would hold several copies of them while compiling.

The GPU graph folds every such transpose (:mod:`stagegraph.stages.gpu.constant_weights`);
the x86 graph only those feeding a matmul of a few rows (its ``matmul.weight_rows``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

#: Constants above this many elements (all folded ones together) are not evaluated.
MAX_ELEMENTS = 1 << 24


def fold_constant_transposes(
    module: Any,
    only: Callable[[Any], bool] | None = None,
    max_elements: int = MAX_ELEMENTS,
) -> int:
    """Replace each ``linalg.transpose`` of an ``arith.constant`` tensor (for which
    ``only(transpose)`` holds, when given) by the transposed constant; returns how many."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import DefUse, collect
    from stagegraph.stages.common.constant_gathers import evaluate_constants

    found, total = [], 0
    def_use = DefUse(module)  # value.owner would import the dialects' modules (see DefUse)
    for op in collect(module, "linalg.transpose"):
        source = def_use.owner(op.operands[0])
        if source is None or source.name != "arith.constant":
            continue
        if only is not None and not only(op):
            continue
        size = int(np.prod(ir.RankedTensorType(op.operands[0].type).shape))
        if total + size > max_elements:
            continue
        total += size
        found.append((op, source))
    if not found:
        return 0
    values = evaluate_constants(module, [source for _, source in found])
    for (op, source), value in zip(found, values, strict=True):
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
        if not list(source.results[0].uses):
            source.erase()
    return len(found)
