"""The payload's thread count: a cost-model decision (cores against the work's size) that
the tuner can revisit.

:func:`payload_threads` is the heuristic's choice; ``X86Params.threads``
(:mod:`stagegraph.stages.x86.params_stage`) holds it, a declared tunable
(:func:`thread_domain`, :func:`thread_rules`: from one thread up to the cores the run was
granted). ``x86.lower`` turns it into the ``num_threads`` of every OpenMP parallel region
(``lowering.to_openmp``), so the count measured is the count chosen, and keeps serial
every loop whose threads would save less than a fork and a join (:func:`serial_below`,
:mod:`stagegraph.stages.common.serial_loops`, which also counts a loop's trips: two threads
save nothing on one block, a third of the work on three).
"""

from __future__ import annotations

from typing import Any

from stagegraph.core.tunable import Range

# Below this much matmul work per thread (about 40 us of one core's FMAs), forking and
# joining OpenMP threads (and waiting for a busy core) costs more than it saves.
MIN_FLOPS_PER_THREAD = 4 << 20

#: What forking and joining one parallel loop costs, in flops of one core's work (a few
#: microseconds; far more when another process holds a core the join waits for).
FORK_JOIN_FLOPS = MIN_FLOPS_PER_THREAD // 16


def threads_for(flops: int, cores: int) -> int:
    """Threads for a contraction of ``flops`` when the config does not say."""
    return max(1, min(cores, flops // MIN_FLOPS_PER_THREAD))


def serial_below(threads: int) -> int:
    """Work (lane operations) below which a loop runs serially on ``threads`` threads: what
    it would save, ``work * (1 - 1 / threads)``, is less than a fork and a join."""
    return threads * FORK_JOIN_FLOPS // (threads - 1)


def payload_threads(facts: Any, contractions: list[Any], cores: int) -> int:
    """Threads for the payload: what its largest contraction (``contractions``: its matmul
    and convolution op facts) is worth, if the work the contractions worth splitting save
    outweighs a fork and a join for every op whose loop stays parallel; else one.

    Once a payload is threaded, ``x86.lower`` keeps its loops too small to gain serial
    (:mod:`stagegraph.stages.common.serial_loops`), so an unrolled recurrent network's
    hundreds of small steps cost no forks: its input projections (large matmuls) take the
    threads and its steps run as before. Each step that is big enough to stay parallel
    (work or output elements above :func:`serial_below`) counts one fork and one join, so
    hundreds of mid-sized steps still keep a payload on one thread (before loops were
    serialized, a GRU ran 10 ms on one thread and 38 ms on two). Elementwise, reduction
    and pooling payloads (memory-bound: no contraction) run on one thread."""
    threads = threads_for(max((op.flops for op in contractions), default=0), cores)
    if threads <= 1:
        return 1
    splittable = sum(op.flops for op in contractions if threads_for(op.flops, cores) > 1)
    saved = splittable - splittable // threads
    parallel = serial_below(threads)
    forks = sum(
        1
        for op in facts.ops
        if max(op.flops, *(v.numel for v in op.outputs if v.kind == "tensor"), 0) >= parallel
    )
    return threads if saved > max(1, forks) * FORK_JOIN_FLOPS else 1


# -- search space (declared beside X86Params in params_stage) -------------------------------


def thread_domain(op: Any, target: Any) -> Range:
    """Thread counts a tuner tries: one up to the target's cores (``thread_rules`` bounds
    them by the cores this run was granted)."""
    return Range(1, max(1, int(getattr(target, "cores", 1))))


def thread_rules(p: Any, op: Any, target: Any, logic: Any) -> dict[str, Any]:
    """A payload never asks for more threads than the run was granted (``--threads``)."""
    return {"threads_within_granted_cores": p.threads <= p.granted_threads}
