"""Which non-matmul ops the generic x86 schedule takes, and how: the decisions (from the
facts and params alone, no IR) that :mod:`.schedule` turns into transform ops."""

from __future__ import annotations

import math

from stagegraph.stages.analysis import REDUCTION_COMBINERS, OpFacts, PayloadFacts
from stagegraph.stages.x86.generic.params import (
    GenericParams,
    largest_divisor_at_most,
    static_tile_size,
)
from stagegraph.stages.x86.matmul.sites import canonicalizable, runs_as_matvec

# Named convolutions that ``transform.structured.decompose`` rewrites to a 1-D op once the
# outer image/filter dims are tiled to 1, and 1-D ones the vectorizer handles directly.
DECOMPOSABLE = frozenset(
    f"linalg.{n}"
    for n in (
        "conv_2d_nhwc_hwcf",
        "conv_2d_nchw_fchw",
        "depthwise_conv_2d_nhwc_hwc",
        "pooling_nhwc_sum",
        "pooling_nhwc_max",
        "pooling_nhwc_min",
        "pooling_nchw_sum",
        "pooling_nchw_max",
    )
)
VECTORIZABLE_1D = frozenset(
    f"linalg.{n}"
    for n in (
        "conv_1d_nwc_wcf",
        "conv_1d_ncw_fcw",
        "depthwise_conv_1d_nwc_wc",
        "pooling_nwc_sum",
        "pooling_nwc_max",
        "pooling_nwc_min",
        "pooling_ncw_sum",
        "pooling_ncw_max",
    )
)
# Convolutions whose output channels are the innermost output dim (after decomposition:
# the vector dim, read and written contiguously), register blocked by their own tiles.
CHANNELS_LAST = frozenset(f"linalg.{n}" for n in ("conv_2d_nhwc_hwcf", "conv_1d_nwc_wcf"))
# Depthwise convolutions whose channels (their ``depth`` dim) are innermost: tiled as
# vectors of channels times a row of output width (:func:`depthwise_channels_last_tiles`).
DEPTHWISE_CHANNELS_LAST = frozenset(
    f"linalg.{n}" for n in ("depthwise_conv_2d_nhwc_hwc", "depthwise_conv_1d_nwc_wc")
)


# ----------------------------------------------------------------------------- selection


def _epilogue_ops(facts: PayloadFacts) -> set[int]:
    """The elementwise ops the matmul schedule fuses into its register tiles: the epilogues
    of unbatched matmuls it takes. A batched matmul runs one matmul per batch element in a
    loop its epilogue stays outside of, and a matrix-vector product runs here: their
    epilogues are this schedule's to vectorize."""
    fused = set()
    for layer in facts.layers:
        op = facts.ops[layer.contraction]
        if canonicalizable(op) and op.contraction is not None and not op.contraction.batch_dims:
            fused.update(layer.epilogue)
    return fused


def schedulable(op: OpFacts, facts: PayloadFacts) -> bool:
    """Whether the generic schedule may transform this op at all (matmul-class ops only
    when they are matrix-vector products, see :func:`reduction_like`)."""
    if op.op_class == "other" or not op.loop_ranges:
        return False
    if op.op_class == "matmul" and not reduction_like(op):
        return False
    return op.index not in _epilogue_ops(facts)


def reduction_like(op: OpFacts) -> bool:
    """A reduction, or a matrix-vector product (scheduled as one: no operand reuse for a
    matmul micro-kernel to exploit)."""
    if op.op_class == "matmul":
        return op.contraction is not None and runs_as_matvec(op.contraction)
    return op.op_class == "reduction"


def vectorizable_reduction(op: OpFacts) -> bool:
    """One output (or several of one shape: a norm's sums in one pass,
    :mod:`.batch_stats`), no index/gather in the body and a recognisable combiner."""
    body = set(op.body_ops)
    return (
        len({v.shape for v in op.outputs}) == 1
        and "linalg.index" not in body
        and "tensor.extract" not in body
        and bool(body & REDUCTION_COMBINERS)
    )


def convolution_plan(op: OpFacts, params: GenericParams) -> tuple[list[int], bool] | None:
    """(tile sizes, decompose first) for a convolution/pooling op, or None (fallback)."""
    conv = op.convolution
    if conv is None:
        return None
    if op.op_class == "pooling" and any(d > 1 for d in conv.dilations):
        return None  # dilated pooling windows vectorize into shuffles slower than loops
    if op.op_class == "pooling" and any(op.loop_ranges[d] == 1 for d in conv.filter_loop):
        # A one-row window (1-D pooling in a 2-D op): shuffles again, and nothing for them
        # to amortize over (avg pool 1-D: 0.14 ms vectorized, 0.07 ms as loops).
        return None
    if math.prod(op.loop_ranges[d] for d in conv.filter_loop) == 1:
        return None  # pointwise: a matmul in disguise, better left to loops (or matmul path)
    decompose = op.name in DECOMPOSABLE
    if not decompose and op.name not in VECTORIZABLE_1D:
        return None
    ranges = op.loop_ranges
    sizes = [1] * len(ranges)  # batch, depth, outer image and filter dims: one at a time
    image, filters = list(conv.output_image), list(conv.filter_loop)
    width_tile, channel_tile = params.conv_width_tile, params.conv_channel_tile
    if op.name in CHANNELS_LAST and conv.output_channel and image:
        channel_tile, width_tile = register_blocking(
            ranges[conv.output_channel[-1]], ranges[image[-1]], params
        )
    if op.name in DEPTHWISE_CHANNELS_LAST and conv.depth and image:
        return depthwise_channels_last_tiles(op, params), decompose
    along_width = pools_along_width(op, params)
    if image:
        width = ranges[image[-1]]
        if along_width:
            sizes[image[-1]] = static_tile_size(width, WIDTH_VECTORS * params.lanes)
        elif op.op_class == "convolution":  # measured there; poolings keep their tiles
            sizes[image[-1]] = static_tile_size(width, width_tile)
        else:
            sizes[image[-1]] = largest_divisor_at_most(width, width_tile)
    for d in conv.output_channel:
        sizes[d] = largest_divisor_at_most(ranges[d], channel_tile)
    channels = math.prod(ranges[d] for d in conv.input_channel)
    whole = op.name in CHANNELS_LAST and channels <= params.conv_whole_channels
    for d in conv.input_channel:
        # A vector's worth of input channels (16 on AVX-512) in one step: KernelBench's
        # l2_025 (16 -> 32 channels) ran 1.5x faster than in two steps of 8, 16 -> 16
        # unchanged (docs/measurements.md, "Few input channels: direct or GEMM").
        cap = ranges[d] if whole else params.conv_reduction_tile
        sizes[d] = largest_divisor_at_most(ranges[d], cap)
    if filters:  # the innermost filter window stays whole (channels-last: see its tile)
        window = params.conv_nhwc_window_tile if op.name in CHANNELS_LAST else 0
        sizes[filters[-1]] = window_tile(op, sizes, params, window) if window else 0
    if conv.batch:
        # A pooling's batch dims hold its channels too (NCHW): independent windows, so
        # taking several per tile pays; a convolution's batch tile only adds spills.
        batch_tile = params.pool_batch_tile if op.op_class == "pooling" else params.conv_batch_tile
        if along_width:
            batch_tile = 1  # the width is the vector: one channel (image row) per tile
        sizes[conv.batch[-1]] = largest_divisor_at_most(ranges[conv.batch[-1]], batch_tile)
    return sizes, decompose


def window_tile(op: OpFacts, sizes: list[int], params: GenericParams, taps: int) -> int:
    """Taps of the innermost window dim per reduction step of a channels-last
    convolution: the smallest divisor of the window's width from ``taps`` on whose
    tap-channel pairs (taps times the step's input channels, ``sizes``) reach
    ``conv_reduction_tile``; 0 (untiled) when that is the whole width. Few input
    channels (an RGB image's 3) would make one-tap steps too short for their loop:
    l1_066 (3 channels, 7 taps) ran 1.12x slower tap by tap than with its whole window
    row per step."""
    conv = op.convolution
    width = op.loop_ranges[conv.filter_loop[-1]]
    channels = math.prod(sizes[d] or op.loop_ranges[d] for d in conv.input_channel)
    for tile in range(max(1, taps), width):
        if width % tile == 0 and tile * channels >= params.conv_reduction_tile:
            return tile
    return 0  # the whole window row (untiled)


#: Output columns per tile of a channels-last depthwise convolution: its accumulators
#: (one vector of channels each); each filter vector then serves that many FMAs.
DEPTHWISE_WIDTH_TILE = 8


def depthwise_channels_last_tiles(op: OpFacts, params: GenericParams) -> list[int]:
    """Tiles of a channels-last depthwise convolution: one vector of channels (its
    ``depth`` dim, contiguous) times :data:`DEPTHWISE_WIDTH_TILE` output columns, one
    output row, the innermost window row whole. Tiled by the output-channel rules, its
    channels took a tile of 1 and its vectors ran along the width, gathering every lane
    (2.8x PyTorch's time on a 256-channel 28x28 one; 2.2x tiled so, transposes
    included)."""
    conv = op.convolution
    assert conv is not None
    ranges = op.loop_ranges
    sizes = [1] * len(ranges)
    channels, width = conv.depth[-1], conv.output_image[-1]
    sizes[channels] = largest_divisor_at_most(ranges[channels], params.lanes)
    sizes[width] = static_tile_size(ranges[width], DEPTHWISE_WIDTH_TILE)
    sizes[conv.filter_loop[-1]] = 0
    return sizes


#: Vectors of output width per tile of a pooling vectorized along its width: its windows
#: are independent, so a longer row only adds parallel work.
WIDTH_VECTORS = 4


def pools_along_width(op: OpFacts, params: GenericParams) -> bool:
    """Whether a pooling is vectorized along its output width (``pool_width_vectors``):
    the width is its innermost loop of the output (NCHW: contiguous rows), read with a
    unit stride, and at least half a vector long (:data:`POOL_ROW_PARTS_OF_A_VECTOR`). Its
    tiles then take one channel and a row of the width, whose unit dims are dropped, so
    each window offset is a contiguous ``vector<W>`` (faster than vectors across
    channels, which the decomposed op gathers and scatters lane by lane; measured:
    docs/measurements.md, "Design decisions: the generic schedule").
    """
    conv = op.convolution
    if op.op_class != "pooling" or conv is None or not params.pool_width_vectors:
        return False
    if not conv.output_image or not conv.strides or conv.strides[-1] != 1:
        return False
    width = conv.output_image[-1]
    others = conv.batch + conv.output_channel + conv.depth + conv.output_image[:-1]
    wide = op.loop_ranges[width] * POOL_ROW_PARTS_OF_A_VECTOR >= params.lanes
    return all(d < width for d in others) and wide


#: A pooling vectorizes along an output width of at least ``lanes`` over this. A row of
#: half a vector or more still beats vectors across channels, which the decomposed op
#: fills and empties lane by lane: a 4x4 max pooling of 16x16 rows (15 wide, 16 lanes)
#: ran 3.0x faster along its width (docs/measurements.md, "Level 1 below PyTorch or
#: IREE"). Of the dev payloads' poolings only that one changed (AVX2: none).
POOL_ROW_PARTS_OF_A_VECTOR = 2


def register_blocking(channels: int, width: int, params: GenericParams) -> tuple[int, int]:
    """(output-channel tile, output-width tile) of a channels-last convolution.

    The nominal tile is ``conv_nhwc_channel_tile`` x ``conv_nhwc_width_tile``; each halving
    of the channel tile (down to half of it: one vector) doubles the width's share of the
    accumulators. The static width tile (:func:`static_tile_size`) may fall far from its
    cap, so the candidate with the largest tile wins (ties: more channels, fewer
    broadcasts). A prime width of 17 takes 8 channels x 17, a width of 20 takes 16 x 4.
    A width tile under its cap moves to a divisor above it when that one is nearer and its
    accumulators fit the registers (:func:`width_above_cap`). A candidate whose
    accumulators outgrow the registers is taken only when no fitting one keeps
    :data:`MIN_CONV_ACCUMULATORS` of them.
    """
    best, fitting = (0, 0), (0, 0)
    tile = params.conv_nhwc_channel_tile
    while True:
        channel = largest_divisor_at_most(channels, tile)
        share = max(1, params.conv_nhwc_channel_tile // channel)
        cap = params.conv_nhwc_width_tile * share
        vectors = -(-channel // params.lanes)
        # the accumulators, plus a filter vector per channel vector and a broadcast
        room = (params.vector_registers - vectors - 1) // vectors
        candidate = (channel, width_above_cap(width, static_tile_size(width, cap), cap, room))
        if candidate[0] * candidate[1] > best[0] * best[1]:
            best = candidate
        if candidate[1] <= room and candidate[0] * candidate[1] > fitting[0] * fitting[1]:
            fitting = candidate
        tile //= 2
        if 2 * tile < params.conv_nhwc_channel_tile or tile < 1:
            break
    # A whole prime width may outgrow the registers: AVX-512's 32 filters x 17 columns
    # (34 accumulators) would spill where 16 x 17 fits. The largest tile that fits wins
    # while it keeps enough FMA chains; AVX2's 8 x 17 (17 accumulators on 16 registers)
    # still ran 1.6x faster than 16 x 1.
    vectors = -(-fitting[0] // params.lanes) if fitting[0] else 0
    return fitting if vectors * fitting[1] >= MIN_CONV_ACCUMULATORS else best


#: Independent accumulators (FMA chains) a register tile needs to keep both FMA units
#: busy (latency 4-5 cycles, as the matmul heuristic's ``MIN_ACCUMULATORS``).
MIN_CONV_ACCUMULATORS = 8


def width_above_cap(width: int, tile: int, cap: int, room: int) -> int:
    """``tile`` (a divisor of ``width``), or, when it is at most half of ``cap`` (few
    accumulators), the smallest divisor above the cap that is nearer to it and at most
    ``room`` (the width columns whose accumulators the registers hold). A width of 10 at
    a cap of 4 took 2 columns (4 accumulators of two vectors): 5 ran KernelBench's l1_056
    1.32x faster on AVX-512 (docs/measurements.md, "Channels-last width tiles above the
    cap"), where a cap of 8 for every width made 16-wide rows slower."""
    if 2 * tile > cap:
        return tile
    for above in range(cap + 1, min(room, cap + (cap - tile) - 1) + 1):
        if width % above == 0:
            return above
    return tile


def partial_tiles(ranges: tuple[int, ...], *tilings: list[int]) -> bool:
    """Whether any tiling (0 = untiled) leaves a partial last tile on some dim."""
    return any(
        size and extent % size
        for sizes in tilings
        for size, extent in zip(sizes, ranges, strict=True)
    )


def has_bool_operands(op: OpFacts) -> bool:
    """An ``i1`` operand: vector<Nxi1> loads/stores are bit-packed in LLVM while memref
    ``i1`` elements are bytes, so such ops are left to the scalar fallback."""
    return any(v.dtype == "i1" for v in op.inputs + op.outputs)


def vectorize_enabled(op: OpFacts, params: GenericParams) -> bool:
    if has_bool_operands(op):
        return False
    return {
        "elementwise": params.vectorize_elementwise,
        "reduction": params.vectorize_reductions and vectorizable_reduction(op),
        "matmul": params.vectorize_reductions and reduction_like(op),
        "convolution": params.vectorize_convolutions,
        "pooling": params.vectorize_pooling,
    }.get(op.op_class, False)
