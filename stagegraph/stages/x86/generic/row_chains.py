"""A softmax-shaped chain of row reductions and pointwise ops as one kernel per row.

Softmax over the innermost dim comes from the importer as four ops on the whole tensor:
``m = max(x)`` (a row reduction), ``e = exp(x - m)`` (pointwise, reading ``m`` broadcast
along the row), ``s = sum(e)`` and ``y = e / s``. Scheduled one by one, each is a pass over
memory: ``x`` is read twice, ``e`` written once and read twice, ``y`` written, five passes
over a tensor that at attention sizes (heads x sequence x sequence) is far past the caches,
at half PyTorch's speed, whose softmax takes a row at a time.

:func:`fuse_row_chains` finds the chain by structure (not by its bodies): a pointwise op
``P`` reading a row reduction ``R2`` of a pointwise op ``E``, which ``P`` also reads;
``E`` reads rows of ``x`` and a row reduction ``R1`` of the same ``x``; the intermediate
results used by nothing else. It becomes one ``scf.forall`` over the rows whose body makes
three passes over a row, which stays in the L1 cache between them: ``R1``'s combiner over
``x``; ``E``'s body, written into the output row and folded by ``R2``'s combiner; ``P``'s
body over that output row, in place. The ops' bodies are cloned onto vectors (any
``arith``/``math`` ops, so a scaled or shifted softmax fits too); a reduction's accumulator
is a vector started at its combiner's identity and folded into the reduction's init value
at the row's end. Rows whose length is not a whole number of vectors keep the generic path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from stagegraph.mlir.bindings import arith, ir, scf, tensor, vector
from stagegraph.mlir.walk import children, top_level_ops
from stagegraph.stages.analysis.ops import declared_iterator_types
from stagegraph.stages.x86.conv.depthwise import erase_unused_init, fill_value
from stagegraph.stages.x86.generic.linalg_parts import body_block, input_count, result_owner
from stagegraph.stages.x86.generic.params import largest_divisor_at_most

#: A reduction's combiner: its vector reduction kind and identity (the accumulator's start).
_COMBINERS = {
    "arith.addf": ("ADD", 0.0),
    "arith.mulf": ("MUL", 1.0),
    "arith.maximumf": ("MAXIMUMF", -math.inf),
    "arith.minimumf": ("MINIMUMF", math.inf),
    "arith.maxnumf": ("MAXNUMF", -math.inf),
    "arith.minnumf": ("MINNUMF", math.inf),
}
#: Vectors of ``lanes`` per step along a row: independent accumulators for the reductions.
UNROLL = 4


@dataclass
class RowChain:
    """``final`` (``P``) reads ``pointwise`` (``E``) and ``second`` (``R2`` of ``E``);
    ``E`` reads ``source`` rows and ``first`` (``R1`` of ``source``)."""

    final: Any
    second: Any
    pointwise: Any
    first: Any
    source: Any


def _maps(op: Any) -> list[Any]:
    return [ir.AffineMapAttr(a).value for a in op.attributes["indexing_maps"]]


def _kinds(op: Any) -> list[str]:
    return list(declared_iterator_types(op))


def _is_identity(amap: Any, rank: int) -> bool:
    return amap == ir.AffineMap.get_identity(rank)


def _is_row_map(amap: Any, rank: int) -> bool:
    """The map of a row result: every loop but the innermost, in order (a kept unit dim at
    the end as the constant 0 allowed)."""
    dims = [ir.AffineExpr.get_dim(d) for d in range(rank - 1)]
    dropped = ir.AffineMap.get(rank, 0, dims)
    kept = ir.AffineMap.get(rank, 0, [*dims, ir.AffineExpr.get_constant(0)])
    return amap in (dropped, kept)


def _generic(value: Any) -> Any | None:
    owner = result_owner(value)
    if owner is None or owner.name != "linalg.generic" or len(owner.results) != 1:
        return None
    return owner


def _same(a: Any, b: Any) -> bool:
    return a.operation == b.operation


def _single_use(value: Any, user: Any) -> bool:
    return all(_same(use.owner, user) for use in value.uses)


def _row_reduction(value: Any, rank: int) -> Any | None:
    op = _generic(value)
    if op is None or input_count(op) != 1 or fill_value(op.operands[1]) is None:
        return None
    maps = _maps(op)
    kinds = ["parallel"] * (rank - 1) + ["reduction"]
    if _kinds(op) != kinds or not _is_identity(maps[0], rank) or not _is_row_map(maps[1], rank):
        return None
    return op if _reduction_combiner(op) else None


def _reduction_combiner(op: Any) -> str | None:
    ops = children(op)
    if len(ops) != 2 or ops[0].name not in _COMBINERS:
        return None
    args = list(body_block(op).arguments)
    operands = list(ops[0].operands)
    both = (operands == args) or (operands == args[::-1])
    return ops[0].name if both and ops[1].operands[0] == ops[0].results[0] else None


def _pointwise_of_rows(op: Any, rank: int) -> tuple[Any, Any] | None:
    """``(rows, row_result)``: the two inputs of a pointwise op on rows, the one read whole
    and the one broadcast along the row, else None. Its body must not read its output."""
    if op is None or input_count(op) != 2 or len(op.operands) != 3:
        return None
    maps = _maps(op)
    if _kinds(op) != ["parallel"] * rank or not _is_identity(maps[2], rank):
        return None
    if list(body_block(op).arguments[2].uses):
        return None
    whole = [i for i in (0, 1) if _is_identity(maps[i], rank)]
    rows = [i for i in (0, 1) if _is_row_map(maps[i], rank)]
    if len(whole) != 1 or len(rows) != 1:
        return None
    return op.operands[whole[0]], op.operands[rows[0]]


def match_row_chain(final: Any) -> RowChain | None:
    """The chain ending in ``final`` (see the module's doc), else None."""
    if final.name != "linalg.generic" or len(final.results) != 1:
        return None
    out_type = final.results[0].type
    if not isinstance(out_type, ir.RankedTensorType) or not out_type.has_static_shape:
        return None
    rank = out_type.rank
    if rank < 1 or not isinstance(out_type.element_type, ir.F32Type | ir.F64Type):
        return None
    read = _pointwise_of_rows(final, rank)
    if read is None:
        return None
    second = _row_reduction(read[1], rank)
    pointwise = _generic(read[0])
    if second is None or second.operands[0] != read[0] or pointwise is None:
        return None
    inner = _pointwise_of_rows(pointwise, rank)
    if inner is None or inner[0].type != out_type:
        return None
    first = _row_reduction(inner[1], rank)
    if first is None or first.operands[0] != inner[0]:
        return None
    if not all(_same(use.owner, final) or _same(use.owner, second) for use in read[0].uses):
        return None
    if not _single_use(read[1], final) or not _single_use(inner[1], pointwise):
        return None
    if not all(_clonable(op) for op in (final, pointwise)):
        return None
    return RowChain(final, second, pointwise, first, inner[0])


def _clonable(op: Any) -> bool:
    return all(
        o.name.split(".")[0] in ("arith", "math") or o.name == "linalg.yield" for o in children(op)
    )


def fuse_row_chains(fn: Any, lanes: int) -> int:
    """Rewrite every chain of ``fn`` that :func:`match_row_chain` finds, whose rows are a
    whole number of ``lanes``-wide vectors, into one kernel per row; returns the count."""
    count = 0
    for op in top_level_ops(fn):
        chain = match_row_chain(op)
        if chain is None:
            continue
        length = ir.RankedTensorType(op.results[0].type).shape[-1]
        if length % lanes:
            continue
        width = lanes * largest_divisor_at_most(length // lanes, UNROLL)
        with ir.InsertionPoint(op), op.location:
            result = _RowKernel(chain, width).build()
        op.results[0].replace_all_uses_with(result)
        op.erase()
        for dead in (chain.second, chain.pointwise, chain.first):  # users first
            inits = [operand.owner for operand in dead.operands[input_count(dead) :]]
            dead.erase()
            for init in inits:
                erase_unused_init(init)
        count += 1
    return count


class _RowKernel:
    """Builds the ``scf.forall`` over the rows of one chain at the insertion point."""

    def __init__(self, chain: RowChain, width: int) -> None:
        self.chain = chain
        self.out_type = ir.RankedTensorType(chain.final.results[0].type)
        self.shape = list(self.out_type.shape)
        self.element = self.out_type.element_type
        self.width = width
        self.vector_type = ir.VectorType.get([width], self.element)
        self.rank = len(self.shape)

    def index(self, value: int) -> Any:
        return arith.ConstantOp(ir.IndexType.get(), value).result

    def build(self) -> Any:
        init = self.chain.final.operands[2]
        outer = self.shape[:-1] or [1]
        over_rows = scf.ForallOp([0] * len(outer), outer, [1] * len(outer), [init])
        with ir.InsertionPoint(over_rows.body):
            row = list(over_rows.induction_variables)[: self.rank - 1]
            sizes = [1] * (self.rank - 1) + [self.shape[-1]]
            dynamic = ir.ShapedType.get_dynamic_stride_or_offset()
            offsets = [dynamic] * (self.rank - 1) + [0]
            tile_type = ir.RankedTensorType.get(sizes, self.element)
            shared = over_rows.inner_iter_args[0]
            tile = tensor.ExtractSliceOp(
                tile_type, shared, row, [], [], offsets, sizes, [1] * self.rank
            ).result
            tile = self._row(row, tile)
            terminator = scf.InParallelOp()
            with ir.InsertionPoint(terminator.region.blocks[0]):
                tensor.ParallelInsertSliceOp(
                    tile, shared, row, [], [], offsets, sizes, [1] * self.rank
                )
        return over_rows.results[0]

    def _row(self, row: list[Any], tile: Any) -> Any:
        """The three passes over one row; returns the written output row."""
        chain = self.chain
        first = self._reduce(chain.first, lambda col, _: self._read(chain.source, row, col))
        broadcast_first = vector.BroadcastOp(self.vector_type, first).result

        def exp_pass(col: Any, carried: Any) -> tuple[Any, Any]:
            rows = self._read(chain.source, row, col)
            made = self._clone_body(chain.pointwise, rows, broadcast_first)
            return made, self._write(made, carried, col)

        second, tile = self._reduce(chain.second, exp_pass, tile)
        broadcast_second = vector.BroadcastOp(self.vector_type, second).result
        over = self._loop([tile])
        with ir.InsertionPoint(over.body):
            col, carried = over.induction_variable, over.inner_iter_args[0]
            rows = self._read(carried, [self.index(0)] * (self.rank - 1), col)
            made = self._clone_body(chain.final, rows, broadcast_second)
            scf.YieldOp([self._write(made, carried, col)])
        return over.results[0]

    def _loop(self, carried: list[Any]) -> Any:
        return scf.ForOp(self.index(0), self.index(self.shape[-1]), self.index(self.width), carried)

    def _reduce(self, op: Any, values: Any, tile: Any = None) -> Any:
        """Fold ``values(col, tile)`` (a vector, or a vector and the written tile) along the
        row with ``op``'s combiner; its scalar (and the tile when one is carried)."""
        combiner = children(op)[0]
        kind, identity = _COMBINERS[combiner.name]
        start = arith.ConstantOp(self.element, identity).result
        carried = [vector.BroadcastOp(self.vector_type, start).result]
        over = self._loop(carried + ([tile] if tile is not None else []))
        with ir.InsertionPoint(over.body):
            col, args = over.induction_variable, list(over.inner_iter_args)
            made = values(col, args[1] if tile is not None else None)
            value, written = made if tile is not None else (made, None)
            folded = self._combine(combiner, value, args[0])
            scf.YieldOp([folded] + ([written] if tile is not None else []))
        fill = fill_value(op.operands[1])
        kind_attr = getattr(vector.CombiningKind, kind)
        total = vector.ReductionOp(self.element, kind_attr, over.results[0], acc=fill).result
        return total if tile is None else (total, over.results[1])

    def _combine(self, combiner: Any, value: Any, acc: Any) -> Any:
        attrs = {name: combiner.attributes[name] for name in combiner.attributes}
        made = ir.Operation.create(combiner.name, [self.vector_type], [value, acc], attrs)
        return made.results[0]

    def _clone_body(self, op: Any, rows: Any, row_result: Any) -> Any:
        """``op``'s body on vectors: its whole-row input is ``rows``, its row-result input
        ``row_result``; values from outside the body are broadcast."""
        block = body_block(op)
        maps = _maps(op)
        whole = 0 if _is_identity(maps[0], self.rank) else 1
        mapped = {block.arguments[whole]: rows, block.arguments[1 - whole]: row_result}
        result = None
        for inner in children(op):
            if inner.name == "linalg.yield":
                result = mapped[inner.operands[0]]
                break
            operands = [mapped.get(v) or self._splat(v) for v in inner.operands]
            types = [ir.VectorType.get([self.width], r.type) for r in inner.results]
            if inner.name == "arith.constant":
                operands, types = [], [r.type for r in inner.results]
            attrs = {name: inner.attributes[name] for name in inner.attributes}
            made = ir.Operation.create(inner.name, types, operands, attrs)
            for old, new in zip(inner.results, made.results, strict=True):
                mapped[old] = new if inner.name != "arith.constant" else self._splat(new)
        return result

    def _splat(self, scalar: Any) -> Any:
        return vector.BroadcastOp(ir.VectorType.get([self.width], scalar.type), scalar).result

    def _minor(self) -> Any:
        return ir.AffineMap.get_minor_identity(self.rank, 1)

    def _read(self, source: Any, row: list[Any], col: Any) -> Any:
        padding = arith.ConstantOp(self.element, 0.0).result
        at = [*row, col]
        return vector.TransferReadOp(
            self.vector_type, source, at, self._minor(), padding, [True]
        ).result

    def _write(self, value: Any, tile: Any, col: Any) -> Any:
        at = [self.index(0)] * (self.rank - 1) + [col]
        return vector.TransferWriteOp(tile.type, value, tile, at, self._minor(), [True]).result
