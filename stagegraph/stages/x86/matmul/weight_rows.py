"""A matmul of one row reads its transposed weight where it lies, row by row (GEMV).

PyTorch's ``nn.Linear`` imports as ``x @ transpose(W)`` with ``W[n, k]`` a constant. With
one row of ``x`` (a classifier at batch 1: ResNet's 512 -> 1000, VGG's 25088 -> 4096),
the matmul is a matrix-vector product (the generic schedule's, see
:func:`stagegraph.stages.x86.generic.plan.reduction_like`): each weight element serves
one FMA, so the run time is the time to read the weight once. Read through the transpose,
it is neither: the transpose rewrites all of W on every call (left unscheduled: scalar
loops), and the product then reads ``[k x 1]`` columns of the copy at a stride of ``n``
(measured on a Xeon, 1 thread: 1024 -> 1000 at batch 1, 50-90x PyTorch's time).

:func:`read_transposed_weights_in_place` drops such a transpose: the matmul reads ``W[n,
k]`` through its indexing map (``(m, n, k) -> (n, k)``, the ``matmul_transpose_b``
layout). Every output element is then the dot product of a contiguous weight row with
``x``, which the generic schedule vectorizes along k, ``GEMV_ROWS`` rows per tile
(:func:`stagegraph.stages.x86.generic.params.gemv_rows`; long vectors, reassociated into
a tree of adds when lowered), with the bias/activation epilogue vectorized after it (a
separate pass over the N outputs, not over the weight). Nothing
is evaluated or copied at compile time: a 400 MB weight stays the one constant it was.
The same holds for a weight that is an argument (read in place instead of copied).

Only for matmuls of at most :data:`MAX_ROWS` rows: with more, the packed kernel takes the
matmul (it reads either layout of B, and packs a constant one at compile time:
:mod:`.constant_pack`). With a few rows (up to :data:`MAX_FEW_ROWS`, batch 2 to 8), a
constant weight's transpose is folded at compile time instead
(:func:`fold_few_row_transposes`): where its columns make no whole panels (N = 1000) the
kernel cannot prepack it, and then reads the ``[k, n]`` constant's rows directly, unpacked
(``heuristic.heuristic_matmul_params``): 1024 -> 1000 at batch 3 went from 1.8x to 0.76x
PyTorch's time (Xeon, 1 thread, under load).
"""

from __future__ import annotations

from typing import Any

from stagegraph.mlir.walk import DefUse, collect

#: Matmuls with more rows than this keep the packed kernel's path (only one row makes a
#: matrix-vector product of it: ``sites.runs_as_matvec``).
MAX_ROWS = 1


#: Matmuls with more rows than this keep a constant weight's transpose for the kernel's own
#: handling (compile-time packing, which transposes in numpy, or per-call packing): few
#: rows are where a per-call pass over B costs as much as the product itself.
MAX_FEW_ROWS = 8


def prepare_weights(module: Any) -> tuple[int, int]:
    """Weights of one-row matmuls read in place, then constant weights of few-row ones
    transposed at compile time; returns how many of each (see the module doc)."""
    return read_transposed_weights_in_place(module), fold_few_row_transposes(module)


def fold_few_row_transposes(module: Any, max_rows: int = MAX_FEW_ROWS) -> int:
    """Fold each transpose of a constant that only matmuls of at most ``max_rows`` rows
    read, as their B (:mod:`stagegraph.stages.common.constant_transposes`); returns how
    many."""
    from stagegraph.stages.common.constant_transposes import fold_constant_transposes

    def_use = DefUse(module)  # value.owner would import the linalg module (see DefUse)

    def only_few_rows(transpose: Any) -> bool:
        users = def_use.users(transpose.results[0])
        return bool(users) and all(
            user.name == "linalg.matmul" and user.operands[1] == transpose.results[0]
            and user.operands[0] != transpose.results[0] and _rows(user) <= max_rows
            for user in users
        )  # fmt: skip

    return fold_constant_transposes(module, only_few_rows)


def read_transposed_weights_in_place(module: Any, max_rows: int = MAX_ROWS) -> int:
    """Rewrite every ``linalg.matmul`` of ``module`` with at most ``max_rows`` rows whose B
    is ``linalg.transpose [1, 0]`` of some ``W`` to read ``W`` itself through a transposed
    indexing map; erase transposes left unused. Returns how many matmuls were
    rewritten."""
    from stagegraph.mlir.bindings import ir

    rewritten = 0
    def_use = DefUse(module)  # value.owner would import the linalg module (see DefUse)
    for mm in collect(module, "linalg.matmul"):
        transpose = _weight_transpose(def_use.owner(mm.operands[1]))
        if transpose is None or _rows(mm) > max_rows or not _plain_maps(mm):
            continue
        mm.operands[1] = transpose.operands[0]
        d_m, d_n, d_k = (ir.AffineDimExpr.get(i) for i in range(3))
        maps = [ir.AffineMap.get(3, 0, e) for e in ([d_m, d_k], [d_n, d_k], [d_m, d_n])]
        mm.attributes["indexing_maps"] = ir.ArrayAttr.get([ir.AffineMapAttr.get(m) for m in maps])
        if not list(transpose.results[0].uses):
            transpose.erase()
        rewritten += 1
    return rewritten


def _weight_transpose(owner: Any | None) -> Any | None:
    """``owner`` (a value's defining op, if any) if it is a ``linalg.transpose [1, 0]``."""
    from stagegraph.mlir.bindings import ir

    if owner is None or owner.name != "linalg.transpose":
        return None
    if list(ir.DenseI64ArrayAttr(owner.attributes["permutation"])) != [1, 0]:
        return None
    return owner


def _rows(mm: Any) -> int:
    """M of a 2-D matmul (A's rows); dynamic or other ranks count as many."""
    from stagegraph.mlir.bindings import ir

    a_type = ir.RankedTensorType(mm.operands[0].type)
    if a_type.rank != 2 or a_type.is_dynamic_dim(0):
        return 1 << 62
    return a_type.shape[0]


def _plain_maps(mm: Any) -> bool:
    """Whether ``mm`` has the default matmul maps (no ``indexing_maps`` of its own, or the
    default ones): A ``[m, k]``, B ``[k, n]``."""
    from stagegraph.mlir.bindings import ir

    if "indexing_maps" not in mm.attributes:
        return True
    maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(mm.attributes["indexing_maps"])]
    expected = [[0, 2], [2, 1], [0, 1]]
    for affine, dims in zip(maps, expected, strict=True):
        results = list(affine.results)
        if [e.position if isinstance(e, ir.AffineDimExpr) else -1 for e in results] != dims:
            return False
    return True
