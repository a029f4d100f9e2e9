"""Sharding stages: ``shard``-annotated tensor IR to per-rank tensor IR calling MPI.

``propagate`` completes the annotations (``sharding-propagation``), ``partition`` rewrites
every function to the *local* shapes one rank holds (``shard-partition``: collectives appear
as ``shard.all_reduce`` and friends), and ``shard_to_mpi`` turns those into ``mpi`` ops
(``convert-shard-to-mpi``). The ``mpi`` dialect has no pass of its own in the wheel: the
generic ``convert-to-llvm`` in ``lowering.LOWER_TO_LLVM`` lowers it to calls into the MPICH
ABI (``MPI_Comm_rank``, ``MPI_Allreduce``, ...), so the CPU stages follow unchanged.
"""

from __future__ import annotations

from typing import Any

from stagegraph.core.ports import Config, TensorModule
from stagegraph.core.stage import stage
from stagegraph.errors import ShardingError
from stagegraph.stages.common.passes import run_pipeline

PROPAGATE = "func.func(sharding-propagation)"
PARTITION = "func.func(shard-partition),canonicalize,cse"
SHARD_TO_MPI = "convert-shard-to-mpi,canonicalize,cse"


class PropagateConfig(Config):
    pipeline: str = PROPAGATE


@stage("passes", name="sharding.propagate")
def propagate(module: TensorModule, config: PropagateConfig) -> TensorModule:
    """Annotate every op with a sharding, so partitioning needs no guesswork."""
    return run_pipeline(module, config.pipeline)


class PartitionConfig(Config):
    pipeline: str = PARTITION


@stage("passes", name="sharding.partition")
def partition(module: TensorModule, config: PartitionConfig) -> TensorModule:
    """Global shapes to one rank's local shapes; the entry signature changes here."""
    return run_pipeline(module, config.pipeline)


class ShardToMpiConfig(Config):
    pipeline: str = SHARD_TO_MPI


@stage("passes", name="sharding.to_mpi")
def shard_to_mpi(module: TensorModule, config: ShardToMpiConfig) -> TensorModule:
    """Collectives to ``mpi`` ops; the grid symbols, now unused, are dropped.

    Raises:
        ShardingError: a ``shard`` op other than ``shard.grid`` survived the conversion.
    """
    run_pipeline(module, config.pipeline)
    left = sorted({op.name for op in shard_ops(module.ir)} - {"shard.grid"})
    if left:
        raise ShardingError(f"convert-shard-to-mpi left unconverted ops: {', '.join(left)}")
    for op in shard_ops(module.ir):
        op.erase()  # only grids remain; LLVM translation has no use for them
    return module


def shard_ops(module: Any) -> list[Any]:
    """Every ``shard.*`` operation nested in ``module``."""
    from stagegraph.mlir.walk import collect

    return collect(module, lambda op: op.name.startswith("shard."))
