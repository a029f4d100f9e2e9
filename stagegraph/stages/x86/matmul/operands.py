"""Operand rewrites on canonicalized matmuls, before :func:`matmul_canonical.find_matmuls`.

:func:`fold_transposed_operands`: a ``linalg.matmul`` operand that is a 2-D
``linalg.transpose`` (PyTorch's ``nn.Linear`` computes ``x @ W.T``) is read through the
matmul's ``indexing_maps`` instead: the schedule packs the transposed layout directly
(``MatmulSite.transpose_b`` packs ``B[n, k]`` as ``[N/reg_n, K, reg_n]`` panels), so the
transposed copy of the weights is never materialised, and no separate, unvectorized pass
over them runs on every call.
"""

from __future__ import annotations

from stagegraph.mlir.bindings import ir, linalg_native
from stagegraph.mlir.build import named_structured_op
from stagegraph.mlir.walk import collect

# Attributes of the rewritten matmul carried over to the new op (labels of the schedule).
_KEPT = ("stagegraph.matmul_source", "stagegraph.matmul_site")


def _swap_results(amap: ir.AffineMap) -> ir.AffineMap:
    """The map of an operand read through a 2-D transpose: its two results swapped."""
    results = list(amap.results)
    return ir.AffineMap.get(amap.n_dims, amap.n_symbols, [results[1], results[0]])


def _transpose_input(value: ir.Value) -> ir.Value | None:
    """The input of the 2-D ``linalg.transpose`` (permutation ``[1, 0]``) defining
    ``value``, else None."""
    owner = value.owner
    if not isinstance(owner, ir.Operation | ir.OpView):
        return None
    op = owner.operation
    if op.name != "linalg.transpose" or len(op.results) != 1:
        return None
    perm = list(ir.DenseI64ArrayAttr(op.attributes["permutation"]))
    if perm != [1, 0]:
        return None
    return op.operands[0]


def fold_transposed_operands(payload: ir.Module) -> int:
    """Make every labelled 2-D ``linalg.matmul`` (``SOURCE_ATTR``) read its A / B operands
    through their transposes' inputs, with the transposition in its ``indexing_maps``; a
    transpose left without uses is erased. Returns the number of operands folded."""
    matmuls = collect(
        payload.operation,
        lambda op: op.name == "linalg.matmul" and _KEPT[0] in op.attributes,
    )
    folded = 0
    for op in matmuls:
        op = op.operation
        if len(op.operands) != 3 or not all(
            isinstance(v.type, ir.RankedTensorType) and ir.RankedTensorType(v.type).rank == 2
            for v in op.operands
        ):
            continue
        maps = [ir.AffineMapAttr(m).value for m in linalg_native.get_indexing_maps(op)]
        operands = list(op.operands)
        transposes = []
        for i in (0, 1):
            source = _transpose_input(operands[i])
            if source is None:
                continue
            transposes.append(operands[i].owner.operation)
            operands[i] = source
            maps[i] = _swap_results(maps[i])
        if not transposes:
            continue
        with ir.InsertionPoint(op), op.location:
            maps_attr = ir.ArrayAttr.get([ir.AffineMapAttr.get(m) for m in maps])
            made = named_structured_op(
                "linalg.matmul", operands[:2], [operands[2]], {"indexing_maps": maps_attr}
            )
        for name in _KEPT:
            if name in op.attributes:
                made.owner.attributes[name] = op.attributes[name]
        op.results[0].replace_all_uses_with(made)
        op.erase()
        for t in transposes:
            if not list(t.results[0].uses):
                t.erase()
        folded += len(transposes)
    return folded
