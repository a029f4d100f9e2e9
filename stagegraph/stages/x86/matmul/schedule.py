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
of B is packed twice (see ``packed_plan.shares_b``).

Without packing (``pack=False``) the block is register-tiled in place and the edge tiles are
vectorized with masks. The schedule stays on tensors; ``lowering.BUFFERIZE`` follows.

The sites come from :mod:`stagegraph.stages.x86.matmul.canonical` (labelled, canonicalized,
described); :mod:`stagegraph.stages.x86.matmul.broadcast_reads` runs on the scheduled payload. The
packed kernel is :mod:`.packed_kernel`, the register-tile steps :mod:`.register_tiles`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from stagegraph.mlir.bindings import ir, structured, transform
from stagegraph.mlir.walk import collect, defining_op, strip_attributes
from stagegraph.stages.common.transform import add_sequence, apply_schedule_module, new_schedule
from stagegraph.stages.common.transform_build import any_op, producer_of
from stagegraph.stages.x86.matmul.canonical import (
    SITE_ATTR,
    WIDEN_ATTR,
    WIDEN_LANES,
    MatmulSite,
)
from stagegraph.stages.x86.matmul.first_k_block import start_first_k_block_from_fill
from stagegraph.stages.x86.matmul.packed_kernel import packed_kernel
from stagegraph.stages.x86.matmul.pad_transposes import PAD_TRANSPOSES_ATTR, pad_transposes
from stagegraph.stages.x86.matmul.params import MatmulParams
from stagegraph.stages.x86.matmul.register_tiles import (
    consumer_of,
    lower_vectors,
    merged,
    unpacked_kernel,
)

# The functions a schedule's second sequence lowers the vectors of (see apply_schedule).
_LOWER_VECTORS_ATTR = "stagegraph.lower_vectors"
#: The named sequence of a matmul schedule that lowers its vectors.
LOWER_VECTORS_ENTRY = "lower_vectors"


def _schedule_site(func: ir.Value, mm: ir.Value, site: MatmulSite, params: MatmulParams) -> None:
    """Tile the matmul ``mm``'s last consumer into parallel blocks, fuse the chain, the fill
    and the widening copies into each block, then build the block's kernel."""
    chain = [mm]
    for _ in range(site.consumers):
        chain.append(consumer_of(chain[-1]))
    fill = producer_of(mm, 2) if site.has_fill else None
    unpack_b = producer_of(mm, 1) if site.prepacked_b else None  # (constant_pack)
    tiled = structured.TileUsingForallOp(chain[-1], tile_sizes=[params.block_rows, params.tile_n])
    forall = tiled.forall_op
    block_mm = tiled.tiled_op
    for producer in reversed(chain[:-1]):
        fused = structured.FuseIntoContainingOp(producer, forall)
        forall = fused.new_containing_op
        block_mm = fused.fused_op
    if unpack_b is not None:
        # The unpack of the packed constant, per block: the kernel's pack of B folds into it.
        forall = structured.FuseIntoContainingOp(unpack_b, forall).new_containing_op
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
        # (a widening linalg.copy, or an implicit GEMM's patch gather: patch_operands)
        copy = structured.MatchOp(
            any_op(), func, ops=["linalg.copy", "linalg.generic"], op_attrs=mark
        ).result
        fused = structured.FuseIntoContainingOp(copy, forall)
        forall = fused.new_containing_op
        widenings.append(fused.fused_op)
    if params.pack:
        packed_kernel(func, block_mm, site, params, widenings)
    else:
        for copy in widenings:
            if copy is not None:
                tiled = structured.TileUsingForOp(copy, sizes=[1, WIDEN_LANES])
                structured.VectorizeOp(
                    tiled.tiled_linalg_op, [1, WIDEN_LANES], vectorize_nd_extract=True
                )
        unpacked_kernel(func, block_mm, block_fill, site, params)


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
    for site, site_params in zip(sites, per_site, strict=True):
        kc = site_params.k_block(site.k) or site.k
        if kc % site_params.k_unroll or site.k % kc:
            raise ValueError(
                f"matmul {site.m}x{site.n}x{site.k} in @{site.function}: k_unroll="
                f"{site_params.k_unroll} and tile_k={site_params.tile_k} must divide k "
                f"(register tiles are static)"
            )
    # Eight f32 lanes: 256-bit vectors (AVX2), where the AVX2 transpose sequence applies.
    avx2_transposes = any(
        site.dtype == "f32" and site_params.vector_width == 8
        for site, site_params in zip(sites, per_site, strict=True)
    )
    module, seq = new_schedule()
    with ir.InsertionPoint(seq.body):
        if sites:
            funcs = merged(_schedule_all(seq.bodyTarget, sites, per_site))
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
        lower_vectors(marked, avx2_transposes)
        transform.YieldOp([])
    return module


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
    for func, mm, site, site_params in zip(funcs, handles, sites, params, strict=True):
        _schedule_site(func, mm, site, site_params)
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
    producers = [(2, site.has_fill), (1, site.prepacked_b)]
    producers += [(i, w) for i, w in enumerate(site.widened)]
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
    for (label, site), site_params in zip(sites, params, strict=True):
        mm = by_label.get(label)
        if mm is None:
            continue
        scope = outline(_site_ops(mm, site))
        if scope is None:
            in_place.append((mm, site, site_params))
            continue
        mm.attributes[SITE_ATTR] = ir.IntegerAttr.get(i64, 0)
        schedule = build_matmul_schedule(site_params, [site])
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
    schedule = build_matmul_schedule(
        [site_params for _, _, site_params in in_place], [s for _, s, _ in in_place]
    )
    if applied is not None:
        applied.append(schedule.operation.get_asm(assume_verified=True))
    apply_schedule(payload, schedule)
