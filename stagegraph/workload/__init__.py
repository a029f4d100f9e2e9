"""Workloads: a payload with its inputs, a reference result, a verifier and its cost.

:mod:`.base` holds the interface, :mod:`.registry` the names (``matmul:m=64``, ``.mlir``
paths), :mod:`.mlir_file` the ``.mlir`` workloads, :mod:`.torch_model` PyTorch models
(problem files, factories; :mod:`.torch_source` reads them, :mod:`.torch_eager` exports
and runs them), :mod:`.verify` the comparison with the reference, :mod:`.criterion` its rule,
:mod:`.layout` how sharded workloads split over ranks. The names users need are re-exported
here, each imported on first use (module ``__getattr__``): importing the package, or one of
its numpy-only modules (:mod:`.criterion`, :mod:`.torch_source`), loads neither MLIR nor
pydantic, so the GPU machine's checker imports them as plain modules.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: Public name -> the module that defines it.
_EXPORTS = {
    "decode": "stagegraph.dtypes",
    "from_bf16": "stagegraph.dtypes",
    "numpy_dtype": "stagegraph.dtypes",
    "to_bf16": "stagegraph.dtypes",
    "PayloadError": "stagegraph.errors",
    "ReferenceUnavailableError": "stagegraph.errors",
    "UnknownWorkloadError": "stagegraph.errors",
    "WorkloadParamError": "stagegraph.errors",
    "Complexity": "stagegraph.workload.base",
    "ReferenceKind": "stagegraph.workload.base",
    "TensorSpec": "stagegraph.workload.base",
    "Workload": "stagegraph.workload.base",
    "WorkloadParams": "stagegraph.workload.base",
    "random_array": "stagegraph.workload.base",
    "list_workloads": "stagegraph.workload.registry",
    "parse_workload": "stagegraph.workload.registry",
    "register": "stagegraph.workload.registry",
    "workload_class": "stagegraph.workload.registry",
    "Verdict": "stagegraph.workload.verify",
}

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

if TYPE_CHECKING:
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
    from stagegraph.workload.registry import (
        list_workloads,
        parse_workload,
        register,
        workload_class,
    )
    from stagegraph.workload.verify import Verdict


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'stagegraph.workload' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
