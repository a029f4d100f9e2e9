"""Parameters of the generic (non-matmul) x86 schedule and the heuristic that picks them.

:class:`GenericParams` holds per-class knobs (how many elements a vectorized tile may hold,
how wide the innermost tile is, how many rows a reduction tile takes, convolution tiling,
whether elementwise producers are fused into their consumer's tile loop).
:func:`heuristic_generic_params` computes them from the payload facts and the target:
vector lanes from ``target.vector_bits``, tile budgets from the L1 cache. Per-op tile sizes
are derived from these knobs and each op's loop ranges by :func:`tile_sizes_for` and
friends (divisors of the ranges, so every tile is static and vectorizes without masks).
"""

from __future__ import annotations

import math

from pydantic import Field

from stagegraph.core.ports import Params
from stagegraph.core.tunable import Choice, declare_space
from stagegraph.dtypes import byte_size
from stagegraph.stages.analysis import OpFacts, PayloadFacts
from stagegraph.stages.target import Target

_REGISTERS = 16  # architectural vector registers on x86-64 (zmm0-15 usable without EVEX hi)


class GenericParams(Params):
    """Knobs of the generic schedule (sizes in elements unless named otherwise)."""

    lanes: int = Field(8, ge=1, description="vector lanes of the widest element type")
    inner_tile: int = Field(64, ge=1, description="target innermost tile of elementwise ops")
    tile_elements: int = Field(1024, ge=1, description="max elements of one vectorized tile")
    reduction_rows: int = Field(
        8, ge=1, description="innermost parallel points per tile of an outer-dim reduction"
    )
    reduction_chunk: int = Field(1024, ge=1, description="max reduction elements per tile")
    fuse_elementwise: bool = Field(True, description="fuse single-use elementwise producers")
    vectorize_elementwise: bool = True
    vectorize_reductions: bool = True
    vectorize_convolutions: bool = True
    vectorize_pooling: bool = True
    conv_width_tile: int = Field(8, ge=1, description="output-width tile of 1-D convolutions")
    conv_channel_tile: int = Field(8, ge=1, description="output-channel tile of convolutions")
    conv_reduction_tile: int = Field(8, ge=1, description="input-channel tile of convolutions")
    conv_whole_channels: int = Field(
        16,
        ge=0,
        description="a channels-last convolution with at most this many input channels "
        "takes them all per reduction step (0: conv_reduction_tile's steps)",
    )
    conv_batch_tile: int = Field(
        1, ge=1, description="innermost batch-dim tile of convolutions (a pooling's channels)"
    )
    conv_hoist_accumulators: bool = Field(
        True,
        description="keep a convolution tile's accumulators in registers across its "
        "reduction loops (generic/conv_accumulators.py)",
    )
    pool_batch_tile: int = Field(
        1, ge=1, description="innermost batch-dim tile of poolings (NCHW: the channels)"
    )
    pool_width_vectors: bool = Field(
        True, description="vectorize unit-stride NCHW poolings along the output width"
    )
    conv_drop_unit_dims: bool = Field(
        False, description="drop unit dims of a convolution tile's vectors before lowering"
    )
    conv_channels_last: bool = Field(
        True, description="rewrite NCHW convolutions channels-last (contiguous vectors)"
    )
    conv_chain_channels_last: bool = Field(
        True,
        description="carry channels-last from a convolution to the next: the transposes "
        "between them sink past the ops in between and cancel (generic/layout_sinking.py)",
    )
    conv_nhwc_channel_tile: int = Field(
        16, ge=1, description="output-channel tile of channels-last convolutions (vector dim)"
    )
    conv_nhwc_width_tile: int = Field(
        4, ge=1, description="output-width tile of channels-last convolutions at that tile"
    )
    conv_nhwc_window_tile: int = Field(
        1,
        ge=0,
        description="innermost window-dim tile of channels-last convolutions "
        "(0: the whole window row per reduction step)",
    )
    vector_registers: int = Field(
        16, ge=8, le=64, description="architectural vector registers (bounds register tiles)"
    )
    conv_grouped_width: bool = Field(
        True,
        description="depthwise/grouped NCHW convolutions as direct kernels along the width",
    )
    reduction_whole_tail: bool = Field(
        True, description="a row whose chunks end in a masked tail, within 2 chunks: whole"
    )
    conv3d_direct: bool = Field(
        True, description="3-D convolutions as one register-blocked channels-last kernel"
    )
    conv3d_accumulators: int = Field(
        0, ge=0, description="accumulators of that kernel's block at most (0: the registers')"
    )
    vector_bytes: int = Field(32, ge=4, description="bytes of the widest vector register")
    vector_fmas_per_cycle: int = Field(
        2, ge=1, description="vector FMAs one core issues per cycle at that width"
    )


def _element_bytes(facts: PayloadFacts, classes: frozenset[str] | None = None) -> int:
    """Bytes of the widest element type the non-matmul ops (of ``classes``, default all)
    touch; 0 when there is none, and f32 when unknown and no classes were asked for."""
    sizes = [
        byte_size(v.dtype, default=0)
        for op in facts.ops
        if op.op_class != "matmul" and (classes is None or op.op_class in classes)
        for v in op.inputs + op.outputs
    ]
    return max(sizes, default=0) or (0 if classes else 4)


_WINDOWED = frozenset({"convolution", "pooling"})


#: Pooling windows (of as many channels) per tile: independent work for the vector unit to
#: overlap (a convolution's batch is not tiled so: it only adds spills). Measured:
#: docs/measurements.md, "Design decisions: the generic schedule".
POOL_BATCH_TILE = 4


def heuristic_generic_params(facts: PayloadFacts, target: Target) -> GenericParams:
    """Knobs from the facts and the machine.

    * lanes = vector register bits / widest element bits;
    * an elementwise tile's innermost size aims at 4 registers (unrolled by 4), and a tile
      holds at most what half of L1 can keep for three operands, capped by the registers
      (so the fully unrolled vector code stays small);
    * reductions over outer dims take 4 registers of the innermost parallel dim per tile;
      the reduction is chunked so that a chunk fits the register file;
    * convolutions tile output channels and width by the lanes; poolings also take
      :data:`POOL_BATCH_TILE` windows of their batch (channel) dim per tile;
    * channels-last convolutions (whose output channels are the vector dim) are register
      blocked: two vectors of channels times a width whose accumulators fill half the
      register file (:func:`channels_last_conv_tiles`).
    """
    elem = _element_bytes(facts)
    lanes = max(1, target.vector_bits // (8 * elem))
    # Convolution tiles by the lanes of their own element type: an i64 argmax or an f64
    # normalization elsewhere in the payload must not halve an f32 convolution's tiles.
    conv_lanes = max(1, target.vector_bits // (8 * (_element_bytes(facts, _WINDOWED) or elem)))
    l1_elements = target.l1d_bytes // (2 * 3 * elem)  # half of L1, three operands
    register_elements = _REGISTERS * lanes * 4
    tile_elements = max(lanes, min(l1_elements, register_elements))
    return GenericParams(
        lanes=lanes,
        inner_tile=4 * lanes,
        tile_elements=tile_elements,
        reduction_rows=4 * lanes,
        reduction_chunk=max(lanes, min(l1_elements, _REGISTERS * lanes * 4)),
        conv_width_tile=conv_lanes,
        conv_channel_tile=max(1, conv_lanes // 2),
        conv_reduction_tile=max(1, conv_lanes // 2),
        conv_whole_channels=conv_lanes,
        pool_batch_tile=POOL_BATCH_TILE,
        vector_registers=target.vector_registers,
        vector_bytes=target.vector_bits // 8,
        vector_fmas_per_cycle=max(
            1, target.fma_lanes_per_cycle() // max(1, target.vector_bits // 32)
        ),
        **channels_last_conv_tiles(conv_lanes, target.vector_registers),
    )


#: Output-channel vectors per tile of a channels-last convolution: each broadcast input
#: element then feeds that many FMAs (one vector measured slower).
NHWC_CHANNEL_VECTORS = 2


def channels_last_conv_tiles(lanes: int, registers: int) -> dict[str, int]:
    """Register blocking of a channels-last convolution's tile: ``NHWC_CHANNEL_VECTORS``
    vectors of output channels times a width whose accumulators fill half of the target's
    ``registers`` (the rest holds filter vectors and broadcasts), one window tap per
    reduction step. Measured: docs/measurements.md, "Design decisions: the generic
    schedule", and "Channels-last convolutions tap by tap".

    The accumulators stay in registers across the reduction loops
    (:mod:`~stagegraph.stages.x86.generic.conv_accumulators`), so a step may be a single
    tap: it reads each input element once. Whole window rows per step made one long block
    in which LLVM kept an input element's broadcast for the row's later taps and spilled
    (a wider tile only spilled more: 8 columns on AVX-512 were slower that way, faster
    tap by tap)."""
    return {
        "conv_nhwc_channel_tile": NHWC_CHANNEL_VECTORS * lanes,
        "conv_nhwc_width_tile": max(1, registers // 2 // NHWC_CHANNEL_VECTORS),
        "conv_nhwc_window_tile": 1,
    }


# ----------------------------------------------------------------------------- per-op sizes


def largest_divisor_at_most(n: int, cap: int) -> int:
    """The largest divisor of ``n`` that is ``<= cap`` (1 when ``cap < 1``)."""
    cap = max(1, min(n, cap))
    for d in range(cap, 0, -1):
        if n % d == 0:
            return d
    return 1


def static_tile_size(extent: int, cap: int) -> int:
    """A divisor of ``extent`` near ``cap`` (static tiles, no masks): the largest one
    ``<= cap`` unless it is under half of ``min(extent, cap)``; then the smallest one up to
    ``2 * cap``, else the whole extent if it is at most ``3 * cap`` (a prime such as 17).

    A convolution's width tile is its count of independent accumulators: a width of 22
    tiled by 2, or 17 by 1, leaves the FMA pipes idle (measured: docs/measurements.md,
    "Design decisions: the generic schedule").
    """
    cap = max(1, cap)
    best = largest_divisor_at_most(extent, cap)
    if 2 * best >= min(extent, cap):
        return best
    larger = [d for d in range(cap + 1, 2 * cap + 1) if extent % d == 0]
    if larger:
        return larger[0]
    return extent if extent <= 3 * cap else best


def tile_size(extent: int, cap: int, partial: bool = True) -> int:
    """A static divisor of ``extent`` of at most ``cap`` when one is at least half as large
    as ``min(extent, cap)`` (no partial tiles); else ``min(extent, cap)``, whose last tile
    is partial and vectorized with masks (a prime extent would otherwise give 1-wide
    "vectors")."""
    want = max(1, min(extent, cap))
    divisor = largest_divisor_at_most(extent, want)
    return divisor if 2 * divisor >= want or not partial else want


def _fill(ranges: tuple[int, ...], dims: list[int], budget: int, partial: bool = True) -> list[int]:
    """Tile sizes (1 elsewhere): ``dims`` innermost first (see :func:`tile_size`), at most
    ``budget`` in all."""
    sizes = [1] * len(ranges)
    for d in dims:
        size = tile_size(ranges[d], budget, partial)
        sizes[d] = size
        budget = max(1, budget // size)
        if size < ranges[d]:
            break  # the next dim outwards is not contiguous with a partial tile
    return sizes


def tile_sizes_for(op: OpFacts, params: GenericParams) -> list[int]:
    """Tile sizes of an elementwise op: the innermost dim takes at most ``inner_tile``
    (:func:`tile_size`); when that is all of a short innermost dim, the outer dims take
    static divisors up to the rest of ``inner_tile``; every other dim takes 1.
    """
    ranges = op.loop_ranges
    # Named ops (fills, copies) keep static divisors: masked stores of a fill's partial
    # tiles made one payload's convolution run minutes instead of milliseconds.
    partial = op.name == "linalg.generic"
    sizes = _fill(ranges, [len(ranges) - 1], params.inner_tile, partial)
    if len(ranges) > 1 and sizes[-1] == ranges[-1] < params.inner_tile:
        # A short innermost dim (GroupNorm's [batch, groups, channels, 1] view) taken
        # whole: the tile grows outwards by static divisors, so one tile is not a handful
        # of elements (l2_037's f64 GroupNorm ran in 65536 tiles of one element).
        budget = params.inner_tile // sizes[-1]
        outer = _fill(ranges[:-1], list(reversed(range(len(ranges) - 1))), budget, False)
        sizes = [*outer, sizes[-1]]
    return sizes


def reduction_tile_sizes(op: OpFacts, params: GenericParams) -> tuple[list[int], list[int]]:
    """(parallel tile sizes, reduction chunk sizes); 0 means "not tiled at this level".

    Parallel dims are tiled to 1, except an innermost parallel dim (a reduction over outer
    dims), which takes up to ``reduction_rows`` points so the reduction is a vector add.
    Reduction dims are chunked, innermost first, to at most ``reduction_chunk`` elements.
    A matrix-vector product reading its weight rows along k (:func:`gemv_rows`) takes
    :data:`GEMV_ROWS` of them per tile, its chunk shrunk to keep the tile's size.
    """
    ranges, iterators = op.loop_ranges, op.iterator_types
    parallel = [d for d, it in enumerate(iterators) if it == "parallel"]
    reduction = [d for d, it in enumerate(iterators) if it == "reduction"][::-1]
    outer = [1 if d in parallel else 0 for d in range(len(ranges))]
    last = len(ranges) - 1
    if iterators and iterators[last] == "parallel":
        outer[last] = tile_size(ranges[last], params.reduction_rows)
    budget = max(1, params.reduction_chunk // max(1, outer[last] if outer else 1))
    rows = gemv_rows(op)
    if rows is not None:
        outer[rows] = largest_divisor_at_most(ranges[rows], GEMV_ROWS)
        budget = max(1, params.reduction_chunk // outer[rows])
    chunk = _fill(ranges, reduction, budget)
    innermost = reduction[0] if reduction else None
    if (
        innermost is not None
        and params.reduction_whole_tail
        and _masked_tail_within(ranges[innermost], chunk[innermost], budget)
    ):
        chunk = [1] * len(ranges)
        chunk[innermost] = ranges[innermost]
    inner = [0] * len(ranges)
    for d in reduction:
        inner[d] = (
            0
            if chunk[d] == ranges[d] and all(chunk[e] == ranges[e] for e in reduction)
            else chunk[d]
        )
    return outer, inner


def _masked_tail_within(extent: int, chunk: int, budget: int) -> bool:
    """Whether chunks of ``chunk`` leave ``extent`` a masked last chunk although the whole
    extent is within twice the ``budget``: one unmasked chunk then. The masked tail of a
    long vector reduction (a dynamic mask over hundreds of lanes) ran slower than the whole
    row: KernelBench's l2_027, GroupNorm statistics in f64 over rows of 845 (chunks of 512
    and a tail of 333): 2.0x faster whole (Xeon, 1 thread, thread CPU time, under load)."""
    return extent % chunk != 0 and extent <= 2 * budget


#: Weight rows per tile of a matrix-vector product reading them along k: as many
#: independent streams and dot products, each vector of ``x`` loaded once for all (1024
#: -> 1000 and 4096 -> 4096 at batch 1, Xeon, 1 thread, under load: one row per tile
#: 0.68x and ~1.6x PyTorch's time, four 0.67x and ~1.1x, eight 0.82x (a faster PyTorch
#: sample: 0.136 ms against four rows' 0.142) and ~0.98x).
GEMV_ROWS = 8


def gemv_rows(op: OpFacts) -> int | None:
    """The loop of a matrix-vector product's weight rows (n, with one row of x), where the
    weight is read along k (its innermost loop, ``B[n, k]``); else None."""
    c = op.contraction
    if op.op_class != "matmul" or c is None or c.m != 1 or c.batch_dims:
        return None
    if len(c.n_dims) != 1 or len(c.k_dims) != 1 or not c.transpose_b:
        return None
    return c.n_dims[0] if c.k_dims[0] == len(op.loop_ranges) - 1 else None


def tile_volume(sizes: list[int], ranges: tuple[int, ...]) -> int:
    """Elements of one tile (0 = the whole range)."""
    return math.prod(s if s else r for s, r in zip(sizes, ranges, strict=True))


# -- search spaces (read by the tuner through stagegraph.core.tunable) -----------------------


def _op_lanes(op: OpFacts, target: Target) -> int:
    """Vector lanes of the op's widest element type on ``target``."""
    elem = max((byte_size(v.dtype, default=0) for v in op.inputs + op.outputs), default=0) or 4
    return max(1, target.vector_bits // (8 * elem))


def _multiples_of_lanes(*factors: int) -> object:
    return lambda op, target: Choice(tuple(f * _op_lanes(op, target) for f in factors))


def _reduction_rules(p: object, op: object, target: Target, logic: object) -> dict[str, object]:
    return {"reduction_rows_within_chunk": p.reduction_rows <= p.reduction_chunk}


def _output_tile_rule(p: object, op: object, target: Target) -> dict[str, object]:
    """An output tile's accumulators (width x channels) stay within four register files, so
    the unrolled vector code stays small enough to compile in seconds."""
    budget = 4 * _REGISTERS * _op_lanes(op, target)
    return {f"conv_output_tile_within_{budget}": p.conv_width_tile * p.conv_channel_tile <= budget}


def _nhwc_output_tile_rule(p: object, op: object, target: Target) -> dict[str, object]:
    """The same budget for the tile of a channels-last convolution."""
    budget = 4 * _REGISTERS * _op_lanes(op, target)
    product = p.conv_nhwc_width_tile * p.conv_nhwc_channel_tile
    return {f"conv_nhwc_output_tile_within_{budget}": product <= budget}


def _pooling_rules(p: object, op: object, target: Target, logic: object) -> dict[str, object]:
    """The output tile's budget, and a batch (channel) tile times the width tile of at most
    64 windows."""
    return {
        **_output_tile_rule(p, op, target),
        "pool_batch_times_width_within_64": p.pool_batch_tile * p.conv_width_tile <= 64,
    }


def _convolution_rules(p: object, op: object, target: Target, logic: object) -> dict[str, object]:
    """The output tile's budget, and a batch tile times the width tile of at most 16 (beyond
    it the unrolled tile spills)."""
    return {
        **_output_tile_rule(p, op, target),
        **_nhwc_output_tile_rule(p, op, target),
        "conv_batch_times_width_within_16": p.conv_batch_tile * p.conv_width_tile <= 16,
    }


_X86 = {"applies_to": lambda target: target.arch in ("x86_64", "AMD64")}
_POWERS = (1, 2, 4, 8, 16, 32)


def _tiles_of(role: str, cap: int = 32) -> object:
    """Tile sizes for a convolution loop role: powers of two (the heuristic's values) and
    the divisors of the op's extent in that role up to ``cap`` (a tile is the largest
    divisor at most the value, so the divisors are the distinct plans)."""

    def domain(op: OpFacts, target: Target) -> Choice:
        conv = op.convolution
        dims = getattr(conv, role, ()) if conv is not None else ()
        extent = op.loop_ranges[dims[-1]] if dims else 1
        divisors = [d for d in range(1, min(extent, cap) + 1) if extent % d == 0]
        return Choice((*_POWERS, *divisors))

    return domain


declare_space(
    GenericParams,
    "elementwise",
    {"inner_tile": _multiples_of_lanes(1, 2, 4, 8, 16), "fuse_elementwise": Choice((0, 1))},
    **_X86,
)
declare_space(
    GenericParams,
    "reduction",
    {
        "reduction_rows": _multiples_of_lanes(1, 2, 4, 8),
        "reduction_chunk": _multiples_of_lanes(*(2**i for i in range(10))),
        "reduction_whole_tail": Choice((0, 1)),
        "fuse_elementwise": Choice((0, 1)),
    },
    _reduction_rules,
    **_X86,
)
declare_space(
    GenericParams,
    "convolution",
    {
        "conv_width_tile": _tiles_of("output_image"),
        "conv_channel_tile": _tiles_of("output_channel", 16),
        "conv_reduction_tile": _tiles_of("input_channel"),
        "conv_batch_tile": Choice((1, 2, 4, 8)),
        "conv_drop_unit_dims": Choice((0, 1)),
        "conv_channels_last": Choice((0, 1)),
        "conv_chain_channels_last": Choice((0, 1)),
        "conv_grouped_width": Choice((0, 1)),
        "conv3d_direct": Choice((0, 1)),
        "conv3d_accumulators": Choice((0, 8, 12, 16, 24)),
        "conv_nhwc_channel_tile": _tiles_of("output_channel"),
        "conv_nhwc_width_tile": _tiles_of("output_image"),
    },
    _convolution_rules,
    **_X86,
)
declare_space(
    GenericParams,
    "pooling",
    {
        "conv_width_tile": _tiles_of("output_image"),
        "conv_channel_tile": _tiles_of("output_channel", 16),
        "pool_batch_tile": Choice((1, 2, 4, 8)),
        "pool_width_vectors": Choice((0, 1)),
        "conv_drop_unit_dims": Choice((0, 1)),
    },
    _pooling_rules,
    **_X86,
)
