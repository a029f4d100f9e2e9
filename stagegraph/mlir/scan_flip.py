"""A scan between two flips of its scanned dimension is a reverse scan.

PyTorch has no reverse cumulative sum: ``x.flip(d).cumsum(d).flip(d)`` is how it is
written, and torch-mlir imports each flip as a ``linalg.generic`` that gathers
``X[i, n - 1 - j]`` with ``tensor.extract``: an element-by-element gather on each side of
the scan (two thirds of a reverse cumsum's run time). :func:`reverse_scan_operands` finds
the flip feeding a scan along the last dimension and the flips reading its result; the
vector scan (:mod:`stagegraph.mlir.scan_vector`) then reads the unflipped input from the
end and writes its result in place of the flips.
"""

from __future__ import annotations

from typing import Any

from stagegraph.mlir.walk import defining_op


def flipped(op: Any, dim: int) -> Any | None:
    """``X`` when ``op`` is a 2-D ``linalg.generic`` whose every element is
    ``X[i, n - 1 - j]`` (flip along dimension 1; ``dim`` must be 1), else None."""
    from stagegraph.mlir.bindings import ir

    if op.name != "linalg.generic" or len(op.results) != 1 or dim != 1:
        return None
    shape = list(ir.RankedTensorType(op.results[0].type).shape)
    if len(shape) != 2:
        return None
    body = op.regions[0].blocks[0]
    inner = [child.operation for child in body.operations]
    done = inner[-1]
    if done.name != "linalg.yield" or len(done.operands) != 1:
        return None
    extract = defining_op(done.operands[0])
    if extract.name != "tensor.extract" or len(extract.operands) != 3:
        return None
    source, row, column = extract.operands
    if defining_op(source).parent == op or list(ir.RankedTensorType(source.type).shape) != shape:
        return None
    if _loop_index(row) != 0 or _mirrored_index(column, shape[1]) != 1:
        return None
    return source


def _loop_index(value: Any) -> int | None:
    """d when ``value`` is ``linalg.index d``."""
    from stagegraph.mlir.bindings import ir

    op = defining_op(value)
    if op.name != "linalg.index" or isinstance(value.owner, ir.Block):
        return None
    return ir.IntegerAttr(op.attributes["dim"]).value


def _mirrored_index(value: Any, extent: int) -> int | None:
    """d when ``value`` is ``(extent - 1) - linalg.index d``."""
    from stagegraph.mlir.bindings import ir

    op = defining_op(value)
    if op.name != "arith.subi" or isinstance(value.owner, ir.Block):
        return None
    first, second = op.operands
    constant = defining_op(first)
    if constant.name != "arith.constant" or isinstance(first.owner, ir.Block):
        return None
    if ir.IntegerAttr(constant.attributes["value"]).value != extent - 1:
        return None
    return _loop_index(second)


def reverse_scan_operands(source: Any, result: Any, dim: int) -> tuple[Any, list[Any]] | None:
    """(the unflipped input, the flips reading ``result``) when ``source`` is a flip along
    ``dim`` and every use of ``result`` is a flip along ``dim`` reading it; else None."""
    unflipped = flipped(defining_op(source), dim)
    if unflipped is None:
        return None
    flips: list[Any] = []
    for use in result.uses:
        user = use.owner.operation
        if user.name == "tensor.extract":  # the gather in a flip's body: the flip itself
            user = user.parent
        flips_what = flipped(user, dim)
        if flips_what is None or flips_what != result:
            return None
        if user not in flips:
            flips.append(user)
    return (unflipped, flips) if flips else None
