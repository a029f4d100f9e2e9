"""The optimized CPU flow: analyse the payload, pick parameters for this machine, schedule
(packed matmul micro-kernels; tiled, fused, vectorized generic ops), bufferize, lower, JIT.

Swap the cost model with ``graph.replace("select", other)`` (same output type).
"""

from stagegraph.core.graph import Graph, GraphInput
from stagegraph.core.ports import Module
from stagegraph.stages.analysis import analyze_stage
from stagegraph.stages.common.emit import jit
from stagegraph.stages.common.passes import bufferize, verify
from stagegraph.stages.target import target
from stagegraph.stages.x86.ir_stages import lower, normalize, schedule
from stagegraph.stages.x86.params_stage import heuristic


def build() -> Graph:
    return Graph(
        "x86",
        [
            verify("load"),
            normalize("normalize"),
            analyze_stage("analyze"),
            target("target"),
            heuristic("select"),
            schedule("schedule", tags={"scheduled"}),
            bufferize(tags={"bufferized"}),
            lower("lower"),
            jit("emit"),
        ],
        [
            "payload -> load.module",
            "load.module -> normalize.module",
            "target.facts -> normalize.target",
            "normalize.module -> analyze.module",
            "analyze.facts -> select.facts",
            "target.facts -> select.target",
            "normalize.module -> schedule.module",
            "analyze.facts -> schedule.facts",
            "select.params -> schedule.params",
            "schedule.module -> bufferize.module",
            "bufferize.module -> lower.module",
            "select.params -> lower.params",
            "target.facts -> lower.target",
            "lower.module -> emit.module",
        ],
        [GraphInput("payload", Module["tensor"], frozenset({"input"}))],
        default_splice="bufferized",
        description=__doc__,
    )
