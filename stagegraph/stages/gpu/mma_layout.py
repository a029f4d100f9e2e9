"""What the tensor-core modules share (:mod:`.mma`, :mod:`.mma_bounds`, :mod:`.epilogue`):
the instruction shapes, the block's warp grid and tiles, the register accounting, and the
builder that creates ops at an insertion point. A leaf: it imports none of them."""

from __future__ import annotations

from typing import Any

#: Marks the warp-level matmuls the schedule leaves for :func:`rewrite_mma`.
MMA_ATTR = "stagegraph.gpu_mma"
#: Instruction shapes (m, n, k) by input element type.
HALF_SHAPE = (16, 8, 16)
TF32_SHAPE = (16, 8, 8)
WARP_SIZE = 32
#: The named ops taken (default indexing maps; a batch matmul's batch loop goes to blocks).
MATMULS = ("linalg.matmul", "linalg.batch_matmul")
#: Block tiles (m, n) tried largest first; each block has a 2x2 grid of warps.
BLOCK_TILES = ((128, 128), (128, 64), (64, 128), (64, 64), (64, 32), (32, 64), (32, 32),
               (32, 16))  # fmt: skip
WARP_GRID = (2, 2)


#: Registers per thread kept for addresses, indices and the loop (ptxas's count beyond the
#: fragments at 128x128 tiles with cp.async staging and ldmatrix: 205 - 160).
REGISTER_RESERVE = 64
#: The most registers one thread may use (PTX).
MAX_REGISTERS = 255


def fragment_registers(tile_m: int, tile_n: int) -> int:
    """32-bit registers per thread for a block tile's warp fragments (2x2 warps): four f32
    accumulators per 16x8 of C, four A registers per 16 rows, two B registers per 8
    columns (the same counts for f16/bf16 and TF32)."""
    wm, wn = tile_m // WARP_GRID[0], tile_n // WARP_GRID[1]
    return (wm // 16) * (wn // 8) * 4 + (wm // 16) * 4 + (wn // 8) * 2


def register_budget(registers_per_block: int) -> int:
    """Fragment registers a thread of a 128-thread block may hold."""
    threads = WARP_GRID[0] * WARP_GRID[1] * WARP_SIZE
    return min(MAX_REGISTERS, registers_per_block // threads) - REGISTER_RESERVE


#: One element's place in its tile: ``(row_g, row_t, row_c, col_g, col_t, col_c)`` means
#: row = ``row_g*g + row_t*t + row_c`` and col likewise, with ``g = lane / 4, t = lane % 4``.
Place = tuple[int, int, int, int, int, int]


class Builder:
    """Creates ops at an insertion point (before an op, or at the end of a loop body)
    through the generic builder (no dialect wrappers)."""

    def __init__(self, at: Any) -> None:
        from stagegraph.mlir.bindings import ir

        self.ir, self.location = ir, at.location
        self.point = ir.InsertionPoint(at)
        self.index = ir.IndexType.get(at.context)
        self.bounds: Any = None  # a partial tile's masks (mma_bounds.Bounds), when masked

    def op(self, name: str, results: list[Any], operands: list[Any], **attrs: Any) -> Any:
        ir = self.ir
        with self.point, self.location:
            made = ir.Operation.create(name, results=results, operands=operands,
                                       attributes=attrs)  # fmt: skip
        return made.results[0] if results else None

    def batch(self, memref: Any) -> list[Any]:
        """Index 0 for each leading (unit) batch dim of a batch matmul's warp-level operand."""
        return [self.const(0)] * (self.ir.MemRefType(memref.type).rank - 2)

    def const(self, value: int) -> Any:
        return self.op("arith.constant", [self.index], [],
                       value=self.ir.IntegerAttr.get(self.index, value))  # fmt: skip

    def affine(self, g: Any, t: Any, place: tuple[int, int, int], base: Any = None) -> Any:
        """``g_coef*g + t_coef*t + const (+ base)`` as index arithmetic."""
        g_coef, t_coef, const = place
        total = self.const(const)
        for value, coef in ((g, g_coef), (t, t_coef)):
            if coef:
                term = self.op("arith.muli", [self.index], [value, self.const(coef)])
                total = self.op("arith.addi", [self.index], [total, term])
        if base is not None:
            total = self.op("arith.addi", [self.index], [total, base])
        return total

    def fragment(self, memref: Any, places: list[Place], lane: tuple[Any, Any],
                 origin: tuple[Any, Any], shape: tuple[int, int],
                 prefix: list[Any] | None = None,
                 limits: tuple[Any, Any] | None = None) -> Any:  # fmt: skip
        """This lane's fragment of the tile of ``memref`` at ``origin`` (after the
        ``prefix`` indices: a batch's 0, or a staging buffer's warp and stage), a vector."""
        ir = self.ir
        kind = ir.MemRefType(memref.type).element_type
        loads = []
        for rg, rt, rc, cg, ct, cc in places:
            row = self.affine(*lane, (rg, rt, rc), origin[0])
            col = self.affine(*lane, (cg, ct, cc), origin[1])
            indices = [*(self.batch(memref) if prefix is None else prefix), row, col]
            if self.bounds is not None and limits is not None:  # zero past the edges
                inside = self.bounds.inside(row, limits[0], col, limits[1])
                loads.append(self.bounds.load(memref, indices, inside))
            else:
                loads.append(self.op("memref.load", [kind], [memref, *indices]))
        with self.location:  # a type's checks report at a location
            vector = ir.VectorType.get(list(shape), kind)
        return self.op("vector.from_elements", [vector], loads)
