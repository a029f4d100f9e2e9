"""Matmul epilogues on wgmma blocks (sm_90a): a matmul's elementwise consumer (bias along
rows or columns, activations, scaling, a residual add, a cast of the output) runs in the
wgmma block's kernel, on the accumulator after the K loop, before anything is written to C.

The schedule tiles the *consumer* to the ``128 x tile_n`` block forall and fuses the matmul
and its fill into it (:func:`wgmma_epilogue_script`, the fused script of
:mod:`stagegraph.stages.gpu.epilogue` with one level); the block's matmul carries the wgmma
marks, its consumer :data:`~stagegraph.stages.gpu.epilogue.EPILOGUE_ATTR`. The rewrite
(:mod:`stagegraph.stages.gpu.wgmma_rewrite`) then builds the block with
:func:`apply_epilogue` as the way out of its C tile: the warpgroup(s) put the accumulator
into the f32 C tile in shared memory (``nvgpu.warpgroup.mma.store``, the path a C that is
added to takes already), and every thread walks the tile in row-major order (consecutive
threads on consecutive columns: coalesced loads of bias and residual, coalesced stores of
the result), applying the consumer's body to each element (its clone,
:func:`~stagegraph.stages.gpu.epilogue.apply_in_registers`) with the element's block-local
(row, col) as the consumer's loop indices. C itself never goes to global memory: one
kernel, one write of the result.

Why through shared memory and not on the fragment registers directly: the accumulator is an
opaque ``!nvgpu.warpgroup.accumulator`` until ``convert-nvgpu-to-nvvm`` turns it into a
struct of f32 registers, and only that lowering knows which (row, col) each register holds;
applying the body per register would mean re-deriving that mapping by hand below the nvgpu
level. The staged tile costs one shared-memory round trip of C (no global traffic) and buys
coalesced global stores, which the fragment layout (two adjacent f32 per thread per row)
would not give.
"""

from __future__ import annotations

from typing import Any

from stagegraph.stages.gpu.wgmma import TILE_M, wgmma_annotations


def wgmma_epilogue_script(plan: Any, attr: str) -> str:
    """Transform ops for a wgmma ``plan`` with a fused consumer: the consumer tiled to the
    ``128 x tile_n`` block forall, the matmul and its fill fused into it, the block's
    matmul annotated for the wgmma rewrite and its consumer for the epilogue."""
    from stagegraph.stages.gpu.epilogue import fused_script

    maps = (["#gpu.block<linear_dim_1>", "#gpu.block<linear_dim_0>"],)
    text = fused_script(plan, attr, maps, ((TILE_M, plan.tile_n),), None)
    return text + wgmma_annotations(f"%mm{plan.op}_l0", plan.op, plan.stages,
                                    plan.warp_specialized, plan.group_m)  # fmt: skip


def apply_epilogue(block: Any, fused: Any, local: Any, workers: int) -> None:
    """After the block's accumulator is in its shared C tile (``block.tile``):
    ``workers`` threads (``local``: this one's index) take element ``local + workers * i``
    each, add C's start where C did not start at zero (the fill's scalar, or C's element
    read from ``fused.source``) and store the consumer's result for that element
    (``fused``: the block's :class:`~stagegraph.stages.gpu.epilogue.WarpEpilogue`)."""
    from stagegraph.stages.gpu.epilogue import _convert, apply_in_registers
    from stagegraph.stages.gpu.zero_fill import _is_zero

    build, ir = block.build, block.ir
    f32 = ir.F32Type.get(build.location.context)
    loop, outer = block.loop(TILE_M * block.tile_n // workers, [])
    flat = block.index("addi", block.scaled(loop.induction_variable, workers), local)
    row = block.index("divui", flat, build.const(block.tile_n))
    col = block.index("remui", flat, build.const(block.tile_n))
    value = build.op("memref.load", [f32], [block.tile, row, col])
    if fused.start is None:  # C's own start, read where it lies
        element = ir.MemRefType(fused.source.type).element_type
        start = _convert(build, build.op("memref.load", [element], [fused.source, row, col]),
                         f32)  # fmt: skip
        value = build.op("arith.addf", [f32], [start, value])
    elif not _is_zero(fused.start):
        value = build.op("arith.addf", [f32], [_convert(build, fused.start, f32), value])
    apply_in_registers(build, fused.consumer, fused.c, value, [row, col])
    build.op("scf.yield", [], [])
    build.point = outer
