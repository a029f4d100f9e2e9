"""Passes over memory of a payload compiled through a graph: the number fusion minimizes.

One call for everyone who reports it (a benchmark column, a script, a test):
:func:`payload_memory_passes` compiles ``workload`` through ``graph`` up to the stage
tagged ``bufferized`` (the schedule's loops, on buffers, before lowering) and counts there
(:mod:`stagegraph.stages.common.memory_passes` defines a pass). Nothing is run or timed.
Every run's report counts them too (:class:`~stagegraph.app.memory_passes_hook.MemoryPassesHook`).
"""

from __future__ import annotations

from typing import Any

from stagegraph.stages.common.memory_passes import (
    RESIDENT_BYTES,
    MemoryPasses,
    count_memory_passes,
)


def payload_memory_passes(
    workload: str,
    graph: str | Any = "x86",
    *,
    threads: int | None = 1,
    resident_bytes: int = RESIDENT_BYTES,
    tag: str = "bufferized",
    **options: Any,
) -> MemoryPasses:
    """The passes over memory of ``workload`` compiled through ``graph`` (counted after the
    stage tagged ``tag``); ``options`` are :func:`stagegraph.api.run`'s keywords (``target``,
    ``param``, ...).

    Raises:
        StagegraphError: as ``stagegraph run --until`` reports it (unknown names, a
            failing stage).
    """
    from stagegraph.app import commands

    values = {keyword: spec.default for keyword, spec in commands.run_options().items()}
    values.update(options, until=tag, threads=threads)
    result = commands.run(graph, workload, values).result
    return count_memory_passes(result.module.ir, None, resident_bytes)
