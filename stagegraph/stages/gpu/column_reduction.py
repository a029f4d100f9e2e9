"""Split column reductions: a reduction over a non-innermost dim gets more threads.

A sum over dim 1 of a (32, 4096, 1024) tensor has 32x1024 outputs: one thread each
(:func:`~stagegraph.stages.gpu.params.plan_op`, thread x along the contiguous columns,
coalesced) is 32768 threads, an eighth of what an H100 keeps in flight, each walking 4096
rows with its accumulator in memory. Here the reduction loop K is split S ways first
(``transform.structured.split_reduction``): S partial results per output, each computed
by its own thread over K/S rows with the accumulator in a register
(:func:`~stagegraph.stages.gpu.reduction.thread_steps`); a second kernel combines the S
partials per output (a small tensor: S times the output). S is the smallest divisor of K
that gives the GPU enough threads to fill it (the target's SMs times its threads per SM).
"""

from __future__ import annotations

import math

from stagegraph.stages.analysis import OpFacts
from stagegraph.stages.gpu.kernel_plan import KernelPlan
from stagegraph.stages.gpu.reduction import ANY_OP, partial_reducible, thread_steps, transform_call
from stagegraph.stages.gpu.simt_plan import block_mapping, plan_op, thread_mapping

#: The fewest rows each thread of a split walks (below that the split costs more than
#: the partials' round trip through memory saves).
MIN_ROWS = 16


def column_split(outputs: int, length: int, threads_in_flight: int) -> int:
    """S: the smallest divisor of ``length`` that gives ``outputs * S`` threads at least
    ``threads_in_flight``, else the largest, leaving each thread at least
    :data:`MIN_ROWS` rows; 1 when the outputs alone are enough threads, or no split
    leaves that many rows."""
    if outputs >= threads_in_flight:
        return 1
    splits = [s for s in range(2, length // MIN_ROWS + 1) if length % s == 0]
    enough = [s for s in splits if outputs * s >= threads_in_flight]
    return enough[0] if enough else max(splits, default=1)


def plan_column_reduction(
    op: OpFacts, sm_count: int, threads_per_sm: int, threads_per_block: int
) -> KernelPlan | None:
    """A split plan for a reduction over one loop that is not the innermost dim of what
    it reads, whose outputs are too few to fill the GPU; None where it does not apply.
    The tiles are those :func:`~stagegraph.stages.gpu.params.plan_op` gives the split op
    (the output's loops with S inserted before the innermost one, then K / S)."""
    kinds, ranges = op.iterator_types, op.loop_ranges
    reductions = [d for d, kind in enumerate(kinds) if kind == "reduction"]
    if not partial_reducible(op) or len(reductions) != 1:
        return None
    (loop,) = reductions
    out = op.operand_dims[-1]
    if not out or list(out) != sorted(out) or loop < len(out) - 1:
        return None  # split_reduction inserts S at one position in the loops and the output
    if any(loop in dims and dims[-1] != out[-1] for dims in op.operand_dims[:-1]):
        return None  # a row (innermost) reduction, or inputs not contiguous along the output
    outputs = math.prod(ranges[d] for d in out)
    split = column_split(outputs, ranges[loop], sm_count * threads_per_sm)
    if split == 1:
        return None
    insert = len(out) - 1  # S goes before the innermost output dim, in loops and output
    split_ranges, split_kinds = list(ranges), list(kinds)
    split_ranges[loop] //= split
    split_ranges.insert(insert, split)
    split_kinds.insert(insert, "parallel")
    shape = OpFacts(index=op.index, name=op.name, op_class="reduction",
                    iterator_types=tuple(split_kinds), loop_ranges=tuple(split_ranges))  # fmt: skip
    plan = plan_op(shape, threads_per_block)
    loops = (insert, loop + 1, split_ranges[loop + 1])
    return plan.model_copy(update={"split": split, "split_loops": loops})


def column_script(plan: KernelPlan, attr: str) -> str:
    """The transform ops for a split plan (op ``plan.op`` tagged by ``attr``): split the
    reduction, then tile the partials' fill, the split op and the combining op each to
    block and thread foralls (three kernels, each block forall tagged with the op's
    index for its launch's block dims); the split op's threads step their rows with the
    accumulator in a register."""
    i = plan.op
    insert, rows, steps = plan.split_loops
    blocks, threads = list(plan.block_tile), list(plan.thread_tile)
    text = (
        f"    %op{i} = transform.structured.match attributes{{{attr} = {i} : i64}} in %root "
        f": ({ANY_OP}) -> {ANY_OP}\n"
        f"    %init{i}, %pfill{i}, %psplit{i}, %pcomb{i} = "
        + transform_call("split_reduction", f"%op{i}",
                 f"{{split_factor = {plan.split}, insert_split_dimension = {insert}}}")
        + f"\n    %index{i} = transform.param.constant {i} : i64 -> !transform.param<i64>\n"
    )  # fmt: skip
    # The partials' loops (the fill's, the combining op's): the split op's but K / S.
    partial = ([t for d, t in enumerate(blocks) if d != rows],
               [t for d, t in enumerate(threads) if d != rows])  # fmt: skip
    combine = ([*partial[0]], [*partial[1]])
    combine[0][insert], combine[1][insert] = 0, 0  # S: the combining op's reduction
    kernels = (("pfill", *partial), ("psplit", blocks, threads), ("pcomb", *combine))
    for name, block, thread in kernels:
        handle = f"%{name}{i}"
        block_map = ", ".join(block_mapping(tuple(block)))
        thread_map = ", ".join(thread_mapping(tuple(thread)))
        text += (
            f"    {handle}_b, {handle}_blocks = "
            + transform_call("tile_using_forall", handle,
                     f"tile_sizes {block} (mapping = [{block_map}])", 2)
            + f'\n    transform.annotate {handle}_blocks "{attr}" = %index{i} '
            f": {ANY_OP}, !transform.param<i64>\n"
            f"    {handle}_t, {handle}_threads = "
            + transform_call("tile_using_forall", f"{handle}_b",
                     f"tile_sizes {thread} (mapping = [{thread_map}])", 2)
            + "\n"
        )  # fmt: skip
    return text + thread_steps(f"{i}c", f"%psplit{i}_t", f"%psplit{i}_threads",
                               tuple(blocks), steps, rows)  # fmt: skip
