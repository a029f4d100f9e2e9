"""Transform-dialect schedule for f32 matmuls on x86 (AVX-512 / AVX2), built with the Python API.

Per matmul (with its zero fill and a chain of elementwise consumers such as bias + ReLU):

1. tile the last consumer into ``tile_m x tile_n`` blocks with ``scf.forall`` and fuse the
   chain, the matmul and the fill into it (no separate pass over C);
2. pack the block with ``structured.pack`` into ``reg_m``-row panels of A and ``reg_n``-column
   panels of B (zero padding makes every register tile static, so odd shapes need no masks);
   the unpack and the elementwise consumers then run together per register tile;
3. tile the packed contraction into ``reg_m x reg_n x k_unroll`` register tiles, vectorize,
   hoist the accumulator out of the k loop and lower the contraction to ``vector.fma``.
   With one K block and whole register tiles, each tile is computed inside the pass that
   writes C and stores its accumulators there: no packed C at all.

On several threads with several K blocks (``share_b``) the K-block loop runs outermost instead:
per K block the threads pack B's panels together and then take the row blocks, so no K block
of B is packed twice (see ``_shares_b``).

Without packing (``pack=False``) the block is register-tiled in place and the edge tiles are
vectorized with masks. The schedule stays on tensors; ``lowering.BUFFERIZE`` follows.

The sites come from :mod:`stagegraph.stages.x86.matmul_canonical` (labelled, canonicalized,
described); :mod:`stagegraph.stages.x86.broadcast_reads` runs on the scheduled payload.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from stagegraph.mlir.bindings import dialect, ir, loop, structured, transform
from stagegraph.mlir.walk import collect, defining_op, strip_attributes
from stagegraph.stages.common.transform import add_sequence, apply_schedule_module, new_schedule
from stagegraph.stages.common.transform_build import (
    any_op,
    apply_patterns,
    match_name,
    producer_of,
)
from stagegraph.stages.x86.first_k_block import K_BLOCKS_ATTR, start_first_k_block_from_fill
from stagegraph.stages.x86.matmul_canonical import (
    SITE_ATTR,
    WIDEN_ATTR,
    WIDEN_LANES,
    MatmulSite,
)
from stagegraph.stages.x86.matmul_params import MatmulParams, pack_k_step, partial_tiles
from stagegraph.stages.x86.pad_transposes import PAD_TRANSPOSES_ATTR, pad_transposes
from stagegraph.stages.x86.prefetch_rows import PREFETCH_ROWS_ATTR

_tvec = dialect("transform.vector")
_ttensor = dialect("transform.tensor")
# Marks on the direct tiles' kernel and consumers (see _peel_direct_edges).
_DIRECT_KERNEL_ATTR = "stagegraph.direct_kernel"
_DIRECT_CONSUMER_ATTR = "stagegraph.direct_consumer"
# The functions a schedule's second sequence lowers the vectors of (see apply_schedule).
_LOWER_VECTORS_ATTR = "stagegraph.lower_vectors"
#: The named sequence of a matmul schedule that lowers its vectors.
LOWER_VECTORS_ENTRY = "lower_vectors"


def _schedule_site(func: ir.Value, mm: ir.Value, site: MatmulSite, p: MatmulParams) -> None:
    chain = [mm]
    for _ in range(site.consumers):
        chain.append(transform.GetConsumersOfResult(any_op(), chain[-1], 0).result)
    fill = producer_of(mm, 2) if site.has_fill else None
    tiled = structured.TileUsingForallOp(chain[-1], tile_sizes=[p.block_rows, p.tile_n])
    forall = tiled.forall_op
    block_mm = tiled.tiled_op
    for producer in reversed(chain[:-1]):
        fused = structured.FuseIntoContainingOp(producer, forall)
        forall = fused.new_containing_op
        block_mm = fused.fused_op
    block_fill = None
    if fill is not None:
        fused = structured.FuseIntoContainingOp(fill, forall)
        forall, block_fill = fused.new_containing_op, fused.fused_op
    widenings: list[ir.Value | None] = []
    for operand, widened in enumerate(site.widened):
        if not widened:
            widenings.append(None)
            continue
        i64 = ir.IntegerType.get_signless(64)
        mark = {WIDEN_ATTR: ir.IntegerAttr.get(i64, 2 * (site.source or 0) + operand)}
        copy = structured.MatchOp(any_op(), func, ops=["linalg.copy"], op_attrs=mark).result
        fused = structured.FuseIntoContainingOp(copy, forall)
        forall = fused.new_containing_op
        widenings.append(fused.fused_op)
    if p.pack:
        _packed_kernel(func, forall, block_mm, site, p, widenings)
    else:
        for copy in widenings:
            if copy is not None:
                tiled = structured.TileUsingForOp(copy, sizes=[1, WIDEN_LANES])
                structured.VectorizeOp(tiled.tiled_linalg_op, [1, WIDEN_LANES])
        _unpacked_kernel(func, forall, block_mm, block_fill, site, p)


def _cleanup(func: ir.Value) -> None:
    apply_patterns(
        func,
        structured.ApplyFoldIntoPackAndUnpackPatternsOp,
        structured.ApplyTilingCanonicalizationPatternsOp,
        transform.ApplyCanonicalizationPatternsOp,
    )


def _packed_kernel(
    func: ir.Value,
    forall: ir.Value,
    block_mm: ir.Value,
    site: MatmulSite,
    p: MatmulParams,
    widenings: Sequence[ir.Value | None],
) -> None:
    packed = structured.PackOp(
        any_op(), block_mm, static_packed_sizes=[p.reg_m, p.reg_n, 0], packed_sizes=[]
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
    _cleanup(func)
    # Re-find the ops from the unpack (patterns replace ops; a one-block forall is even
    # inlined). Earlier sites' unpacks are vectorized already, so the match is this site's.
    unpack = match_name(func, "linalg.unpack")
    kernel = producer_of(unpack, 0)
    pack_a, pack_b = producer_of(kernel, 0), producer_of(kernel, 1)
    # The packed C starts as zeros (a fused fill) or as the packed init (C += A B).
    zero = producer_of(kernel, 2)
    # Kernel dims: (mo, no, k, mi, ni); loops: no, mo, k.
    tk = p.tile_k if p.tile_k and p.tile_k < site.k else 0
    # One K block and whole register tiles: the tiles write C themselves (see
    # _writes_c_directly) and the kernel skips the packed-C path's tiling below.
    direct = _writes_c_directly(site, p, tk, widenings)
    shared = _shares_b(site, p, tk, direct)
    # Columns per block of the parallel pass over C (shared): a multiple of reg_n below N
    # unless whole panels tile N. An unpack block spanning a partial panel unpacks into a
    # padded temporary that is then copied to C.
    panels = -(-site.n // p.reg_n)
    pass_n = site.n if site.n % p.reg_n == 0 else -(-panels // 2) * p.reg_n
    if tk:
        # Pack A and B one K block at a time, inside the K-block loop (BLIS order): the
        # packed slices (tile_m x kc, kc x tile_n) are written just before the register
        # tiles read them, while they are still in L2, instead of packing all of K first
        # (a packed B of K x tile_n overflows L2 and comes back from L3 / memory).
        by_k = structured.TileUsingForOp(kernel, sizes=[0, 0, tk, 0, 0])
        kernel, kloop = by_k.tiled_linalg_op, by_k.loops[0]
        fused = structured.FuseIntoContainingOp(pack_a, kloop)
        pack_a, kloop = fused.fused_op, fused.new_containing_op
        pack_b = structured.FuseIntoContainingOp(pack_b, kloop).fused_op
        # A widening copy follows its pack into the K-block loop (and below, into the pack
        # step): fusion only reaches a producer used directly inside the container.
        widenings = [
            None if copy is None else structured.FuseIntoContainingOp(copy, kloop).fused_op
            for copy in widenings
        ]
        if site.has_fill:  # its first K block may start from the fill (see first_k_block)
            transform.AnnotateOp(kloop, K_BLOCKS_ATTR)
    if not direct and p.block_rows > p.tile_m:
        # A block of several tile_m row blocks: B is packed once per K block for all of
        # them, A one tile_m x kc slice at a time (the slice the register tiles sweep).
        # Shared: the threads take the row blocks of each K block.
        row_sizes = [p.tile_m // p.reg_m, 0, 0, 0, 0]
        if shared:
            by_m = structured.TileUsingForallOp(kernel, tile_sizes=row_sizes)
            kernel, rows = by_m.tiled_op, by_m.forall_op
        else:
            by_m = structured.TileUsingForOp(kernel, sizes=row_sizes)
            kernel, rows = by_m.tiled_linalg_op, by_m.loops[0]
        fused = structured.FuseIntoContainingOp(pack_a, rows)
        pack_a, rows = fused.fused_op, fused.new_containing_op
        if widenings[0] is not None:
            widenings = [
                structured.FuseIntoContainingOp(widenings[0], rows).fused_op,
                widenings[1],
            ]
    if tk or p.block_rows > p.tile_m:
        # Each K (and M) block packs into its own buffer (a slice of an empty tensor is an
        # empty tensor), so every block rewrites the same cache-resident lines.
        apply_patterns(func, _ttensor.ApplyFoldTensorEmptyPatternsOp)
    chain = [unpack]
    for _ in range(site.consumers):
        chain.append(transform.GetConsumersOfResult(any_op(), chain[-1], 0).result)
    if direct:
        tile_nest, kernel, zero, consumers, pack_a = _direct_tiles(
            chain, kernel, zero, pack_a, site, p
        )
        # Marked, to be found again in each edge piece peeled below.
        transform.AnnotateOp(kernel, _DIRECT_KERNEL_ATTR)
        for consumer in consumers:
            transform.AnnotateOp(consumer, _DIRECT_CONSUMER_ATTR)
    else:
        kernel = structured.TileUsingForOp(
            kernel, sizes=[1, 1, p.k_unroll, 0, 0], interchange=[1, 0, 2, 3, 4]
        ).tiled_linalg_op
        # The packed C is zeroed (or the init packed) tile by tile with vector stores.
        if shared:  # (each thread a share of the column panels)
            zero = structured.TileUsingForallOp(
                zero, num_threads=[p.threads] + [0] * (3 if site.has_fill else 1)
            ).tiled_op
        zero = structured.TileUsingForOp(
            zero, sizes=[1, 1, 0, 0] if site.has_fill else [1, 1]
        ).tiled_linalg_op
        # Unpack and the elementwise chain run together per register tile: one pass over C.
        node, producers = chain[-1], list(reversed(chain[:-1]))
        if shared:  # (the threads take its blocks)
            blocks = structured.TileUsingForallOp(
                node, tile_sizes=[p.tile_m, 0 if pass_n == site.n else pass_n]
            )
            node, forall = blocks.tiled_op, blocks.forall_op
            for i, producer in enumerate(producers):
                fused = structured.FuseIntoContainingOp(producer, forall)
                producers[i], forall = fused.fused_op, fused.new_containing_op
        tile_nest = structured.TileUsingForOp(node, sizes=[p.reg_m, p.reg_n])
        for producer in producers:
            structured.FuseIntoContainingOp(producer, tile_nest.loops[1])
    # Pack steps must tile the K block evenly, or every step gets a k mask.
    kp = pack_k_step(tk or site.k)
    partial_a = partial_b = None
    if widenings[0] is None:
        pack_a, partial_a = _split_partial_panel(pack_a, site.m, p.tile_m, p.reg_m)
    # A widened input is converted per packing step, into the panel being packed.
    tiled_a = structured.TileUsingForOp(pack_a, sizes=[1, kp])
    if not site.transpose_a:  # each step reads reg_m rows of A: prefetch ahead along them
        transform.AnnotateOp(tiled_a.loops[1], PREFETCH_ROWS_ATTR)
    # B[k, n] packs k-outer: each step reads kp rows of B along n (contiguous), instead of
    # walking one reg_n-wide column strip down all of K (a new page every row).
    b_order = [0, 1] if site.transpose_b else [1, 0]
    if widenings[1] is None:
        pack_b, partial_b = _split_partial_panel(pack_b, site.n, p.tile_n, p.reg_n)
    if shared:  # the threads pack B's whole panels together (the partial one follows)
        pack_b = structured.TileUsingForallOp(pack_b, num_threads=[p.threads, 0]).tiled_op
    tiled_b = structured.TileUsingForOp(pack_b, sizes=[1, kp], interchange=b_order)
    pack_a, pack_b = tiled_a.tiled_linalg_op, tiled_b.tiled_linalg_op
    if partial_a is not None:
        partial_a = structured.TileUsingForOp(partial_a, sizes=[1, kp]).tiled_linalg_op
    if partial_b is not None:
        partial_b = structured.TileUsingForOp(
            partial_b, sizes=[1, kp], interchange=b_order
        ).tiled_linalg_op
    steps = []
    for copy, tiled, panel in zip(
        widenings,
        (tiled_a, tiled_b),
        ([kp, p.reg_m] if site.transpose_a else [p.reg_m, kp],
         [p.reg_n, kp] if site.transpose_b else [kp, p.reg_n]),
        strict=True,
    ):  # fmt: skip
        if copy is None:
            continue
        if tk or p.block_rows > p.tile_m:
            # Inside the K (and M) block loops the copy widens its block's slice once, in
            # vector steps, just before the packing reads it (still in cache).
            step = structured.TileUsingForOp(copy, sizes=[1, WIDEN_LANES]).tiled_linalg_op
            steps.append((step, [1, WIDEN_LANES]))
        else:
            steps.append((structured.FuseIntoContainingOp(copy, tiled.loops[1]).fused_op, panel))
    # Peel the partial last row and column of tiles: the full tiles then have static
    # shapes and store to C unmasked (a masked vmaskmovps store is slow, several uops).
    # (Peeling fails on a loop whose static trip count has no remainder: skip those.)
    if direct:
        pieces = _peel_direct_edges(tile_nest, site, p)
        kernel = _merged([_match_marked(piece, _DIRECT_KERNEL_ATTR) for piece in pieces])
        zero = _merged(
            [
                match_name(piece, "linalg.fill" if site.has_fill else "linalg.pack")
                for piece in pieces
            ]
        )
        consumers = (
            [_match_marked(piece, _DIRECT_CONSUMER_ATTR) for piece in pieces]
            if site.consumers
            else []
        )
    else:
        pieces = _peel_edges(tile_nest, site, p, shared, pass_n)
        consumers = (
            [match_name(piece, "linalg.generic") for piece in pieces] if site.consumers else []
        )
    unpacks = [match_name(piece, "linalg.unpack") for piece in pieces]
    _cleanup(func)
    if partial_a is not None or partial_b is not None:
        # The whole panels' row (column) counts are min(reg, rows left): loop bounds prove
        # them reg, so those steps vectorize without a mask.
        apply_patterns(func, loop.ApplyForLoopCanonicalizationPatternsOp)
    structured.VectorizeOp(kernel)
    for step, panel in steps:
        structured.VectorizeOp(step, panel)
    structured.VectorizeOp(pack_a, [1, kp, p.reg_m])
    if partial_a is not None:
        structured.VectorizeOp(partial_a, [1, kp, p.reg_m])
    structured.VectorizeOp(pack_b, [1, kp, p.reg_n])
    if partial_b is not None:
        structured.VectorizeOp(partial_b, [1, kp, p.reg_n])
    if site.has_fill:
        structured.VectorizeOp(zero)
    else:
        structured.VectorizeOp(zero, [1, 1, p.reg_m, p.reg_n])
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
            structured.VectorizeOp(piece_unpack, [1, 1, p.reg_m, p.reg_n])
    for piece_consumers in consumers:
        structured.VectorizeOp(piece_consumers, [p.reg_m, p.reg_n])
    _hoist_accumulators(func)


def _peel_edges(
    tile_nest: Any, site: MatmulSite, p: MatmulParams, shared: bool, pass_n: int
) -> list[ir.Value]:
    """Peel the pass over C's partial last row and column of register tiles (rows outer);
    returns the pieces: the partial row, the partial column of the full rows, the rest."""
    full, pieces = tile_nest.loops[0], []
    if partial_tiles(site.m, p.tile_m if shared else p.block_rows, p.reg_m):
        rows = loop.LoopPeelOp(any_op(), any_op(), full)
        full, pieces = rows.peeled_loop, [rows.remainder_loop]
    columns = tile_nest.loops[1]
    if pieces:  # the column loop of the full rows
        columns = transform.GetParentOp(
            any_op(), match_name(full, "linalg.unpack"), op_name="scf.for", deduplicate=True
        ).result
    if partial_tiles(site.n, pass_n if shared else p.tile_n, p.reg_n):
        peeled = loop.LoopPeelOp(any_op(), any_op(), columns)
        pieces.append(peeled.remainder_loop)
        columns = peeled.peeled_loop
    pieces.append(columns)
    return pieces


def _peel_direct_edges(tile_nest: Any, site: MatmulSite, p: MatmulParams) -> list[ir.Value]:
    """Peel the direct tiles' partial last column and row (columns outer, rows inner, each
    tile's kernel fused inside); returns the pieces: the partial column, the partial row
    of the full columns, the full tiles."""
    columns, rows = tile_nest.loops
    pieces = []
    if partial_tiles(site.n, p.tile_n, p.reg_n):
        peeled = loop.LoopPeelOp(any_op(), any_op(), columns)
        pieces.append(peeled.remainder_loop)
        # (The row loop's handle went with the peeled one: found again in the full part.)
        rows = transform.GetParentOp(
            any_op(),
            match_name(peeled.peeled_loop, "linalg.unpack"),
            op_name="scf.for",
            deduplicate=True,
        ).result
    if partial_tiles(site.m, p.tile_m, p.reg_m):
        peeled = loop.LoopPeelOp(any_op(), any_op(), rows)
        pieces.append(peeled.remainder_loop)
        rows = peeled.peeled_loop
    pieces.append(rows)
    return pieces


def _match_marked(target: ir.Value, attribute: str) -> ir.Value:
    """The ops in ``target`` carrying the unit attribute ``attribute``."""
    return structured.MatchOp(any_op(), target, op_attrs={attribute: ir.UnitAttr.get()}).result


def _writes_c_directly(
    site: MatmulSite, p: MatmulParams, tk: int, widenings: Sequence[ir.Value | None]
) -> bool:
    """Whether the register tiles can be computed inside the pass that writes C: one K
    block (the accumulators need no packed C between blocks) and, with several row blocks,
    no widening copy of A (it would have to follow A's packing into the row-block loop).
    Partial edge tiles are peeled into pieces of their own, each with its kernel
    (:func:`_peel_direct_edges`), unless an elementwise chain follows (the pieces' tiles
    then still slice a whole packed C, left allocated) or several parallel blocks each
    hold several row blocks (229x65x571 on two threads: 120-row blocks of 60-row blocks,
    the last partial; the fusion into the peeled row loop fails). Those keep packed C.

    Then no packed C exists: no zeroing pass, no pass that reads it back to write C. Zen 1,
    one thread: 256^3 1.4% faster, 1024x1024x256 (four row blocks) 6%, 2048x512x128 14%;
    the dev set's matmuls 1.01-1.15x (l1_009 tall-skinny 1.13x, l1_010 3-D 1.15x). With
    edge tiles (Zen 4, one thread): x86-64-v3 256^3 (6-row tiles, 4 rows left) 1.025x;
    AVX-512 1000^3 (32-column tiles, 8 columns left) 1.021x; 100x70x200, 256x250x256,
    500x500x250 and a 100-row MLP 0.99-1.01x. (With row blocks and a partial column, the
    unpack's row-block tiling still writes a padded temporary that is copied to C, as on
    the packed-C path; 1000^3 on AVX-512 is that case.)

    Several K blocks keep packed C: computing the last block's tiles in the pass over C
    (its kernel split off, its packing fused into one-trip loops) measured 0.98-0.99x at
    512^3 and 1024^3, the strided stores to C costing what the unpack pass saved."""
    one_row_block_loop = p.block_rows <= p.tile_m or p.block_rows >= site.m
    edges_ok = not site.consumers and one_row_block_loop
    return (
        not tk
        and (p.whole_register_tiles(site.m, site.n) or edges_ok)
        and not (p.block_rows > p.tile_m and widenings[0] is not None)
    )


def _shares_b(site: MatmulSite, p: MatmulParams, tk: int, direct: bool) -> bool:
    """Whether the threads share each K block's packed B (``MatmulParams.share_b``): the
    K-block loop runs outermost and serially; per K block the threads pack B's panels
    together, then take the row blocks, each packing its own A slice. The passes that zero
    packed C (unless the first K block starts from the fill: first_k_block) and write C
    back are parallel loops of their own.

    Otherwise each parallel block packs its own B: with row blocks as the parallel blocks,
    every K block of B is packed once per block (four times at 1024^3 on two threads).
    Needs several K blocks, packed C, one parallel block spanning C (the threads share the
    loops inside it instead) and several row blocks to share."""
    return (
        p.share_b
        and p.threads > 1
        and bool(tk)
        and not direct
        and p.block_rows >= site.m
        and p.tile_n >= site.n
        and p.block_rows > p.tile_m
        and site.n > p.reg_n
    )


def _direct_tiles(
    chain: list[ir.Value],
    kernel: ir.Value,
    zero: ir.Value,
    pack_a: ir.Value,
    site: MatmulSite,
    p: MatmulParams,
) -> tuple:
    """Tile the pass over C (the unpack and its consumers) and compute the register tiles
    inside it, columns outer as the kernel sweeps B's panels; each tile's accumulators
    start from its fused zero fill (or packed C init). With several row blocks, A is
    packed per row block in a loop around them, as on the packed-C path.

    Returns the register-tile loop nest, the tiled kernel (its k loop), the zero fill,
    the consumers' handles and A's pack (moved into the row-block loop, if any)."""
    node, producers = chain[-1], list(reversed(chain[:-1]))

    def nest(sizes: list[int], interchange: list[int]) -> tuple:
        """Tile the pass over C and fuse the chain, the kernel and its zero fill into the
        new loop: each level's uses are slices of the level above."""
        nonlocal node, producers, kernel, zero
        tiled = structured.TileUsingForOp(node, sizes=sizes, interchange=interchange)
        inner = tiled.loops[-1]
        node = tiled.tiled_linalg_op
        producers = [structured.FuseIntoContainingOp(op, inner).fused_op for op in producers]
        kernel = structured.FuseIntoContainingOp(kernel, inner).fused_op
        zero = structured.FuseIntoContainingOp(zero, inner).fused_op
        return tiled, inner

    if p.block_rows > p.tile_m:
        _, rows = nest([p.tile_m, 0], [0, 1])
        pack_a = structured.FuseIntoContainingOp(pack_a, rows).fused_op
    tiled, _ = nest([p.reg_m, p.reg_n], [1, 0])
    # The consumers: the tiled op and the fused producers but the unpack (the last of the
    # reversed chain); taken now, before the kernel's own tiling adds ops to the loop.
    consumers = [node, *producers[:-1]] if site.consumers else []
    kernel = structured.TileUsingForOp(kernel, sizes=[0, 0, p.k_unroll, 0, 0]).tiled_linalg_op
    return tiled, kernel, zero, consumers, pack_a


def _split_partial_panel(
    pack: ir.Value, extent: int, block: int, reg: int
) -> tuple[ir.Value, ir.Value | None]:
    """Split a packing (A's ``reg_m``-row or B's ``reg_n``-column panels) into its whole
    panels and the partial last one, when one block spans the dimension (``block`` >=
    ``extent``, so the panel count is static) and the extent is not whole panels: returns
    the packs of the whole panels and of the partial one (``pack`` and None when there is
    no split).

    Otherwise every packing step reads through a mask computed from the rows or columns
    left (``vmaskmovps``), not only the last panel's. Zen 1, one thread: the masked B
    packing took 2.0% of 1000^3, the unmasked one 0.8% of 1024^3."""
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


def _unpacked_kernel(
    func: ir.Value,
    forall: ir.Value,
    block_mm: ir.Value,
    block_fill: ir.Value | None,
    site: MatmulSite,
    p: MatmulParams,
) -> None:
    """Register tiles in place (no packing): edge tiles are vectorized with masks."""
    outputs = []
    if site.consumers:
        chain = [transform.GetConsumersOfResult(any_op(), block_mm, 0).result]
        for _ in range(site.consumers - 1):
            chain.append(transform.GetConsumersOfResult(any_op(), chain[-1], 0).result)
        tiled = structured.TileUsingForOp(chain[-1], sizes=[p.reg_m, p.reg_n])
        outputs = [tiled.tiled_linalg_op]
        for producer in reversed(chain[:-1]):
            outputs.append(structured.FuseIntoContainingOp(producer, tiled.loops[1]).fused_op)
    tk = p.tile_k if p.tile_k and p.tile_k < site.k else 0
    if tk:
        block_mm = structured.TileUsingForOp(block_mm, sizes=[0, 0, tk]).tiled_linalg_op
    kernel = structured.TileUsingForOp(
        block_mm, sizes=[p.reg_m, p.reg_n, p.k_unroll], interchange=[1, 0, 2]
    ).tiled_linalg_op
    if block_fill is not None:
        block_fill = structured.TileUsingForOp(block_fill, sizes=[p.reg_m, p.reg_n]).tiled_linalg_op
    _cleanup(func)
    structured.VectorizeOp(kernel, [p.reg_m, p.reg_n, p.k_unroll])
    if block_fill is not None:
        structured.VectorizeOp(block_fill, [p.reg_m, p.reg_n])
    for op in outputs:
        structured.VectorizeOp(op, [p.reg_m, p.reg_n])
    _hoist_accumulators(func)


def _hoist_accumulators(func: ir.Value) -> None:
    """Keep the register tile in registers across the k loop."""
    apply_patterns(
        func,
        _tvec.ApplyVectorReductionToContractPatternsOp,
        _tvec.ApplyTransferPermutationPatternsOp,
        transform.ApplyCanonicalizationPatternsOp,
    )
    # Only now drop unit dims (earlier it hides broadcasts from the contraction folding), so
    # the hoisted accumulator is a plain reg_m x reg_n vector.
    apply_patterns(
        func,
        _tvec.ApplyCastAwayVectorLeadingOneDimPatternsOp,
        transform.ApplyCanonicalizationPatternsOp,
    )
    contract = match_name(func, "vector.contract")
    # No k loop is left when k fits one step; then there is nothing to hoist.
    kloop = transform.GetParentOp(
        any_op(), contract, op_name="scf.for", allow_empty_results=True
    ).result
    loop.HoistLoopInvariantSubsetsOp(kloop)
    loop.HoistLoopInvariantSubsetsOp(kloop)


def _lower_vectors(func: ir.Value, avx2_transposes: bool = False) -> None:
    """Contraction -> outer products -> FMAs; n-D transfers stay for the unrolling pass.

    ``avx2_transposes``: lower the 4x8 and 8x8 f32 transposes of A's packing (a ``reg_m x
    8`` block of rows becomes eight ``reg_m``-wide columns) with upstream's AVX2 sequence of
    in-lane unpacks and shuffles, not one flat 32- or 64-element shuffle that LLVM turns
    into lane-crossing permutes (3 uops each on Zen 1). Zen 1, one thread: 256^3 1.3%
    faster, 1024^3 0.5%. A 5-7 row block was padded to 8x8 before this runs (see
    pad_transposes), so it takes the 8x8 sequence too."""
    apply_patterns(func, _tvec.ApplyLowerMaskedTransfersPatternsOp, _tvec.ApplyLowerMasksPatternsOp)
    apply_patterns(
        func,
        _ttensor.ApplyFoldTensorSubsetOpsIntoVectorTransfersPatternsOp,
        _tvec.ApplyCastAwayVectorLeadingOneDimPatternsOp,
        _tvec.ApplyTransferPermutationPatternsOp,
        transform.ApplyCanonicalizationPatternsOp,
    )
    apply_patterns(
        func,
        lambda: _tvec.ApplyLowerContractionPatternsOp(
            lowering_strategy=_tvec.VectorContractLowering.OuterProduct
        ),
    )
    apply_patterns(func, _tvec.ApplyLowerOuterProductPatternsOp)
    apply_patterns(
        func,
        lambda: _tvec.ApplyLowerTransposePatternsOp(
            lowering_strategy=_tvec.VectorTransposeLowering.Shuffle16x16,
            avx2_lowering_strategy=avx2_transposes,
        ),
        _tvec.ApplyLowerShapeCastPatternsOp,
    )
    apply_patterns(
        func,
        _tvec.ApplyTransferPermutationPatternsOp,
        lambda: _tvec.ApplyLowerTransferPatternsOp(max_transfer_rank=1),
    )
    apply_patterns(func, transform.ApplyCanonicalizationPatternsOp)
    # Equal block offsets must be one SSA value, or bufferization copies each block.


def build_matmul_schedule(
    params: MatmulParams | Sequence[MatmulParams], sites: Sequence[MatmulSite]
) -> ir.Module:
    """A transform module whose ``__transform_main`` schedules every matmul in ``sites``.

    ``sites`` comes from :func:`find_matmuls` on the payload (walk order); ``params`` is one
    model for all of them or one per site. Build inside the payload's context.
    """
    per_site = [params] * len(sites) if isinstance(params, MatmulParams) else list(params)
    if len(per_site) != len(sites):
        raise ValueError(f"{len(per_site)} params for {len(sites)} matmuls")
    for site, p in zip(sites, per_site, strict=True):
        kc = p.tile_k if p.tile_k and p.tile_k < site.k else site.k
        if kc % p.k_unroll or site.k % kc:
            raise ValueError(
                f"matmul {site.m}x{site.n}x{site.k} in @{site.function}: k_unroll="
                f"{p.k_unroll} and tile_k={p.tile_k} must divide k (register tiles are static)"
            )
    # Eight f32 lanes: 256-bit vectors (AVX2), where the AVX2 transpose sequence applies.
    avx2_transposes = any(
        site.dtype == "f32" and p.vector_width == 8 for site, p in zip(sites, per_site, strict=True)
    )
    module, seq = new_schedule()
    with ir.InsertionPoint(seq.body):
        if sites:
            funcs = _merged(_schedule_all(seq.bodyTarget, sites, per_site))
            transform.AnnotateOp(funcs, _LOWER_VECTORS_ATTR)
            if avx2_transposes:
                transform.AnnotateOp(funcs, PAD_TRANSPOSES_ATTR)
        transform.YieldOp([])
    # Vector lowering is a second sequence: apply_schedule pads A's packing transposes
    # between the two (see pad_transposes).
    lower = add_sequence(module, LOWER_VECTORS_ENTRY)
    with ir.InsertionPoint(lower.body):
        marked = structured.MatchOp(
            any_op(),
            lower.bodyTarget,
            ops=["func.func"],
            op_attrs={_LOWER_VECTORS_ATTR: ir.UnitAttr.get()},
        ).result
        _lower_vectors(marked, avx2_transposes)
        transform.YieldOp([])
    return module


def _merged(handles: list[ir.Value]) -> ir.Value:
    if len(handles) == 1:
        return handles[0]
    return transform.MergeHandlesOp(handles, deduplicate=True).result


def _schedule_all(
    root: ir.Value, sites: Sequence[MatmulSite], params: list[MatmulParams]
) -> list[ir.Value]:
    i64 = ir.IntegerType.get_signless(64)
    handles = [
        structured.MatchOp(
            any_op(), root, ops=["linalg.matmul"], op_attrs={SITE_ATTR: ir.IntegerAttr.get(i64, i)}
        ).result
        for i in range(len(sites))
    ]
    funcs = [transform.GetParentOp(any_op(), h, op_name="func.func").result for h in handles]
    for func, mm, site, p in zip(funcs, handles, sites, params, strict=True):
        _schedule_site(func, mm, site, p)
    return funcs


def apply_schedule(payload: ir.Module, schedule: ir.Module) -> None:
    """Run a schedule from :func:`build_matmul_schedule` on ``payload`` (in place): its
    ``__transform_main`` (tiling, packing, vectorization), the padding of A's packing
    transposes, then its vector lowering."""
    apply_schedule_module(payload, schedule)
    pad_transposes(payload)
    apply_schedule_module(payload, schedule, LOWER_VECTORS_ENTRY)
    strip_attributes(payload, SITE_ATTR, _LOWER_VECTORS_ATTR)
    start_first_k_block_from_fill(payload)


def _site_ops(mm: ir.Operation, site: MatmulSite) -> list[ir.Operation]:
    """The ops the schedule of ``site`` rewrites, in program order: its fill and widening
    copies (when only the matmul reads them), the matmul, its elementwise chain."""
    block = mm.block
    ops = []
    producers = [(2, site.has_fill)] + [(i, w) for i, w in enumerate(site.widened)]
    for operand, present in producers:
        owner = defining_op(mm.operands[operand]) if present else None
        if owner is not None and owner.block == block and len(list(owner.results[0].uses)) == 1:
            ops.append(owner)
    ops.sort(key=functools.cmp_to_key(lambda a, b: -1 if a.is_before_in_block(b) else 1))
    ops.append(mm)
    op = mm
    for _ in range(site.consumers):
        op = next(iter(op.results[0].uses)).owner.operation
        ops.append(op)
    return ops


def schedule_matmuls(
    payload: ir.Module,
    sites: Sequence[tuple[int, MatmulSite]],
    params: Sequence[MatmulParams],
    applied: list[str] | None = None,
) -> None:
    """Schedule each of ``sites`` (its ``SITE_ATTR`` label from :func:`find_matmuls`, its
    description) with its ``params``: :func:`build_matmul_schedule` of that site alone.

    Each site is moved into a scratch module with the ops its schedule rewrites
    (:func:`stagegraph.stages.common.scope.outline`), scheduled there and moved back. The
    schedule's function-wide steps cost time proportional to the payload module around
    them: pattern sets walk the function, and both ``fuse_into_containing_op`` and every
    failed pattern match under ``apply_patterns`` (the transform interpreter's tracking
    listener) print an op, which numbers and verifies the whole module. In a scratch module
    that is the site, so compile time stays linear in the number of matmuls. Sites that
    cannot be moved are scheduled in place, together. The transform modules applied are
    appended to ``applied`` as text.
    """
    from stagegraph.stages.common.scope import outline

    by_label = {
        ir.IntegerAttr(op.attributes[SITE_ATTR]).value: op
        for op in collect(
            payload, lambda op: op.name == "linalg.matmul" and SITE_ATTR in op.attributes
        )
    }
    i64 = ir.IntegerType.get_signless(64, payload.context)
    in_place: list[tuple[ir.Operation, MatmulSite, MatmulParams]] = []
    for (label, site), p in zip(sites, params, strict=True):
        mm = by_label.get(label)
        if mm is None:
            continue
        scope = outline(_site_ops(mm, site))
        if scope is None:
            in_place.append((mm, site, p))
            continue
        mm.attributes[SITE_ATTR] = ir.IntegerAttr.get(i64, 0)
        schedule = build_matmul_schedule(p, [site])
        if applied is not None:
            applied.append(schedule.operation.get_asm(assume_verified=True))
        try:
            apply_schedule(scope.module, schedule)
        finally:
            scope.inline()
    strip_attributes(payload, SITE_ATTR)
    if not in_place:
        return
    for i, (mm, _, _) in enumerate(in_place):
        mm.attributes[SITE_ATTR] = ir.IntegerAttr.get(i64, i)
    schedule = build_matmul_schedule([p for _, _, p in in_place], [s for _, s, _ in in_place])
    if applied is not None:
        applied.append(schedule.operation.get_asm(assume_verified=True))
    apply_schedule(payload, schedule)
