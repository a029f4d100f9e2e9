"""Reductions to a scalar (losses, a Frobenius norm): blocks of threads share the input.

Without parallel loops an op has no rows to give blocks, and ran as host work in a kernel
of one thread. Here its contiguous input (every loop a reduction, all contiguous in loop
order) is split into (B, J, L, V) loops: B blocks (``tile_reduction_using_forall`` mapped
to blocks) each reduce their part as one cooperative row
(:func:`~stagegraph.stages.gpu.reduction.reduction_body`: L threads, V-element vectors, J
steps each) into a partial result in memory; the B partials are then combined by the
remaining host work (one thread, B values).
"""

from __future__ import annotations

import math

from stagegraph.stages.analysis import OpFacts
from stagegraph.stages.gpu.kernel_plan import KernelPlan
from stagegraph.stages.gpu.reduction import (
    ANY_OP,
    VECTOR_BYTES,
    _element_bytes,
    partial_reducible,
    reduction_body,
    row_loops,
    row_split,
    transform_call,
)

#: Blocks per SM a reduction to a scalar spreads over (partials: B = this x SMs at most).
BLOCKS_PER_SM = 2


def plan_full_reduction(
    op: OpFacts, warp: int, threads_per_block: int, sm_count: int
) -> KernelPlan | None:
    """A plan of B blocks of ``lanes`` threads for a reduction to a scalar over contiguous
    input whose length splits into whole warps of vectors; None where it does not apply.
    ``split`` is B; the tiles name the (1, B, J, L, V) loops
    (:func:`~stagegraph.stages.gpu.reduction.expand_reduction_loops`: a unit row first)."""
    kinds = op.iterator_types
    if not partial_reducible(op) or any(k != "reduction" for k in kinds):
        return None
    if row_loops(kinds, op.operand_dims) != 0:
        return None
    length = math.prod(op.loop_ranges)
    sliced = "tensor.extract_slice" in op.producers
    split = row_split(length, VECTOR_BYTES if sliced else _element_bytes(op), warp,
                      threads_per_block)  # fmt: skip
    if split is None:
        return None
    lanes, vector = split
    chunks = length // (lanes * vector)
    blocks = max(d for d in range(1, min(chunks, BLOCKS_PER_SM * sm_count) + 1) if chunks % d == 0)
    return KernelPlan(op=op.index, name=op.name, block_tile=(0, 1, 0, 0, 0), threads=(lanes,),
                      vector=vector, lanes=lanes, merge=warp if lanes > warp else 0,
                      split=blocks)  # fmt: skip


def is_full(plan: KernelPlan) -> bool:
    """Whether ``plan`` is :func:`plan_full_reduction`'s (lanes and blocks)."""
    return bool(plan.lanes and plan.split)


def full_reduction_script(plan: KernelPlan, attr: str, shape: tuple[int, ...]) -> str:
    """The transform ops for a reduction to a scalar (op ``plan.op`` tagged by ``attr``,
    reshaped to (B, J, L, V) loops): B partials over blocks (their fill fused into each
    block), each block's part as a cooperative row; the combining op stays host work."""
    i = plan.op
    text = (
        f"    %op{i} = transform.structured.match attributes{{{attr} = {i} : i64}} in %root "
        f": ({ANY_OP}) -> {ANY_OP}\n"
        f"    %bfill{i}, %bpart{i}, %bcomb{i}, %blocks{i} = "
        + transform_call("tile_reduction_using_forall", f"%op{i}",
                         f"reduction_dims = [1] by num_threads = [0, {plan.split}, 0, 0, 0] "
                         "tile_sizes = [] mapping = [#gpu.block<linear_dim_0>]")
        + f"\n    %index{i} = transform.param.constant {i} : i64 -> !transform.param<i64>\n"
        f'    transform.annotate %blocks{i} "{attr}" = %index{i} '
        f": {ANY_OP}, !transform.param<i64>\n"
        f"    %bffill{i}, %blocks{i}_f = transform.structured.fuse_into_containing_op "
        f"%bfill{i} into %blocks{i} : ({ANY_OP}, {ANY_OP}) -> ({ANY_OP}, {ANY_OP})\n"
    )  # fmt: skip
    text += reduction_body(plan, f"%bpart{i}", shape)
    return text + (
        f"    transform.apply_patterns to %blocks{i}_f {{\n"
        "      transform.apply_patterns.canonicalization\n"
        f"    }} : {ANY_OP}\n"
    )
