"""The shared libraries compiled code calls at run time (OpenMP, glibc's libmvec): what the
JIT loads, what a shared library links and what an artifact's manifest names."""

from __future__ import annotations

from typing import Any


def runtime_libraries(module: Any, omp: bool | None = None) -> list[str]:
    """Shared libraries the module needs at run time: an OpenMP runtime for ``omp`` ops
    (translated to ``__kmpc_*`` calls only when the engine is created) and glibc's libmvec
    for the vector math functions the lowering called. ``omp``: whether the module holds
    ``omp`` ops, when the caller walked it already (else it is walked here)."""
    from stagegraph.mlir.walk import contains
    from stagegraph.stages.x86.vector_math import declared_vector_functions, libmvec_path

    libraries = [libmvec_path()] if declared_vector_functions(module) else []
    if omp is None:
        omp = contains(module, lambda op: op.name.startswith("omp."))
    if not omp:
        return libraries
    from stagegraph.runtime.openmp import library_path

    return [library_path(), *libraries]
