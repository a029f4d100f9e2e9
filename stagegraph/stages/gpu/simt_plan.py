"""The SIMT mapping of one op, and the mapping attributes a schedule writes for it.

A leaf of the GPU cost model (it imports no other stage module but the plan's record), so
that the model (:mod:`stagegraph.stages.gpu.params`), the schedule and the special plans
built on the plain one (:mod:`stagegraph.stages.gpu.column_reduction`, the host leftovers of
:mod:`stagegraph.stages.gpu.lower`) share it without import cycles.
"""

from __future__ import annotations

from stagegraph.stages.analysis import OpFacts
from stagegraph.stages.gpu.kernel_plan import KernelPlan

_THREAD_DIMS = ("x", "y", "z")


def largest_divisor(n: int, limit: int) -> int:
    """The largest divisor of ``n`` not above ``limit`` (at least 1)."""
    for d in range(min(n, limit), 0, -1):
        if n % d == 0:
            return d
    return 1


#: Bytes one thread loads at once: a 16-byte vector (``ld.global.v4.f32``).
VECTOR_BYTES = 16


def vector_width(op: OpFacts) -> int:
    """Elements per thread for a pointwise op whose every operand's rows split into whole
    16-byte vectors (4-byte elements, innermost dims a multiple of 4), else 1."""
    from stagegraph.dtypes import byte_size

    values = (*op.inputs, *op.outputs)
    sizes = {byte_size(v.dtype, default=0) for v in values if v.shape}
    if "reduction" in op.iterator_types or not op.loop_ranges or sizes != {4}:
        return 1
    lanes = VECTOR_BYTES // 4
    if op.loop_ranges[-1] % lanes or any(v.shape[-1] % lanes for v in values if v.shape):
        return 1
    return lanes


def plan_op(op: OpFacts, threads_per_block: int, vector: int = 1) -> KernelPlan:
    """Map one op: thread x on its innermost parallel loop (``vector`` elements each, when
    that loop is the innermost one), thread y on the next one while the block has room,
    blocks on the rest."""
    ranges = op.loop_ranges
    parallel = [
        i for i, (kind, n) in enumerate(zip(op.iterator_types, ranges, strict=False))
        if kind == "parallel" and n > 1
    ]  # fmt: skip
    block = [0] * len(ranges)
    thread = [0] * len(ranges)
    spans: list[int] = []
    budget = threads_per_block
    if not parallel or parallel[-1] != len(ranges) - 1:
        vector = 1
    for dim in reversed(parallel[-2:]):
        width = vector if not spans else 1
        count = largest_divisor(ranges[dim] // width, budget)
        if count == 1 and spans:
            break
        spans.append(count)
        budget //= count
        block[dim] = count * width  # a whole loop in one block still makes a (unit) block dim
        thread[dim] = width
    for dim in parallel[: len(parallel) - len(spans)]:
        block[dim] = 1
    return KernelPlan(
        op=op.index,
        name=op.name,
        block_tile=tuple(block),
        thread_tile=tuple(thread),
        threads=tuple(spans),
        vector=vector if parallel else 1,
    )


def block_mapping(tiles: tuple[int, ...]) -> list[str]:
    """``#gpu.block<linear_dim_N>`` per tiled loop, linear dim 0 on the innermost."""
    tiled = [i for i, t in enumerate(tiles) if t]
    return [f"#gpu.block<linear_dim_{len(tiled) - 1 - k}>" for k in range(len(tiled))]


def thread_mapping(tiles: tuple[int, ...]) -> list[str]:
    """``#gpu.thread<x>`` on the innermost tiled loop, ``y`` (then ``z``) outward."""
    tiled = [i for i, t in enumerate(tiles) if t]
    return [f"#gpu.thread<{_THREAD_DIMS[len(tiled) - 1 - k]}>" for k in range(len(tiled))]
