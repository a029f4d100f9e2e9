"""Build named linalg ops (``linalg.fill``, ``linalg.matmul``, ...) from the bindings' core.

The ``linalg`` dialect module of the Python bindings defines every named op through OpDSL on
import, which costs more than a tenth of a second; a workload that only needs a fill and a
matmul (and a command that only analyses it, such as ``tune --explain``) should not pay for
that. A named structured op is an ``operandSegmentSizes`` attribute and a body that the
dialect's C++ region builder knows how to fill, so it can be created generically.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def named_structured_op(name: str, inputs: Sequence[Any], outputs: Sequence[Any]) -> Any:
    """A named linalg op ``name`` (say ``"linalg.matmul"``) reading ``inputs`` and
    accumulating into ``outputs``, with its body filled as its OpDSL definition says; returns
    its single result (on tensors) or the op (on buffers). Needs an insertion point and a
    location, as every op builder does."""
    from stagegraph.mlir.bindings import ir, linalg_native

    result_types = [v.type for v in outputs if isinstance(v.type, ir.RankedTensorType)]
    op = ir.Operation.create(
        name,
        results=result_types,
        operands=[*inputs, *outputs],
        attributes={"operandSegmentSizes": ir.DenseI32ArrayAttr.get([len(inputs), len(outputs)])},
        regions=1,
    )
    linalg_native.fill_builtin_region(op)
    return op.results[0] if len(op.results) == 1 else op
