"""Tensor-core matmuls whose shapes do not divide the tiles (1000^3, 100x72x40, a batch
of 65x33 by 33x17): the tile choice from the shape, and the boundary handling.

The block tile no longer has to divide C: the schedule tiles with the plan's sizes and the
last blocks' (and their warps') tiles are partial (``affine.min`` sizes, dynamic memref
shapes). Each warp's matmul carries its full static tile (:data:`ROWS_ATTR`,
:data:`COLS_ATTR`), which the rewrite (:mod:`stagegraph.stages.gpu.mma`) computes as
always, with the K loop rounded up to whole instruction steps, and masks at the edges
(:class:`Bounds`): a ``cp.async`` of a chunk past the edge copies fewer source elements
and zero-fills the rest (its ``src-size`` operand), a fragment element read straight from
global memory past the edge is a zero without a load, and an element of C past the edge
is not stored (nor its epilogue applied). The zeros make the partial products exact.

The block tile is chosen by a cost model of wave quantization (:func:`choose_block_tile`):
the blocks run in waves of ``sm_count x blocks per SM``; a tile's cost is the number of
waves times the time one block takes, which grows with its area and shrinks with its
arithmetic intensity (``bm*bn / (bm+bn)`` multiply-adds per element loaded).
"""

from __future__ import annotations

import math
from typing import Any

#: The full static tile (rows, columns of C) of a warp's matmul, for partial tiles.
ROWS_ATTR = "stagegraph.gpu_mma_rows"
COLS_ATTR = "stagegraph.gpu_mma_cols"
#: Registers per thread the masks of a partial tile take beyond a whole tile's (ptxas: a
#: 1000^3 matmul in 128x128 tiles needs 214 on sm_90a against 201 whole, and spills on sm_80).
MASK_REGISTERS = 48
#: Multiply-adds per loaded element at which a block is half compute-bound (a knee: below
#: it, loads bound the block's time).
INTENSITY_KNEE = 16.0
_ULT = 6  # arith.cmpi predicate "ult"


def whole_warp_tiles(tile: tuple[int, int], shape: tuple[int, int, int]) -> bool:
    """Whether block tile ``tile`` splits into the 2x2 warps' tiles of whole instructions
    (all a partial-tile schedule needs)."""
    from stagegraph.stages.gpu.mma_layout import WARP_GRID

    bm, bn = tile
    return (bm > 0 and bn > 0 and bm % (WARP_GRID[0] * shape[0]) == 0
            and bn % (WARP_GRID[1] * shape[1]) == 0)  # fmt: skip


def blocks_per_sm(tile: tuple[int, int], shape: tuple[int, int, int], element_bytes: int,
                  target: Any) -> int:  # fmt: skip
    """How many 128-thread blocks of ``tile`` an SM holds at once: the least of its thread,
    register (fragments plus the reserve) and shared-memory (cp.async stages) limits."""
    from stagegraph.stages.gpu.mma_layout import (
        REGISTER_RESERVE,
        WARP_GRID,
        WARP_SIZE,
        fragment_registers,
    )
    from stagegraph.stages.gpu.mma_staged import shared_bytes

    threads = WARP_GRID[0] * WARP_GRID[1] * WARP_SIZE
    registers = (fragment_registers(*tile) + REGISTER_RESERVE) * threads
    shared = shared_bytes(tile[0] // 2, tile[1] // 2, shape[2], element_bytes, 4)
    return max(1, min(target.max_threads_per_sm // threads,
                      target.registers_per_sm // registers,
                      target.shared_bytes_per_sm // max(shared, 1)))  # fmt: skip


def tile_cost(m: int, n: int, batches: int, tile: tuple[int, int], sm_count: int,
              per_sm: int) -> float:  # fmt: skip
    """Relative time of a (batches x m x n) C in ``tile`` blocks, ``per_sm`` of them resident
    on each of ``sm_count`` SMs: waves x the time of one SM's share of a wave (its
    resident blocks' area over their efficiency at their arithmetic intensity; blocks
    sharing an SM share its tensor cores, so residency hides latency, not work)."""
    bm, bn = tile
    blocks = batches * math.ceil(m / bm) * math.ceil(n / bn)
    waves = math.ceil(blocks / (sm_count * per_sm))
    intensity = bm * bn / (bm + bn)
    efficiency = intensity / (intensity + INTENSITY_KNEE)
    resident = min(per_sm, math.ceil(blocks / sm_count))  # few blocks spread over the SMs
    return waves * resident * bm * bn / efficiency


def partial(m: int, n: int, k: int, tile: tuple[int, int], shape: tuple[int, int, int]) -> bool:
    """Whether ``tile`` leaves partial tiles of C or a partial K step (masks needed)."""
    return bool(m % tile[0] or n % tile[1] or k % shape[2])


def fits_registers(tile: tuple[int, int], masked: bool, target: Any) -> bool:
    """Whether a thread's fragments of ``tile`` (plus the masks' registers where
    ``masked``) fit the registers it may hold."""
    from stagegraph.stages.gpu.mma_layout import fragment_registers, register_budget

    extra = MASK_REGISTERS if masked else 0
    return fragment_registers(*tile) + extra <= register_budget(target.registers_per_block)


def choose_block_tile(m: int, n: int, k: int, batches: int, shape: tuple[int, int, int],
                      element_bytes: int, target: Any) -> tuple[int, int] | None:  # fmt: skip
    """The block tile of least :func:`tile_cost` among
    :data:`~stagegraph.stages.gpu.mma.BLOCK_TILES` that fit the registers (ties: the tile
    dividing C, then the larger); None when no tile splits into whole warp tiles."""
    from stagegraph.stages.gpu.mma_layout import BLOCK_TILES

    fitting = [t for t in BLOCK_TILES if whole_warp_tiles(t, shape)
               and fits_registers(t, partial(m, n, k, t, shape), target)]  # fmt: skip
    if not fitting:
        return None

    def key(tile: tuple[int, int]) -> tuple[float, bool, int]:
        per_sm = blocks_per_sm(tile, shape, element_bytes, target)
        exact = m % tile[0] == 0 and n % tile[1] == 0
        cost = tile_cost(m, n, batches, tile, target.sm_count, per_sm)
        return (cost, not exact, -tile[0] * tile[1])

    return min(fitting, key=key)


class Bounds:
    """The valid extents of one warp's partial tile: rows of A (and C), columns of B (and
    C), and K; ``masked`` is False where the tile is whole (no mask is built)."""

    def __init__(self, build: Any, a: Any, b: Any, k: int, step: int) -> None:
        ir = build.ir
        a_type, b_type = ir.MemRefType(a.type), ir.MemRefType(b.type)
        dynamic = ir.ShapedType.get_dynamic_size()
        self.build, self.k = build, k
        self.k_steps = -(-k // step) * step
        self.masked = (a_type.shape[-2] == dynamic or b_type.shape[-1] == dynamic
                       or k % step != 0)  # fmt: skip
        self.rows = self._extent(a, a_type.rank - 2)
        self.cols = self._extent(b, b_type.rank - 1)
        self.k_value = build.const(k)

    def _extent(self, memref: Any, dim: int) -> Any:
        build = self.build
        size = build.ir.MemRefType(memref.type).shape[dim]
        if size != build.ir.ShapedType.get_dynamic_size():
            return build.const(size)
        return build.op("memref.dim", [build.index], [memref, build.const(dim)])

    def below(self, value: Any, limit: Any) -> Any:
        """``value < limit`` (indices) as an i1."""
        build = self.build
        i1 = build.ir.IntegerType.get_signless(1)
        predicate = build.ir.IntegerAttr.get(build.ir.IntegerType.get_signless(64), _ULT)
        return build.op("arith.cmpi", [i1], [value, limit], predicate=predicate)

    def inside(self, row: Any, row_limit: Any, col: Any, col_limit: Any) -> Any:
        build = self.build
        i1 = build.ir.IntegerType.get_signless(1)
        return build.op("arith.andi", [i1], [self.below(row, row_limit),
                                              self.below(col, col_limit)])  # fmt: skip

    def load(self, memref: Any, indices: list[Any], inside: Any) -> Any:
        """``memref[indices]`` where ``inside``, else a zero: the load only where inside."""
        from stagegraph.mlir.bindings import dialect

        build, ir = self.build, self.build.ir
        kind = ir.MemRefType(memref.type).element_type
        with build.location:
            branch = dialect("scf").IfOp(inside, [kind], has_else=True, ip=build.point)
        outer = build.point
        build.point = ir.InsertionPoint(branch.then_block)
        build.op("scf.yield", [], [build.op("memref.load", [kind], [memref, *indices])])
        build.point = ir.InsertionPoint(branch.else_block)
        zero = build.op("arith.constant", [kind], [], value=ir.FloatAttr.get(kind, 0.0))
        build.op("scf.yield", [], [zero])
        build.point = outer
        return branch.results[0]

    def guarded(self, inside: Any) -> Any:
        """An ``scf.if inside`` without results; returns its then-block's insertion point
        (the caller builds there and restores its own point)."""
        from stagegraph.mlir.bindings import dialect

        build = self.build
        with build.location:
            branch = dialect("scf").IfOp(inside, [], ip=build.point)
        point = build.ir.InsertionPoint(branch.then_block)
        with point, build.location:
            build.ir.Operation.create("scf.yield")
        return build.ir.InsertionPoint.at_block_terminator(branch.then_block)

    def copy_elements(self, valid: Any, first: Any, limit: Any, lanes: int) -> Any:
        """Source elements of a ``cp.async`` chunk of ``lanes`` elements starting at
        ``first`` of a line ending at ``limit``: ``clamp(limit - first, 0, lanes)`` where
        ``valid`` (its line is inside the tile), else 0."""
        build = self.build
        index = build.index
        left = build.op("arith.subi", [index], [limit, first])
        left = build.op("arith.minsi", [index], [left, build.const(lanes)])
        left = build.op("arith.maxsi", [index], [left, build.const(0)])
        return build.op("arith.select", [index], [valid, left, build.const(0)])


def tile_annotations(handle: str, rows: int, cols: int, tag: str) -> str:
    """Transform ops that set :data:`ROWS_ATTR` and :data:`COLS_ATTR` on the warp matmul
    ``handle`` (``tag`` keeps the param names of each kernel apart)."""
    any_op, param = "!transform.any_op", "!transform.param<i64>"
    text = ""
    for attr, value, name in ((ROWS_ATTR, rows, "r"), (COLS_ATTR, cols, "c")):
        text += (
            f"    %{name}{tag} = transform.param.constant {value} : i64 -> {param}\n"
            f'    transform.annotate {handle} "{attr}" = %{name}{tag} : {any_op}, {param}\n'
        )
    return text


def static_tile(op: Any) -> tuple[int, int]:
    """A warp matmul's full tile (rows, columns of C): its annotations, else its C's shape."""
    from stagegraph.mlir.bindings import ir

    if ROWS_ATTR in op.attributes:
        return (ir.IntegerAttr(op.attributes[ROWS_ATTR]).value,
                ir.IntegerAttr(op.attributes[COLS_ATTR]).value)  # fmt: skip
    return tuple(ir.MemRefType(op.operands[2].type).shape[-2:])


def static_warp_grids(module: Any) -> int:
    """Give every warp forall of a partial block tile the full 2x2 warp grid: its trip
    counts (``ceildiv(block extent, warp tile)``, dynamic) become the static grid the GPU
    mapping needs, and each warp's extents ``min(rest, tile)`` are clamped at zero, so a
    warp past the edge runs its (collective) matmul on an empty tile: every load masked,
    every copy zero-filled, nothing stored. Returns how many foralls changed."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import collect
    from stagegraph.stages.gpu.mma_layout import WARP_GRID
    from stagegraph.stages.gpu.mma_layout import Builder as _Builder

    count = 0
    for forall in collect(module, "scf.forall"):
        if "mapping" not in forall.attributes or not any(
            "gpu.warp" in str(m) for m in ir.ArrayAttr(forall.attributes["mapping"])
        ):
            continue  # fmt: skip
        body = forall.regions[0].blocks[0]
        if not any(op.name == "linalg.matmul" or op.name == "linalg.batch_matmul"
                   for op in body.operations):  # fmt: skip
            continue
        static = list(ir.DenseI64ArrayAttr(forall.attributes["staticUpperBound"]))
        dynamic = [dim for dim, size in enumerate(static)
                   if size == ir.ShapedType.get_dynamic_size()]  # fmt: skip
        if not dynamic:
            continue
        # Normalized foralls (the schedule's): their only dynamic operands are the upper
        # bounds, in the order of their dims.
        build = _Builder(forall)
        grid = [WARP_GRID[dim] for dim in dynamic]
        for k, operand in enumerate(forall.operands):
            if not _is_constant(operand):
                forall.operands[k] = build.const(grid.pop(0))
        _clamp_extents(body)
        count += 1
    return count


def _is_constant(value: Any) -> bool:
    from stagegraph.mlir.bindings import ir

    owner = value.owner
    return isinstance(owner, ir.Operation | ir.OpView) and owner.name == "arith.constant"


def _clamp_extents(body: Any) -> None:
    """Each ``affine.min`` at the top of ``body`` (a warp's extents) clamped at zero."""
    from stagegraph.stages.gpu.mma_layout import Builder as _Builder

    for op in list(body.operations):
        if op.name != "affine.min":
            continue
        build = _Builder(op)
        result = op.results[0]
        users = [(use.owner, use.operand_number) for use in result.uses]
        clamped = build.op("arith.maxsi", [build.index], [result, build.const(0)])
        clamped.owner.move_after(op)
        for owner, number in users:
            owner.operands[number] = clamped
