"""A vectorized convolution tile's accumulators held in registers across its reduction loops.

The generic schedule tiles a convolution's output (one ``scf.forall``) and then its window
and input channels (``scf.for`` loops inside, see ``OpSequenceBuilder._tile_convolution``).
Vectorized, each reduction step reads the output tile from the loop's tensor
(``tensor.extract_slice`` + ``vector.transfer_read``), adds its products and writes it back
(``vector.transfer_write`` + ``tensor.insert_slice``): bufferized, a load and a store of
every accumulator per step, and each accumulator's FMA chain waits on a store-to-load
forward between steps. Those pairs read and write the same subset at loop-invariant
offsets, so ``transform.loop.hoist_loop_invariant_subsets`` moves them out of the loop and
the tile becomes a loop-carried vector: the accumulators stay in registers for the whole
reduction, as the matmul's register tiles do (``matmul.register_tiles.hoist_accumulators``).

That also frees the innermost window dim to be tiled: a step of one tap (``conv_nhwc_window_tile
= 1``) reads each input element once, while a whole window row per step gives LLVM one
straight-line block in which an input element broadcast for one tap is kept, for the next
taps that read it, in registers the accumulators need (a 5x9 window of 8 channels, 4
columns: 87 spilled vectors per block on AVX-512).
"""

from __future__ import annotations

from typing import Any

from stagegraph.stages.common.transform_build import match_name


def hoist_accumulators(scope: Any, depth: int) -> None:
    """Hoist the accumulator reads and writes out of every ``scf.for`` under ``scope`` (the
    output tile's loop), ``depth`` times: each pass moves them out of one more loop level
    (an outer loop sees the pair only once its inner loop has been hoisted).

    The loops are matched after vectorization, so a loop the tiling made and
    canonicalization folded (one trip) is simply absent.
    """
    from stagegraph.mlir.bindings import loop, transform

    loops = match_name(scope, "scf.for")
    for _ in range(depth):
        # the subsets' offsets (constants the vector lowering made inside the loops) must
        # be defined outside a loop before its subsets count as loop-invariant
        transform.ApplyLoopInvariantCodeMotionOp(loops)
        loop.HoistLoopInvariantSubsetsOp(loops)
