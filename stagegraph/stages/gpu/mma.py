"""Tensor-core matmuls (``mma.sync``, sm_80 and up) for the GPU graph.

A ``linalg.matmul`` whose inputs are f16 or bf16 and whose output is f32 or the inputs'
type (accumulated in f32 all the same, rounded when stored: what cuBLAS does; or all f32 with
the ``tf32`` param on, which rounds the inputs to TF32 and so changes results; a
``linalg.batch_matmul`` likewise, its batch index on the grid) is tiled twice by the
schedule: to a ``forall`` over blocks and inside it a ``forall`` over the block's 2x2
warps (``#gpu.warp`` linear mapping); each warp's matmul is annotated with
:data:`MMA_ATTR`. After bufferization :func:`rewrite_mma` replaces it by this lane's
fragments of C (the PTX ISA's fragment layouts, indexed by ``gpu.lane_id``), a loop over K
(16 for f16/bf16, 8 for TF32 per step) that carries them as loop values and issues one
``nvgpu.mma.sync`` per 16x8 of C, and the stores of C after it; ``convert-nvgpu-to-nvvm``
lowers it to the ``llvm.nvvm.mma`` intrinsic (which llvmlite's LLVM prints as
``mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32`` and the like; ptxas takes it).

Why not ``transform.nvgpu.rewrite_matmul_as_mma_sync``: it handles only f16 x f16 -> f16
and f32 (TF32) matmuls, not f16/bf16 inputs with f32 accumulation, which is what users run.
Where the tiles' rows are whole 16-byte chunks, each warp stages its A and B tiles through
shared memory with ``cp.async`` (:mod:`stagegraph.stages.gpu.mma_staged`); elsewhere the
fragments are read from global memory. A fill of C and an elementwise consumer fused into
the warp (:mod:`stagegraph.stages.gpu.epilogue`) become the accumulators' start and a
computation on them before the store; partial tiles are masked
(:mod:`stagegraph.stages.gpu.mma_bounds`).
"""

from __future__ import annotations

from typing import Any

from stagegraph.stages.analysis import OpFacts
from stagegraph.stages.gpu.mma_layout import (  # noqa: F401  (names of this module too)
    BLOCK_TILES,
    HALF_SHAPE,
    MATMULS,
    MAX_REGISTERS,
    MMA_ATTR,
    REGISTER_RESERVE,
    TF32_SHAPE,
    WARP_GRID,
    WARP_SIZE,
    Place,
    fragment_registers,
    register_budget,
)
from stagegraph.stages.gpu.mma_layout import Builder as _Builder


def mma_shape(op: OpFacts, tf32: bool = False) -> tuple[int, int, int] | None:
    """The ``mma.sync`` instruction shape for ``op``, or None where it takes none: a plain
    ``linalg.matmul`` or ``linalg.batch_matmul`` of f16/bf16 inputs (both the same) into
    f32 or their own type, or f32 when ``tf32``."""
    if op.name not in MATMULS or len(op.inputs) != 2 or len(op.outputs) != 1:
        return None
    ins = {v.dtype for v in op.inputs}
    if len(ins) != 1 or op.outputs[0].dtype not in ("f32", *ins):
        return None  # f32 accumulators; a half output is rounded from them when stored
    (dtype,) = ins
    if dtype in ("f16", "bf16"):
        return HALF_SHAPE
    if dtype == "f32" and tf32:
        return TF32_SHAPE
    return None


def tile_fits(m: int, n: int, k: int, shape: tuple[int, int, int], tile: tuple[int, int]) -> bool:
    """Whether block tile ``tile`` divides (m, n) into whole warp tiles of whole instructions
    (the schedule's tiles must divide exactly: the GPU mapping needs static trip counts)."""
    bm, bn = tile
    wm, wn = bm // WARP_GRID[0], bn // WARP_GRID[1]
    return (k % shape[2] == 0 and bm > 0 and bn > 0 and m % bm == 0 and n % bn == 0
            and bm % WARP_GRID[0] == 0 and bn % WARP_GRID[1] == 0
            and wm % shape[0] == 0 and wn % shape[1] == 0)  # fmt: skip


def block_tile(m: int, n: int, k: int, shape: tuple[int, int, int],
               sm_count: int) -> tuple[int, int] | None:  # fmt: skip
    """The block tile for a (m, n, k) matmul on a GPU of ``sm_count`` SMs: the largest of
    :data:`BLOCK_TILES` that fits and still gives every SM a block, else (a small matmul)
    the fitting one with the most blocks; None when none fits (the op stays SIMT)."""
    fitting = [t for t in BLOCK_TILES if tile_fits(m, n, k, shape, t)]
    if not fitting:
        return None
    filling = [t for t in fitting if (m // t[0]) * (n // t[1]) >= sm_count]
    if filling:
        return filling[0]
    return max(fitting, key=lambda t: (m // t[0]) * (n // t[1]))


def mma_script(op: int, block: tuple[int, int], attr: str, batched: bool = False) -> str:
    """Transform ops for op ``op`` (matched by ``attr``): tiled to blocks (a batch matmul's
    batch index too), then warps; the warp-level matmul is annotated for :func:`rewrite_mma`."""
    from stagegraph.stages.gpu.mma_bounds import tile_annotations

    any_op = "!transform.any_op"
    tiled = f"({any_op}) -> ({any_op}, {any_op})"
    bm, bn = block
    wm, wn = bm // WARP_GRID[0], bn // WARP_GRID[1]
    blocks = "#gpu.block<linear_dim_1>, #gpu.block<linear_dim_0>"
    warps = "#gpu.warp<linear_dim_1>, #gpu.warp<linear_dim_0>"
    batch_block, batch_warp = ("1, ", "0, ") if batched else ("", "")
    if batched:
        blocks = "#gpu.block<linear_dim_2>, " + blocks
    return (
        f"    %mm{op} = transform.structured.match attributes{{{attr} = {op} : i64}} "
        f"in %root : ({any_op}) -> {any_op}\n"
        f"    %mb{op}_op, %mb{op} = transform.structured.tile_using_forall %mm{op} "
        f"tile_sizes [{batch_block}{bm}, {bn}, 0] (mapping = [{blocks}]) : {tiled}\n"
        f"    %mi{op} = transform.param.constant {op} : i64 -> !transform.param<i64>\n"
        f'    transform.annotate %mb{op} "{attr}" = %mi{op} : {any_op}, !transform.param<i64>\n'
        f"    %mw{op}_op, %mw{op} = transform.structured.tile_using_forall %mb{op}_op "
        f"tile_sizes [{batch_warp}{wm}, {wn}, 0] (mapping = [{warps}]) : {tiled}\n"
        f'    transform.annotate %mw{op}_op "{MMA_ATTR}" : {any_op}\n'
    ) + tile_annotations(f"%mw{op}_op", wm, wn, str(op))


def fragment_places(shape: tuple[int, int, int]) -> dict[str, list[Place]]:
    """Per operand (``a``: m x k, ``b``: k x n, ``c``: m x n), where each element of one
    lane's fragment sits in the tile, in register order (the PTX ISA's ``mma.m16n8k16`` and
    ``mma.m16n8k8`` TF32 layouts)."""
    if shape == HALF_SHAPE:  # A 4 regs x 2 halves, B 2 x 2
        a = [(1, 0, 8 * (i % 2), 0, 2, 8 * (i // 2) + j) for i in range(4) for j in range(2)]
        b = [(0, 2, 8 * i + j, 1, 0, 0) for i in range(2) for j in range(2)]
    else:  # TF32 m16n8k8: A 4 x 1, B 2 x 1
        a = [(1, 0, 8 * (i % 2), 0, 1, 4 * (i // 2)) for i in range(4)]
        b = [(0, 1, 4 * i, 1, 0, 0) for i in range(2)]
    c = [(1, 0, 8 * i, 0, 2, j) for i in range(2) for j in range(2)]
    return {"a": a, "b": b, "c": c}


def fragment_vector_shapes(shape: tuple[int, int, int]) -> dict[str, tuple[int, int]]:
    """The ``nvgpu.mma.sync`` operand vector shapes (registers x elements per register)."""
    per = 2 if shape == HALF_SHAPE else 1
    return {"a": (4, per), "b": (2, per), "c": (2, 2)}


def lane_places(shape: tuple[int, int, int]) -> dict[str, list[list[tuple[int, int]]]]:
    """For each operand and lane, the (row, col) of each element it holds: what the rewrite
    loads and stores, for checking that the lanes cover each tile exactly once."""
    out: dict[str, list[list[tuple[int, int]]]] = {}
    for name, places in fragment_places(shape).items():
        out[name] = [
            [(rg * (lane // 4) + rt * (lane % 4) + rc, cg * (lane // 4) + ct * (lane % 4) + cc)
             for rg, rt, rc, cg, ct, cc in places]
            for lane in range(WARP_SIZE)
        ]  # fmt: skip
    return out


def rewrite_mma(module: Any) -> int:
    """Replace every matmul annotated :data:`MMA_ATTR` (on memrefs, one instruction's
    tile, inside a warp) by fragment loads, one ``nvgpu.mma.sync`` and the accumulator's
    stores; returns how many. The TF32 form is taken where the inputs are f32."""
    from stagegraph.mlir.walk import collect

    ops = collect(module, lambda op: MMA_ATTR in op.attributes)
    for op in ops:
        _replace(op)
    return len(ops)


def _stager(build: _Builder, a: Any, b: Any, tile: tuple[int, int, int], lane: Any) -> Any:
    """The cp.async staging of this warp's tiles (None where they cannot be staged)."""
    from stagegraph.stages.gpu.mma_staged import Stager, can_stage

    wm, wn, bk = tile
    warps = WARP_GRID[0] * WARP_GRID[1]
    if not can_stage(a, b, wm, wn, bk, warps):
        return None
    return Stager(build, a, b, wm, wn, bk, warps, lane)


def _next_step(build: _Builder, stager: Any, kk: Any, k: int) -> Any:
    """In the loop body at K offset ``kk``: copy the next step (the last one again at the
    end, into the free stage), wait for this one; returns this step's stage."""
    bk = stager.bk
    step = build.op("arith.divui", [build.index], [kk, build.const(bk)])
    stage = build.op("arith.remui", [build.index], [step, build.const(2)])
    following = build.op("arith.addi", [build.index], [kk, build.const(bk)])
    following = build.op("arith.minui", [build.index], [following, build.const(k - bk)])
    other = build.op("arith.subi", [build.index], [build.const(1), stage])
    stager.wait(stager.copy_step(following, other), 1)
    return stage


def _replace(op: Any) -> None:
    """One warp's ``wm x wn x K`` matmul: C's fragments loaded once, a loop over K whose
    body loads the A and B fragments (each reused across the warp tile) and issues one
    ``mma.sync`` per (16 x 8) fragment of C, carried as loop values, stored once."""
    from stagegraph.mlir.bindings import dialect
    from stagegraph.stages.gpu.epilogue import WarpEpilogue
    from stagegraph.stages.gpu.mma_bounds import Bounds, static_tile

    build = _Builder(op)
    ir, scf = build.ir, dialect("scf")
    a, b = op.operands[0], op.operands[1]
    element = ir.MemRefType(a.type).element_type
    shape = TF32_SHAPE if isinstance(element, ir.F32Type) else HALF_SHAPE
    (wm, wn), k = static_tile(op), ir.MemRefType(a.type).shape[-1]
    bounds = Bounds(build, a, b, k, shape[2])
    build.bounds = bounds if bounds.masked else None
    places, vectors = fragment_places(shape), fragment_vector_shapes(shape)
    lane_id = build.op("gpu.lane_id", [build.index], [])
    lane = (build.op("arith.divui", [build.index], [lane_id, build.const(4)]),
            build.op("arith.remui", [build.index], [lane_id, build.const(4)]))  # fmt: skip
    tiles = [(i, j) for i in range(0, wm, shape[0]) for j in range(0, wn, shape[1])]
    origins = {v: build.const(v) for v in {0, *(i for i, _ in tiles), *(j for _, j in tiles)}}
    epilogue = WarpEpilogue(op)
    acc = [_start(build, epilogue, places["c"], lane, (origins[i], origins[j]), vectors["c"])
           for i, j in tiles]  # fmt: skip
    stager = _stager(build, a, b, (wm, wn, shape[2]), lane_id)
    if stager is not None:
        stager.copy_step(origins[0], origins[0])
    with build.location:
        loop = scf.ForOp(origins[0], build.const(bounds.k_steps), build.const(shape[2]), acc,
                         ip=build.point)  # fmt: skip
    outer, build.point = build.point, ir.InsertionPoint(loop.body)
    kk = loop.induction_variable
    if stager is None:
        a_at, b_at, a_prefix, b_prefix = a, b, None, None
        a_col, b_row = kk, kk
    else:
        stage = _next_step(build, stager, kk, bounds.k_steps)
        a_at, b_at = stager.buffers
        a_prefix = b_prefix = [stager.warp, stage]
        a_col = b_row = origins[0]
    row_origins = {i: origins[i] for i in sorted({i for i, _ in tiles})}
    col_origins = {j: origins[j] for j in sorted({j for _, j in tiles})}
    if stager is not None and shape == HALF_SHAPE:  # ldmatrix from the staged tiles
        rows, cols = stager.ldmatrix_fragments(a_prefix[1], row_origins, col_origins)
    else:
        a_limits = (bounds.rows, bounds.k_value) if stager is None else None
        b_limits = (bounds.k_value, bounds.cols) if stager is None else None
        rows = {i: build.fragment(a_at, places["a"], lane, (at, a_col), vectors["a"], a_prefix,
                                  a_limits) for i, at in row_origins.items()}  # fmt: skip
        cols = {j: build.fragment(b_at, places["b"], lane, (b_row, at), vectors["b"], b_prefix,
                                  b_limits) for j, at in col_origins.items()}  # fmt: skip
    attrs = {"mmaShape": ir.ArrayAttr.get([ir.IntegerAttr.get(
        ir.IntegerType.get_signless(64), d) for d in shape])}  # fmt: skip
    if shape == TF32_SHAPE:
        attrs["tf32Enabled"] = ir.UnitAttr.get()
    results = [build.op("nvgpu.mma.sync", [value.type], [rows[i], cols[j], value], **attrs)
               for (i, j), value in zip(tiles, loop.inner_iter_args, strict=True)]  # fmt: skip
    if stager is not None:
        stager.barrier()  # every lane has read this stage before it is copied over
    build.op("scf.yield", [], results)
    build.point = outer
    if stager is not None:
        stager.wait(stager.first, 0)
    if epilogue.consumer is not None:  # after the ops that define its operands
        build.point = ir.InsertionPoint(epilogue.consumer)
    for (i, j), value in zip(tiles, loop.results, strict=True):
        _store(build, epilogue, value, places["c"], lane, (origins[i], origins[j]))
    epilogue.finish(op)


def _start(build: _Builder, epilogue: Any, places: list[Place], lane: tuple[Any, Any],
           origin: tuple[Any, Any], shape: tuple[int, int]) -> Any:  # fmt: skip
    """An accumulator's first value: the fill's scalar where a fill zeroes C (C is then
    never read), else this lane's fragment of C."""
    from stagegraph.stages.gpu.epilogue import _convert

    ir = build.ir
    with build.location:
        vector = ir.VectorType.get(list(shape), ir.F32Type.get())
    if epilogue.start is None:
        bounds = build.bounds
        limits = (bounds.rows, bounds.cols) if bounds is not None else None
        loaded = build.fragment(epilogue.source, places, lane, origin, shape, None, limits)
        return loaded if loaded.type == vector else build.op("arith.extf", [vector], [loaded])
    start = _convert(build, epilogue.start, ir.F32Type.get())
    return build.op("vector.broadcast", [vector], [start])


def _store(build: _Builder, epilogue: Any, value: Any, places: list[Place],
           lane: tuple[Any, Any], origin: tuple[Any, Any]) -> None:  # fmt: skip
    """Each element of one accumulator: through the epilogue's body into its output, or
    into C where there is no epilogue."""
    from stagegraph.stages.gpu.epilogue import _convert, apply_in_registers

    ir, c = build.ir, epilogue.c
    for n, (rg, rt, rc, cg, ct, cc) in enumerate(places):
        item = build.op("vector.extract", [ir.F32Type.get()], [value],
                        static_position=ir.DenseI64ArrayAttr.get([n // 2, n % 2]))  # fmt: skip
        row = build.affine(*lane, (rg, rt, rc), origin[0])
        col = build.affine(*lane, (cg, ct, cc), origin[1])
        outer = build.point
        if build.bounds is not None:  # nothing stored past the edges
            build.point = build.bounds.guarded(
                build.bounds.inside(row, build.bounds.rows, col, build.bounds.cols)
            )
        if epilogue.consumer is None:
            item = _convert(build, item, ir.MemRefType(c.type).element_type)
            build.op("memref.store", [], [item, c, *build.batch(c), row, col])
        else:
            apply_in_registers(build, epilogue.consumer, c, item, [*build.batch(c), row, col])
        build.point = outer
