"""Block foralls with more mapped dims than the grid has: folded to one linear dim.

The schedule maps each tiled loop of an op to ``#gpu.block<linear_dim_N>``, one per loop.
Upstream ``transform.gpu.map_forall_to_blocks`` sizes the 3-D grid from the first three
linear dims only: a forall of four or more (an NCHW convolution or pool, a norm over a
4-D tensor, a 5-D 3-D convolution) launched a fraction of its blocks, and the outputs of
the others stayed unwritten (found on an H200, where poisoned result buffers came back
with NaNs). So before the mapping, such a forall becomes a one-dim forall over the product
of its trip counts whose body recovers the original indices with
``affine.delinearize_index`` (row-major: the last loop varies fastest, as the linear
mapping ordered them).
"""

from __future__ import annotations

from math import prod
from typing import Any

#: Grid dimensions a launch has (x, y, z).
GRID_DIMS = 3


def _static_counts(forall: Any) -> list[int] | None:
    """The forall's trip counts when its bounds are static, lower bounds 0 and steps 1."""
    from stagegraph.mlir.bindings import ir

    attrs = forall.attributes
    try:
        lower = list(ir.DenseI64ArrayAttr(attrs["staticLowerBound"]))
        upper = list(ir.DenseI64ArrayAttr(attrs["staticUpperBound"]))
        steps = list(ir.DenseI64ArrayAttr(attrs["staticStep"]))
    except KeyError:
        return None
    dynamic = ir.ShapedType.get_dynamic_size()
    if any(v == dynamic for v in (*lower, *upper, *steps)):
        return None
    if any(lower) or any(s != 1 for s in steps) or forall.results:
        return None
    return upper


def fold_block_forall(forall: Any) -> Any | None:
    """Replace ``forall`` (a buffer-level block forall with static, normalized bounds and
    more than :data:`GRID_DIMS` dims) by a one-dim forall mapped to
    ``#gpu.block<linear_dim_0>``; returns the new op, or None when it was left alone."""
    from stagegraph.mlir.bindings import affine, ir, scf

    counts = _static_counts(forall)
    if counts is None or len(counts) <= GRID_DIMS:
        return None
    context = forall.context
    index = ir.IndexType.get(context)
    mapping = ir.ArrayAttr.get([ir.Attribute.parse("#gpu.block<linear_dim_0>", context)])
    with ir.InsertionPoint(forall), forall.location:
        folded = scf.ForallOp([0], [prod(counts)], [1], mapping=mapping)
    new_body = folded.regions[0].blocks[0]
    old_body = forall.regions[0].blocks[0]
    with ir.InsertionPoint.at_block_begin(new_body), forall.location:
        indices = affine.AffineDelinearizeIndexOp(
            [index] * len(counts), new_body.arguments[0], [], counts
        ).results
    for old, new in zip(old_body.arguments, indices, strict=True):
        old.replace_all_uses_with(new)
    for terminator in list(new_body.operations)[1:]:  # the builder's own in_parallel
        terminator.erase()
    for op in list(old_body.operations):
        new_body.append(op)
    for name in ("stagegraph.gpu_op", "stagegraph.gpu_launch"):
        if name in forall.attributes:
            folded.operation.attributes[name] = forall.attributes[name]
    forall.erase()
    return folded.operation


def fold_block_foralls(foralls: list[Any]) -> list[Any]:
    """:func:`fold_block_forall` over ``foralls``; the list of block foralls after it."""
    return [fold_block_forall(f) or f for f in foralls]


def check_grids(foralls: list[Any], launches: list[Any]) -> None:
    """Each block forall's launch must have at least as many blocks as the forall had
    iterations (static ones): fewer leaves outputs unwritten, silently, on the GPU.

    Raises:
        UnsupportedPayloadError: a launch with fewer blocks than its forall's iterations
            (a mapping fault: the message names the counts).
    """
    from stagegraph.errors import UnsupportedPayloadError
    from stagegraph.mlir.bindings import ir

    for counts, launch in zip(foralls, launches, strict=False):
        if counts is None:
            continue
        start = ir.DenseI32ArrayAttr(launch.attributes["operandSegmentSizes"])[0]
        grid = []
        for value in list(launch.operands)[start : start + 3]:
            owner = value.owner
            if isinstance(owner, ir.Block) or owner.name != "arith.constant":
                break
            grid.append(ir.IntegerAttr(owner.attributes["value"]).value)
        if len(grid) == 3 and prod(grid) < prod(counts):
            raise UnsupportedPayloadError(
                f"stage gpu.lower: a block forall of {counts} iterations was mapped to a "
                f"grid of {grid} blocks ({prod(grid)} < {prod(counts)}); its outputs would "
                "stay partly unwritten"
            )


def static_counts(foralls: list[Any]) -> list[list[int] | None]:
    """The trip counts of each forall (None where not static and normalized)."""
    return [_static_counts(f) for f in foralls]
