"""The GPU graph's schedule, run on the CPU: a correctness check without a GPU.

The same normalization, analysis, GPU cost model and GPU schedule (block and thread
foralls, vector transfers) as the ``gpu`` graph, then bufferized and lowered for the host:
the foralls run as serial loops, so ``run`` verifies that the tiling and vectorization keep
the payload's meaning. The mapping of foralls to blocks and threads, and the PTX, are
checked only on a GPU (``benchmarks/gpu_check.py``).
"""

from stagegraph.core.graph import Graph
from stagegraph.graphs.gpu import FRONT_EDGES, INPUTS, front_stages
from stagegraph.stages.common.emit import jit
from stagegraph.stages.common.passes import linalg_to_loops, lower_to_llvm


def build() -> Graph:
    return Graph(
        "gpu_cpu",
        [*front_stages(), linalg_to_loops("loops"), lower_to_llvm("lower"), jit("emit")],
        [
            *FRONT_EDGES,
            "bufferize.module -> loops.module",
            "loops.module -> lower.module",
            "lower.module -> emit.module",
        ],
        INPUTS,
        default_splice="bufferized",
        description=__doc__,
    )
