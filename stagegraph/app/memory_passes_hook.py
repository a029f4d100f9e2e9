"""The hook that gives every run report its passes over memory: its own module, apart from
:mod:`stagegraph.app.memory_passes` (which compiles through ``app.commands``), so the
session imports it without an import cycle."""

from __future__ import annotations

from stagegraph.core.engine import Hook, StageEvent
from stagegraph.instrument.ir_hooks import output_module
from stagegraph.stages.common.memory_passes import RESIDENT_BYTES, count_memory_passes


class MemoryPassesHook(Hook):
    """Counts the passes over memory on the module a stage tagged ``bufferized`` produces
    (before lowering changes it), so every run reports them (``RunReport.memory_passes``)
    at the cost of one walk of the module. ``total`` stays None for a graph without such
    a stage or a run that stops before it."""

    def __init__(self, resident_bytes: int = RESIDENT_BYTES) -> None:
        self.resident_bytes = resident_bytes
        self.total: int | None = None

    def after_stage(self, event: StageEvent) -> None:
        if "bufferized" not in event.stage.tags:
            return
        module = output_module(event)
        if module is None:
            return
        with module.ir.context:
            self.total = count_memory_passes(module.ir, None, self.resident_bytes).total
