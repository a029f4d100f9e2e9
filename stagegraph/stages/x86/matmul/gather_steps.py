"""The packed kernel's packing of B when B is an implicit GEMM's patch gather
(:mod:`.patch_operands`): the gather is fused into every step that packs B's panels, so
each step gathers its ``k_step x reg_n`` tile of patches from the input and stores it in
the panel. Every step must have a static shape (a masked ``vector.gather`` of a unit-dim
tile fails to verify): the whole panels and the partial last one are split apart, each
with its own copy of the gather. :mod:`.packed_kernel` calls these from its packing
phase."""

from __future__ import annotations

from typing import Any

from stagegraph.mlir.bindings import dialect, ir, loop, structured, transform
from stagegraph.stages.common.transform_build import any_op, apply_patterns, match_name
from stagegraph.stages.x86.matmul.canonical import MatmulSite
from stagegraph.stages.x86.matmul.params import MatmulParams

_ttensor = dialect("transform.tensor")


def split_gathered_panel(
    pack: ir.Value, gather: ir.Value, site: MatmulSite, params: MatmulParams
) -> tuple[ir.Value, ir.Value | None, list[ir.Value]]:
    """``packed_kernel._split_partial_panel`` of B's packing when an implicit GEMM's patch gather
    (``matmul.patch_operands``) makes B: the gather is fused into the split first, so each
    piece (whole panels, partial one) holds its own. Returns the packs and the gathers."""
    whole = site.n // params.reg_n
    if params.tile_n < site.n or whole < 2 or site.n % params.reg_n == 0:
        return pack, None, [gather]
    # Static shapes first: in a K-block loop the gather's tile is K-block rows by loop
    # bounds only, and fusion does not look past the tensor.dim a dynamic one is read by.
    func = transform.GetParentOp(any_op(), pack, op_name="func.func").result
    apply_patterns(
        func, loop.ApplyForLoopCanonicalizationPatternsOp, transform.ApplyCanonicalizationPatternsOp
    )
    split = structured.TileUsingForOp(pack, sizes=[whole, 0])
    structured.FuseIntoContainingOp(gather, split.loops[0])
    peeled = loop.LoopPeelOp(any_op(), any_op(), split.loops[0])
    pieces = (peeled.peeled_loop, peeled.remainder_loop)
    return (
        match_name(pieces[0], "linalg.pack"),
        match_name(pieces[1], "linalg.pack"),
        [match_name(piece, "linalg.generic") for piece in pieces],
    )


def gather_in_steps(
    gathers: list[ir.Value],
    pieces: list[Any],
    site: MatmulSite,
    params: MatmulParams,
    k_step: int,
) -> list[tuple[ir.Value, list[int]]]:
    """Fuse an implicit GEMM's patch gathers (``matmul.patch_operands``; one per piece of
    B's packing, :func:`split_gathered_panel`) into the tiled steps that pack B's whole
    panels and its partial one (``pieces``): each step gathers its tile of patches from
    the input and stores it in the panel (no patch matrix in memory). Returns the fused
    gathers with their vector shapes (the partial panel's: its static width)."""
    # Each step slices the slice of the gather that the split (or K block) took: one slice
    # of the gather, for fusion to find.
    func = transform.GetParentOp(any_op(), pieces[0].loops[0], op_name="func.func").result
    apply_patterns(func, _ttensor.ApplyMergeConsecutiveInsertExtractSlicePatternsOp)
    steps = []
    for number, (gather, tiled) in enumerate(zip(gathers, pieces, strict=True)):
        width = site.n % params.reg_n if number else params.reg_n
        fused = structured.FuseIntoContainingOp(gather, tiled.loops[0]).fused_op
        steps.append((fused, [width, k_step] if site.transpose_b else [k_step, width]))
    # The partial panel's gather writes its steps into a slice of the patch matrix's empty
    # tensor (the whole panels' write into the panels): a slice of an empty tensor is an
    # empty tensor, so no buffer of the whole matrix is allocated for that strip.
    apply_patterns(func, _ttensor.ApplyFoldTensorEmptyPatternsOp)
    return steps
