"""Parallel loops too small to pay for their threads run serially.

When a payload runs on several threads, every ``scf.forall`` the schedules made becomes an
OpenMP parallel loop: a fork, a join, and a wait for the slowest thread. A big matmul's
block loop pays that back many times; a bias add or a normalization over a few thousand
elements does not, and on a machine whose cores other processes share its join can wait a
whole time slice for a descheduled thread. This pass estimates each outermost loop's work
from the buffer-level IR (vector lanes times static trip counts) and turns the loops below
a threshold into ``scf.for`` before the OpenMP lowering.

Given the thread count, a loop's work counts only as far as its trips split it: ``T`` trips
on ``P`` threads take ``ceil(T / P)`` trips' time, so one trip saves nothing (a matmul whose
blocks were not split for threads, a convolution parallel over a batch of one) and three
trips on two threads save a third. Such a loop only forks, joins and waits; serial, the
payload is never slower on two threads than on one for it.
"""

from __future__ import annotations

import math
from typing import Any

SERIAL_ATTR = "stagegraph.serial"

# Work assumed for a loop body the estimate cannot see into (a call, a dynamic trip count):
# large, so such a loop stays parallel.
UNKNOWN_WORK = 1 << 40


def loop_work(op: Any) -> int:
    """Estimated lane operations of ``op`` (and everything nested in it): a vector op
    counts its lanes, a scalar op one, a loop its body times its static trip count."""
    from stagegraph.mlir.bindings import ir

    name = op.name
    if name == "func.call":
        return UNKNOWN_WORK
    if name in ("scf.for", "scf.forall", "scf.parallel"):
        trips = _trip_count(op)
        if trips is None:
            return UNKNOWN_WORK
        return trips * _regions_work(op)
    if name.startswith("linalg."):
        shapes = [ir.ShapedType(v.type).shape for v in op.operands if _is_shaped(v.type)]
        return max((math.prod(s) for s in shapes), default=1)
    lanes = 1
    for value in [*op.results, *op.operands]:
        if isinstance(value.type, ir.VectorType):
            lanes = max(lanes, math.prod(ir.VectorType(value.type).shape))
    return lanes + _regions_work(op)


def _regions_work(op: Any) -> int:
    total = 0
    for region in op.regions:
        for block in region.blocks:
            for child in block.operations:
                total += loop_work(child.operation)
    return total


def _is_shaped(value_type: Any) -> bool:
    from stagegraph.mlir.bindings import ir

    return (
        isinstance(value_type, ir.MemRefType | ir.RankedTensorType)
        and ir.ShapedType(value_type).has_static_shape
    )


def _constant(value: Any) -> int | None:
    from stagegraph.mlir.bindings import ir

    owner = value.owner
    if not isinstance(owner, ir.Operation | ir.OpView):
        return None
    owner = owner.operation
    if owner.name != "arith.constant" or not isinstance(owner.results[0].type, ir.IndexType):
        return None
    return ir.IntegerAttr(owner.attributes["value"]).value


def _trip_count(op: Any) -> int | None:
    """Static trip count of an ``scf.for``/``scf.forall``/``scf.parallel`` (all of its
    dimensions), or None when a bound is dynamic."""
    from stagegraph.mlir.bindings import ir

    if op.name == "scf.for":
        bounds = [_constant(op.operands[i]) for i in range(3)]
        if None in bounds or bounds[2] <= 0:
            return None
        lower, upper, step = bounds
        return max(0, -(-(upper - lower) // step))
    if op.name == "scf.forall":
        attrs = op.attributes
        dynamic = ir.ShapedType.get_dynamic_size()
        lowers = list(ir.DenseI64ArrayAttr(attrs["staticLowerBound"]))
        uppers = list(ir.DenseI64ArrayAttr(attrs["staticUpperBound"]))
        steps = list(ir.DenseI64ArrayAttr(attrs["staticStep"]))
        if dynamic in lowers + uppers + steps:
            return None
        return math.prod(
            max(0, -(-(u - lo) // s)) for lo, u, s in zip(lowers, uppers, steps, strict=True)
        )
    return None  # scf.parallel: not made by these schedules; assume it is worth its threads


def splittable_work(op: Any, threads: int) -> int:
    """``op``'s work (:func:`loop_work`) scaled by how much of it ``threads`` threads can
    split: ``work * (1 - ceil(T/P)/T) / (1 - 1/P)`` for a loop of ``T`` static trips (its
    whole work when the trips divide evenly, none for one trip); a loop with a dynamic trip
    count or with parallel loops inside (they may split what its trips do not) counts whole."""
    from stagegraph.mlir.walk import collect

    work = loop_work(op)
    trips = _trip_count(op)
    if threads <= 1 or trips is None or trips <= 0 or collect(op, "scf.forall"):
        return work
    per_thread = -(-trips // threads)
    return work * (trips - per_thread) * threads // (trips * (threads - 1))


def mark_small_parallel_loops(module: Any, min_work: int, threads: int = 0) -> int:
    """Mark (``SERIAL_ATTR``) each outermost ``scf.forall`` whose estimated work is below
    ``min_work`` (with ``threads``, the work those threads can split:
    :func:`splittable_work`); returns how many."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import collect

    marked = 0
    for forall in collect(module, "scf.forall"):
        parent = forall.parent
        nested = False
        while parent is not None and parent.name != "func.func":
            if parent.name == "scf.forall":
                nested = True
                break
            parent = parent.parent
        work = splittable_work(forall, threads) if threads else loop_work(forall)
        if nested or work >= min_work:
            continue
        # The loops nested in it go too: left parallel, each would fork once per trip of
        # the serial loop (a weight transpose's inner loops forked 1,344 times a call and
        # ran a 2 ms convolution in 4.9 ms on two threads, 49 ms with sleeping workers).
        for loop in [forall, *collect(forall, "scf.forall")]:
            rank = len(ir.DenseI64ArrayAttr(loop.attributes["staticUpperBound"]))
            i64 = ir.IntegerType.get_signless(64, loop.context)
            loop.attributes[SERIAL_ATTR] = ir.IntegerAttr.get(i64, rank)
            marked += 1
    return marked


def serialize_small_parallel_loops(module: Any, min_work: int, threads: int = 0) -> int:
    """Rewrite the outermost ``scf.forall`` loops of ``module`` (buffer level: no results)
    whose estimated work (split on ``threads`` threads, when given) is below ``min_work``
    into ``scf.for`` nests; returns how many."""
    from stagegraph.mlir.bindings import ir, loop, structured, transform
    from stagegraph.mlir.walk import collect, strip_attributes
    from stagegraph.stages.common.transform import apply_schedule_module, new_schedule
    from stagegraph.stages.common.transform_build import any_op

    count = mark_small_parallel_loops(module, min_work, threads)
    if count:
        ranks = {
            ir.IntegerAttr(op.attributes[SERIAL_ATTR]).value
            for op in collect(module, "scf.forall")
            if SERIAL_ATTR in op.attributes
        }
        with module.context, ir.Location.unknown(module.context):
            schedule, sequence = new_schedule()
            with ir.InsertionPoint(sequence.body):
                handle = any_op()
                i64 = ir.IntegerType.get_signless(64)
                for rank in sorted(ranks):  # one handle per loop made: one match per rank
                    loops = structured.MatchOp(
                        handle,
                        sequence.bodyTarget,
                        ops=["scf.forall"],
                        op_attrs={SERIAL_ATTR: ir.IntegerAttr.get(i64, rank)},
                    ).result
                    each = transform.ForeachOp([], [loops])
                    with ir.InsertionPoint(each.body):
                        loop.ForallToForOp([handle] * rank, each.body.arguments[0])
                        transform.YieldOp([])
                transform.YieldOp([])
            apply_schedule_module(module, schedule)
    strip_attributes(module, SERIAL_ATTR)
    return count
