"""One op's GPU mapping (:class:`KernelPlan`) and the op kinds its tensor-core search
spaces are declared under: a leaf module, so the cost model
(:mod:`stagegraph.stages.gpu.params`) and the paths it routes to (wgmma, its space) import
it without importing each other."""

from __future__ import annotations

from pydantic import Field

from stagegraph.core.ports import Params

#: The op kind the tensor-core declaration is looked up by.
MMA_KIND = "mma_matmul"
#: ... and the wgmma one (sm_90a; declared in :mod:`stagegraph.stages.gpu.wgmma_space`).
WGMMA_KIND = "wgmma_matmul"


class KernelPlan(Params):
    """One op's mapping. ``block_tile``/``thread_tile`` have one entry per loop of the op
    (0: not tiled at that level)."""

    op: int
    name: str
    block_tile: tuple[int, ...] = ()
    thread_tile: tuple[int, ...] = ()
    threads: tuple[int, ...] = ()  # block dims (x, y) the thread tiles span
    vector: int = 1  # elements per thread along thread x, loaded as one vector
    mma: tuple[int, ...] = ()  # the mma.sync instruction shape (m, n, k): a tensor-core op
    tile_m: int = Field(0, ge=0, le=256)  # a tensor-core op's block tile (rows, columns of C)
    tile_n: int = Field(0, ge=0, le=256)
    stages: int = Field(0, ge=0, le=8)  # a wgmma kernel's pipeline depth (0: not wgmma)
    warp_specialized: bool = False  # wgmma: a producer warpgroup and two consumer ones
    group_m: int = Field(0, ge=0, le=4096)  # wgmma: tile rows per group of blocks (0: plain)
    fused: tuple[int, ...] = ()  # ops run in this kernel: its consumer, its init fill
    lanes: int = Field(0, ge=0, le=1024)  # threads sharing each reduction row (gpu.reduction)
    merge: int = Field(0, ge=0, le=1024)  # ... of which combine the row's partials (0: one)
    accumulate: tuple[int, ...] = ()  # (loop, extent) a thread walks, accumulating in a register
    group: tuple[int, ...] = ()  # ops run inside this op's row kernel (gpu.row_fusion)
    split: int = Field(0, ge=0)  # a column reduction's loop split S ways (gpu.column_reduction)
    split_loops: tuple[int, ...] = ()  # ... the split op's S loop, K/S loop and K/S

    @property
    def mapped(self) -> bool:
        """Whether the op has parallel work for blocks or threads (else one thread runs it)."""
        return bool(self.mma) or any(self.block_tile) or any(self.thread_tile)
