"""Emit stages: an LLVM-dialect module becomes a callable binary.

``jit`` keeps machine code in-process (ExecutionEngine); ``object`` writes an object file;
``shared`` links a shared library that ctypes loads and calls like the JIT.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import Field

from stagegraph.core.ports import Binary, Config, LLVMModule
from stagegraph.core.registry import Registry
from stagegraph.core.stage import stage
from stagegraph.stages.common.lowering import (
    raise_not_lowered,
    survey_llvm_level,
)


class JitConfig(Config):
    opt_level: int = Field(3, ge=0, le=3)
    shared_libs: tuple[str, ...] = ()


@stage("emit", name="jit")
def jit(module: LLVMModule, config: JitConfig) -> Binary:
    """Compile in-process; the fastest way from IR to a callable."""
    from stagegraph.runtime.jit import JitBinary

    left, omp = survey_llvm_level(module.ir)  # one walk for both questions
    raise_not_lowered(left, "the stage that produced emit's input")
    check_runnable(module.ir)
    libs = [*config.shared_libs, *runtime_libraries(module.ir, omp)]
    check_external_symbols(module.ir, libs)
    return JitBinary(module.ir, opt_level=config.opt_level, shared_libs=libs)


class FileConfig(Config):
    path: str
    opt_level: int = Field(3, ge=0, le=3)


@stage("emit", name="object", cacheable=False)
def object_file(module: LLVMModule, config: FileConfig) -> Binary:
    """Write a position-independent object file (not callable by itself)."""
    from stagegraph.runtime.jit import build_key
    from stagegraph.runtime.shared import emit_object

    libs = runtime_libraries(module.ir)
    path = emit_object(module.ir, config.path, opt_level=config.opt_level, shared_libs=libs)
    binary = Binary(build_key(module.ir, "object", config.opt_level))
    binary.path = str(path)  # type: ignore[attr-defined]
    return binary


@stage("emit", name="shared", cacheable=False)
def shared_library(module: LLVMModule, config: FileConfig) -> Binary:
    """Link a shared library that plain ctypes code can load and call."""
    from stagegraph.runtime.shared import emit_shared_library

    libs = runtime_libraries(module.ir)
    return emit_shared_library(module.ir, config.path, opt_level=config.opt_level, shared_libs=libs)


def check_runnable(module: Any) -> None:
    """Refuse to load code built for ISA features this host lacks (it would die of SIGILL).

    Raises:
        TargetNotRunnableError: names the target and the missing features; emitting an
            object file or a shared library for that target still works.
    """
    from stagegraph.errors import TargetNotRunnableError
    from stagegraph.stages.common.lowering import required_isa
    from stagegraph.stages.target import detect_target

    recorded = required_isa(module)
    if recorded is None:
        return
    name, isa = recorded
    missing = sorted(isa - detect_target().isa)
    if missing:
        raise TargetNotRunnableError(
            f"code built for target {name!r} cannot run on this host, which lacks "
            f"{', '.join(missing)}; emit it instead (--emit object|shared -o PATH) or pick "
            "a target this host runs (--target host)"
        )


#: Hooks naming the shared libraries a lowered module needs, each ``(module) -> [path]``:
#: a target package registers those its lowering calls into (x86: glibc's libmvec for the
#: vector math functions), so this generic emitter names no target.
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


def check_external_symbols(module: Any, libraries: list[str]) -> None:
    """Fail clearly, before the JIT does, on calls no loaded library provides.

    The execution engine reports a missing symbol on stderr and then crashes the process.
    """
    import ctypes

    from stagegraph.errors import EmitError

    handles = [ctypes.CDLL(None), *(ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL) for lib in libraries)]
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import children

    missing = []
    for op in children(module.operation):  # iterating the body would import the llvm module
        if op.name != "llvm.func" or op.regions[0].blocks:
            continue
        name = ir.StringAttr(op.attributes["sym_name"]).value
        if not name.startswith("llvm.") and not any(hasattr(h, name) for h in handles):
            missing.append(name)
    if missing:
        raise EmitError(
            f"the module calls {', '.join(sorted(missing))}, which no loaded library provides; "
            "add the library with the jit stage's shared_libs config"
        )
