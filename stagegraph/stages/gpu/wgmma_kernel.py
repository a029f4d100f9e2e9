"""The body of one wgmma block (:mod:`stagegraph.stages.gpu.wgmma`), built through the
bindings from nvgpu, nvvm, gpu, memref, scf and arith ops in place of the block's matmul.

The shared memory is one dynamic buffer: ``stages`` A slots (``128 x 64``), then
``stages`` B slots (``64 x tile_n``, each ``tile_n / 64`` TMA boxes of ``64 x 64`` one after
the other, which is the layout ``nvgpu.warpgroup.mma`` expects of a transposed B); the
epilogue reuses it from byte 0 for the f32 C tile.

Accumulators are ``m64`` fragments (``64 x tile_n``), one ``nvgpu.warpgroup.mma`` each per
K step: a plain block's warpgroup holds two (rows 0-63 and 64-127). Two facts of the
upstream ``nvgpu.warpgroup.mma.store`` lowering (NVGPUToNVVM.cpp) decide how they are
stored, both found on an H200 where the first build wrote wrong rows and left others
unwritten: (1) it places the rows of a fragment by the block's raw ``threadIdx.x``
(warp ``w`` of the block writes rows ``16w + lane / 4`` and ``+ 8`` of the destination),
so the warpgroup of threads ``128g..`` writes rows ``64g..64g+63``; (2) an accumulator of
several ``m64`` fragments stores fragment ``i`` at row ``i * tile_n / 2`` (its running
offset counts registers, not rows), right only at ``tile_n = 128``. So every store here
takes one fragment, into a destination whose row ``64g`` is where warpgroup ``g``'s
fragment belongs (:meth:`_Block.store_fragments`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from stagegraph.errors import UnsupportedPayloadError
from stagegraph.stages.gpu.mma import _Builder
from stagegraph.stages.gpu.wgmma import (
    BOX_N,
    SHARED_ATTR,
    TILE_K,
    TILE_M,
    WAIT_TICKS,
    WARPGROUP,
    WGMMA_M,
    dynamic_shared_bytes,
)


def _block_forall(op: Any) -> Any:
    """The outermost ``scf.forall`` around ``op`` (the block loop of the schedule)."""
    found, parent = None, op.parent
    while parent is not None:
        if parent.name == "scf.forall":
            found = parent
        parent = parent.parent
    if found is None:
        raise UnsupportedPayloadError("stage gpu.lower: a wgmma matmul outside a block loop")
    return found


def _root(value: Any, forall: Any) -> tuple[Any, list[Any]]:
    """The memref defined outside ``forall`` that ``value`` views, and the view's offsets
    in it (an int or a value each): a subview of it, or the memref itself."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import defining_op, nested_in

    owner = defining_op(value)
    if not nested_in(owner, {forall.operation}):
        return value, [0, 0]
    if owner.name != "memref.subview" or nested_in(defining_op(owner.operands[0]),
                                                  {forall.operation}):  # fmt: skip
        raise UnsupportedPayloadError(
            f"stage gpu.lower: a wgmma operand comes from {owner.name}, not a block's view "
            "of a buffer"
        )
    static = list(ir.DenseI64ArrayAttr(owner.attributes["static_offsets"]))
    dynamic = iter(list(owner.operands)[1 : 1 + sum(1 for s in static if s == _dynamic())])
    return owner.operands[0], [next(dynamic) if s == _dynamic() else s for s in static]


def _dynamic() -> int:
    from stagegraph.mlir.bindings import ir

    return ir.ShapedType.get_dynamic_stride_or_offset()


def _tma_view(memref: Any) -> bool:
    """A static 2-D view TMA can describe: unit inner stride, rows and start on 16-byte
    boundaries (any other static layout goes into the tensor map as it is)."""
    from stagegraph.mlir.bindings import ir

    mtype = ir.MemRefType(memref.type)
    if mtype.rank != 2 or not mtype.has_static_shape:
        return False
    strides, offset = mtype.get_strides_and_offset()
    size = ir.FloatType(mtype.element_type).width // 8
    dynamic = ir.ShapedType.get_dynamic_stride_or_offset()
    return (dynamic not in (*strides, offset) and strides[1] == 1
            and strides[0] * size % 16 == 0 and offset * size % 16 == 0)  # fmt: skip


def _as_pointer(host: _Builder, build: _Builder, descriptor: Any) -> Any:
    """``descriptor`` carried into the kernel as the 64-bit device address of the encoded
    tensor map (the host plan passes it), turned back into a pointer and the descriptor
    inside: the GPU-to-NVVM lowering cannot convert a kernel parameter of the descriptor
    type, and a plain cast pair would fold away before outlining. In the kernel the
    NVVM lowering makes the descriptor a generic pointer again, and
    ``reconcile-unrealized-casts`` drops the casts."""
    from stagegraph.mlir.bindings import ir, llvm

    cast = "builtin.unrealized_conversion_cast"
    with host.location:
        i64, pointer = ir.IntegerType.get_signless(64), llvm.PointerType.get()
    address = host.op(cast, [i64], [descriptor])
    carried = build.op("llvm.inttoptr", [pointer], [address])
    return build.op(cast, [descriptor.type], [carried])


class _Block:
    """Builds one block's pipeline at ``build``'s insertion point."""

    def __init__(self, build: _Builder, descriptors: tuple[Any, Any], origin: tuple[Any, Any],
                 shape: tuple[Any, int, int], stages: int, consumers: int = 1) -> None:  # fmt: skip
        from stagegraph.mlir.bindings import ir

        self.build, self.ir = build, ir
        self.descriptors, self.origin = descriptors, origin
        self.element, self.tile_n, self.k = shape
        self.stages = stages
        #: Warpgroups doing wgmma, each on ``rows`` rows of the block's 128, in ``parts``
        #: ``m64`` accumulators (two in a plain block, one per consumer otherwise).
        self.consumers, self.rows = consumers, TILE_M // consumers
        self.parts = self.rows // WGMMA_M
        #: Whether C holds zeros before the block (then it is stored, not added to).
        self.zero_init = False
        #: The fused consumer's :class:`~stagegraph.stages.gpu.epilogue.WarpEpilogue`, or
        #: None: then the C tile goes through the consumer's body on its way out.
        self.fused: Any = None
        self.a_bytes = TILE_M * TILE_K * 2
        self.b_bytes = TILE_K * self.tile_n * 2
        with build.location:
            self.space = ir.Attribute.parse("#gpu.address_space<workgroup>")
            self.i1 = ir.IntegerType.get_signless(1)

    def memref(self, shape: list[int], element: Any) -> Any:
        with self.build.location:
            return self.ir.MemRefType.get(shape, element, memory_space=self.space)

    def view(self, offset: Any, shape: list[int], element: Any = None) -> Any:
        """A typed view of the dynamic shared memory at byte ``offset``."""
        from stagegraph.mlir.bindings import memref

        kind = self.memref(shape, element or self.element)
        with self.build.location:
            return memref.ViewOp(kind, self.smem, offset, [], ip=self.build.point).result

    def index(self, name: str, *operands: Any) -> Any:
        return self.build.op(f"arith.{name}", [self.build.index], list(operands))

    def scaled(self, value: Any, factor: int, plus: int = 0) -> Any:
        out = self.index("muli", value, self.build.const(factor))
        return self.index("addi", out, self.build.const(plus)) if plus else out

    def prepare(self) -> None:
        """Thread 0 initialises the mbarriers (:meth:`barrier_counts`: one group, one
        barrier per stage) and prefetches the descriptors; a block barrier makes the
        barriers visible before anyone waits on them."""
        from stagegraph.mlir.bindings import gpu, nvgpu

        build, ir = self.build, self.ir
        with build.location:
            self.tid = gpu.ThreadIdOp(gpu.Dimension.x, ip=build.point).result
            group = ir.Type.parse(
                "!nvgpu.mbarrier.group<memorySpace = #gpu.address_space<workgroup>, "
                f"num_barriers = {self.stages}>"
            )
            groups = [(nvgpu.MBarrierCreateOp(group, ip=build.point).result, count)
                      for count in self.barrier_counts()]  # fmt: skip
        self.first = self.compare(0, self.tid, build.const(0))
        self.barriers = groups[0][0]
        self.groups = [g for g, _ in groups]
        with self.only_if(self.first):
            for barriers, count in groups:
                for slot in range(self.stages):
                    with build.location:
                        nvgpu.MBarrierInitOp(barriers, build.const(count), build.const(slot),
                                             ip=build.point)  # fmt: skip
            for descriptor in self.descriptors:
                with build.location:
                    nvgpu.TmaPrefetchOp(descriptor, ip=build.point)
        with build.location:
            gpu.BarrierOp(ip=build.point)
            raw = ir.MemRefType.get([_dynamic_size()], ir.IntegerType.get_signless(8),
                                    memory_space=self.space)  # fmt: skip
            made = gpu.DynamicSharedMemoryOp(raw, ip=build.point)
        made.operation.attributes[SHARED_ATTR] = ir.IntegerAttr.get(
            ir.IntegerType.get_signless(64), dynamic_shared_bytes(self.stages, self.tile_n)
        )
        self.smem = made.result

    def barrier_counts(self) -> list[int]:
        """Arrivals per phase of each barrier group: the loads' one ``expect_tx``."""
        return [1]

    @contextmanager
    def only_if(self, condition: Any) -> Iterator[None]:
        """Build the ops of the ``with`` body under ``scf.if condition`` (a branch, not
        predicated instructions: the NVVM lowering would print a predicate that folded to
        a constant as ``@0``/``@1``, which ptxas rejects)."""
        from stagegraph.mlir.bindings import scf

        with self.build.location:
            branch = scf.IfOp(condition, ip=self.build.point)
        outer, self.build.point = self.build.point, self.ir.InsertionPoint(branch.then_block)
        try:
            yield
            self.build.op("scf.yield", [], [])
        finally:
            self.build.point = outer

    def slot_views(self, slot: Any) -> tuple[Any, Any]:
        """Stage ``slot``'s A tile and its whole B tile (``64 x tile_n``)."""
        a = self.view(self.scaled(slot, self.a_bytes), [TILE_M, TILE_K])
        b_at = self.scaled(slot, self.b_bytes, self.stages * self.a_bytes)
        return a, self.view(b_at, [TILE_K, self.tile_n])

    def load(self, slot: Any, step: Any) -> None:
        """Expect the stage's bytes on its barrier and issue the TMA loads of K step
        ``step`` (one thread does): A at (m0, k), B's boxes at (k, n0 + 64j)."""
        from stagegraph.mlir.bindings import nvgpu

        build = self.build
        a_desc, b_desc = self.descriptors
        m0, n0 = self.origin
        with build.location:
            nvgpu.MBarrierArriveExpectTxOp(self.barriers, build.const(self.a_bytes + self.b_bytes),
                                           slot, ip=build.point)  # fmt: skip
            k = self.scaled(step, TILE_K)
            a_view = self.view(self.scaled(slot, self.a_bytes), [TILE_M, TILE_K])
            nvgpu.TmaAsyncLoadOp(a_view, self.barriers, a_desc, [k, m0], slot, ip=build.point)
            for box in range(self.tile_n // BOX_N):
                at = self.scaled(
                    slot, self.b_bytes, self.stages * self.a_bytes + box * TILE_K * BOX_N * 2
                )
                b_view = self.view(at, [TILE_K, BOX_N])
                n = self.index("addi", n0, build.const(box * BOX_N))
                nvgpu.TmaAsyncLoadOp(b_view, self.barriers, b_desc, [n, k], slot, ip=build.point)

    def accumulator_type(self) -> Any:
        """One ``m64`` fragment: ``64 x tile_n`` f32 (see the module's docstring)."""
        with self.build.location:
            return self.ir.Type.parse("!nvgpu.warpgroup.accumulator<fragmented = "
                                      f"vector<{WGMMA_M}x{self.tile_n}xf32>>")  # fmt: skip

    def zero_accumulators(self) -> list[Any]:
        """This warpgroup's ``parts`` accumulators, zeroed."""
        from stagegraph.mlir.bindings import nvgpu

        with self.build.location:
            return [nvgpu.WarpgroupMmaInitAccumulatorOp(self.accumulator_type(),
                                                        ip=self.build.point).result
                    for _ in range(self.parts)]  # fmt: skip

    def flag(self, value: int) -> Any:
        return self.build.op("arith.constant", [self.i1], [],
                             value=self.ir.IntegerAttr.get(self.i1, value))  # fmt: skip

    def compare(self, predicate: int, lhs: Any, rhs: Any) -> Any:
        """``arith.cmpi`` (0: eq, 1: ne, 6: ult, 8: ugt) on two index values."""
        return self.build.op("arith.cmpi", [self.i1], [lhs, rhs], predicate=self.ir.IntegerAttr
                             .get(self.ir.IntegerType.get_signless(64), predicate))  # fmt: skip

    def wait(self, barriers: Any, slot: Any, phase: Any) -> None:
        from stagegraph.mlir.bindings import nvgpu

        with self.build.location:
            nvgpu.MBarrierTryWaitParityOp(barriers, phase, self.build.const(WAIT_TICKS), slot,
                                          ip=self.build.point)  # fmt: skip

    def next_phase(self, phase: Any, slot: Any) -> Any:
        """The barrier phase parity after ``slot``: flipped once every slot was used."""
        last = self.compare(0, slot, self.build.const(self.stages - 1))
        flipped = self.build.op("arith.xori", [self.i1], [phase, self.flag(1)])
        return self.build.op("arith.select", [self.i1], [last, flipped, phase])

    def describe(self, view: Any, descriptor: Any) -> Any:
        from stagegraph.mlir.bindings import nvgpu

        with self.build.location:
            kind = self.ir.Type.parse(f"!nvgpu.warpgroup.descriptor<tensor = {view.type}>")
            return nvgpu.WarpgroupGenerateDescriptorOp(kind, view, descriptor,
                                                       ip=self.build.point).result  # fmt: skip

    def accumulate(self, accs: list[Any], slot: Any, consumer: Any = None) -> list[Any]:
        """One wgmma step on stage ``slot``: each ``m64`` part of this consumer's ``rows``
        of A (``consumer``: its index, None for the only one) by the stage's B, into its
        accumulator. Each part is one wgmma group, whose lowering waits until at most
        ``parts`` groups (this step's) are in flight: the previous step's are complete,
        so its slot may be refilled or freed."""
        from stagegraph.mlir.bindings import nvgpu

        build = self.build
        a_at = self.scaled(slot, self.a_bytes)
        if consumer is not None:
            a_at = self.index("addi", a_at, self.scaled(consumer, self.rows * TILE_K * 2))
        b_view = self.view(self.scaled(slot, self.b_bytes, self.stages * self.a_bytes),
                           [TILE_K, self.tile_n])  # fmt: skip
        b_described = self.describe(b_view, self.descriptors[1])
        out = []
        for part, acc in enumerate(accs):
            at = self.index("addi", a_at, build.const(part * WGMMA_M * TILE_K * 2))
            a_described = self.describe(self.view(at, [WGMMA_M, TILE_K]), self.descriptors[0])
            with build.location:
                out.append(nvgpu.WarpgroupMmaOp(
                    self.accumulator_type(), a_described, b_described, acc,
                    waitGroup=self.parts, transposeB=True, ip=build.point).result)  # fmt: skip
        return out

    def store_fragments(self, accs: list[Any], target: Any) -> None:
        """Store this warpgroup's accumulators into ``target`` (the block's ``128 x
        tile_n`` C, global or shared): part ``p`` into the ``64`` rows from ``64p`` on. The
        lowering adds ``64g`` rows for warpgroup ``g`` itself (module docstring): a
        consumer's fragment goes to the first 64 rows' view and lands in its own rows
        (consumer 1's past the view's 64, inside the block's 128); a plain block (``g =
        0``) has two parts."""
        from stagegraph.mlir.bindings import memref, nvgpu

        build = self.build
        for part, acc in enumerate(accs):
            with build.location:
                into = memref.subview(target, [part * WGMMA_M, 0], [WGMMA_M, self.tile_n],
                                      [1, 1], ip=build.point)  # fmt: skip
                nvgpu.WarpgroupMmaStoreOp(acc, into, ip=build.point)

    def loop(self, steps: int, carried: list[Any]) -> tuple[Any, Any]:
        """An ``scf.for`` over ``steps`` carrying ``carried``; the builder moves into its
        body. Returns the loop and the insertion point to come back to."""
        from stagegraph.mlir.bindings import scf

        build = self.build
        with build.location:
            made = scf.ForOp(build.const(0), build.const(steps), build.const(1), carried,
                             ip=build.point)  # fmt: skip
        outer, build.point = build.point, self.ir.InsertionPoint(made.body)
        return made, outer

    def mainloop(self) -> Any:
        """The prologue's loads, then the loop over K steps; returns the accumulators."""
        from stagegraph.mlir.bindings import nvvm

        build = self.build
        steps = self.k // TILE_K
        with self.only_if(self.first):
            for step in range(min(self.stages - 1, steps)):
                self.load(build.const(step), build.const(step))
        loop, outer = self.loop(steps, [*self.zero_accumulators(), self.flag(0)])
        step = loop.induction_variable
        *accs, phase = loop.inner_iter_args
        slot = self.index("remui", step, build.const(self.stages))
        self.wait(self.barriers, slot, phase)
        accs = self.accumulate(accs, slot)
        self.refill(step, steps)
        build.op("scf.yield", [], [*accs, self.next_phase(phase, slot)])
        build.point = outer
        with build.location:
            nvvm.WgmmaWaitGroupSyncOp(0, ip=build.point)
        return list(loop.results)[: self.parts]

    def refill(self, step: Any, steps: int) -> None:
        """Load K step ``step + stages - 1`` into its slot (the one the previous step read,
        whose wgmma group has completed), where that step exists."""
        build = self.build
        ahead = self.index("addi", step, build.const(self.stages - 1))
        exists = self.compare(6, ahead, build.const(steps))
        with self.only_if(build.op("arith.andi", [self.i1], [exists, self.first])):
            self.load(self.index("remui", ahead, build.const(self.stages)), ahead)

    def make_tile(self) -> None:
        """The f32 C tile in shared memory (over the stages, once they are all read)."""
        f32 = self.ir.F32Type.get(self.build.location.context)
        self.tile = self.view(self.build.const(0), [TILE_M, self.tile_n], f32)

    def store_tile(self, accs: list[Any]) -> Any:
        """After a block barrier (every warp is done reading the stages): the accumulators
        into the f32 C tile in shared memory (this warpgroup's rows); returns the tile."""
        self.store_fragments(accs, self.tile)
        return self.tile

    def tile_out(self, c: Any, local: Any, workers: int) -> None:
        """The shared C tile out of the block by ``workers`` threads: through the fused
        consumer (:mod:`stagegraph.stages.gpu.wgmma_epilogue`), else added to C."""
        if self.fused is None:
            self.add_to_c(c, local, workers)
            return
        from stagegraph.stages.gpu.wgmma_epilogue import apply_epilogue

        apply_epilogue(self, self.fused, local, workers)

    def add_to_c(self, c: Any, local: Any, workers: int) -> None:
        """``workers`` threads (``local``: this one's index) add the shared C tile to C,
        element ``local + workers * i`` each (consecutive threads on consecutive columns)."""
        build = self.build
        f32 = self.ir.F32Type.get(build.location.context)
        loop, outer = self.loop(TILE_M * self.tile_n // workers, [])
        flat = self.index("addi", self.scaled(loop.induction_variable, workers), local)
        row = self.index("divui", flat, build.const(self.tile_n))
        col = self.index("remui", flat, build.const(self.tile_n))
        value = build.op("memref.load", [f32], [self.tile, row, col])
        old = build.op("memref.load", [f32], [c, row, col])
        total = build.op("arith.addf", [f32], [old, value])
        build.op("memref.store", [], [total, c, row, col])
        build.op("scf.yield", [], [])
        build.point = outer

    def store_to_c(self, accs: list[Any], c: Any) -> None:
        """C held zeros (:mod:`stagegraph.stages.gpu.zero_fill`): the accumulators go
        straight to C (this warpgroup's rows), each warp's stores whole 32-byte sectors."""
        self.store_fragments(accs, c)

    def epilogue(self, accs: list[Any], c: Any) -> None:
        """Accumulator -> C: stored where C held zeros, else through shared memory and
        added to C (or put through the fused consumer) by the warpgroup."""
        from stagegraph.mlir.bindings import gpu

        if self.zero_init and self.fused is None:
            self.store_to_c(accs, c)
            return
        with self.build.location:
            gpu.BarrierOp(ip=self.build.point)
        self.make_tile()
        self.store_tile(accs)
        with self.build.location:
            gpu.BarrierOp(ip=self.build.point)
        self.tile_out(c, self.tid, WARPGROUP)


def _dynamic_size() -> int:
    from stagegraph.mlir.bindings import ir

    return ir.ShapedType.get_dynamic_size()
