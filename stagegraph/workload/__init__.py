"""Workloads: a payload with its inputs, a reference result, a verifier and its cost.

:mod:`.base` holds the interface, :mod:`.registry` the names (``matmul:m=64``, ``.mlir``
paths), :mod:`.mlir_file` the ``.mlir`` workloads, :mod:`.torch_model` PyTorch models
(problem files, factories; :mod:`.torch_source` reads them, :mod:`.torch_eager` exports
and runs them), :mod:`.verify` the comparison with the reference, :mod:`.layout` how
sharded workloads split over ranks. The names users need are re-exported here. Importing
this package does not import MLIR.
"""

from stagegraph.dtypes import decode, from_bf16, numpy_dtype, to_bf16
from stagegraph.errors import (
    PayloadError,
    ReferenceUnavailableError,
    UnknownWorkloadError,
    WorkloadParamError,
)
from stagegraph.workload.base import (
    Complexity,
    ReferenceKind,
    TensorSpec,
    Workload,
    WorkloadParams,
    random_array,
)
from stagegraph.workload.registry import list_workloads, parse_workload, register, workload_class
from stagegraph.workload.verify import Verdict

__all__ = [
    "Complexity",
    "PayloadError",
    "ReferenceKind",
    "ReferenceUnavailableError",
    "TensorSpec",
    "UnknownWorkloadError",
    "Verdict",
    "Workload",
    "WorkloadParamError",
    "WorkloadParams",
    "decode",
    "from_bf16",
    "list_workloads",
    "numpy_dtype",
    "parse_workload",
    "random_array",
    "register",
    "to_bf16",
    "workload_class",
]
