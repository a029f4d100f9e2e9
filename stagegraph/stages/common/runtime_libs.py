"""The shared libraries compiled code calls at run time (OpenMP, a target's math library):
what the JIT loads, what a shared library links and what an artifact's manifest names."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stagegraph.core.registry import Registry

#: Hooks naming the shared libraries a lowered module needs, each ``(module) -> [path]``:
#: a target package registers those its lowering calls into (x86: glibc's libmvec for the
#: vector math functions), so this generic layer names no target.
RUNTIME_LIBRARIES: Registry[Callable[[Any], list[str]]] = Registry(
    "runtime-library hook", plural="runtime-libraries"
)


def runtime_libraries(module: Any, omp: bool | None = None) -> list[str]:
    """Shared libraries the module needs at run time: an OpenMP runtime for ``omp`` ops
    (translated to ``__kmpc_*`` calls only when the engine is created) and those the
    target packages' :data:`RUNTIME_LIBRARIES` hooks ask for. ``omp``: whether the module
    holds ``omp`` ops, when the caller walked it already (else it is walked here)."""
    from stagegraph.mlir.walk import contains

    libraries = [path for _, needs in RUNTIME_LIBRARIES.items() for path in needs(module)]
    if omp is None:
        omp = contains(module, lambda op: op.name.startswith("omp."))
    if not omp:
        return libraries
    from stagegraph.runtime.openmp import library_path

    return [library_path(), *libraries]
