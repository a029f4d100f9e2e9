"""The NVIDIA GPU flow: analyse the payload, map each op to blocks and threads for the
target GPU, schedule (transform dialect: tile to block and thread foralls, vectorize),
bufferize, map the foralls to kernels and lower them to NVVM, emit PTX per kernel and the
host-side plan that allocates, copies and launches them.

Compiles anywhere (PTX comes from llvmlite's NVPTX backend); ``run`` needs a GPU.
"""

from stagegraph.core.graph import Graph, GraphInput
from stagegraph.core.ports import Module
from stagegraph.stages.analysis import analyze_stage
from stagegraph.stages.common.passes import bufferize, verify
from stagegraph.stages.gpu.emit import gpu_emit
from stagegraph.stages.gpu.lower import gpu_lower
from stagegraph.stages.gpu.normalize import gpu_normalize
from stagegraph.stages.gpu.params import gpu_heuristic
from stagegraph.stages.gpu.schedule import gpu_schedule
from stagegraph.stages.gpu.split_reduction import gpu_split_reductions
from stagegraph.stages.gpu.target import gpu_target


def front_stages() -> list:
    """The stages the GPU graphs share, up to bufferizing: normalize, split reductions to a
    scalar into parallel rows (:mod:`stagegraph.stages.gpu.split_reduction`), analyse, ask
    the GPU cost model for the mapping, schedule to block and thread foralls (``gpu_cpu``
    runs that schedule on the CPU). New stages for each graph: stages are not shared
    between graphs."""
    return [
        verify("load"),
        gpu_normalize("normalize"),
        gpu_target("target"),
        gpu_split_reductions("split"),
        analyze_stage("analyze"),
        gpu_heuristic("select"),
        gpu_schedule("schedule", tags={"scheduled"}),
        bufferize(tags={"bufferized"}),
    ]


#: The edges among :func:`front_stages` (and from the payload).
FRONT_EDGES = [
    "payload -> load.module",
    "load.module -> normalize.module",
    "normalize.module -> split.module",
    "target.facts -> split.target",
    "split.module -> analyze.module",
    "analyze.facts -> select.facts",
    "target.facts -> select.target",
    "split.module -> schedule.module",
    "select.params -> schedule.params",
    "schedule.module -> bufferize.module",
]
INPUTS = [GraphInput("payload", Module["tensor"], frozenset({"input"}))]


def build() -> Graph:
    return Graph(
        "gpu",
        [*front_stages(), gpu_lower("lower"), gpu_emit("emit")],
        [
            *FRONT_EDGES,
            "bufferize.module -> lower.module",
            "select.params -> lower.params",
            "target.facts -> lower.target",
            "lower.module -> emit.module",
            "target.facts -> emit.target",
            "analyze.facts -> emit.facts",
        ],
        INPUTS,
        default_splice="bufferized",
        description=__doc__,
    )
