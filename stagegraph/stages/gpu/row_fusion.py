"""One kernel per row: a pointwise op and the row reductions it reads, fused.

Softmax is ``m = max(x)``, ``s = sum(exp(x - m))``, ``y = exp(x - m) / s`` over each row.
As three kernels, ``x`` comes from memory three times and ``y`` goes once. Here one block
takes a row through all three: its threads reduce the row into ``m`` (cooperatively, as
:mod:`stagegraph.stages.gpu.reduction` does), then into ``s``, then write ``y``, reading
the row again from the caches between the passes. The row results stay in the block:
written by one thread, read by all after the barrier that closes each thread forall.

The cost model (:func:`fuse_rows`) takes a pointwise op whose innermost loop runs along
contiguous rows and whose other inputs are row results of cooperative reductions over
rows of the same length, split alike (lanes, vector), used by nothing else; their fills
and the reductions they read in turn (``s`` reads ``m``) join the kernel too.
"""

from __future__ import annotations

from stagegraph.stages.analysis import OpFacts, PayloadFacts
from stagegraph.stages.gpu.kernel_plan import KernelPlan
from stagegraph.stages.gpu.reduction import ANY_OP, reduction_body, thread_steps, transform_call


def _pointwise_rows(op: OpFacts) -> bool:
    """A pointwise ``linalg.generic`` on rows: identity output, bare loop indices, the
    innermost loop the innermost dim of every operand that reads it."""
    loops = len(op.iterator_types)
    if op.name != "linalg.generic" or len(op.outputs) != 1 or not loops:
        return False
    if any(k != "parallel" for k in op.iterator_types) or op.loop_ranges[-1] < 2:
        return False
    if {"linalg.index", "tensor.extract"} & set(op.body_ops):
        return False
    if op.operand_dims[-1] != tuple(range(loops)) or any(-1 in d for d in op.operand_dims):
        return False
    inner = loops - 1
    return all(inner not in d or d[-1] == inner for d in op.operand_dims)


def _row_group(op: OpFacts, facts: PayloadFacts, plans: dict[int, KernelPlan]) -> list[int]:
    """The cooperative reductions ``op`` reads rows of (and those they read in turn), in
    program order; empty when they cannot all join its kernel."""
    ops = {o.index: o for o in facts.ops}
    rows = op.loop_ranges[:-1]
    group: list[int] = []
    todo = [p for p, dims in zip(op.producer_ops, op.operand_dims, strict=False)
            if p >= 0 and len(op.loop_ranges) - 1 not in dims]  # fmt: skip
    while todo:
        index = todo.pop()
        plan, reduction = plans.get(index), ops.get(index)
        if index in group or plan is None or reduction is None:
            if index in group:
                continue
            return []
        if (
            not plan.lanes
            or reduction.loop_ranges[:-1] != rows
            or len(plan.block_tile) != len(reduction.loop_ranges) + 2
        ):
            return []  # not a cyclic single-loop row reduction over the same rows
        group.append(index)
        inner = len(reduction.loop_ranges) - 1
        todo += [p for p, dims in zip(reduction.producer_ops, reduction.operand_dims[:-1],
                                      strict=False) if p >= 0 and inner not in dims]  # fmt: skip
    return sorted(group)


def fuse_rows(kernels: list[KernelPlan], facts: PayloadFacts) -> list[KernelPlan]:
    """Give each pointwise op that reads row results of cooperative reductions the plan
    of one block per row with those reductions and their fills in it (``group``);
    returns the new plans (the grouped ops keep theirs, for the schedule to read)."""
    plans = {plan.op: plan for plan in kernels}
    users: dict[int, set[int]] = {}
    for op in facts.ops:
        for producer in op.producer_ops:
            users.setdefault(producer, set()).add(op.index)
    out = list(kernels)
    taken: set[int] = set()
    for op in facts.ops:
        if op.index not in plans or not _pointwise_rows(op):
            continue
        if "tensor.extract_slice" in op.producers:
            continue  # a slice may start anywhere: its rows' vectors may be misaligned
        group = _row_group(op, facts, plans)
        if not group or taken & set(group):
            continue
        reductions = [plans[g] for g in group]
        if len({(p.lanes, p.vector) for p in reductions}) != 1:
            continue
        fills = [facts.ops[g].producer_ops[-1] for g in group]
        members = set(group) | {op.index}
        if any(f < 0 or facts.ops[f].name != "linalg.fill" for f in fills):
            continue
        if any(users.get(g, set()) - members for g in group):
            continue  # a row result used outside the kernel
        length = op.loop_ranges[-1]
        lanes, vector = reductions[0].lanes, reductions[0].vector
        if length % (lanes * vector) or facts.ops[group[0]].loop_ranges[-1] != length:
            continue
        block = tuple(1 if r > 1 else 0 for r in op.loop_ranges[:-1])
        fused = KernelPlan(op=op.index, name=op.name, block_tile=(*block, 0, 0, 0),
                           threads=(lanes,), vector=vector, lanes=lanes,
                           group=tuple(sorted({*group, *fills})))  # fmt: skip
        position = {p.op: n for n, p in enumerate(out)}
        out[position[op.index]] = fused
        for fill in fills:  # run by the block's threads: no launch, no block dims of their own
            out[position[fill]] = KernelPlan(op=fill, name=facts.ops[fill].name)
        taken |= set(group)
    return out


def grouped(kernels: tuple[KernelPlan, ...]) -> set[int]:
    """The ops that run inside another op's row kernel."""
    return {index for plan in kernels for index in plan.group}


def row_kernel_script(plan: KernelPlan, plans: dict[int, KernelPlan], attr: str,
                      shapes: dict[int, tuple[int, ...]]) -> str:  # fmt: skip
    """The transform ops of one row kernel: the pointwise op's rows to blocks, its group
    fused into the block (last op first), each reduction split over the block's threads
    as :func:`~stagegraph.stages.gpu.reduction.reduction_body` does, then the pointwise
    op's row over the threads, one vector per step, its J loop unrolled."""
    i = plan.op
    loops = len(plan.block_tile)
    blocks = [t for t in plan.block_tile if t]
    mapping = ", ".join(f"#gpu.block<linear_dim_{len(blocks) - 1 - k}>" for k in range(len(blocks)))
    text = (
        f"    %op{i} = transform.structured.match attributes{{{attr} = {i} : i64}} in %root "
        f": ({ANY_OP}) -> {ANY_OP}\n"
        f"    %pw{i}, %rows{i} = "
        + transform_call("tile_using_forall", f"%op{i}",
                 f"tile_sizes {list(plan.block_tile)} (mapping = [{mapping}])", 2)
        + f"\n    %index{i} = transform.param.constant {i} : i64 -> !transform.param<i64>\n"
        f'    transform.annotate %rows{i} "{attr}" = %index{i} : {ANY_OP}, !transform.param<i64>\n'
    )  # fmt: skip
    for member in sorted(plan.group, reverse=True):
        text += (
            f"    transform.apply_cse to %rows{i} : {ANY_OP}\n"
            f"    %m{member} = transform.structured.match attributes{{{attr} = {member} : i64}} "
            f"in %root : ({ANY_OP}) -> {ANY_OP}\n"
            f"    %fused{member}, %rows{i}_{member} = transform.structured.fuse_into_containing_op "
            f"%m{member} into %rows{i} : ({ANY_OP}, {ANY_OP}) -> ({ANY_OP}, {ANY_OP})\n"
        )
    for member in sorted(plan.group):
        if plans[member].lanes:
            text += reduction_body(plans[member], f"%fused{member}", shapes[member])
    steps = shapes[i][1]
    lanes = [1 if d == loops - 2 else 0 for d in range(loops)]
    text += (
        f"    %pwt{i}, %pwthreads{i} = "
        + transform_call("tile_using_forall", f"%pw{i}",
                 f"tile_sizes {lanes} (mapping = [#gpu.thread<x>])", 2)
        + "\n"
    )  # fmt: skip
    text += thread_steps(f"{i}p", f"%pwt{i}", f"%pwthreads{i}", plan.block_tile, steps, loops - 3)
    # The grouped ops' originals are left unused outside the block: erase them.
    return text + (
        f"    transform.apply_patterns to %rows{i} {{\n"
        "      transform.apply_patterns.canonicalization\n"
        f"    }} : {ANY_OP}\n"
        f'    %func{i} = transform.structured.match ops{{["func.func"]}} in %root '
        f": ({ANY_OP}) -> {ANY_OP}\n"
        f"    transform.apply_dce to %func{i} : {ANY_OP}\n"
    )
