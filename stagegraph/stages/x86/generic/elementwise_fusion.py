"""Elementwise chains merged into single generics before the generic schedule (run by
:func:`stagegraph.stages.x86.generic.prepare.prepare` when the params fuse elementwise producers).

* :func:`duplicate_cheap_producers`: a cheap elementwise generic (a cast) read by several
  generics is copied per reader, so each copy fuses into its reader's loops.
* :func:`fuse_elementwise_chains`: an elementwise generic used only by an elementwise
  generic or a reduction (read without broadcast) is merged into it, so a chain is one op:
  the schedule then needs no per-producer fusion, whose cost grows with the whole function,
  and a reduction computes its inputs in registers (no temporary buffer per tile).
"""

from __future__ import annotations

from typing import Any

from stagegraph.mlir.bindings import ir, linalg_ops
from stagegraph.mlir.walk import children, top_level_ops
from stagegraph.stages.x86.generic.linalg_parts import (
    body_block,
    body_yield,
    input_count,
    is_bool_tensor,
    is_contraction,
    result_owner,
)


def _all_parallel(op: Any) -> bool:
    """Compares the whole attribute: reading its elements would import the linalg module
    (see ``analysis.ops.declared_iterator_types``)."""
    from stagegraph.mlir.build import iterator_types_attr

    declared = op.attributes["iterator_types"]
    parallel = iterator_types_attr(["parallel"] * len(ir.ArrayAttr(declared)), op.context)
    return declared == parallel


def _maps(op: Any) -> list[Any]:
    return [ir.AffineMapAttr(a).value for a in op.attributes["indexing_maps"]]


def _element_type(value_type: Any) -> Any:
    if isinstance(value_type, ir.ShapedType):
        return ir.ShapedType(value_type).element_type
    return value_type


def _plain_elementwise(op: Any) -> bool:
    """A single-result, all-parallel ``linalg.generic`` on ranked tensors whose body reads
    neither its init nor ``linalg.index`` (so it can be inlined anywhere with only its
    input arguments remapped)."""
    if op.name != "linalg.generic" or len(op.results) != 1 or is_contraction(op):
        return False
    if not isinstance(op.results[0].type, ir.RankedTensorType) or not _all_parallel(op):
        return False
    if is_bool_tensor(op.results[0].type):
        return False  # i1 vectors are bit-packed: the schedule leaves these alone
    block = body_block(op)
    if list(block.arguments[input_count(op)].uses):
        return False
    return all(inner.name != "linalg.index" for inner in children(op))


def _feeds_named_linalg(op: Any) -> bool:
    """Whether a result of ``op`` is an operand of a linalg op other than a plain generic
    (a matmul, a transpose, ...): such producers are left to that op's schedule."""
    for result in op.results:
        for use in result.uses:
            user = use.owner.operation
            if user.name.startswith("linalg.") and is_contraction(user):
                return True
    return False


def _plain_reduction(op: Any) -> bool:
    """A single-result ``linalg.generic`` on ranked tensors with a reduction loop, whose body
    reads no ``linalg.index``, and not a contraction: a consumer whose elementwise producers
    can be inlined into its body like an elementwise consumer's."""
    if op.name != "linalg.generic" or len(op.results) != 1 or is_contraction(op):
        return False
    if not isinstance(op.results[0].type, ir.RankedTensorType) or _all_parallel(op):
        return False
    if is_bool_tensor(op.results[0].type):
        return False
    return all(inner.name != "linalg.index" for inner in children(op))


_MULTIPLIES = frozenset({"arith.mulf", "arith.muli"})


def _multiplies_inputs(producer: Any) -> bool:
    """Whether ``producer`` yields the product of two of its inputs (through casts at most):
    inlined into a sum, that is a contraction, which the generic schedule does not take."""
    value = body_yield(producer).operands[0]
    owner = result_owner(value)
    if owner is None or owner.name not in _MULTIPLIES:
        return False
    sources = []
    for operand in owner.operands:
        while (inner := result_owner(operand)) is not None and len(inner.operands) == 1:
            operand = inner.operands[0]  # a cast or another unary op
        sources.append(operand)
    arguments = list(body_block(producer).arguments)
    return all(v in arguments for v in sources) and sources[0] != sources[1]


def _fusable_operand(consumer: Any) -> int | None:
    """The first input of ``consumer`` made by an elementwise generic that only it uses, read
    without broadcast or reduction (each producer element computed once), else None. A
    product of two inputs is not inlined into a reduction (it would make a contraction)."""
    maps = _maps(consumer)
    reduction = not _all_parallel(consumer)
    for k in range(input_count(consumer)):
        producer = result_owner(consumer.operands[k])
        if producer is None or producer.parent != consumer.parent:
            continue
        if not _plain_elementwise(producer) or not maps[k].is_permutation:
            continue
        if reduction and _multiplies_inputs(producer):
            continue
        if _reading_slots(consumer, producer) is None:
            continue
        if not _maps(producer)[-1].is_permutation:
            continue
        return k
    return None


def _reading_slots(consumer: Any, producer: Any) -> list[int] | None:
    """The inputs of ``consumer`` that read ``producer``'s result, if ``consumer`` is its only
    reader and reads it through one map (``(x - m) * (x - m)`` reads ``x - m`` twice); else
    None."""
    slots = []
    for use in producer.results[0].uses:
        if use.owner.operation != consumer or use.operand_number >= input_count(consumer):
            return None
        slots.append(use.operand_number)
    maps = _maps(consumer)
    return slots if all(maps[j] == maps[slots[0]] for j in slots) else None


def _fuse_producer(consumer: Any, k: int) -> Any:
    """Replace ``consumer`` and the producer of its input ``k`` by one generic computing
    both bodies per element; returns the new op."""
    producer = result_owner(consumer.operands[k])
    # Other inputs reading the same result through the same map read the same element: they
    # become uses of input k's block argument, and are dropped.
    c_in = input_count(consumer)
    c_args = list(body_block(consumer).arguments)
    duplicates = [j for j in _reading_slots(consumer, producer) or [k] if j != k]
    for j in duplicates:
        c_args[j].replace_all_uses_with(c_args[k])
    keep = [j for j in range(len(c_args)) if j not in duplicates]
    c_maps, p_maps = _maps(consumer), _maps(producer)
    n_loops = c_maps[0].n_dims
    # Producer loop p_out.results[i] runs along the consumer's c_maps[k].results[i].
    to_consumer: list[Any] = [None] * p_maps[-1].n_dims
    for p_expr, c_expr in zip(p_maps[-1].results, c_maps[k].results, strict=True):
        to_consumer[ir.AffineDimExpr(p_expr).position] = c_expr
    remap = ir.AffineMap.get(n_loops, 0, to_consumer)
    p_in = input_count(producer)
    p_inputs = list(producer.operands)[:p_in]
    c_operands = [consumer.operands[j] for j in keep]
    c_maps = [c_maps[j] for j in keep]
    c_args = [c_args[j] for j in keep]
    k, c_in = keep.index(k), c_in - len(duplicates)
    inputs = c_operands[:k] + p_inputs + c_operands[k + 1 : c_in]
    inits = c_operands[c_in:]
    p_in_maps = [
        ir.AffineMap.get(n_loops, 0, [e.compose(remap) for e in m.results]) for m in p_maps[:p_in]
    ]
    maps = c_maps[:k] + p_in_maps + c_maps[k + 1 :]
    # An input read twice through one map (each bias add of a merged Mish reads C) is one
    # input: the fused op then reads C once, and stays a single-use consumer of C.
    alias, kept = _distinct_inputs(inputs, maps[: len(inputs)])
    kept_maps = [maps[j] for j in kept] + maps[len(inputs) :]
    with ir.InsertionPoint(consumer), consumer.location:
        fused = linalg_ops.GenericOp(
            [r.type for r in consumer.results],
            [inputs[j] for j in kept],
            inits,
            ir.ArrayAttr.get([ir.AffineMapAttr.get(m) for m in kept_maps]),
            consumer.attributes["iterator_types"],
        )
    types = [_element_type(v.type) for v in [inputs[j] for j in kept] + inits]
    block = ir.Block.create_at_start(fused.regions[0], types, [consumer.location] * len(types))
    args = list(block.arguments)
    new_args = [args[a] for a in alias] + args[len(kept) :]
    p_block, c_block = body_block(producer), body_block(consumer)
    for old, new in zip(list(p_block.arguments)[:p_in], new_args[k : k + p_in], strict=True):
        old.replace_all_uses_with(new)
    p_yield = body_yield(producer)
    c_args[k].replace_all_uses_with(p_yield.operands[0])
    kept = c_args[:k] + c_args[k + 1 :]
    for old, new in zip(kept, new_args[:k] + new_args[k + p_in :], strict=True):
        old.replace_all_uses_with(new)
    into = ir.InsertionPoint(block)
    for body_op in [o.operation for o in p_block.operations][:-1]:
        body_op.detach_from_parent()
        into.insert(body_op)
    for body_op in [o.operation for o in c_block.operations]:
        body_op.detach_from_parent()
        into.insert(body_op)
    for old, new in zip(consumer.results, fused.results, strict=True):
        old.replace_all_uses_with(new)
    consumer.erase()
    producer.erase()
    return fused.operation


def _distinct_inputs(inputs: list[Any], maps: list[Any]) -> tuple[list[int], list[int]]:
    """For each input, the position among the distinct (value, map) pairs of its pair; and
    the index of each distinct pair's first input."""
    alias: list[int] = []
    kept: list[int] = []
    for j, (value, amap) in enumerate(zip(inputs, maps, strict=True)):
        same = next((i for i, first in enumerate(kept)
                     if inputs[first] == value and maps[first] == amap), None)  # fmt: skip
        if same is None:
            kept.append(j)
            same = len(kept) - 1
        alias.append(same)
    return alias, kept


#: Body ops (besides the yield) of an elementwise generic cheap enough to recompute for
#: each consumer rather than store once and read back per consumer.
CHEAP_BODY_OPS = 2


def _cheap(op: Any) -> bool:
    body = [inner.name for inner in children(op)][:-1]
    return len(body) <= CHEAP_BODY_OPS and not any(n.startswith("math.") for n in body)


def duplicate_cheap_producers(fn: Any) -> int:
    """Give each consumer of a cheap elementwise generic (a cast, a negation, a scaling) its
    own copy; returns the number of copies made.

    PyTorch's decompositions widen an input once (``extf`` to f64 for a variance) and read
    it in two reductions: stored, the widened copy is written and read twice at twice the
    width; copied per consumer, each copy fuses into its consumer's loops. A consumer that
    reads the producer broadcast (it would recompute each element per copy), a matmul-like
    or other named op, and the function's return keep the original."""
    count = 0
    for op in top_level_ops(fn):
        if not _plain_elementwise(op) or not _cheap(op) or _feeds_named_linalg(op):
            continue
        reads: dict[Any, list[int]] = {}  # user -> operand numbers (a user may read it twice)
        for use in op.results[0].uses:
            reads.setdefault(use.owner.operation, []).append(use.operand_number)
        readers = [user for user, ks in reads.items() if _reads_elementwise(user, op, ks)]
        if len(reads) < 2 or not readers:
            continue
        for user in readers[1:] if len(readers) == len(reads) else readers:
            with ir.InsertionPoint(user):
                copy = op.clone()
            for k in reads[user]:
                user.operands[k] = copy.results[0]
            count += 1
    return count


def _reads_elementwise(user: Any, producer: Any, operands: list[int]) -> bool:
    """Whether ``user`` is a generic beside ``producer`` reading it only as inputs, each
    element once (a permutation map: no broadcast)."""
    if user.name != "linalg.generic" or user.parent != producer.parent:
        return False
    maps = _maps(user)
    return all(k < input_count(user) and maps[k].is_permutation for k in operands)


def fuse_elementwise_chains(fn: Any) -> int:
    """Merge each elementwise ``linalg.generic`` into its only consumer when that consumer is
    an elementwise generic or a reduction reading it without broadcast; returns the number
    of merges.

    A recurrent model unrolls into thousands of tiny elementwise ops in chains; one generic
    per chain gives the schedule one sub-sequence per chain, with no producer to fuse into
    tile loops (``transform.structured.fuse_into_containing_op`` costs time proportional to
    the whole function per producer: quadratic overall). A reduction's producers (a
    widening to f64, a square) inlined into its body are computed in the registers the
    sum reads them from; fused into its row tiles instead, each tile's producer was
    vectorized on its own and stored to a temporary buffer, read back by the sum.
    Consumers feeding a matmul-like or other named linalg op are left alone (their
    schedule decides about producers).
    """
    count = 0
    for op in top_level_ops(fn):
        if not (_plain_elementwise(op) or _plain_reduction(op)) or _feeds_named_linalg(op):
            continue
        while (k := _fusable_operand(op)) is not None:
            op = _fuse_producer(op, k)
            count += 1
    return count
