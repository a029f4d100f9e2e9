"""Attention tiled over (batch, query rows): the score matrix stays in cache.

After ``x86.normalize`` an attention layer is ``S = Q @ K^T`` (a ``linalg.batch_matmul`` or
``linalg.matmul`` into a ``[B, M, N]`` score tensor), a row-wise softmax (a max reduction
over the keys, subtract, exp, a sum reduction, divide; optionally a scale, a mask or a
bias) as separate ``linalg.generic`` ops, then ``P @ V``. KernelBench's VisionAttention
(8 batch-heads x 1024 x 1024 scores, head dim 8) writes and reads its 32 MB score tensor
about ten times: memory-bound at 7% of the FMA peak, slower than PyTorch.

Every op of that chain keeps the batch and query-row dims of the scores (the reductions
run over the keys only), so the whole chain can run block by block: an ``scf.forall`` over
(batch, blocks of ``R`` query rows) whose body is the same ops on slices (the QK^T of
``R`` rows, their softmax, their ``P @ V``), each block's scores (``R`` x keys) in L2.
This module finds such chains by walking the ops and reading their indexing maps and
iterator types, chooses ``R`` from the target's L2 (:func:`row_block`; off where the
whole score tensor already fits) and builds the loop with upstream transforms:
``transform.structured.tile_using_forall`` on ``P @ V`` and
``transform.structured.fuse_into_containing_op`` of the softmax ops, the QK^T matmul and
their fills, in that order. The x86 schedule then treats the ops in the loop like any
others (the packed matmul kernels for the two small matmuls, the row chains and the
polynomial ``exp`` for the softmax).

The chain must be a softmax (a reduction along the rows and an ``exp``): a Linear ->
LayerNorm -> Linear chain has the same shape, but its matmuls read weights that every
block would pack again. A chain whose scores or intermediate results have a user outside
it (a softmax whose result is also returned, attention weights that are averaged) is
left alone: its scores must reach memory anyway. So is a chain whose matmuls and softmax
meet through reshapes (``[batch * heads, ...]`` matmuls around ``[batch, heads, ...]``
softmax ops, as MinGPT's): not matched yet.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field

from stagegraph.core.ports import Config
from stagegraph.dtypes import byte_size
from stagegraph.stages.target import Target

#: The label on the chain's ``P @ V`` matmul that the tiling transform matches.
ROOT_ATTR = "stagegraph.attention_root"
#: The label (fusion order) on the ops fused into its loop.
FUSE_ATTR = "stagegraph.attention_fuse"
#: The label on each loop over (batch, row blocks): the schedule's ``prepare`` rewrites
#: its body like a function's (elementwise chains merged, the softmax one kernel per row).
LOOP_ATTR = "stagegraph.attention_blocks"
_CONTRACTIONS = ("linalg.batch_matmul", "linalg.matmul")
_INITS = ("linalg.fill", "tensor.empty")


class AttentionTiles(Config):
    """How ``x86.normalize`` tiles attention chains (:mod:`stagegraph.stages.x86.attention`).

    ``enabled``: off, every chain keeps its whole score tensor. ``row_block``: query rows
    per block, pinned (a tuner's or a user's choice; rounded down to a divisor of the rows
    so every block has the same static shape); None: the cost model's choice
    (:func:`row_block`). ``l2_fraction``: the share of L2 one block (its score rows and
    its rows of Q and of the output) may take. ``min_rows`` and ``rows_per_width``: a
    block has at least ``max(min_rows, rows_per_width * (d + e))`` rows (``d``, ``e``:
    the widths of Q's and V's rows): each block's two small matmuls pack K and V again
    (``keys * (d + e)`` copies against ``rows * keys * (d + e)`` FMAs), and fewer rows
    than the micro-kernel's register block run below its speed. Measured on a 2 MB-L2
    Xeon (docs/measurements.md): head dim 8, 1024 keys: 32 rows best (16: 8% slower,
    128: 5%); head dim 64, 4096 keys: 128-256 rows (64: 13% slower, 16: 23%), past L2."""

    enabled: bool = True
    row_block: int | None = Field(None, ge=1)
    l2_fraction: float = Field(0.125, gt=0.0, le=8.0)
    min_rows: int = Field(32, ge=1)
    rows_per_width: float = Field(1.0, ge=0.0)


@dataclass
class AttentionChain:
    """One ``S = Q K^T -> row-wise ops -> S' V`` chain: ``last`` the ``P @ V`` matmul,
    ``first`` the ``Q K^T`` one, ``between`` the row-wise generics (program order),
    ``inits`` the fills and empties only they use, ``reshapes`` the expand of the scores
    and the collapse of the probabilities where the matmuls merge batch dims the softmax
    keeps apart (``[batch * heads, ...]`` against ``[batch, heads, ...]``); the scores'
    shape as the softmax sees it, ``[batch..., rows, keys]``, and the widths of Q's and
    V's rows."""

    last: Any
    first: Any
    between: list[Any] = field(default_factory=list)
    inits: list[Any] = field(default_factory=list)
    reshapes: list[Any] = field(default_factory=list)
    scores: tuple[int, ...] = ()
    depth: int = 0
    width: int = 0
    element_bytes: int = 4

    @property
    def rows(self) -> int:
        return self.scores[-2]

    @property
    def keys(self) -> int:
        return self.scores[-1]

    @property
    def batch(self) -> int:
        return math.prod(self.scores[:-2])


def _shape(value: Any) -> tuple[int, ...] | None:
    from stagegraph.mlir.bindings import ir

    if not isinstance(value.type, ir.RankedTensorType):
        return None
    shape = ir.RankedTensorType(value.type)
    return None if not shape.has_static_shape else tuple(shape.shape)


def _producer(value: Any) -> Any:
    """The op defining ``value``, or None for a block argument."""
    from stagegraph.mlir.walk import defining_op

    return defining_op(value)


def _users(op: Any) -> list[Any]:
    return [use.owner.operation for result in op.results for use in result.uses]


def _row_wise(op: Any, rank: int) -> bool:
    """A generic over the scores' loops whose only reduction is the last (keys) loop and
    whose results keep the batch and row loops as their leading dims: tiled over those
    loops it computes each block from that block's rows alone."""
    from stagegraph.stages.analysis.ops import op_facts

    if op.name != "linalg.generic":
        return False
    facts = op_facts(op, 0, "attention chain", None)
    kinds = facts.iterator_types
    if len(kinds) != rank or any(kind != "parallel" for kind in kinds[:-1]):
        return False
    leading = tuple(range(rank - 1))
    outputs = facts.operand_dims[len(facts.inputs) :]
    return all(tuple(dims[: rank - 1]) == leading for dims in outputs)


def _in_rows(op: Any, scores: tuple[int, ...]) -> bool:
    """``op`` is a row-wise generic over the scores' batch and row dims."""
    rank = len(scores)
    if not _row_wise(op, rank):
        return False
    shape = _shape(op.results[0])
    return shape is not None and shape[: rank - 1] == scores[:-1]


def _reads_rows(op: Any, operand: int, rank: int) -> bool:
    """``op`` reads its operand ``operand`` with the batch and row loops leading."""
    from stagegraph.stages.analysis.ops import op_facts

    dims = op_facts(op, 0, "attention chain", None).operand_dims[operand]
    return tuple(dims[: rank - 1]) == tuple(range(rank - 1))


def _inputs_and_inits(op: Any) -> tuple[list[Any], list[Any]]:
    from stagegraph.stages.analysis.ops import op_facts

    n_inputs = len(op_facts(op, 0, "attention chain", None).inputs)
    operands = list(op.operands)
    return operands[:n_inputs], operands[n_inputs:]


def _merged_batch(collapsed: tuple[int, ...] | None, whole: tuple[int, ...] | None) -> bool:
    """``collapsed`` is ``whole`` with its batch dims merged into one (the rows and keys
    kept): the only reassociation that gives these shapes keeps the element order."""
    return (
        collapsed is not None
        and whole is not None
        and len(collapsed) == 3
        and len(whole) > 3
        and collapsed[1:] == whole[-2:]
        and collapsed[0] == math.prod(whole[:-2])
    )


def _scores_source(last: Any) -> tuple[Any, list[Any]]:
    """The value the softmax hands ``last`` (its first operand, or the source of the
    ``tensor.collapse_shape`` that merges its batch dims) and that reshape."""
    value = last.operands[0]
    producer = _producer(value)
    if producer is not None and producer.name == "tensor.collapse_shape":
        source = producer.operands[0]
        if _merged_batch(_shape(value), _shape(source)):
            return source, [producer]
    return value, []


def _scores_producer(value: Any, scores: tuple[int, ...], merged: Any) -> tuple[Any, Any]:
    """(the contraction, the expand between it and the softmax or None) when ``value``
    is the QK^T product the chain reads, else (None, None)."""
    producer = _producer(value)
    if producer is None or _shape(value) != scores:
        return None, None
    if producer.name in _CONTRACTIONS:
        return producer, None
    if producer.name == "tensor.expand_shape":
        source = _producer(producer.operands[0])
        if (
            source is not None
            and source.name in _CONTRACTIONS
            and _shape(source.results[0]) == merged
        ):
            return source, producer
    return None, None


def match_chain(last: Any) -> AttentionChain | None:
    """The attention chain ending in the contraction ``last`` (its first operand the
    softmax's result), or None when ``last`` ends none that tiling may take apart."""
    lhs = _shape(last.operands[0])
    value, reshapes = _scores_source(last)
    scores, start = _shape(value), _producer(value)
    if lhs is None or scores is None or start is None or len(lhs) not in (2, 3):
        return None
    if len(lhs) == 3 and last.name != "linalg.batch_matmul":
        return None
    rank = len(scores)
    between: list[Any] = []
    first = None
    pending = [start]
    while pending:
        op = pending.pop()
        if op in between:
            continue
        if not _in_rows(op, scores):
            return None
        between.append(op)
        inputs, _ = _inputs_and_inits(op)
        for k, input_value in enumerate(inputs):
            producer = _producer(input_value)
            contraction, expand = _scores_producer(input_value, scores, lhs)
            if contraction is not None:
                if first is not None and first != contraction:
                    return None
                first = contraction
                if expand is not None and expand not in reshapes:
                    reshapes.append(expand)
            elif producer is not None and _in_rows(producer, scores):
                pending.append(producer)
            else:
                continue  # a mask or bias: read through the block's slice
            if not _reads_rows(op, k, rank):
                return None
    if first is None or not _is_softmax(between):
        return None
    return _closed_chain(last, first, between, reshapes, scores)


def _is_softmax(between: list[Any]) -> bool:
    """A softmax: a reduction along the rows and an ``exp`` (a Linear -> LayerNorm ->
    Linear chain has the first, not the second, and its matmuls read weights that each
    block would pack again)."""
    from stagegraph.mlir.walk import contains
    from stagegraph.stages.analysis.ops import op_facts

    reduces = any(
        op_facts(op, 0, "attention chain", None).iterator_types[-1] == "reduction" for op in between
    )
    return reduces and any(contains(op, "math.exp") for op in between)


def _closed_chain(
    last: Any, first: Any, between: list[Any], reshapes: list[Any], scores: tuple[int, ...]
) -> AttentionChain | None:
    """The chain when nothing outside it uses the scores or any intermediate (their full
    tensors would have to be written then), else None."""
    from stagegraph.mlir.types import element_name

    members = {first, *between, *reshapes, last}
    for op in [first, *between, *reshapes]:
        if any(user not in members for user in _users(op)):
            return None
    order = {op: k for k, op in enumerate(_block_ops(last))}
    if any(op not in order for op in members):
        return None  # not all in one block: no single loop can hold them
    between.sort(key=order.__getitem__)
    inits: list[Any] = []
    for op in [first, *between]:
        for value in _inputs_and_inits(op)[1]:
            init = _producer(value)
            if (
                init is not None
                and init.name in _INITS
                and init not in inits
                and all(user in members for user in _users(init))
            ):
                inits.append(init)
    q_shape, v_shape = _shape(first.operands[0]), _shape(last.operands[1])
    element = element_name(first.results[0].type.element_type) or "f32"
    if q_shape is None or v_shape is None:
        return None
    return AttentionChain(
        last=last,
        first=first,
        between=between,
        inits=inits,
        reshapes=reshapes,
        scores=scores,
        depth=q_shape[-1],
        width=v_shape[-1],
        element_bytes=byte_size(element, 4),
    )


def _block_ops(op: Any) -> list[Any]:
    block = op.operation.block
    return [child.operation for child in block.operations]


def find_chains(module: Any) -> list[AttentionChain]:
    """Every attention chain of ``module``'s functions, in program order."""
    from stagegraph.mlir.walk import collect

    found = []
    for op in collect(module.operation, _CONTRACTIONS):
        chain = match_chain(op.operation)
        if chain is not None:
            found.append(chain)
    return found


def block_loops(fn: Any) -> list[Any]:
    """The loops over (batch, row blocks) that :func:`tile_attention` made in ``fn``."""
    from stagegraph.mlir.walk import collect

    return collect(fn, lambda op: op.name == "scf.forall" and LOOP_ATTR in op.attributes)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def row_block(chain: AttentionChain, target: Target, config: AttentionTiles) -> int | None:
    """Query rows per block, or None to keep the chain whole.

    None when tiling is off or the whole score tensor (all batches) fits
    ``l2_fraction`` of L2: it makes no pass over memory then. Else the largest divisor of
    the rows whose block (``R`` score rows, ``R`` rows of Q and of the output) fits that
    share among those of at least ``max(min_rows, rows_per_width * (d + e))`` rows, or
    the smallest of those when none fits (L3 holds the block then); a pinned
    ``row_block`` is rounded down to a divisor. A block of all rows (one batch element at
    a time) is None for an unbatched chain."""
    if not config.enabled:
        return None
    bytes_ = chain.element_bytes
    budget = target.l2_bytes * config.l2_fraction
    if config.row_block is not None:
        chosen = max(d for d in _divisors(chain.rows) if d <= config.row_block)
    else:
        if chain.batch * chain.rows * chain.keys * bytes_ <= budget:
            return None
        per_row = (chain.keys + chain.depth + chain.width) * bytes_
        least = max(config.min_rows, math.ceil(config.rows_per_width * (chain.depth + chain.width)))
        wide = [d for d in _divisors(chain.rows) if d >= min(chain.rows, least)]
        fitting = [d for d in wide if d * per_row <= budget]
        chosen = max(fitting) if fitting else min(wide)
    if chosen == chain.rows and chain.batch == 1:
        return None
    return chosen


def tile_attention(module: Any, target: Target | None, config: AttentionTiles) -> int:
    """Tile every attention chain of ``module`` (an ``ir.Module``) whose :func:`row_block`
    is not None into a loop over (batch, row blocks); returns how many such loops the
    module then has."""
    from stagegraph.mlir.walk import nested_in
    from stagegraph.stages.target import detect_target

    if not config.enabled:
        return 0
    target = target or detect_target()
    tiled = 0
    while True:  # found again after each tiling: its clean-up may have rewritten any op
        loops = block_loops(module.operation)
        chosen = [
            (chain, rows)
            for chain in find_chains(module)
            if not nested_in(chain.last, set(loops))
            and (rows := row_block(chain, target, config)) is not None
        ]
        if not chosen:
            return tiled
        _apply_tiling(module, *chosen[0])
        if len(block_loops(module.operation)) == len(loops):
            return tiled  # the tiling failed (and left the IR valid): stop here
        tiled += 1


def _apply_tiling(module: Any, chain: AttentionChain, rows: int) -> None:
    """Label the chain's ops, tile ``P @ V`` into an ``scf.forall`` over (batch, row
    blocks) and fuse the rest into it, consumers first, with the transform interpreter."""
    from stagegraph.mlir.bindings import dialect, ir, transform
    from stagegraph.mlir.walk import strip_attributes
    from stagegraph.stages.common.transform import apply_schedule_module, new_schedule
    from stagegraph.stages.common.transform_build import apply_patterns

    ttensor = dialect("transform.tensor")
    i64 = ir.IntegerType.get_signless(64)
    chain.last.attributes[ROOT_ATTR] = ir.UnitAttr.get()
    fused = [*reversed(chain.between), chain.first, *chain.inits]
    for k, op in enumerate(fused):
        op.attributes[FUSE_ATTR] = ir.IntegerAttr.get(i64, k)
    sizes = [1, rows, 0, 0] if chain.last.name == "linalg.batch_matmul" else [rows, 0, 0]
    schedule, sequence = new_schedule()
    with ir.InsertionPoint(sequence.body):
        # A fusion that fails (a chain this module's matcher misjudged) leaves the ops not
        # yet fused outside the loop, which then reads their whole results: still correct.
        mode = transform.FailurePropagationMode.Suppress
        tiling = transform.SequenceOp(mode, [], sequence.bodyTarget)
        with ir.InsertionPoint(tiling.body):
            _tile_and_fuse(tiling.bodyTarget, chain, sizes, len(fused))
            transform.YieldOp([])
        apply_patterns(
            sequence.bodyTarget,
            ttensor.ApplyFoldTensorEmptyPatternsOp,
            transform.ApplyCanonicalizationPatternsOp,
        )
        transform.YieldOp([])
    apply_schedule_module(module, schedule)
    strip_attributes(module.operation, ROOT_ATTR, FUSE_ATTR)


def _tile_and_fuse(root: Any, chain: AttentionChain, sizes: list[int], fused: int) -> None:
    """The transform ops: tile the op labelled ``ROOT_ATTR`` by ``sizes`` into an
    ``scf.forall``, fuse the ``fused`` ops labelled ``FUSE_ATTR`` in their order, label
    the loop ``LOOP_ATTR``."""
    from stagegraph.mlir.bindings import dialect, ir, structured, transform
    from stagegraph.stages.common.transform_build import any_op, apply_patterns

    ttensor = dialect("transform.tensor")
    i64 = ir.IntegerType.get_signless(64)
    last = structured.MatchOp(any_op(), root, op_attrs={ROOT_ATTR: ir.UnitAttr.get()})
    made = structured.TileUsingForallOp(any_op(), any_op(), last.result, tile_sizes=sizes)
    loop = made.results[1]
    # A block's slice of a reshaped tensor becomes the reshape of a slice, which the next
    # producer (the softmax's last op, the QK^T matmul) fuses into.
    bubble = (ttensor.ApplyBubbleUpExtractSlicePatternsOp,)
    if chain.reshapes:
        apply_patterns(loop, *bubble)
    for k in range(fused):
        attrs = {FUSE_ATTR: ir.IntegerAttr.get(i64, k)}
        producer = structured.MatchOp(any_op(), root, op_attrs=attrs).result
        loop = structured.FuseIntoContainingOp(any_op(), any_op(), producer, loop).results[1]
        # Two users of one producer read the same slice: one slice, so one tile of it.
        transform.ApplyCommonSubexpressionEliminationOp(loop)
        if chain.reshapes:
            apply_patterns(loop, *bubble)
    transform.AnnotateOp(loop, LOOP_ATTR)
