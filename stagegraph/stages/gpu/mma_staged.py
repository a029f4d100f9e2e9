"""Shared-memory staging of the tensor-core operands with ``cp.async`` (sm_80 and up).

Each warp copies its A (``wm x bk``) and B (``bk x wn``) tiles of the next K step into its
own part of shared memory with 16-byte ``nvgpu.device_async_copy`` (``cp.async``), while
it computes on the current step's tiles: two stages, one ``cp.async`` group per step,
``nvgpu.device_async_wait`` for the older group and a barrier before the fragments are
read from shared memory. Global reads become coalesced 16-byte copies instead of the
fragments' scattered 2- and 4-byte loads.

The buffers are ``memref.alloc`` in workgroup memory while the kernel is built; after
outlining :func:`allocs_to_globals` makes each one a ``memref.global`` of its
``gpu.module`` (static shared memory, which the NVVM lowering gives ``addrspace(3)``).
"""

from __future__ import annotations

from typing import Any

#: Bytes one ``cp.async`` copies (the largest it takes, and the one that bypasses L1).
CHUNK_BYTES = 16
STAGES = 2
#: Static shared memory a block may have without opting in to more.
STATIC_SHARED_BYTES = 48 * 1024


def _row_aligned(memref_type: Any, element_bytes: int) -> bool:
    """Unit inner stride and a static row stride of whole 16-byte chunks."""
    strides, _ = memref_type.get_strides_and_offset()
    row, inner = strides[-2], strides[-1]
    return inner == 1 and 0 < row < 2**62 and (row * element_bytes) % CHUNK_BYTES == 0


def padded_shapes(wm: int, wn: int, bk: int, element_bytes: int) -> tuple[tuple[int, int], ...]:
    """The A (``wm x bk``) and B (``bk x wn``) stage buffers, each row padded by one
    16-byte chunk: the eight 16-byte rows an ``ldmatrix`` phase reads then fall in
    distinct banks (a row of 32 or 128 bytes would put two of them in the same banks)."""
    pad = CHUNK_BYTES // element_bytes
    return (wm, bk + pad), (bk, wn + pad)


def shared_bytes(wm: int, wn: int, bk: int, element_bytes: int, warps: int) -> int:
    """Shared memory of one block: every warp's two stages of (padded) A and B tiles."""
    (am, ak), (bkr, bn) = padded_shapes(wm, wn, bk, element_bytes)
    return warps * STAGES * (am * ak + bkr * bn) * element_bytes


def can_stage(a: Any, b: Any, wm: int, wn: int, bk: int, warps: int) -> bool:
    """Whether the warp tiles can be staged: rows of whole 16-byte chunks in global memory
    and in the tiles, and the block's buffers within static shared memory."""
    from stagegraph.mlir.bindings import ir

    a_type, b_type = ir.MemRefType(a.type), ir.MemRefType(b.type)
    size = ir.FloatType(a_type.element_type).width // 8
    lanes = CHUNK_BYTES // size
    return (
        _row_aligned(a_type, size) and _row_aligned(b_type, size)
        and bk % lanes == 0 and wn % lanes == 0
        and shared_bytes(wm, wn, bk, size, warps) <= STATIC_SHARED_BYTES
    )  # fmt: skip


class Stager:
    """Builds one warp's staging: buffers, the copies of a K step, the waits."""

    def __init__(self, build: Any, a: Any, b: Any, wm: int, wn: int, bk: int, warps: int,
                 lane: Any) -> None:  # fmt: skip
        from stagegraph.mlir.bindings import ir

        self.build, self.ir, self.bk, self.lane = build, ir, bk, lane
        self.kind = ir.MemRefType(a.type).element_type
        self.lanes = CHUNK_BYTES // (ir.FloatType(self.kind).width // 8)
        self.sources = (a, b)
        self.shapes = ((wm, bk), (bk, wn))
        with build.location:
            space = ir.Attribute.parse("#gpu.address_space<workgroup>")
            size = CHUNK_BYTES // self.lanes
            types = [ir.MemRefType.get([warps, STAGES, *s], self.kind, memory_space=space)
                     for s in padded_shapes(wm, wn, bk, size)]  # fmt: skip
        self.buffers = [build.op("memref.alloc", [t], [], operandSegmentSizes=ir.DenseI32ArrayAttr
                                 .get([0, 0])) for t in types]  # fmt: skip
        tid = build.op("gpu.thread_id", [build.index], [],
                       dimension=ir.Attribute.parse("#gpu<dim x>"))  # fmt: skip
        self.warp = build.op("arith.divui", [build.index], [tid, build.const(32)])

    def copy_step(self, k: Any, stage: Any) -> Any:
        """``cp.async`` the A and B tiles at K offset ``k`` into ``stage``; one group."""
        from stagegraph.mlir.bindings import dialect

        nvgpu, build = dialect("nvgpu"), self.build
        tokens = []
        for which, (source, buffer, (rows, cols)) in enumerate(
            zip(self.sources, self.buffers, self.shapes, strict=True)
        ):
            per_row = cols // self.lanes
            total = rows * per_row
            for step in range(-(-total // 32)):
                chunk = build.op("arith.addi", [build.index], [self.lane, build.const(32 * step)])
                if total % 32:
                    chunk = build.op("arith.remui", [build.index], [chunk, build.const(total)])
                row = build.op("arith.divui", [build.index], [chunk, build.const(per_row)])
                col = build.op("arith.remui", [build.index], [chunk, build.const(per_row)])
                col = build.op("arith.muli", [build.index], [col, build.const(self.lanes)])
                if which == 0:  # A: K runs along the columns
                    src_row, src_col = row, build.op("arith.addi", [build.index], [col, k])
                else:  # B: along the rows
                    src_row, src_col = build.op("arith.addi", [build.index], [row, k]), col
                elements = self._elements(which, src_row, src_col)
                with build.location:
                    copy = nvgpu.DeviceAsyncCopyOp(
                        buffer,
                        [self.warp, stage, row, col],
                        source,
                        [*build.batch(source), src_row, src_col],
                        self.lanes,
                        srcElements=elements,
                        bypassL1=True,
                        ip=build.point,
                    )
                tokens.append(copy.result)
        with build.location:
            group = nvgpu.DeviceAsyncCreateGroupOp(tokens, ip=build.point).result
        self.first = getattr(self, "first", group)  # the prologue's: it dominates the end
        return group

    def _elements(self, which: int, row: Any, col: Any) -> Any:
        """A partial tile's source elements for the chunk at (``row``, ``col``) of A
        (``which`` 0) or B (zero-filled past the edges); None for a whole tile."""
        bounds = self.build.bounds
        if bounds is None:
            return None
        if which == 0:
            return bounds.copy_elements(bounds.below(row, bounds.rows), col, bounds.k_value,
                                        self.lanes)  # fmt: skip
        return bounds.copy_elements(bounds.below(row, bounds.k_value), col, bounds.cols,
                                    self.lanes)  # fmt: skip

    def wait(self, group: Any, pending: int) -> None:
        """Wait until at most ``pending`` groups are in flight (``group``: any group token;
        the wait counts groups), then a block barrier."""
        from stagegraph.mlir.bindings import dialect

        with self.build.location:
            dialect("nvgpu").DeviceAsyncWaitOp(group, numGroups=pending, ip=self.build.point)
        self.barrier()

    def ldmatrix_fragments(self, stage: Any, rows: dict[int, Any], cols: dict[int, Any]
                           ) -> tuple[dict[int, Any], dict[int, Any]]:  # fmt: skip
        """The f16/bf16 A fragments (one per 16-row origin in ``rows``) and B fragments (one
        per 8-column origin in ``cols``) of ``stage`` by ``ldmatrix``: A as four 8x8
        matrices (rows 0-7/8-15 by columns 0-7/8-15, in the register order of
        ``mma.m16n8k16``), lane ``l`` naming row ``l % 16`` of column block ``l / 16``; B as
        two transposed 8x8 matrices (K rows 0-7 and 8-15), lane ``l`` naming K row
        ``l % 16``."""
        from stagegraph.mlir.bindings import dialect

        build, ir, nvgpu = self.build, self.ir, dialect("nvgpu")
        lane = self.lane
        a_row = build.op("arith.remui", [build.index], [lane, build.const(16)])
        a_col = build.op("arith.divui", [build.index], [lane, build.const(16)])
        a_col = build.op("arith.muli", [build.index], [a_col, build.const(8)])
        with build.location:
            a_type = ir.VectorType.get([4, 2], self.kind)
            b_type = ir.VectorType.get([2, 2], self.kind)
        a_frags, b_frags = {}, {}
        a_buffer, b_buffer = self.buffers
        for origin, at in rows.items():
            row = build.op("arith.addi", [build.index], [at, a_row])
            indices = [self.warp, stage, row, a_col]
            with build.location:
                load = nvgpu.LdMatrixOp(a_type, a_buffer, indices, False, 4, ip=build.point)
            a_frags[origin] = load.result
        for origin, at in cols.items():
            indices = [self.warp, stage, a_row, at]
            with build.location:
                load = nvgpu.LdMatrixOp(b_type, b_buffer, indices, True, 2, ip=build.point)
            b_frags[origin] = load.result
        return a_frags, b_frags

    def barrier(self) -> None:
        self.build.op("gpu.barrier", [], [])


def allocs_to_globals(module: Any) -> int:
    """Each workgroup-memory ``memref.alloc`` in a ``gpu.module`` becomes a private
    ``memref.global`` of that module read by ``memref.get_global``; returns how many."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import collect

    count = 0
    workgroup = ir.Attribute.parse("#gpu.address_space<workgroup>")
    for gpu_module in collect(module, "gpu.module"):
        body = gpu_module.regions[0].blocks[0]
        for alloc in collect(gpu_module, "memref.alloc"):
            memref_type = ir.MemRefType(alloc.results[0].type)
            if memref_type.memory_space is None or memref_type.memory_space != workgroup:
                continue
            name = f"__stagegraph_smem_{count}"
            with alloc.location:
                ir.Operation.create(
                    "memref.global", attributes={
                        "sym_name": ir.StringAttr.get(name),
                        "sym_visibility": ir.StringAttr.get("private"),
                        "type": ir.TypeAttr.get(memref_type),
                        "alignment": ir.IntegerAttr.get(ir.IntegerType.get_signless(64), 16),
                    }, ip=ir.InsertionPoint.at_block_begin(body),
                )  # fmt: skip
                with ir.InsertionPoint(alloc):
                    got = ir.Operation.create(
                        "memref.get_global", results=[memref_type],
                        attributes={"name": ir.FlatSymbolRefAttr.get(name)},
                    )  # fmt: skip
            alloc.results[0].replace_all_uses_with(got.results[0])
            alloc.erase()
            count += 1
    return count
