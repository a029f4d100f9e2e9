"""Elementwise consumers of a matmul that reach it through pure reshapes move onto the
matmul's own ``[M, N]`` result, so the matmul schedule fuses them into its register tiles.

A convolution rewritten as a matmul (the x86 graph's implicit GEMM, or a pointwise
convolution as a matmul) hands its ``[F, N*O]`` result to its consumers
through ``tensor.expand_shape``/``collapse_shape`` ops back to the convolution's layout. The
layer analysis (``stagegraph.stages.analysis.ops.layers_of``) fuses only a consumer that
uses the matmul directly, so bias, ReLU, residual adds and what eval-mode BatchNorm leaves
ran as separate passes over the output. A reshape only renames positions: an elementwise
op over the reshaped space ``S`` is the same op over ``[M, N]`` when ``S`` splits into a
prefix whose sizes multiply to ``M`` and a suffix to ``N`` (row-major order is kept by
every reshape), and each other operand reads either all or none of each part's non-unit
dims, in order (a per-channel bias reads the filter part; a residual add reads all). Then
the op is rewritten in place over the two dims, its other operands collapsed to match (a
free reshape of contiguous memory), and one ``tensor.expand_shape`` after it restores
``S`` for its users. The reshapes between the matmul and the op become dead and go, so the
op is the matmul's single user: one layer with its epilogue. Repeated along the chain.

Upstream's ``FoldReshapeWithGenericOpByCollapsing`` does the like but is not reachable
from the Python bindings (only through a test pass), and does not drop unit dims that an
operand omits.
"""

from __future__ import annotations

import math
from typing import Any

from stagegraph.mlir.build import collapse_shape, expand_shape, iterator_types_attr
from stagegraph.mlir.walk import DefUse, LiveDefUse, collect, top_level_ops

RESHAPES = ("tensor.expand_shape", "tensor.collapse_shape")


def fuse_epilogues_through_reshapes(module: Any) -> int:
    """Move every elementwise consumer that reaches a ``linalg.matmul`` (anywhere in
    ``module``'s functions, inside loops too) through a single-use chain of reshapes onto
    the matmul's result; returns how many ops moved."""
    moved = 0
    for fn in top_level_ops(module.operation):
        if fn.name != "func.func":
            continue
        for matmul in collect(fn, lambda op: op.name == "linalg.matmul"):
            moved += _follow(matmul.results[0])
    return moved


def _only_user(links: DefUse | LiveDefUse, value: Any) -> Any | None:
    """The one op that reads ``value``, else None."""
    users = links.users(value)
    return users[0] if len(users) == 1 else None


def _follow(value: Any) -> int:
    """Walk the single-use chain from ``value`` (a matmul's ``[M, N]`` result), moving each
    elementwise op met after reshapes onto the chain's ``[M, N]`` value."""
    from stagegraph.mlir.bindings import ir

    moved = 0
    links = LiveDefUse()  # the IR changes under the walk: ask its use lists
    current, reshapes = value, []
    while True:
        user = _only_user(links, current)
        if user is None or len(user.results) != 1:
            return moved
        name = user.operation.name
        if name in RESHAPES:
            reshapes.append(user.operation)
            current = user.results[0]
            continue
        if not elementwise(user.operation):
            return moved
        if reshapes:
            shape = list(ir.RankedTensorType(value.type).shape)
            if not _move(links, user.operation, current, value, shape):
                return moved
            for reshape in reversed(reshapes):  # dead now: the op reads the 2-D value
                reshape.erase()
            moved += 1
        value = current = user.results[0]
        reshapes = []


def elementwise(op: Any) -> bool:
    """A ``linalg.generic`` with all loops parallel, one output and an identity output
    map: what the matmul schedule fuses as an epilogue."""
    from stagegraph.mlir.bindings import ir

    if op.name != "linalg.generic" or len(op.results) != 1:
        return False
    kinds = [str(k) for k in op.attributes["iterator_types"]]
    if not all("parallel" in k for k in kinds):
        return False
    maps = [ir.AffineMapAttr(m).value for m in op.attributes["indexing_maps"]]
    return maps[-1] == ir.AffineMap.get_identity(maps[-1].n_dims)


def chain_end(links: DefUse | LiveDefUse, value: Any) -> tuple[Any, Any | None]:
    """The end of the single-use chain of reshapes from ``value``, and its only user (None
    when it has several or none)."""
    while True:
        user = _only_user(links, value)
        if user is None or user.operation.name not in RESHAPES:
            return value, None if user is None else user.operation
        value = user.results[0]


def _from_matmul(links: DefUse | LiveDefUse, value: Any, depth: int = 16) -> bool:
    """Whether ``value`` is a matmul's result through a single-use chain of reshapes and
    elementwise ops: the op reading it could then join either matmul's layer, and the
    layer analysis would give it to both. (A value read elsewhere too, such as a
    residual block's input, ends any chain.)"""
    owner = links.owner(value)
    if depth == 0 or owner is None or len(links.users(value)) != 1:
        return False
    if owner.name == "linalg.matmul":
        return True
    if owner.name in RESHAPES:
        return _from_matmul(links, owner.operands[0], depth - 1)
    if not elementwise(owner):
        return False
    return any(_from_matmul(links, v, depth - 1) for v in list(owner.operands)[:-1])


def _split(shape: list[int], rows: int) -> int | None:
    """The first index ``p`` (``0 < p < len(shape)``) whose prefix ``shape[:p]`` holds
    ``rows`` elements, else None."""
    for p in range(1, len(shape)):
        if math.prod(shape[:p]) == rows:
            return p
    return None


def _collapsed_operand(
    dims: list[int], space: list[int], split: int
) -> list[tuple[int, list[int]]] | None:
    """For an operand reading the loop dims ``dims`` (ascending) of ``space``: per part
    (0: ``[:split]``, 1: the rest) it reads, the positions of its dims that collapse into
    that part's one dim, unit dims joining a neighbour; None when a part is read only in
    part (some but not all of its non-unit dims)."""
    parts: list[tuple[int, list[int]]] = []
    loose: list[int] = []  # unit positions not yet placed
    for part, lo, hi in ((0, 0, split), (1, split, len(space))):
        wanted = [d for d in range(lo, hi) if space[d] != 1]
        read = [i for i, d in enumerate(dims) if lo <= d < hi]
        nonunit = [dims[i] for i in read if space[dims[i]] != 1]
        if not nonunit:
            loose += read
            continue
        if nonunit != wanted:
            return None
        parts.append((part, read))
    if not parts:
        return []
    for position in loose:  # a unit dim joins the group read before it (or the first)
        before = [g for _, g in parts if g[0] < position]
        (before[-1] if before else parts[0][1]).append(position)
    return [(part, sorted(g)) for part, g in parts]


def _move(links: DefUse | LiveDefUse, op: Any, reshaped: Any, source: Any, flat: list[int]) -> bool:
    """Rewrite the elementwise ``op`` (one of whose inputs is ``reshaped``, a reshape of
    ``source``, whose shape is ``flat`` = ``[M, N]``) to run over ``flat``; False (nothing
    changed) when its operands do not allow it."""
    from stagegraph.mlir.bindings import dialect, ir

    out_type = ir.RankedTensorType(op.results[0].type)
    space = list(out_type.shape)
    split = _split(space, flat[0])
    if split is None or not out_type.has_static_shape or op.operands[-1] == reshaped:
        return False
    maps = [ir.AffineMapAttr(m).value for m in op.attributes["indexing_maps"]]
    operands = list(op.operands)
    identity = ir.AffineMap.get_identity(len(space))
    plans: list[list[tuple[int, list[int]]]] = []
    for operand, amap in zip(operands[:-1], maps[:-1], strict=True):
        if operand == reshaped:
            if amap != identity:
                return False
            plans.append([])
            continue
        dims = [e.position if isinstance(e, ir.AffineDimExpr) else -1 for e in amap.results]
        if -1 in dims or dims != sorted(set(dims)):
            return False
        if _from_matmul(links, operand):
            return False  # two matmuls' layers would both claim the op
        groups = _collapsed_operand(dims, space, split)
        if groups is None:
            return False
        plans.append(groups)
    outer = [list(range(split)), list(range(split, len(space)))]
    d = [ir.AffineDimExpr.get(0), ir.AffineDimExpr.get(1)]
    new_maps, new_operands = [], []
    with ir.InsertionPoint(op), op.location:
        for operand, groups in zip(operands[:-1], plans, strict=True):
            if operand == reshaped:
                new_operands.append(source)
                new_maps.append(ir.AffineMap.get_identity(2))
                continue
            parts = [part for part, _ in groups]  # the loop dim (0: rows, 1: columns) each reads
            sizes = [flat[part] for part in parts]
            shape = list(ir.RankedTensorType(operand.type).shape)
            if sizes != shape:
                operand = collapse_shape(operand, [g for _, g in groups], sizes)
            new_operands.append(operand)
            new_maps.append(ir.AffineMap.get(2, 0, [d[p] for p in parts]))
        init = operands[-1]
        init_owner = links.owner(init)
        if init_owner is not None and init_owner.name == "tensor.empty":
            init = dialect("tensor").EmptyOp(flat, out_type.element_type).result
            dead = init_owner if len(links.users(operands[-1])) == 1 else None
        else:
            dead, init = None, collapse_shape(init, outer, flat)
        new_operands.append(init)
        new_maps.append(ir.AffineMap.get_identity(2))
    for i, value in enumerate(new_operands):
        op.operands[i] = value
    op.attributes["indexing_maps"] = ir.ArrayAttr.get([ir.AffineMapAttr.get(m) for m in new_maps])
    op.attributes["iterator_types"] = iterator_types_attr(["parallel", "parallel"])
    result = op.results[0]
    result.set_type(ir.RankedTensorType.get(flat, out_type.element_type))
    if dead is not None:
        dead.erase()
    if space != flat:
        with ir.InsertionPoint.after(op), op.location:
            back = expand_shape(result, outer, space)
        result.replace_all_uses_except(back, back.owner.operation)
    return True
