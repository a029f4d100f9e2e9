"""Recompute a cheap elementwise op in each of its consumers instead of storing it once.

Elementwise fusion (``linalg-fuse-elementwise-ops``) only moves a producer into its
consumer when it has a single use. Softmax's ``exp(x - max)`` feeds both the row sum and
the division: kept as its own kernel it costs a write and two reads of a full-size
tensor, where recomputing it in both consumers costs a second read of ``x`` (the GPU's
reductions and pointwise kernels run at memory speed; ``exp`` is free beside a load).
So an elementwise producer that reads at most one full-size tensor (its other inputs are
broadcast rows or scalars) is cloned once per consumer, and the fusion runs again.
"""

from __future__ import annotations

from typing import Any

#: Full-size inputs a cloned producer may read: each clone reads them again.
MAX_FULL_INPUTS = 1


def _recomputable(op: Any) -> bool:
    """An elementwise ``linalg.generic`` with one result, used by two or more generic ops,
    reading at most :data:`MAX_FULL_INPUTS` tensors of its result's size."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.stages.analysis import op_facts

    if op.name != "linalg.generic" or len(op.results) != 1:
        return False
    users = [use.owner for use in op.results[0].uses]
    if len(users) < 2 or any(user.name != "linalg.generic" for user in users):
        return False
    facts = op_facts(op, 0, "gpu.recompute")
    if facts.op_class != "elementwise" or any(k != "parallel" for k in facts.iterator_types):
        return False
    if {"linalg.index", "tensor.extract"} & set(facts.body_ops):
        return False
    shape = ir.RankedTensorType(op.results[0].type).shape
    full = [v for v in facts.inputs if tuple(v.shape) == tuple(shape)]
    return len(full) <= MAX_FULL_INPUTS


def duplicate_shared_producers(module: Any) -> int:
    """Give every consumer but the first of a recomputable producer its own clone of it,
    placed before that consumer; returns how many clones were made."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.functions import payload_functions, select_entry
    from stagegraph.mlir.walk import collect

    entry = select_entry(payload_functions(module))
    clones = 0
    for op in [o for o in collect(entry, "linalg.generic") if _recomputable(o)]:
        uses = [(use.owner, use.operand_number) for use in op.results[0].uses]
        for user, number in uses[1:]:
            copy = op.clone(ip=ir.InsertionPoint(user))
            user.operands[number] = copy.results[0]
            clones += 1
    return clones
