"""Emit stages: an LLVM-dialect module becomes a callable binary.

``jit`` keeps machine code in-process (ExecutionEngine); ``object`` writes an object file;
``shared`` links a shared library that ctypes loads and calls like the JIT.
"""

from __future__ import annotations

from pydantic import Field

from stagegraph.ports import Binary, Config, LLVMModule
from stagegraph.stage import stage


class JitConfig(Config):
    opt_level: int = Field(3, ge=0, le=3)
    shared_libs: tuple[str, ...] = ()


@stage("emit", name="jit")
def jit(module: LLVMModule, config: JitConfig) -> Binary:
    """Compile in-process; the fastest way from IR to a callable."""
    from stagegraph.runtime.jit import JitBinary

    return JitBinary(module.ir, opt_level=config.opt_level, shared_libs=config.shared_libs)


class FileConfig(Config):
    path: str
    opt_level: int = Field(3, ge=0, le=3)


@stage("emit", name="object", cacheable=False)
def object_file(module: LLVMModule, config: FileConfig) -> Binary:
    """Write a position-independent object file (not callable by itself)."""
    from stagegraph.runtime.jit import build_key
    from stagegraph.runtime.shared import emit_object

    path = emit_object(module.ir, config.path, opt_level=config.opt_level)
    binary = Binary(build_key(module.ir, "object", config.opt_level))
    binary.path = str(path)  # type: ignore[attr-defined]
    return binary


@stage("emit", name="shared", cacheable=False)
def shared_library(module: LLVMModule, config: FileConfig) -> Binary:
    """Link a shared library that plain ctypes code can load and call."""
    from stagegraph.runtime.shared import emit_shared_library

    return emit_shared_library(module.ir, config.path, opt_level=config.opt_level)
