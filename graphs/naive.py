"""The reference flow: linalg straight to scalar loops, no schedule. Slow and simple."""

from stagegraph.core.graph import Graph, GraphInput
from stagegraph.core.ports import Module
from stagegraph.stages.common.emit import jit
from stagegraph.stages.common.passes import bufferize, linalg_to_loops, lower_to_llvm, verify


def build() -> Graph:
    return Graph(
        "naive",
        [
            verify("load"),
            bufferize(tags={"bufferized"}),
            linalg_to_loops("loops"),
            lower_to_llvm("lower"),
            jit("emit", opt_level=2),
        ],
        [
            "payload -> load.module",
            "load.module -> bufferize.module",
            "bufferize.module -> loops.module",
            "loops.module -> lower.module",
            "lower.module -> emit.module",
        ],
        [GraphInput("payload", Module["tensor"], frozenset({"input"}))],
        default_splice="bufferized",
        description=__doc__,
    )
