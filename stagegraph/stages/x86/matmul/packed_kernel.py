"""The packed matmul kernel: A and B packed into register-tile panels, C computed per
register tile with its accumulators in registers.

:func:`packed_kernel` runs its phases in order, each adding transform ops for one site:

1. pack the block's matmul (``structured.pack``) and transpose the panels so each is
   contiguous over k (:func:`_pack_panels`);
2. split K into blocks, packing A and B one K block at a time (:func:`_block_k`), and a
   block of several ``tile_m`` row blocks into row blocks (:func:`_block_rows`);
3. tile the pass over C into register tiles: computed inside the pass that writes C
   (``direct``, :func:`writes_c_directly`) or into a packed C that the unpack pass reads
   (:func:`_packed_c_tiles`);
4. tile the packing into vector steps (:func:`_tile_packing`), peel the partial edge tiles
   (:func:`_peel`), vectorize everything (:func:`_vectorize`) and hoist the accumulators.

With several threads and several K blocks (``share_b``) the threads share each K block's
packed B (:func:`shares_b`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from stagegraph.mlir.bindings import dialect, ir, loop, structured, transform
from stagegraph.stages.common.transform_build import (
    any_op,
    apply_patterns,
    match_name,
    producer_of,
)
from stagegraph.stages.x86.matmul.canonical import WIDEN_LANES, MatmulSite
from stagegraph.stages.x86.matmul.first_k_block import K_BLOCKS_ATTR
from stagegraph.stages.x86.matmul.gather_steps import gather_in_steps, split_gathered_panel
from stagegraph.stages.x86.matmul.kernel_plan import KernelPlan, plan_kernel
from stagegraph.stages.x86.matmul.params import MatmulParams, partial_tiles
from stagegraph.stages.x86.matmul.prefetch_rows import PREFETCH_ROWS_ATTR
from stagegraph.stages.x86.matmul.register_tiles import (
    cleanup,
    consumer_of,
    hoist_accumulators,
    merged,
)
from stagegraph.stages.x86.matmul.stream_prefetch import STREAM_PREFETCH_ATTR

_ttensor = dialect("transform.tensor")
# Marks on the direct tiles' kernel and consumers (see _peel_direct_edges).
_DIRECT_KERNEL_ATTR = "stagegraph.direct_kernel"
_DIRECT_CONSUMER_ATTR = "stagegraph.direct_consumer"


@dataclass
class _Handles:
    """The transform handles of one site's packed kernel, replaced as phases tile and fuse
    them: the unpack of C, the packed contraction, A's and B's packs, the zero fill (or
    packed init) of packed C, and the widening copies of A and B (None: not widened)."""

    unpack: ir.Value
    kernel: ir.Value
    pack_a: ir.Value
    pack_b: ir.Value | None
    zero: ir.Value
    widenings: list[ir.Value | None]


def packed_kernel(
    func: ir.Value,
    block_mm: ir.Value,
    site: MatmulSite,
    params: MatmulParams,
    widenings: Sequence[ir.Value | None],
) -> None:
    """Schedule the block's matmul ``block_mm`` (in ``func``) as the packed kernel."""
    handles = _pack_panels(func, block_mm, site, params, widenings)
    plan = plan_kernel(site, params, widenings)
    if plan.k_block:
        _block_k(handles, site, plan.k_block)
    if not plan.direct and plan.row_blocks:
        _block_rows(handles, params, plan.shared)
    if plan.k_block or plan.row_blocks:
        # Each K (and M) block packs into its own buffer (a slice of an empty tensor is an
        # empty tensor), so every block rewrites the same cache-resident lines.
        apply_patterns(func, _ttensor.ApplyFoldTensorEmptyPatternsOp)
    chain = [handles.unpack]
    for _ in range(site.consumers):
        chain.append(consumer_of(chain[-1]))
    if plan.direct:
        tile_nest = _direct_tiles(chain, handles, site, params)
    else:
        tile_nest = _packed_c_tiles(chain, handles, site, params, plan)
    partial_a, partial_b, steps = _tile_packing(handles, site, params, plan)
    consumers, unpacks = _peel(tile_nest, handles, site, params, plan)
    cleanup(func)
    if partial_a is not None or partial_b is not None:
        # The whole panels' row (column) counts are min(reg, rows left): loop bounds prove
        # them reg, so those steps vectorize without a mask.
        apply_patterns(func, loop.ApplyForLoopCanonicalizationPatternsOp)
    structured.VectorizeOp(handles.kernel)
    for step, panel in steps:
        # (a patch gather reads its input with tensor.extract: patch_operands)
        structured.VectorizeOp(step, panel, vectorize_nd_extract=True)
    _vectorize_packing(handles, partial_a, partial_b, params, plan.k_step)
    _vectorize_pass_over_c(handles.zero, unpacks, consumers, site, params)
    hoist_accumulators(func)


def _pack_panels(
    func: ir.Value,
    block_mm: ir.Value,
    site: MatmulSite,
    params: MatmulParams,
    widenings: Sequence[ir.Value | None],
) -> _Handles:
    """Pack the block's matmul into ``reg_m``-row panels of A, ``reg_n``-column panels of B
    and register tiles of C, laid out for the kernel; returns the handles found again."""
    packed = structured.PackOp(
        any_op(), block_mm, static_packed_sizes=[params.reg_m, params.reg_n, 0], packed_sizes=[]
    ).packed_op
    # B[k, n] is packed as [K, N/reg_n, reg_n]; make each reg_n-wide panel contiguous over
    # k. A transposed B[n, k] packs as [N/reg_n, K, reg_n] already; a transposed A[k, m]
    # packs as [K, M/reg_m, reg_m] and needs the transposition instead.
    if site.transpose_a:
        pack_a = producer_of(packed, 0)
        packed = structured.PackTransposeOp(
            any_op(), any_op(), any_op(), pack_a, packed, outer_perm=[1, 0]
        ).results[0]
    if not site.transpose_b:
        pack_b = producer_of(packed, 1)
        packed = structured.PackTransposeOp(
            any_op(), any_op(), any_op(), pack_b, packed, outer_perm=[1, 0]
        ).results[0]
    # C packs as [N/reg_n, M/reg_m, reg_m, reg_n]: the register tiles of one B micro-panel
    # (the inner loop runs over M) are then adjacent in memory, so their accumulators load
    # and store sequentially (prefetchable) rather than a whole packed row apart.
    unpack_c = transform.GetConsumersOfResult(any_op(), packed, 0).result
    structured.PackTransposeOp(any_op(), any_op(), any_op(), unpack_c, packed, outer_perm=[1, 0])
    cleanup(func)
    # Re-find the ops from the unpack (patterns replace ops; a one-block forall is even
    # inlined). Earlier sites' unpacks are vectorized already, so the match is this site's.
    unpack = match_name(func, "linalg.unpack")
    kernel = producer_of(unpack, 0)
    # The packed C starts as zeros (a fused fill) or as the packed init (C += A B).
    # Kernel dims: (mo, no, k, mi, ni); loops: no, mo, k.
    return _Handles(
        unpack=unpack,
        kernel=kernel,
        pack_a=producer_of(kernel, 0),
        # A prepacked B (constant_pack): its pack folded into the packed constant's slice.
        pack_b=None if site.prepacked_b else producer_of(kernel, 1),
        zero=producer_of(kernel, 2),
        widenings=list(widenings),
    )


def _block_k(handles: _Handles, site: MatmulSite, k_block: int) -> None:
    """Pack A and B one K block at a time, inside the K-block loop (BLIS order): the packed
    slices (tile_m x kc, kc x tile_n) are written just before the register tiles read them,
    while they are still in L2, instead of packing all of K first (a packed B of K x
    tile_n overflows L2 and comes back from L3 / memory)."""
    by_k = structured.TileUsingForOp(handles.kernel, sizes=[0, 0, k_block, 0, 0])
    handles.kernel, kloop = by_k.tiled_linalg_op, by_k.loops[0]
    fused = structured.FuseIntoContainingOp(handles.pack_a, kloop)
    handles.pack_a, kloop = fused.fused_op, fused.new_containing_op
    if handles.pack_b is not None:
        handles.pack_b = structured.FuseIntoContainingOp(handles.pack_b, kloop).fused_op
    # A widening copy follows its pack into the K-block loop (and below, into the pack
    # step): fusion only reaches a producer used directly inside the container.
    handles.widenings = [
        None if copy is None else structured.FuseIntoContainingOp(copy, kloop).fused_op
        for copy in handles.widenings
    ]
    if site.has_fill:  # its first K block may start from the fill (see first_k_block)
        transform.AnnotateOp(kloop, K_BLOCKS_ATTR)


def _block_rows(handles: _Handles, params: MatmulParams, shared: bool) -> None:
    """A block of several tile_m row blocks: B is packed once per K block for all of them,
    A one tile_m x kc slice at a time (the slice the register tiles sweep). Shared: the
    threads take the row blocks of each K block."""
    row_sizes = [params.tile_m // params.reg_m, 0, 0, 0, 0]
    if shared:
        by_m = structured.TileUsingForallOp(handles.kernel, tile_sizes=row_sizes)
        handles.kernel, rows = by_m.tiled_op, by_m.forall_op
    else:
        by_m = structured.TileUsingForOp(handles.kernel, sizes=row_sizes)
        handles.kernel, rows = by_m.tiled_linalg_op, by_m.loops[0]
    fused = structured.FuseIntoContainingOp(handles.pack_a, rows)
    handles.pack_a, rows = fused.fused_op, fused.new_containing_op
    if handles.widenings[0] is not None:
        handles.widenings = [
            structured.FuseIntoContainingOp(handles.widenings[0], rows).fused_op,
            handles.widenings[1],
        ]


def _packed_c_tiles(
    chain: list[ir.Value],
    handles: _Handles,
    site: MatmulSite,
    params: MatmulParams,
    plan: KernelPlan,
) -> Any:
    """Register tiles into packed C, which the pass over C (the unpack and its consumers,
    tiled per register tile) then reads; returns that pass's tile loop nest."""
    k_tiled = structured.TileUsingForOp(
        handles.kernel, sizes=[1, 1, params.k_unroll, 0, 0], interchange=[1, 0, 2, 3, 4]
    )
    handles.kernel = k_tiled.tiled_linalg_op
    _mark_stream(k_tiled.loops[2], site, params)
    # The packed C is zeroed (or the init packed) tile by tile with vector stores.
    zero = handles.zero
    if plan.shared:  # (each thread a share of the column panels)
        zero = structured.TileUsingForallOp(
            zero, num_threads=[params.threads] + [0] * (3 if site.has_fill else 1)
        ).tiled_op
    handles.zero = structured.TileUsingForOp(
        zero, sizes=[1, 1, 0, 0] if site.has_fill else [1, 1]
    ).tiled_linalg_op
    # Unpack and the elementwise chain run together per register tile: one pass over C.
    node, producers = chain[-1], list(reversed(chain[:-1]))
    if plan.shared:  # (the threads take its blocks)
        blocks = structured.TileUsingForallOp(
            node, tile_sizes=[params.tile_m, 0 if plan.pass_n == site.n else plan.pass_n]
        )
        node, forall = blocks.tiled_op, blocks.forall_op
        for i, producer in enumerate(producers):
            fused = structured.FuseIntoContainingOp(producer, forall)
            producers[i], forall = fused.fused_op, fused.new_containing_op
    tile_nest = structured.TileUsingForOp(node, sizes=[params.reg_m, params.reg_n])
    for producer in producers:
        structured.FuseIntoContainingOp(producer, tile_nest.loops[1])
    return tile_nest


def _tile_packing(
    handles: _Handles, site: MatmulSite, params: MatmulParams, plan: KernelPlan
) -> tuple[ir.Value | None, ir.Value | None, list[tuple[ir.Value, list[int]]]]:
    """Tile A's and B's packing into vector steps of ``k_step`` k elements (a partial last
    panel split off where one block spans the dimension); returns the partial panels'
    packs (or None) and the widening copies' steps with their vector shapes."""
    kp, widenings = plan.k_step, handles.widenings
    partial_a = partial_b = None
    pack_a, pack_b = handles.pack_a, handles.pack_b
    if widenings[0] is None:
        pack_a, partial_a = _split_partial_panel(pack_a, site.m, params.tile_m, params.reg_m)
    # A widened input is converted per packing step, into the panel being packed.
    tiled_a = structured.TileUsingForOp(pack_a, sizes=[1, kp])
    if not site.transpose_a:  # each step reads reg_m rows of A: prefetch ahead along them
        transform.AnnotateOp(tiled_a.loops[1], PREFETCH_ROWS_ATTR)
    handles.pack_a = tiled_a.tiled_linalg_op
    if partial_a is not None:
        partial_a = structured.TileUsingForOp(partial_a, sizes=[1, kp]).tiled_linalg_op
    tiled_b = None
    if pack_b is not None:  # (none for a B packed at compile time)
        # B[k, n] packs k-outer: each step reads kp rows of B along n (contiguous), instead
        # of walking one reg_n-wide column strip down all of K (a new page every row).
        # A patch gather runs panel-outer instead: each panel's column coordinates (the
        # divisions of its output positions) are then computed once for all of K.
        b_order = [0, 1] if site.transpose_b or site.patch_b else [1, 0]
        gathers = [widenings[1]]
        if site.patch_b:  # (the patch gather follows the split: one per piece)
            pack_b, partial_b, gathers = split_gathered_panel(pack_b, widenings[1], site, params)
        elif widenings[1] is None:
            pack_b, partial_b = _split_partial_panel(pack_b, site.n, params.tile_n, params.reg_n)
        if plan.shared:  # the threads pack B's whole panels together (the partial one next)
            pack_b = structured.TileUsingForallOp(pack_b, num_threads=[params.threads, 0]).tiled_op
        tiled_b = structured.TileUsingForOp(pack_b, sizes=[1, kp], interchange=b_order)
        handles.pack_b = tiled_b.tiled_linalg_op
        if partial_b is not None:
            tiled_partial = structured.TileUsingForOp(partial_b, sizes=[1, kp], interchange=b_order)
            partial_b = tiled_partial.tiled_linalg_op
    steps = []
    if site.patch_b:  # the patch gather, into every step (each of static shape: patch_operands)
        pieces = [tiled_b] if partial_b is None else [tiled_b, tiled_partial]
        steps = gather_in_steps(gathers, pieces, site, params, kp)
        widenings = [widenings[0], None]
    for copy, tiled, panel in zip(
        widenings,
        (tiled_a, tiled_b),
        ([kp, params.reg_m] if site.transpose_a else [params.reg_m, kp],
         [params.reg_n, kp] if site.transpose_b else [kp, params.reg_n]),
        strict=True,
    ):  # fmt: skip
        if copy is None:
            continue
        if plan.k_block or plan.row_blocks:
            # Inside the K (and M) block loops the copy widens its block's slice once, in
            # vector steps, just before the packing reads it (still in cache).
            step = structured.TileUsingForOp(copy, sizes=[1, WIDEN_LANES]).tiled_linalg_op
            steps.append((step, [1, WIDEN_LANES]))
        else:
            steps.append((structured.FuseIntoContainingOp(copy, tiled.loops[1]).fused_op, panel))
    return partial_a, partial_b, steps


def _peel(
    tile_nest: Any, handles: _Handles, site: MatmulSite, params: MatmulParams, plan: KernelPlan
) -> tuple[list[ir.Value], list[ir.Value]]:
    """Peel the partial last row and column of tiles: the full tiles then have static
    shapes and store to C unmasked (a masked vmaskmovps store is slow, several uops).
    (Peeling fails on a loop whose static trip count has no remainder: skip those.)
    Returns the consumers and the unpacks of every piece; direct, the kernel and zero
    handles become those of all pieces."""
    if plan.direct:
        pieces = _peel_direct_edges(tile_nest, site, params)
        handles.kernel = merged([_match_marked(piece, _DIRECT_KERNEL_ATTR) for piece in pieces])
        zero_op = "linalg.fill" if site.has_fill else "linalg.pack"
        handles.zero = merged([match_name(piece, zero_op) for piece in pieces])
        consumers = (
            [_match_marked(piece, _DIRECT_CONSUMER_ATTR) for piece in pieces]
            if site.consumers
            else []
        )
    else:
        pieces = _peel_edges(tile_nest, site, params, plan.shared, plan.pass_n)
        consumers = (
            [match_name(piece, "linalg.generic") for piece in pieces] if site.consumers else []
        )
    return consumers, [match_name(piece, "linalg.unpack") for piece in pieces]


def _vectorize_packing(
    handles: _Handles,
    partial_a: ir.Value | None,
    partial_b: ir.Value | None,
    params: MatmulParams,
    k_step: int,
) -> None:
    """Vectorize A's and B's packing steps (whole panels, then the partial one)."""
    structured.VectorizeOp(handles.pack_a, [1, k_step, params.reg_m])
    if partial_a is not None:
        structured.VectorizeOp(partial_a, [1, k_step, params.reg_m])
    if handles.pack_b is not None:
        structured.VectorizeOp(handles.pack_b, [1, k_step, params.reg_n])
    if partial_b is not None:
        structured.VectorizeOp(partial_b, [1, k_step, params.reg_n])


def _vectorize_pass_over_c(
    zero: ir.Value,
    unpacks: list[ir.Value],
    consumers: list[ir.Value],
    site: MatmulSite,
    params: MatmulParams,
) -> None:
    """Vectorize the zero fill of the tiles, the unpacks and the elementwise consumers."""
    if site.has_fill:
        structured.VectorizeOp(zero)
    else:
        structured.VectorizeOp(zero, [1, 1, params.reg_m, params.reg_n])
    for piece_unpack in unpacks:
        if site.consumers:
            # The tile unpack becomes a slice of the packed tile, read by the (masked)
            # consumers: a masked unpack write then a masked read would make bufferization
            # copy.
            structured.LowerUnPackOp(
                any_op(),
                any_op(),
                any_op(),
                any_op(),
                any_op(),
                piece_unpack,
                lowerUnpadLikeWithExtractSlice=True,
            )
        else:
            structured.VectorizeOp(piece_unpack, [1, 1, params.reg_m, params.reg_n])
    for piece_consumers in consumers:
        structured.VectorizeOp(piece_consumers, [params.reg_m, params.reg_n])


def _peel_edges(
    tile_nest: Any, site: MatmulSite, params: MatmulParams, shared: bool, pass_n: int
) -> list[ir.Value]:
    """Peel the pass over C's partial last row and column of register tiles (rows outer);
    returns the pieces: the partial row, the partial column of the full rows, the rest."""
    full, pieces = tile_nest.loops[0], []
    if partial_tiles(site.m, params.tile_m if shared else params.block_rows, params.reg_m):
        rows = loop.LoopPeelOp(any_op(), any_op(), full)
        full, pieces = rows.peeled_loop, [rows.remainder_loop]
    columns = tile_nest.loops[1]
    if pieces:  # the column loop of the full rows
        columns = transform.GetParentOp(
            any_op(), match_name(full, "linalg.unpack"), op_name="scf.for", deduplicate=True
        ).result
    if partial_tiles(site.n, pass_n if shared else params.tile_n, params.reg_n):
        peeled = loop.LoopPeelOp(any_op(), any_op(), columns)
        pieces.append(peeled.remainder_loop)
        columns = peeled.peeled_loop
    pieces.append(columns)
    return pieces


def _peel_direct_edges(tile_nest: Any, site: MatmulSite, params: MatmulParams) -> list[ir.Value]:
    """Peel the direct tiles' partial last column and row (columns outer, rows inner, each
    tile's kernel fused inside); returns the pieces: the partial column, the partial row
    of the full columns, the full tiles."""
    columns, rows = tile_nest.loops
    pieces = []
    if partial_tiles(site.n, params.tile_n, params.reg_n):
        peeled = loop.LoopPeelOp(any_op(), any_op(), columns)
        pieces.append(peeled.remainder_loop)
        # (The row loop's handle went with the peeled one: found again in the full part.)
        rows = transform.GetParentOp(
            any_op(),
            match_name(peeled.peeled_loop, "linalg.unpack"),
            op_name="scf.for",
            deduplicate=True,
        ).result
    if partial_tiles(site.m, params.tile_m, params.reg_m):
        peeled = loop.LoopPeelOp(any_op(), any_op(), rows)
        pieces.append(peeled.remainder_loop)
        rows = peeled.peeled_loop
    pieces.append(rows)
    return pieces


def _match_marked(target: ir.Value, attribute: str) -> ir.Value:
    """The ops in ``target`` carrying the unit attribute ``attribute``."""
    return structured.MatchOp(any_op(), target, op_attrs={attribute: ir.UnitAttr.get()}).result


def _direct_tiles(
    chain: list[ir.Value], handles: _Handles, site: MatmulSite, params: MatmulParams
) -> Any:
    """Tile the pass over C (the unpack and its consumers) and compute the register tiles
    inside it, columns outer as the kernel sweeps B's panels; each tile's accumulators
    start from its fused zero fill (or packed C init). With several row blocks, A is
    packed per row block in a loop around them, as on the packed-C path.

    Returns the register-tile loop nest; the kernel (tiled to its k loop), the zero fill
    and A's pack (moved into the row-block loop, if any) are updated in ``handles``, the
    kernel and consumers marked to be found again in each edge piece peeled later."""
    node, producers = chain[-1], list(reversed(chain[:-1]))

    def nest(sizes: list[int], interchange: list[int]) -> tuple:
        """Tile the pass over C and fuse the chain, the kernel and its zero fill into the
        new loop: each level's uses are slices of the level above."""
        nonlocal node, producers
        tiled = structured.TileUsingForOp(node, sizes=sizes, interchange=interchange)
        inner = tiled.loops[-1]
        node = tiled.tiled_linalg_op
        producers = [structured.FuseIntoContainingOp(op, inner).fused_op for op in producers]
        handles.kernel = structured.FuseIntoContainingOp(handles.kernel, inner).fused_op
        handles.zero = structured.FuseIntoContainingOp(handles.zero, inner).fused_op
        return tiled, inner

    if params.block_rows > params.tile_m:
        _, rows = nest([params.tile_m, 0], [0, 1])
        handles.pack_a = structured.FuseIntoContainingOp(handles.pack_a, rows).fused_op
    tiled, _ = nest([params.reg_m, params.reg_n], [1, 0])
    # The consumers: the tiled op and the fused producers but the unpack (the last of the
    # reversed chain); taken now, before the kernel's own tiling adds ops to the loop.
    consumers = [node, *producers[:-1]] if site.consumers else []
    k_tiled = structured.TileUsingForOp(handles.kernel, sizes=[0, 0, params.k_unroll, 0, 0])
    handles.kernel = k_tiled.tiled_linalg_op
    _mark_stream(k_tiled.loops[0], site, params)
    transform.AnnotateOp(handles.kernel, _DIRECT_KERNEL_ATTR)
    for consumer in consumers:
        transform.AnnotateOp(consumer, _DIRECT_CONSUMER_ATTR)
    return tiled


def _mark_stream(k_loop: ir.Value, site: MatmulSite, params: MatmulParams) -> None:
    """Mark the kernel's k loop to prefetch the packed constant B ahead (stream_prefetch)."""
    if site.prepacked_b and params.prefetch_b:
        distance = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), params.prefetch_b)
        value = transform.ParamConstantOp(transform.AnyParamType.get(), distance).param
        transform.AnnotateOp(k_loop, STREAM_PREFETCH_ATTR, param=value)


def _split_partial_panel(
    pack: ir.Value, extent: int, block: int, reg: int
) -> tuple[ir.Value, ir.Value | None]:
    """Split a packing (A's ``reg_m``-row or B's ``reg_n``-column panels) into its whole
    panels and the partial last one, when one block spans the dimension (``block`` >=
    ``extent``, so the panel count is static) and the extent is not whole panels: returns
    the packs of the whole panels and of the partial one (``pack`` and None when there is
    no split).

    Otherwise every packing step reads through a mask computed from the rows or columns
    left (``vmaskmovps``), not only the last panel's."""
    whole = extent // reg
    # (One whole panel: the split loop would have no remainder to peel; the operand is
    # tiny then.)
    if block < extent or whole < 2 or extent % reg == 0:
        return pack, None
    split = structured.TileUsingForOp(pack, sizes=[whole, 0])
    peeled = loop.LoopPeelOp(any_op(), any_op(), split.loops[0])
    return (
        match_name(peeled.peeled_loop, "linalg.pack"),
        match_name(peeled.remainder_loop, "linalg.pack"),
    )
