"""The register-tile steps both matmul kernels share: cleanup patterns, keeping the
accumulators in registers across the k loop, lowering the vectors to FMAs, and the
unpacked kernel (register tiles in place, edge tiles masked).

The packed kernel (:mod:`stagegraph.stages.x86.matmul.packed_kernel`) and the schedule that
chooses between the two (:mod:`stagegraph.stages.x86.matmul.schedule`) build on these.
"""

from __future__ import annotations

from stagegraph.mlir.bindings import dialect, ir, loop, structured, transform
from stagegraph.stages.common.transform_build import any_op, apply_patterns, match_name
from stagegraph.stages.x86.matmul.canonical import MatmulSite
from stagegraph.stages.x86.matmul.params import MatmulParams

_tvec = dialect("transform.vector")
_ttensor = dialect("transform.tensor")


def cleanup(func: ir.Value) -> None:
    """Fold tensor ops into packs and unpacks and canonicalize: after a kernel's tiling,
    before it is found again by name (patterns replace the ops its handles held)."""
    apply_patterns(
        func,
        structured.ApplyFoldIntoPackAndUnpackPatternsOp,
        structured.ApplyTilingCanonicalizationPatternsOp,
        transform.ApplyCanonicalizationPatternsOp,
    )


def unpacked_kernel(
    func: ir.Value,
    block_mm: ir.Value,
    block_fill: ir.Value | None,
    site: MatmulSite,
    params: MatmulParams,
) -> None:
    """Register tiles in place (no packing): edge tiles are vectorized with masks."""
    outputs = []
    if site.consumers:
        chain = [consumer_of(block_mm)]
        for _ in range(site.consumers - 1):
            chain.append(consumer_of(chain[-1]))
        tiled = structured.TileUsingForOp(chain[-1], sizes=[params.reg_m, params.reg_n])
        outputs = [tiled.tiled_linalg_op]
        for producer in reversed(chain[:-1]):
            outputs.append(structured.FuseIntoContainingOp(producer, tiled.loops[1]).fused_op)
    tk = params.k_block(site.k)
    if tk:
        block_mm = structured.TileUsingForOp(block_mm, sizes=[0, 0, tk]).tiled_linalg_op
    kernel = structured.TileUsingForOp(
        block_mm, sizes=[params.reg_m, params.reg_n, params.k_unroll], interchange=[1, 0, 2]
    ).tiled_linalg_op
    if block_fill is not None:
        block_fill = structured.TileUsingForOp(
            block_fill, sizes=[params.reg_m, params.reg_n]
        ).tiled_linalg_op
    cleanup(func)
    structured.VectorizeOp(kernel, [params.reg_m, params.reg_n, params.k_unroll])
    if block_fill is not None:
        structured.VectorizeOp(block_fill, [params.reg_m, params.reg_n])
    for op in outputs:
        structured.VectorizeOp(op, [params.reg_m, params.reg_n])
    hoist_accumulators(func)


def hoist_accumulators(func: ir.Value) -> None:
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


def lower_vectors(func: ir.Value, avx2_transposes: bool = False) -> None:
    """Contraction -> outer products -> FMAs; n-D transfers stay for the unrolling pass.

    ``avx2_transposes``: lower the 4x8 and 8x8 f32 transposes of A's packing (a ``reg_m x
    8`` block of rows becomes eight ``reg_m``-wide columns) with upstream's AVX2 sequence of
    in-lane unpacks and shuffles, not one flat 32- or 64-element shuffle that LLVM turns
    into lane-crossing permutes (3 uops each on Zen 1). A 5-7 row block was padded to 8x8
    before this runs (see pad_transposes), so it takes the 8x8 sequence too."""
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


def consumer_of(handle: ir.Value) -> ir.Value:
    """The op consuming ``handle``'s first result, once: a consumer reading it in several
    inputs (a merged elementwise chain) is listed once per input, and a handle naming an op
    twice cannot be consumed by a transform."""
    consumers = transform.GetConsumersOfResult(any_op(), handle, 0).result
    return transform.MergeHandlesOp([consumers], deduplicate=True).result


def merged(handles: list[ir.Value]) -> ir.Value:
    """One handle to the ops of ``handles`` (the handle itself when there is one)."""
    if len(handles) == 1:
        return handles[0]
    return transform.MergeHandlesOp(handles, deduplicate=True).result
