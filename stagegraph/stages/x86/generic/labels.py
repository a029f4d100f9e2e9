"""Labels on the payload for the generic x86 schedule: which linalg ops of the entry it may
transform (``stagegraph.generic_op = <index in PayloadFacts.ops>``) and which elementwise
producers fuse into a consumer's tile loop (``stagegraph.fuse_into = <root index>``).

Matmul-class ops, the fills and 2-D transposes the matmul schedule takes into its matmuls,
and producers that fused would be recomputed per broadcast copy stay unlabelled. The
schedule (:mod:`stagegraph.stages.x86.generic.schedule`) matches ops by these labels, never
by printed IR.
"""

from __future__ import annotations

import math
from typing import Any

from stagegraph.mlir.functions import entry_function
from stagegraph.stages.analysis import OpFacts, PayloadFacts, linalg_ops
from stagegraph.stages.x86.generic.plan import has_bool_operands, schedulable
from stagegraph.stages.x86.matmul.patch_operands import PATCH_ATTR

OP_ATTR = "stagegraph.generic_op"
FUSE_ATTR = "stagegraph.fuse_into"


def _users(op: Any) -> list[Any]:
    return [use.owner.operation for result in op.results for use in result.uses]


def _recomputations(producer: Any, consumer: Any, consumer_facts: OpFacts) -> int:
    """How many times a producer fused into ``consumer``'s tiles computes each element: the
    trip count of the consumer loops its indexing map for the producer's result leaves out
    (an RMSNorm's ``sqrt(mean + eps)``, read broadcast over the normalized axis, would be
    recomputed for every element of that axis)."""
    from stagegraph.mlir.bindings import ir, linalg_native

    maps = [ir.AffineMapAttr(a).value for a in linalg_native.get_indexing_maps(consumer)]
    results = set(producer.results)
    worst = 1
    for operand, amap in zip(consumer.operands, maps, strict=False):
        if operand not in results:
            continue
        used = {e.position for e in amap.results if isinstance(e, ir.AffineDimExpr)}
        left_out = [r for d, r in enumerate(consumer_facts.loop_ranges) if d not in used]
        worst = max(worst, math.prod(left_out))
    return worst


def _absorbed_by_matmuls(fact: OpFacts) -> bool:
    """A producer of a matmul that the matmul schedule takes into the matmul itself."""
    return fact.name == "linalg.fill" or (
        fact.name == "linalg.transpose" and len(fact.loop_ranges) == 2
    )


def _initialized_convolution(
    op: Any, fact: OpFacts, users: list[Any], position: dict[Any, int], facts: PayloadFacts
) -> int | None:
    """The index of the convolution or pooling whose init ``op`` alone makes (a fill, an
    elementwise broadcast of a bias), else None: fused into its output tiles, the init is
    written in the tile the convolution then accumulates into, not in a pass of its own."""
    if len(users) != 1 or len(op.results) != 1 or fact.op_class != "elementwise":
        return None
    j = position.get(users[0])
    if j is None or facts.ops[j].op_class not in ("convolution", "pooling"):
        return None
    conv = users[0]
    inits = list(conv.operands)[len(facts.ops[j].inputs) :]
    if list(op.results) != inits or conv.parent != op.parent:
        return None
    return j


def annotate_generic_ops(module: Any, facts: PayloadFacts) -> dict[int, int]:
    """Label the ops this schedule may touch; returns {fused producer: root consumer}.

    Raises:
        ValueError: the module's linalg ops are not the ones ``facts`` describe.
    """
    from stagegraph.mlir.bindings import ir

    fn = entry_function(module, facts.entry)
    ops = linalg_ops(fn)
    if [op.name for op in ops] != [f.name for f in facts.ops]:
        raise ValueError("payload linalg ops differ from the facts; re-run the analysis")
    position = {op: i for i, op in enumerate(ops)}
    matmuls = {i for i, f in enumerate(facts.ops) if f.op_class == "matmul"}
    mine: set[int] = set()
    for i, (op, fact) in enumerate(zip(ops, facts.ops, strict=True)):
        # A matmul's zero fill and a transposed operand are the matmul schedule's: it fuses
        # the fill into its tiles and reads a 2-D transpose through its maps. Any other
        # producer runs here (left alone, it would become scalar loops).
        # So is an implicit GEMM's patch gather: fused into the packing of B.
        feeds_matmul = any(position.get(u) in matmuls for u in _users(op))
        if feeds_matmul and (_absorbed_by_matmuls(fact) or PATCH_ATTR in op.attributes):
            continue
        if schedulable(fact, facts):
            mine.add(i)
    fused: dict[int, int] = {}
    for i in sorted(mine, reverse=True):  # consumers first: chains resolve to their root
        users = _users(ops[i])
        if (j := _initialized_convolution(ops[i], facts.ops[i], users, position, facts)) in mine:
            fused[i] = j  # the init (zero fill, bias broadcast) made in the output tiles
            continue
        if facts.ops[i].op_class != "elementwise" or len(users) != 1:
            continue
        if has_bool_operands(facts.ops[i]):
            continue
        j = position.get(users[0])
        if j is None or j not in mine or facts.ops[j].op_class not in ("elementwise", "reduction"):
            continue
        if users[0].parent != ops[i].parent:
            continue
        if _recomputations(ops[i], users[0], facts.ops[j]) > 1:
            continue  # fused, the producer would run once per broadcast copy of each element
        fused[i] = fused.get(j, j)
    i64 = ir.IntegerType.get_signless(64, module.context)
    for i in mine:
        ops[i].attributes[OP_ATTR] = ir.IntegerAttr.get(i64, i)
        if i in fused:
            ops[i].attributes[FUSE_ATTR] = ir.IntegerAttr.get(i64, fused[i])
    return fused


def strip_annotations(module: Any) -> None:
    """Remove the labels of :func:`annotate_generic_ops` (after the schedule ran)."""
    from stagegraph.mlir.walk import strip_attributes

    strip_attributes(module, OP_ATTR, FUSE_ATTR)
