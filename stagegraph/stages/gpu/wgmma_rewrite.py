"""The wgmma rewrite after bufferization: each block matmul the schedule annotated
(:data:`~stagegraph.stages.gpu.wgmma.WGMMA_ATTR`) becomes the TMA + mbarrier + wgmma block
of :mod:`stagegraph.stages.gpu.wgmma_kernel` (one warpgroup) or
:mod:`stagegraph.stages.gpu.wgmma_specialized` (producer and consumer warpgroups). Its own
module so that the two block builders and the routing in :mod:`stagegraph.stages.gpu.wgmma`
import in one direction."""

from __future__ import annotations

from typing import Any

from stagegraph.errors import UnsupportedPayloadError
from stagegraph.stages.gpu.epilogue import WarpEpilogue
from stagegraph.stages.gpu.mma import _Builder
from stagegraph.stages.gpu.raster import regroup_blocks
from stagegraph.stages.gpu.tma import create_descriptor
from stagegraph.stages.gpu.wgmma import (
    BOX_N,
    CONSUMERS,
    GROUP_ATTR,
    TILE_K,
    TILE_M,
    WGMMA_ATTR,
    WS_ATTR,
)
from stagegraph.stages.gpu.wgmma_kernel import (
    _as_pointer,
    _Block,
    _block_forall,
    _root,
    _tma_view,
)
from stagegraph.stages.gpu.wgmma_specialized import SpecializedBlock
from stagegraph.stages.gpu.zero_fill import dead_zero_fill


def rewrite_wgmma(module: Any) -> int:
    """Replace every matmul annotated :data:`WGMMA_ATTR` (on memrefs, a ``128 x tile_n``
    block tile inside its block forall) by the TMA + mbarrier + wgmma kernel body, and
    create its operands' TMA descriptors before the forall; returns how many."""
    from stagegraph.mlir.walk import collect

    ops = collect(module, lambda op: WGMMA_ATTR in op.attributes)
    for op in ops:
        build_block(op)
    return len(ops)


def build_block(matmul: Any) -> None:
    """Replace one annotated block matmul by the pipeline (its descriptors on the host);
    a zero fill of C right before it is dropped (the block then stores C); a fused
    consumer (:mod:`stagegraph.stages.gpu.wgmma_epilogue`) runs on the C tile instead.

    Raises:
        UnsupportedPayloadError: an operand is not a block's view of a 2-D buffer TMA can
            describe.
    """
    from stagegraph.mlir.bindings import ir

    forall = _block_forall(matmul)
    stages = ir.IntegerAttr(matmul.attributes[WGMMA_ATTR]).value
    if GROUP_ATTR in matmul.attributes:
        regroup_blocks(forall, ir.IntegerAttr(matmul.attributes[GROUP_ATTR]).value)
    a, b, c = (matmul.operands[i] for i in range(3))
    (a_root, a_at), (b_root, b_at) = _root(a, forall), _root(b, forall)
    if not (_tma_view(a_root) and _tma_view(b_root)):
        raise UnsupportedPayloadError(
            "stage gpu.lower: wgmma reads A and B through TMA, which needs static 2-D views "
            "with unit inner stride and 16-byte aligned rows"
        )
    host = _Builder(forall)
    made = (create_descriptor(host, a_root, (TILE_M, TILE_K)),
            create_descriptor(host, b_root, (TILE_K, BOX_N)))  # fmt: skip
    fused = WarpEpilogue(matmul)
    fused = fused if fused.consumer is not None else None
    # With a consumer the block goes where the consumer is: after its operands' views.
    build = _Builder(matmul if fused is None else fused.consumer)
    descriptors = tuple(_as_pointer(host, build, descriptor) for descriptor in made)
    fill = dead_zero_fill(_root(c, forall)[0], forall) if fused is None else None
    if fill is not None:
        fill.erase()
    origin = tuple(v if not isinstance(v, int) else build.const(v) for v in (a_at[0], b_at[1]))
    a_type, c_type = ir.MemRefType(a.type), ir.MemRefType(c.type)
    shape = (a_type.element_type, c_type.shape[1], a_type.shape[1])
    if WS_ATTR in matmul.attributes:
        specialized = SpecializedBlock(build, descriptors, origin, shape, stages, CONSUMERS)
        specialized.zero_init, specialized.fused = fill is not None, fused
        specialized.prepare()
        specialized.run(c)
    else:
        block = _Block(build, descriptors, origin, shape, stages)
        block.zero_init, block.fused = fill is not None, fused
        block.prepare()
        block.epilogue(block.mainloop(), c)
    if fused is None:
        matmul.erase()
    else:  # the consumer, the matmul, its fill and C's block buffer
        fused.finish(matmul)
