"""Sharded flow: ``shard`` annotations → per-rank code calling MPI → the naive CPU lowering.

The stage tagged ``partitioned`` holds the local (per-rank) signature; everything after it
is the ordinary CPU flow. The JIT needs MPICH's ``libmpi`` at run time:
``stagegraph run sharded ... --ranks N`` (see :mod:`stagegraph.app.mpi_launch`) adds it.
"""

from stagegraph.core.graph import Graph, GraphInput
from stagegraph.core.ports import Module
from stagegraph.stages.common.emit import jit
from stagegraph.stages.common.passes import bufferize, linalg_to_loops, lower_to_llvm, verify
from stagegraph.stages.sharding import partition, propagate, shard_to_mpi


def build() -> Graph:
    return Graph(
        "sharded",
        [
            verify("load"),
            propagate("propagate"),
            partition("partition", tags={"partitioned"}),
            shard_to_mpi("to_mpi"),
            bufferize(tags={"bufferized"}),
            linalg_to_loops("loops"),
            lower_to_llvm("lower"),
            jit("emit", opt_level=2),
        ],
        [
            "payload -> load.module",
            "load.module -> propagate.module",
            "propagate.module -> partition.module",
            "partition.module -> to_mpi.module",
            "to_mpi.module -> bufferize.module",
            "bufferize.module -> loops.module",
            "loops.module -> lower.module",
            "lower.module -> emit.module",
        ],
        [GraphInput("payload", Module["tensor"], frozenset({"input"}))],
        default_splice="partitioned",
        description=__doc__,
    )
