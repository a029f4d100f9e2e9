"""Cooperative row reductions: a block of threads shares each reduction row.

Mapped one thread per output element (:func:`~stagegraph.stages.gpu.params.plan_op`), a
reduction over a long contiguous row (softmax's max and sum over 16384 columns) keeps a
few thousand threads busy, each reading its 64 KB row one element at a time, far below
the memory bandwidth. Here each block takes one output element (one row) and its
``lanes`` threads read the row together:

1. The row's innermost reduction loop K is split into (J, L, V) loops
   (:func:`expand_reduction_loops`, on the payload before the schedule): element
   ``k = (j * L + l) * V + v``. Thread ``l`` reads the V contiguous elements at
   ``(j * L + l) * V`` for every j: a warp's loads are whole consecutive 16-byte vectors,
   coalesced, and each thread keeps its own accumulator in a register.
2. ``tile_reduction_using_forall`` over L gives the thread forall and a partial result
   per thread; a second one lets a warp's threads combine L/warp partials each; one
   thread combines the warp's partials into the row's result. The partial buffers are
   the block's shared memory (:func:`partials_to_shared`, after bufferization; the
   thread foralls' barriers order them).

The cost model (:func:`plan_row_reduction`) takes a reduction whose loops are parallel
then reduction, whose innermost loop is the innermost dim of every operand it indexes
(contiguous rows), whose body combines with one associative op (the partial results must
combine in any order), and whose row splits into whole warps of threads.
"""

from __future__ import annotations

import math
from typing import Any

from stagegraph.dtypes import byte_size
from stagegraph.stages.analysis import REDUCTION_COMBINERS, OpFacts
from stagegraph.stages.gpu.kernel_plan import KernelPlan
from stagegraph.stages.gpu.simt_plan import VECTOR_BYTES

#: Row steps each thread's loop is unrolled by (loads in flight per thread).
UNROLL = 4
ANY_OP = "!transform.any_op"


def row_loops(kinds: tuple[str, ...], operand_dims: tuple[tuple[int, ...], ...]) -> int | None:
    """The first loop of the row: the trailing reduction loops that every operand reading
    them reads as its innermost dims, in loop order (contiguous in memory, one loop once
    collapsed); None when the innermost loop is not such a reduction."""
    loops = len(kinds)

    def tail(first: int) -> bool:
        group = list(range(first, loops))
        for dims in operand_dims:
            used = [d for d in dims if d in group]
            tail_dims = list(dims[len(dims) - len(group) :])
            if used and (tail_dims != group or len(used) != len(group)):
                return False
        return True

    if not loops or kinds[-1] != "reduction" or not tail(loops - 1):
        return None
    first = loops - 1
    while first > 0 and kinds[first - 1] == "reduction" and tail(first - 1):
        first -= 1
    return first


def partial_reducible(op: OpFacts) -> bool:
    """Whether partial results of ``op`` combine in any order into its result: a
    ``linalg.generic`` with one output indexed by exactly its parallel loops, a single
    associative combiner, no index-dependent body and bare loop indices only."""
    kinds = op.iterator_types
    if op.name != "linalg.generic" or len(op.outputs) != 1 or "reduction" not in kinds:
        return False
    body = set(op.body_ops)
    if "linalg.index" in body or "tensor.extract" in body or not body & REDUCTION_COMBINERS:
        return False
    if len(op.operand_dims) != len(op.inputs) + 1 or any(-1 in d for d in op.operand_dims):
        return False
    parallel = {d for d, kind in enumerate(kinds) if kind == "parallel"}
    return set(op.operand_dims[-1]) == parallel  # the output indexes exactly the rows


def row_reducible(op: OpFacts) -> bool:
    """Whether ``op`` is a reduction over contiguous rows (:func:`row_loops`) whose
    partial results combine in any order (:func:`partial_reducible`)."""
    return partial_reducible(op) and row_loops(op.iterator_types, op.operand_dims) is not None


def _element_bytes(op: OpFacts) -> int:
    """The widest element among the operands that read the row (they share its vector)."""
    innermost = len(op.loop_ranges) - 1
    rows = [v for v, dims in zip(op.inputs, op.operand_dims, strict=False) if innermost in dims]
    return max((byte_size(v.dtype, default=4) for v in rows), default=4)


def row_split(length: int, element_bytes: int, warp: int, limit: int) -> tuple[int, int] | None:
    """(lanes, vector) for a row of ``length`` elements: the widest vector (up to 16 bytes)
    whose row of vectors splits into the most whole warps up to ``limit`` threads; None
    when no split gives whole warps."""
    widest = max(1, VECTOR_BYTES // max(1, element_bytes))
    for vector in (v for v in (widest, widest // 2, widest // 4, 1) if v >= 1):
        if length % vector:
            continue
        chunks = length // vector
        lanes = max((n for n in range(warp, limit + 1, warp) if chunks % n == 0), default=0)
        if lanes:
            return lanes, vector
    return None


def plan_row_reduction(op: OpFacts, warp: int, threads_per_block: int) -> KernelPlan | None:
    """A cooperative plan for a row reduction (:func:`row_reducible`): one block per row
    (every parallel loop tiled by 1), ``lanes`` threads per row. A row that splits into
    whole warps of ``vector``-element steps is read cyclically (:func:`row_split`); any
    other row in one contiguous piece per thread (``vector`` 1), each thread given at
    least :data:`UNROLL` elements. None where it does not apply. The tiles name the
    loops of the op after :func:`expand_reduction_loops` (the row one loop, split in
    three when cyclic)."""
    if not row_reducible(op):
        return None
    ranges, kinds = op.loop_ranges, op.iterator_types
    if math.prod(r for r, k in zip(ranges, kinds, strict=True) if k == "parallel") < 2:
        return None  # a full reduction: no rows to give blocks
    first = row_loops(kinds, op.operand_dims)
    length = math.prod(ranges[first:])
    if length < 2 * warp:
        return None  # a short row: a block's barriers and merges would cost more than it
    # A slice may start anywhere: 16-byte vector loads need 16-byte aligned rows.
    sliced = "tensor.extract_slice" in op.producers
    split = row_split(length, VECTOR_BYTES if sliced else _element_bytes(op), warp,
                      threads_per_block)  # fmt: skip
    if split is None:
        warps = -(-length // (warp * UNROLL))
        split = (max(warp, min(warps * warp, threads_per_block // warp * warp)), 1)
        row = (0,)
    else:
        row = (0, 0, 0)
    lanes, vector = split
    block = [1 if k == "parallel" and r > 1 else 0
             for r, k in zip(ranges[:first], kinds[:first], strict=True)]  # fmt: skip
    return KernelPlan(op=op.index, name=op.name, block_tile=(*block, *row),
                      threads=(lanes,), vector=vector, lanes=lanes,
                      merge=warp if lanes > warp else 0)  # fmt: skip


def in_registers(op: OpFacts, plan: KernelPlan) -> KernelPlan:
    """``plan`` (one thread per output element, :func:`~stagegraph.stages.gpu.params.plan_op`)
    with each thread's reduction loops stepped and the accumulator in a register
    (:func:`thread_steps`), where ``op``'s partial results combine in any order; without
    it every step loads and stores the output element."""
    kinds = op.iterator_types
    if not partial_reducible(op) or not plan.mapped or plan.lanes or plan.split:
        return plan
    reductions = [d for d, kind in enumerate(kinds) if kind == "reduction"]
    tiles = (plan.block_tile, plan.thread_tile)
    if any(t[d] for t in tiles for d in reductions if d < len(t)):
        return plan
    row = reductions[-1]
    return plan.model_copy(update={"accumulate": (row, op.loop_ranges[row])})


# -- the payload rewrite before the schedule -----------------------------------------------


def expand_reduction_loops(module: Any, plans: Any, attr: str) -> dict[int, tuple[int, ...]]:
    """Reshape the row loops (:func:`row_loops`) of every op a cooperative plan names
    (``attr``: the op-index attribute) into one loop K, split into (K / (L*V), L, V)
    loops where the plan reads the row cyclically; the operands that read the row are
    reshaped alike. Returns, per op changed, its output's rank, its J (row steps per
    thread, 0 when not cyclic) and whether it is cyclic: what its script needs. The op
    keeps its body and its result."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.build import iterator_types_attr

    wanted = {plan.op: plan for plan in plans if plan.lanes}
    ops = [op for op in collect_tagged(module, attr) if op.name == "linalg.generic"
           and ir.IntegerAttr(op.attributes[attr]).value in wanted]  # fmt: skip
    shapes = {}
    for op in ops:
        plan = wanted[ir.IntegerAttr(op.attributes[attr]).value]
        maps = [ir.AffineMapAttr(a).value for a in ir.ArrayAttr(op.attributes["indexing_maps"])]
        loops = maps[0].n_dims
        rows = {e.position for e in maps[-1].results}  # the output's loops: the parallel ones
        kinds = tuple("parallel" if d in rows else "reduction" for d in range(loops))
        pointwise = len(rows) == loops  # a row kernel's pointwise op (gpu.row_fusion)
        dims = tuple(tuple(e.position for e in m.results) for m in maps)
        first = loops - 1 if pointwise else row_loops(kinds, dims)
        cyclic = len(plan.block_tile) == first + 3
        length = math.prod(_loop_extent(op, maps, d) for d in range(first, loops))
        parts = [length // (plan.lanes * plan.vector), plan.lanes, plan.vector]
        parts = parts if cyclic else [length]
        shapes[plan.op] = (len(rows), parts[0] if cyclic else 0, int(cyclic))
        if plan.split:  # a reduction to a scalar over blocks (gpu.full_reduction)
            steps = length // (plan.split * plan.lanes * plan.vector)
            parts = [plan.split, steps, plan.lanes, plan.vector]
            shapes[plan.op] = (1, parts[1], 1)
        new_maps = []
        with ir.InsertionPoint(op), op.location:
            for index, amap in enumerate(maps):
                keep = len([e for e in amap.results if e.position < first])
                if keep < len(amap.results):
                    op.operands[index] = _reshape_row(op.operands[index], keep, parts)
                results = [
                    *amap.results[:keep],
                    *(ir.AffineDimExpr.get(first + k) for k in range(len(parts))),
                ]
                new_maps.append(ir.AffineMap.get(first + len(parts), 0,
                                                 results if keep < len(amap.results)
                                                 else list(amap.results)))  # fmt: skip
        op.attributes["indexing_maps"] = ir.ArrayAttr.get(
            [ir.AffineMapAttr.get(m) for m in new_maps]
        )
        kind = "parallel" if pointwise else "reduction"
        op.attributes["iterator_types"] = iterator_types_attr(
            [*kinds[:first], *[kind] * len(parts)]
        )
        if pointwise:
            _reshape_result(op, len(maps[-1].results))
        if plan.split:
            _unit_row(op)
    return shapes


def _unit_row(op: Any) -> None:
    """A reduction to a scalar given a leading parallel loop of one trip and a result of
    one element (reshaped back to a scalar for its users): its per-block pieces then
    have a row the cooperative script can give to one thread at the end."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.build import collapse_shape, expand_shape, iterator_types_attr

    maps = [ir.AffineMapAttr(a).value for a in ir.ArrayAttr(op.attributes["indexing_maps"])]
    loops = maps[0].n_dims
    shifted = [
        ir.AffineMap.get(loops + 1, 0, [ir.AffineDimExpr.get(e.position + 1) for e in m.results])
        for m in maps[:-1]
    ]
    out = ir.AffineMap.get(loops + 1, 0, [ir.AffineDimExpr.get(0)])
    op.attributes["indexing_maps"] = ir.ArrayAttr.get(
        [ir.AffineMapAttr.get(m) for m in (*shifted, out)]
    )
    op.attributes["iterator_types"] = iterator_types_attr(["parallel"] + ["reduction"] * loops)
    init = len(op.operands) - 1
    with ir.InsertionPoint(op), op.location:
        op.operands[init] = expand_shape(op.operands[init], [], [1])
    result = op.results[0]
    result.set_type(op.operands[init].type)
    with ir.InsertionPoint.after(op), op.location:
        back = collapse_shape(result, [], [])
    result.replace_all_uses_except(back, back.owner.operation)


def _reshape_result(op: Any, rank: int) -> None:
    """The op's result typed as its (reshaped) init, reshaped back for its users."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.build import collapse_shape

    result = op.results[0]
    old = ir.RankedTensorType(result.type)
    result.set_type(op.operands[len(op.operands) - 1].type)
    groups = [[d] for d in range(rank - 1)] + [[rank - 1 + k for k in range(3)]]
    with ir.InsertionPoint.after(op), op.location:
        back = collapse_shape(result, groups, list(old.shape))
    result.replace_all_uses_except(back, back.owner.operation)


def collect_tagged(module: Any, attr: str) -> list[Any]:
    """The ops of ``module`` that carry ``attr``."""
    from stagegraph.mlir.walk import collect

    return collect(module, lambda o: attr in o.attributes)


def _reshape_row(value: Any, keep: int, parts: list[int]) -> Any:
    """``value`` with its dims after the first ``keep`` (the row) collapsed into one and
    expanded into ``parts``."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.build import collapse_shape, expand_shape

    shape = list(ir.RankedTensorType(value.type).shape)
    outer = [[d] for d in range(keep)]
    if len(shape) - keep > 1:
        value = collapse_shape(value, [*outer, list(range(keep, len(shape)))],
                               [*shape[:keep], math.prod(shape[keep:])])  # fmt: skip
    if len(parts) > 1:
        value = expand_shape(value, [*outer, [keep + k for k in range(len(parts))]],
                             [*shape[:keep], *parts])  # fmt: skip
    return value


def _loop_extent(op: Any, maps: list[Any], loop: int) -> int:
    """The static extent of ``loop``: the size of an operand dim it indexes."""
    from stagegraph.mlir.bindings import ir

    for value, amap in zip(op.operands, maps, strict=True):
        for dim, expr in enumerate(amap.results):
            if isinstance(expr, ir.AffineDimExpr) and expr.position == loop:
                return ir.RankedTensorType(value.type).shape[dim]
    raise ValueError(f"{op.name}: loop {loop} indexes no operand")


# -- the schedule --------------------------------------------------------------------------


def transform_call(kind: str, target: str, spec: str, outs: int = 4) -> str:
    """``transform.structured.<kind> <target> <spec>`` on an any-op handle, giving
    ``outs`` any-op handles."""
    types = ", ".join([ANY_OP] * outs)
    return f"transform.structured.{kind} {target} {spec} : ({ANY_OP}) -> ({types})"


def row_reduction_script(plan: KernelPlan, attr: str, shape: tuple[int, ...]) -> str:
    """The transform ops for a cooperative plan (op ``plan.op`` tagged by ``attr``;
    ``shape``: its output's rank, row steps and whether cyclic, from
    :func:`expand_reduction_loops`): rows to blocks, then :func:`reduction_body`."""
    i, tiles = plan.op, plan.block_tile
    blocks = [t for t in tiles if t]
    mapping = ", ".join(f"#gpu.block<linear_dim_{len(blocks) - 1 - k}>" for k in range(len(blocks)))
    text = (
        f"    %op{i} = transform.structured.match attributes{{{attr} = {i} : i64}} in %root "
        f": ({ANY_OP}) -> {ANY_OP}\n"
        f"    %rows{i}_op, %rows{i} = "
        + transform_call(
            "tile_using_forall", f"%op{i}", f"tile_sizes {list(tiles)} (mapping = [{mapping}])", 2
        )
        + f"\n    %index{i} = transform.param.constant {i} : i64 -> !transform.param<i64>\n"
        f'    transform.annotate %rows{i} "{attr}" = %index{i} : {ANY_OP}, !transform.param<i64>\n'
    )
    text += reduction_body(plan, f"%rows{i}_op", shape)
    # The partial buffers' whole fills stay behind, unused, when fused into the thread
    # foralls; bufferized, every thread would run them unsynchronized: drop them now.
    text += (
        f"    transform.apply_patterns to %rows{i} {{\n"
        "      transform.apply_patterns.canonicalization\n"
        f"    }} : {ANY_OP}\n"
    )
    return text


def reduction_body(plan: KernelPlan, handle: str, shape: tuple[int, ...]) -> str:
    """One block's row (the op ``handle``, already tiled to one row): the row's L loop to
    the block's threads, each thread's steps (:func:`thread_steps`), then the partial
    results combined (:func:`_merge_script`). The caller canonicalizes the block after."""
    i, tiles = plan.op, plan.block_tile
    out_rank, steps, cyclic = shape
    loops = len(tiles)
    lane_dim = loops - 2 if cyclic else loops - 1
    lanes = [plan.lanes if d == lane_dim else 0 for d in range(loops)]
    text = (
        f"    %fill{i}, %part{i}, %comb{i}, %lanes{i} = "
        + transform_call(
            "tile_reduction_using_forall",
            handle,
            f"reduction_dims = [{lane_dim}] by num_threads = {lanes} tile_sizes = [] "
            "mapping = [#gpu.thread<x>]",
        )
        + f"\n    %ffill{i}, %lanes{i}_f = transform.structured.fuse_into_containing_op "
        f"%fill{i} into %lanes{i} : ({ANY_OP}, {ANY_OP}) -> ({ANY_OP}, {ANY_OP})\n"
    )
    row = loops - 3 if cyclic else loops - 1
    text += thread_steps(str(i), f"%part{i}", f"%lanes{i}_f", tiles, steps, row)
    return text + _merge_script(i, plan.lanes, plan.merge, out_rank)


def thread_steps(
    i: str, part: str, scope: str, tiles: tuple[int, ...], steps: int, row: int
) -> str:
    """One thread's share of a reduction (the op ``part`` inside the thread forall
    ``scope``; ``i`` names the handles): a loop over every other untiled loop before
    ``row`` (outermost first), inside them the ``row`` loop (J, or the thread's piece of
    an uneven row), each step one vector (``vector.reduction`` into the accumulator),
    the accumulator hoisted out of the loops into a register (innermost loop first: one
    hoisting round per loop) and the ``row`` loop unrolled by up to :data:`UNROLL` when
    it has ``steps`` (loads in flight)."""
    loops = len(tiles)
    outer = [1 if d < row and not tiles[d] else 0 for d in range(loops)]
    inner = [1 if d == row else 0 for d in range(loops)]
    text = ""
    if any(outer):
        count = sum(outer)
        handles = ", ".join(f"%outer{i}_{k}" for k in range(count))
        text += (
            f"    %opart{i}, {handles} = "
            + transform_call("tile_using_for", part, f"tile_sizes {outer}", count + 1)
            + "\n"
        )
        part = f"%opart{i}"
    text += (
        f"    %step{i}, %loop{i} = "
        + transform_call("tile_using_for", part, f"tile_sizes {inner}", 2)
        + f"\n    transform.structured.vectorize %step{i} : {ANY_OP}\n"
        f"    transform.apply_patterns to {scope} {{\n"
        "      transform.apply_patterns.vector.cast_away_vector_leading_one_dim\n"
        "      transform.apply_patterns.vector.reorder_multi_reduction_dims "
        "lowering_strategy = innerreduction\n"
        "      transform.apply_patterns.vector.multi_reduction_flattening "
        "lowering_strategy = innerreduction\n"
        "      transform.apply_patterns.vector.multi_reduction_unrolling "
        "lowering_strategy = innerreduction\n"
        "      transform.apply_patterns.canonicalization\n"
        f"    }} : {ANY_OP}\n"
    )
    for k in range(sum(outer) + 1):
        text += (
            f'    %loops{i}_{k} = transform.structured.match ops{{["scf.for"]}} in {scope} '
            f": ({ANY_OP}) -> {ANY_OP}\n"
            f"    transform.apply_licm to %loops{i}_{k} : {ANY_OP}\n"
            f"    transform.loop.hoist_loop_invariant_subsets %loops{i}_{k} : {ANY_OP}\n"
        )
    unroll = max(d for d in range(1, UNROLL + 1) if steps % d == 0) if steps else 1
    if unroll > 1:
        text += f"    transform.loop.unroll %loop{i} {{factor = {unroll}}} : {ANY_OP}\n"
    return text


def _merge_script(i: int, lanes: int, merge: int, out_rank: int) -> str:
    """Combine a row's ``lanes`` partial results: ``merge`` threads (a warp) each combine
    lanes/merge of them (when ``merge``), then one thread the rest."""
    thread = "mapping = [#gpu.thread<x>]"
    last = f"%comb{i}"
    text = ""
    if merge:
        split = [0] * out_rank + [merge]
        text += (
            f"    %mfill{i}, %mpart{i}, %mcomb{i}, %merge{i} = "
            + transform_call(
                "tile_reduction_using_forall",
                f"%comb{i}",
                f"reduction_dims = [{out_rank}] by num_threads = {split} tile_sizes = [] {thread}",
            )
            + f"\n    %mffill{i}, %merge{i}_f = transform.structured.fuse_into_containing_op "
            f"%mfill{i} into %merge{i} : ({ANY_OP}, {ANY_OP}) -> ({ANY_OP}, {ANY_OP})\n"
        )
        last = f"%mcomb{i}"
    text += (
        f"    %final{i}_op, %final{i} = "
        + transform_call("tile_using_forall", last, f"tile_sizes [1] ({thread})", 2)
        + "\n"
    )
    return text


# -- after bufferization -------------------------------------------------------------------


def partials_to_shared(module: Any, plans: Any, attr: str) -> int:
    """Put the partial-result buffers of every cooperative kernel (the allocations inside
    the block forall of a plan with lanes) in the block's shared memory: its threads
    write them and read each other's. Users keep the generic address space through a
    ``memref.memory_space_cast``; returns how many buffers moved."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import collect

    wanted = {plan.op for plan in plans if plan.lanes}
    workgroup = ir.Attribute.parse("#gpu.address_space<workgroup>")
    foralls = [
        op
        for op in collect(module, "scf.forall")
        if attr in op.attributes and ir.IntegerAttr(op.attributes[attr]).value in wanted
    ]
    moved = 0
    for forall in foralls:
        for alloc in collect(forall, "memref.alloc"):
            old = ir.MemRefType(alloc.results[0].type)
            shared = ir.MemRefType.get(old.shape, old.element_type, old.layout, workgroup)
            with ir.InsertionPoint(alloc), alloc.location:
                new = ir.Operation.create("memref.alloc", results=[shared],
                                          attributes=dict(alloc.attributes),
                                          operands=[])  # fmt: skip
                cast = ir.Operation.create("memref.memory_space_cast", results=[old],
                                           operands=[new.results[0]])  # fmt: skip
            alloc.results[0].replace_all_uses_with(cast.results[0])
            alloc.erase()
            moved += 1
    return moved
