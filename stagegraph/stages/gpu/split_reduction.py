"""Reductions to a scalar, split into rows of partial results that the GPU runs in parallel.

A ``linalg.generic`` whose every loop is a reduction (a loss's mean, a norm over the whole
tensor) has no parallel loop for the cost model to give blocks or threads: the GPU
lowering ran it in a kernel of one thread (:mod:`stagegraph.stages.gpu.host_kernels`),
tens of thousands of serial steps. Here, on the payload before the cost model, its N
elements (the loops flattened, row-major) are read as P rows of C = N // P elements:

1. a partial reduction with a parallel loop over the P rows (each row starts from the
   combiner's neutral element, the original body unchanged): an ordinary row reduction,
   which the cost model maps to blocks and threads like any other;
2. the P partial results reduced into the op's own initial value by the same rule
   (:func:`split_scalar_reductions` recurses: P rows become fewer rows again until a
   handful remain, which one thread adds);
3. where P does not divide N, the last N - P * C elements continue the fold from that
   result (their own reduction, split alike when long).

Reductions the cost model spreads over blocks itself (contiguous input a whole number of
warps long, ``gpu.full_reduction``: one kernel, fewer launches) are left to it
(:func:`left_to_blocks`; ``contiguous=true`` splits them too). P is the largest divisor of
N up to a row per warp the GPU holds at once (its SMs times the warps each SM keeps: a
cost model that gives a row a block of threads fills the SMs, one that gives a row one
thread still has that many) with rows no shorter than two warps (what a block of threads
shares, :data:`MIN_ROW_WARPS`); without a divisor at least half that, P is the bound
itself and the remainder takes step 3. The partial results are combined in a different
order than the serial loop did: the op's combiner must be associative and commutative
(:data:`NEUTRAL`), as floating-point sums are taken to be.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from stagegraph.core.ports import Config, TensorModule
from stagegraph.core.stage import stage
from stagegraph.stages.gpu.target import GpuTarget

#: Combiners whose partial results merge in any order, with their neutral element.
NEUTRAL = {
    "arith.addf": -0.0,
    "arith.mulf": 1.0,
    "arith.maximumf": float("-inf"),
    "arith.minimumf": float("inf"),
    "arith.maxnumf": float("-inf"),
    "arith.minnumf": float("inf"),
    "arith.addi": 0,
    "arith.muli": 1,
}
#: The shortest row worth a split, in warps' worth of elements: a block's threads share a
#: row at least this long (shorter rows are one thread's serial steps anyway).
MIN_ROW_WARPS = 2


def row_split(total: int, rows_bound: int) -> tuple[int, int]:
    """(P, C) for ``total`` elements and at most ``rows_bound`` rows: the largest divisor
    of ``total`` up to the bound when at least half of it, else the bound (C =
    ``total // P``; the caller folds the remainder). (1, total) when no split helps."""
    if rows_bound < 2:
        return 1, total
    divisor = next(d for d in range(rows_bound, 0, -1) if total % d == 0)
    rows = divisor if 2 * divisor >= rows_bound else rows_bound
    return rows, total // rows


def rows_bound(total: int, target: GpuTarget) -> int:
    """The most rows worth making of ``total`` elements on ``target``: one per warp its SMs
    hold at once, each row at least :data:`MIN_ROW_WARPS` warps' worth of elements long."""
    fill = target.sm_count * max(1, target.max_threads_per_sm // target.warp_size)
    return min(fill, total // (MIN_ROW_WARPS * target.warp_size))


def _maps(op: Any) -> list[Any]:
    from stagegraph.mlir.bindings import ir

    return [ir.AffineMapAttr(a).value for a in ir.ArrayAttr(op.attributes["indexing_maps"])]


def _combiner(op: Any) -> Any | None:
    """The op of ``op``'s body that folds each element into the output (``out ⊕ x``, the
    output's block argument used by it alone), when it is one of :data:`NEUTRAL`."""
    from stagegraph.mlir.bindings import ir

    block = op.regions[0].blocks[0]
    out = block.arguments[len(block.arguments) - 1]
    body = list(block.operations)
    if any(len(o.regions) or o.name == "linalg.index" for o in body):
        return None
    yielded = body[-1].operands
    if len(yielded) != 1 or isinstance(yielded[0].owner, ir.Block):
        return None
    combine = yielded[0].owner
    uses = [use.owner for use in out.uses]
    if combine.name not in NEUTRAL or len(uses) != 1 or uses[0] != combine:
        return None
    return combine if out in list(combine.operands) else None


def loop_ranges(op: Any) -> list[int] | None:
    """The static range of each loop of ``op``, read from the inputs that index it (every
    input map a projected permutation over static shapes); None otherwise."""
    from stagegraph.mlir.bindings import ir

    maps = _maps(op)
    ranges: list[int | None] = [None] * maps[0].n_dims
    for value, amap in zip(list(op.operands)[:-1], maps[:-1], strict=True):
        if not isinstance(value.type, ir.RankedTensorType) or not amap.is_projected_permutation:
            return None
        shaped = ir.RankedTensorType(value.type)
        if not shaped.has_static_shape:
            return None
        for expr, size in zip(amap.results, shaped.shape, strict=True):
            ranges[ir.AffineDimExpr(expr).position] = size
    return None if None in ranges else ranges  # type: ignore[return-value]


def whole_reads(op: Any) -> bool:
    """Whether every input of ``op`` is read whole in loop order (the identity map) or as a
    scalar: the loops then flatten into one (:func:`split_op`)."""
    from stagegraph.mlir.bindings import ir

    maps = _maps(op)
    identity = ir.AffineMap.get_identity(maps[0].n_dims)
    return all(m == identity or not len(m.results) for m in maps[:-1])


def splittable(op: Any) -> bool:
    """Whether ``op`` is a ``linalg.generic`` reduction of every loop into one scalar, over
    static inputs read through projected permutations (:func:`loop_ranges`), folded by one
    combiner of :data:`NEUTRAL`."""
    from stagegraph.mlir.bindings import ir

    if op.name != "linalg.generic" or len(op.results) != 1:
        return False
    kinds = [str(k) for k in ir.ArrayAttr(op.attributes["iterator_types"])]
    if not kinds or any("reduction" not in k for k in kinds):
        return False
    maps = _maps(op)
    if len(maps) != len(list(op.operands)) or len(maps[-1].results):
        return False
    return _combiner(op) is not None and loop_ranges(op) is not None


def _slice(value: Any, start: int, size: int) -> Any:
    from stagegraph.mlir.bindings import dialect, ir

    element = ir.RankedTensorType(value.type).element_type
    result = ir.RankedTensorType.get([size], element)
    return dialect("tensor").ExtractSliceOp(result, value, [], [], [], [start], [size], [1]).result


def _neutral(kind: str, element: Any) -> Any:
    from stagegraph.mlir.bindings import arith, ir

    value = NEUTRAL[kind]
    if isinstance(element, ir.IntegerType):
        return arith.ConstantOp(element, ir.IntegerAttr.get(element, int(value))).result
    return arith.ConstantOp(element, ir.FloatAttr.get(element, float(value))).result


Body = Callable[..., Any]


def _fold(inputs: Sequence[Any], total: int, body: Body, init: Any, kind: str,
          bound: Callable[[int], int]) -> Any:  # fmt: skip
    """``init`` folded with ``body`` over ``total`` elements of the flat ``inputs`` (1-D
    tensors of ``total``, or scalars read whole): split in rows (:func:`row_split`) while
    that helps, the rows' partial results folded by the combiner ``kind``."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.build import expand_shape, generic, named_structured_op

    rows, length = row_split(total, bound(total))
    flat = [v for v in inputs if ir.RankedTensorType(v.type).rank]
    if rows == 1:
        maps = [ir.AffineMap.get(1, 0, [ir.AffineDimExpr.get(0)] if v in flat else [])
                for v in inputs]  # fmt: skip
        return generic(inputs, [init], [*maps, ir.AffineMap.get(1, 0, [])], ["reduction"], body)
    main = rows * length
    element = ir.RankedTensorType(init.type).element_type
    empty = _empty([rows], element)
    partial_init = named_structured_op("linalg.fill", [_neutral(kind, element)], [empty])
    shaped = [expand_shape(v if main == total else _slice(v, 0, main), [[0, 1]], [rows, length])
              if v in flat else v for v in inputs]  # fmt: skip
    d0, d1 = ir.AffineDimExpr.get(0), ir.AffineDimExpr.get(1)
    maps = [ir.AffineMap.get(2, 0, [d0, d1] if v in flat else []) for v in inputs]
    partials = generic(shaped, [partial_init], [*maps, ir.AffineMap.get(2, 0, [d0])],
                       ["parallel", "reduction"], body)  # fmt: skip
    result = _fold([partials], rows, _combine_body(kind), init, kind, bound)
    if main == total:
        return result
    tail = [_slice(v, main, total - main) if v in flat else v for v in inputs]
    return _fold(tail, total - main, body, result, kind, bound)


def _empty(shape: list[int], element: Any) -> Any:
    from stagegraph.mlir.bindings import dialect

    return dialect("tensor").EmptyOp(shape, element).result


def _combine_body(kind: str) -> Body:
    """A body folding one partial result into the output with the combiner ``kind``."""
    from stagegraph.mlir.bindings import ir

    def body(partial: Any, out: Any) -> Any:
        return ir.Operation.create(kind, results=[out.type], operands=[partial, out]).result

    return body


def _cloned_body(op: Any) -> Body:
    """A body that repeats ``op``'s own, op by op, over new block arguments."""
    from stagegraph.mlir.build import clone_mapped

    block = op.regions[0].blocks[0]

    def body(*arguments: Any) -> Any:
        mapping = dict(zip(block.arguments, arguments, strict=True))
        for inner in list(block.operations)[:-1]:
            clone_mapped(inner, mapping)
        value = block.operations[len(block.operations) - 1].operands[0]
        return mapping.get(value, value)

    return body


def split_op(op: Any, bound: Callable[[int], int]) -> bool:
    """Replace ``op`` (:func:`splittable`) by its split form; False where no split helps.
    Inputs read whole (:func:`whole_reads`) flatten into one loop split in rows
    (:func:`_fold`); otherwise (a broadcast operand) the leading loops become the rows
    (:func:`_leading_rows`)."""
    from math import prod

    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.build import collapse_shape

    operands = list(op.operands)
    ranges = loop_ranges(op)
    total = prod(ranges)
    kind = _combiner(op).name
    if not whole_reads(op):
        return _leading_rows(op, ranges, bound, kind)
    if row_split(total, bound(total))[0] == 1:
        return False
    with ir.InsertionPoint(op), op.location:
        flat = [collapse_shape(v, [list(range(len(ranges)))], [total])
                if ir.RankedTensorType(v.type).rank > 1 else v
                for v in operands[:-1]]  # fmt: skip
        result = _fold(flat, total, _cloned_body(op), operands[-1], kind, bound)
    op.results[0].replace_all_uses_with(result)
    op.erase()
    return True


def _leading_rows(op: Any, ranges: list[int], bound: Callable[[int], int], kind: str) -> bool:
    """Split ``op`` with its leading loops as the rows: as many as keep their product
    within the bound (the first loop at least), the others reduced in each row; the rows'
    partial results then fold like a flat reduction. False when that gives one row."""
    from math import prod

    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.build import collapse_shape, generic, named_structured_op

    limit = max(2, bound(prod(ranges)))
    lead = 1
    while lead < len(ranges) - 1 and prod(ranges[: lead + 1]) <= limit:
        lead += 1
    rows = prod(ranges[:lead])
    if rows < 2 or lead == len(ranges):
        return False
    operands = list(op.operands)
    maps = _maps(op)
    dims = [ir.AffineDimExpr.get(d) for d in range(lead)]
    kinds = ["parallel"] * lead + ["reduction"] * (len(ranges) - lead)
    with ir.InsertionPoint(op), op.location:
        element = ir.RankedTensorType(operands[-1].type).element_type
        init = named_structured_op("linalg.fill", [_neutral(kind, element)],
                                   [_empty(ranges[:lead], element)])  # fmt: skip
        out_map = ir.AffineMap.get(len(ranges), 0, dims)
        partials = generic(operands[:-1], [init], [*maps[:-1], out_map], kinds, _cloned_body(op))
        flat = collapse_shape(partials, [list(range(lead))], [rows]) if lead > 1 else partials
        result = _fold([flat], rows, _combine_body(kind), operands[-1], kind, bound)
    op.results[0].replace_all_uses_with(result)
    op.erase()
    return True


def left_to_blocks(op: Any, target: GpuTarget) -> bool:
    """Whether the cost model's own reduction to a scalar over blocks takes ``op``
    (``gpu.full_reduction``: every input read whole, the length a whole number of warps):
    one kernel and one thread's combine, fewer launches than the levels of rows here."""
    from math import prod

    return whole_reads(op) and prod(loop_ranges(op) or [1]) % target.warp_size == 0


def split_scalar_reductions(module: Any, target: GpuTarget, contiguous: bool = False) -> int:
    """Split every reduction to a scalar (:func:`splittable`) of the entry, but those the
    cost model takes over blocks itself (:func:`left_to_blocks`) unless ``contiguous``;
    returns how many."""
    from stagegraph.mlir.functions import payload_functions, select_entry
    from stagegraph.mlir.walk import top_level_ops

    entry = select_entry(payload_functions(module))
    ops = [op for op in top_level_ops(entry) if splittable(op)
           and (contiguous or not left_to_blocks(op, target))]  # fmt: skip
    return sum(split_op(op, lambda n: rows_bound(n, target)) for op in ops)


class SplitReductionsConfig(Config):
    """``contiguous``: also split the reductions to a scalar the cost model spreads over
    blocks itself (contiguous input, a whole number of warps long; :func:`left_to_blocks`),
    to compare the two."""

    contiguous: bool = False


@stage("passes", name="gpu.split_reductions")
def gpu_split_reductions(
    module: TensorModule, target: GpuTarget, config: SplitReductionsConfig
) -> TensorModule:
    """Reductions to a scalar as partial reductions over rows (parallel), then their sum."""
    from stagegraph.mlir.build import ir_location
    from stagegraph.stages.common.passes import run_pipeline

    with module.ir.context, ir_location(module.ir):
        split = split_scalar_reductions(module.ir, target, config.contiguous)
    return run_pipeline(module, "canonicalize,cse") if split else module
