"""Which results of a payload are plain sums, and of how many terms.

Why the verifier needs it: a result computed as ``sum_j y_j`` accumulates rounding errors
at the size of its partial sums, ``sqrt(n)`` times the size of the terms for ``n`` terms of
random sign, even when the terms cancel and the result is near zero (the sum over a
GroupNorm group: the error of the group mean is added ``n`` times). The default magnitude
floor of a payload is the size of its inputs, i.e. of the terms; for such a result the floor
is ``sqrt(n)`` times that, as :class:`~workloads.matmul.Matmul` already says for its sum of
``k`` products. Only results produced by a sum reduction get it: elsewhere (elementwise ops
after a convolution, a mean divided by ``n``) the floor stays the inputs' size, so the
verifier keeps its strength there.
"""

from __future__ import annotations

from typing import Any

#: Ops a result may pass through after its reduction (views and casts of the same values).
_VIEWS = ("tensor.expand_shape", "tensor.collapse_shape", "tensor.cast", "tensor.reshape")


def summed_terms(module: Any, entry: str) -> list[int]:
    """Per result of ``entry``: the number of terms summed into each element when the
    result comes from a sum reduction (``linalg.generic`` whose body only adds its input to
    the accumulator), else 1."""
    from stagegraph.mlir.functions import entry_function

    with module.context:
        function = entry_function(module, entry)
        block = function.regions[0].blocks[0]
        terminator = list(block.operations)[-1]
        return [_terms(value) for value in terminator.operands]


def _terms(value: Any) -> int:
    from stagegraph.mlir.bindings import ir

    op = _producer(value)
    while op is not None and op.name in _VIEWS:
        op = _producer(op.operands[0])
    if op is None or op.name != "linalg.generic" or not _adds_input(op):
        return 1
    kinds = [str(k) for k in ir.ArrayAttr(op.attributes["iterator_types"])]
    maps = [ir.AffineMapAttr(a).value for a in ir.ArrayAttr(op.attributes["indexing_maps"])]
    shape = ir.RankedTensorType(op.operands[0].type).shape
    ranges = {
        expr.position: size
        for expr, size in zip(maps[0].results, shape, strict=True)
        if isinstance(expr, ir.AffineDimExpr)
    }
    terms = 1
    for dim, kind in enumerate(kinds):
        if "reduction" in kind:
            terms *= ranges.get(dim, 1)
    return terms


def _producer(value: Any) -> Any:
    from stagegraph.mlir.bindings import ir

    owner = value.owner
    return owner if isinstance(owner, ir.Operation) else getattr(owner, "operation", None)


def _adds_input(op: Any) -> bool:
    """One input, one init, and a body that is ``yield(addf(in, acc))``."""
    if len(op.operands) != 2 or len(op.results) != 1:
        return False
    block = op.regions[0].blocks[0]
    body = list(block.operations)
    if len(body) != 2 or body[0].name != "arith.addf" or body[1].name != "linalg.yield":
        return False
    arguments = set(block.arguments)
    return set(body[0].operands) == arguments and body[1].operands[0] == body[0].result
