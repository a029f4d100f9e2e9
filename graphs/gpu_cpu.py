"""The GPU graph's schedule, run on the CPU: a correctness check without a GPU.

The same normalization, analysis, GPU cost model and GPU schedule (block and thread
foralls, vector transfers) as the ``gpu`` graph, then bufferized and lowered for the host:
the foralls run as serial loops, so ``run`` verifies that the tiling and vectorization keep
the payload's meaning. The mapping of foralls to blocks and threads, and the PTX, are
checked only on a GPU (``benchmarks/gpu_check.py``).
"""

from stagegraph.core.graph import Graph, GraphInput
from stagegraph.core.ports import Module
from stagegraph.stages.analysis import analyze_stage
from stagegraph.stages.common.emit import jit
from stagegraph.stages.common.passes import bufferize, linalg_to_loops, lower_to_llvm, verify
from stagegraph.stages.gpu.normalize import gpu_normalize
from stagegraph.stages.gpu.params import gpu_heuristic
from stagegraph.stages.gpu.schedule import gpu_schedule
from stagegraph.stages.gpu.target import gpu_target


def build() -> Graph:
    return Graph(
        "gpu_cpu",
        [
            verify("load"),
            gpu_normalize("normalize"),
            analyze_stage("analyze"),
            gpu_target("target"),
            gpu_heuristic("select"),
            gpu_schedule("schedule", tags={"scheduled"}),
            bufferize(tags={"bufferized"}),
            linalg_to_loops("loops"),
            lower_to_llvm("lower"),
            jit("emit"),
        ],
        [
            "payload -> load.module",
            "load.module -> normalize.module",
            "normalize.module -> analyze.module",
            "analyze.facts -> select.facts",
            "target.facts -> select.target",
            "normalize.module -> schedule.module",
            "select.params -> schedule.params",
            "schedule.module -> bufferize.module",
            "bufferize.module -> loops.module",
            "loops.module -> lower.module",
            "lower.module -> emit.module",
        ],
        [GraphInput("payload", Module["tensor"], frozenset({"input"}))],
        default_splice="bufferized",
        description=__doc__,
    )
