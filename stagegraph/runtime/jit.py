"""JIT-compiled binaries: an LLVM-dialect module turned into callable machine code in-process."""

from __future__ import annotations

import ctypes
import hashlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from stagegraph.errors import StagegraphError
from stagegraph.mlir import execution_engine
from stagegraph.runtime.heap import keep_heap_pages
from stagegraph.runtime.memref import (
    CIFACE_PREFIX,
    CallableBinary,
    Marshalled,
    Signature,
    SignatureError,
    read_signatures,
)

_PACKED = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class EmitError(StagegraphError, ValueError):
    """A module cannot be turned into a binary (wrong IR level, toolchain failure)."""


def build_key(module: Any, *options: object) -> str:
    """Content hash of a module (as text) and the build options."""
    digest = hashlib.sha256(str(module).encode())
    for option in options:
        digest.update(repr(option).encode())
    return digest.hexdigest()


def check_llvm_level(module: Any) -> None:
    """Refuse modules that still hold ``func.func`` definitions (not lowered to LLVM)."""
    for op in module.body.operations:
        if op.operation.name == "func.func" and len(op.regions[0].blocks):
            name = op.attributes["sym_name"].value
            raise EmitError(
                f"function {name!r} is not lowered to the LLVM dialect; run "
                "lowering.LOWER_TO_LLVM before emitting a binary"
            )


class JitBinary(CallableBinary):
    """An ``ExecutionEngine`` over an LLVM-dialect module, called through C interfaces.

    Entry points need the ``llvm.emit_c_interface`` attribute before lowering (set by
    :func:`~stagegraph.runtime.memref.record_signature`), which also records the signature
    that :meth:`call` uses to allocate outputs.
    """

    def __init__(
        self,
        module: Any,
        *,
        opt_level: int = 3,
        shared_libs: Sequence[str | Path] = (),
        signatures: Mapping[str, Signature] | None = None,
    ) -> None:
        check_llvm_level(module)
        keep_heap_pages()
        libs = [str(p) for p in shared_libs]
        super().__init__(build_key(module, "jit", opt_level, libs))
        with module.context:
            self.signatures = {**read_signatures(module), **(signatures or {})}
            self.entries = frozenset(
                op.attributes["sym_name"].value.removeprefix(CIFACE_PREFIX)
                for op in module.body.operations
                if "sym_name" in op.attributes
                and op.attributes["sym_name"].value.startswith(CIFACE_PREFIX)
            )
            self.engine = execution_engine.ExecutionEngine(
                module, opt_level=opt_level, shared_libs=libs
            )
        self._functions: dict[str, Callable[[Any], None]] = {}

    def function(self, entry: str) -> Callable[[Any], None]:
        """The packed ``void(void**)`` wrapper of ``entry``'s C interface."""
        if entry not in self._functions:
            if entry not in self.entries:
                raise SignatureError(
                    f"entry {entry!r} has no C interface in the module (entries: "
                    f"{', '.join(sorted(self.entries)) or 'none'}); set "
                    "llvm.emit_c_interface (record_signature) before lowering"
                )
            self._functions[entry] = _PACKED(self.engine.raw_lookup(CIFACE_PREFIX + entry))
        return self._functions[entry]

    def _invoker(self, entry: str, marshalled: Marshalled) -> Callable[[], None]:
        fn = self.function(entry)
        packed = marshalled.packed

        def run() -> None:
            fn(packed)

        run.marshalled = marshalled  # type: ignore[attr-defined]  # keeps buffers alive
        return run


def jit(module: Any, *, opt_level: int = 3, shared_libs: Sequence[str | Path] = ()) -> JitBinary:
    """Build a :class:`JitBinary` (convenience for the emit stage)."""
    return JitBinary(module, opt_level=opt_level, shared_libs=shared_libs)


__all__ = ["EmitError", "JitBinary", "build_key", "check_llvm_level", "jit"]
