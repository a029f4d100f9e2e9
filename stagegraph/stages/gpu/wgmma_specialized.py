"""Warp-specialized wgmma blocks (sm_90a): a producer warpgroup feeds the pipeline, two
consumer warpgroups compute.

The block has three warpgroups (384 threads). The last, warpgroup 2, gives registers back
(``setmaxnreg.dec`` to :data:`~stagegraph.stages.gpu.wgmma.PRODUCER_REGISTERS`) and its
first thread (thread 256) runs the loads: for each K step it waits until the step's slot
is free (the slot's "empty" mbarrier, phase starting at 1 so that the first round
passes), expects the stage's bytes on the slot's "full" mbarrier and issues the TMA
copies. Warpgroups 0 and 1 take registers (``setmaxnreg.inc`` to
:data:`~stagegraph.stages.gpu.wgmma.CONSUMER_REGISTERS`); consumer ``g`` (warpgroup ``g``)
owns rows ``64g..64g+63`` of the block's 128. The consumers come first because the
``nvgpu.warpgroup.mma.store`` lowering places a fragment's rows by the raw thread index
(warpgroup ``g`` writes rows ``64g..``, :mod:`stagegraph.stages.gpu.wgmma_kernel`): with
the producer first, the consumers' rows landed 64 rows too low (found on an H200: half
the block unwritten, stores past the end of C). Per K step the consumers wait on the full
barrier, issue ``nvgpu.warpgroup.mma`` (whose
lowering waits for all but the newest wgmma group) and then release the previous step's
slot (every consumer thread arrives on its empty barrier, which counts 256 arrivals). The
loads thus run ahead by ``stages`` steps without the consumers ever issuing one, and the
two consumers' wgmma streams overlap each other's waits. After the loop the consumers put
their accumulators into the shared C tile and add it to C (or put it through the fused
consumer, :mod:`stagegraph.stages.gpu.wgmma_epilogue`), synchronised by a named
barrier of their 256 threads: the producer, at its lower register count, never runs code
past its branch.
"""

from __future__ import annotations

from typing import Any

from stagegraph.stages.gpu.wgmma import (
    CONSUMER_REGISTERS,
    PRODUCER_REGISTERS,
    TILE_K,
    WARPGROUP,
)
from stagegraph.stages.gpu.wgmma_kernel import _Block


class SpecializedBlock(_Block):
    """A :class:`_Block` run by one producer and :data:`CONSUMERS` consumer warpgroups."""

    def barrier_counts(self) -> list[int]:
        """Full barriers: the producer's one ``expect_tx``; empty barriers: every consumer
        thread's arrival."""
        return [1, WARPGROUP * self.consumers]

    def set_registers(self, count: int, increase: bool) -> None:
        from stagegraph.mlir.bindings import nvvm

        action = nvvm.SetMaxRegisterAction.increase if increase else (
            nvvm.SetMaxRegisterAction.decrease)  # fmt: skip
        with self.build.location:
            nvvm.SetMaxRegisterOp(count, action, ip=self.build.point)

    def produce(self, steps: int) -> None:
        """The producer thread's loop: wait for the slot to be free, load the step."""
        build = self.build
        loop, outer = self.loop(steps, [self.flag(1)])
        step, (phase,) = loop.induction_variable, loop.inner_iter_args
        slot = self.index("remui", step, build.const(self.stages))
        self.wait(self.groups[1], slot, phase)
        self.load(slot, step)
        build.op("scf.yield", [], [self.next_phase(phase, slot)])
        build.point = outer

    def consume(self, accs: list[Any], consumer: Any, steps: int) -> list[Any]:
        """A consumer warpgroup's loop: wait for the step's data, wgmma on this
        consumer's rows, free the previous step's slot; returns the accumulators."""
        from stagegraph.mlir.bindings import nvgpu, nvvm

        build = self.build
        loop, outer = self.loop(steps, [*accs, self.flag(0)])
        step, (*accs, phase) = loop.induction_variable, loop.inner_iter_args
        slot = self.index("remui", step, build.const(self.stages))
        self.wait(self.barriers, slot, phase)
        accs = self.accumulate(accs, slot, consumer)
        with self.only_if(self.compare(8, step, build.const(0))):  # ugt: a previous step
            previous = self.index("remui", self.index("addi", step, build.const(
                self.stages - 1)), build.const(self.stages))  # fmt: skip
            with build.location:
                nvgpu.MBarrierArriveOp(self.groups[1], previous, ip=build.point)
        build.op("scf.yield", [], [*accs, self.next_phase(phase, slot)])
        build.point = outer
        with build.location:
            nvvm.WgmmaWaitGroupSyncOp(0, ip=build.point)
        return list(loop.results)[: self.parts]

    def consumers_barrier(self) -> None:
        """A barrier of the consumer warpgroups only (named barrier 1): the producer,
        at its own register count, must never reach code the consumers run."""
        from stagegraph.mlir.bindings import nvvm

        build = self.build
        i32 = self.ir.IntegerType.get_signless(32)
        ids = [build.op("arith.constant", [i32], [], value=self.ir.IntegerAttr.get(i32, v))
               for v in (1, WARPGROUP * self.consumers)]  # fmt: skip
        with build.location:
            nvvm.BarrierOp(barrierId=ids[0], numberOfThreads=ids[1], ip=build.point)

    def run(self, c: Any) -> None:
        """Roles by warpgroup: the producer's loads (the last warpgroup); the consumers'
        loop and epilogue (warpgroup ``g`` is consumer ``g``: threads ``0..255``)."""
        from stagegraph.mlir.bindings import scf

        build = self.build
        steps = self.k // TILE_K
        group = self.index("divui", self.tid, build.const(WARPGROUP))
        with build.location:
            roles = scf.IfOp(self.compare(0, group, build.const(self.consumers)), [],
                             has_else=True, ip=build.point)  # fmt: skip
        outer = build.point
        build.point = self.ir.InsertionPoint(roles.then_block)
        self.set_registers(PRODUCER_REGISTERS, increase=False)
        with self.only_if(self.compare(0, self.tid, build.const(WARPGROUP * self.consumers))):
            self.produce(steps)
        build.op("scf.yield", [], [])
        build.point = self.ir.InsertionPoint(roles.else_block)
        self.set_registers(CONSUMER_REGISTERS, increase=True)
        accs = self.consume(self.zero_accumulators(), group, steps)
        if self.zero_init and self.fused is None:
            self.store_to_c(accs, c)
            build.op("scf.yield", [], [])
            build.point = outer
            return
        self.consumers_barrier()  # both consumers are done reading the stages
        self.make_tile()
        self.store_tile(accs)
        self.consumers_barrier()
        self.tile_out(c, self.tid, WARPGROUP * self.consumers)
        build.op("scf.yield", [], [])
        build.point = outer
