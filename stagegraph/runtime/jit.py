"""JIT-compiled binaries: an LLVM-dialect module turned into callable machine code in-process."""

from __future__ import annotations

import contextlib
import ctypes
import io
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from stagegraph.errors import EmitError
from stagegraph.mlir.bindings import execution_engine
from stagegraph.mlir.digest import bytecode_digest
from stagegraph.mlir.jit_weights import weights_outside
from stagegraph.mlir.walk import children
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


def build_key(module: Any, *options: object) -> str:
    """Content hash of a module (as bytecode: printing a large LLVM-dialect module as text
    costs over a second) and the build options."""
    digest = bytecode_digest(module)  # hashed as written: the weights are not held again
    for option in options:
        digest.update(repr(option).encode())
    return digest.hexdigest()


def check_llvm_level(module: Any) -> None:
    """Refuse modules that still hold ``func.func`` definitions (not lowered to LLVM)."""
    for op in children(module.operation):  # iterating the body imports the llvm module
        if op.name == "func.func" and len(op.regions[0].blocks):
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
                for op in children(module.operation)
                if "sym_name" in op.attributes
                and op.attributes["sym_name"].value.startswith(CIFACE_PREFIX)
            )
            # Large weights reach the JIT as buffers, not LLVM constants (memory and time:
            # see stagegraph.mlir.jit_weights); no object cache, nothing dumps this engine.
            with weights_outside(module) as self.weights:
                self.engine = execution_engine.ExecutionEngine(
                    module, opt_level=opt_level, shared_libs=libs, enable_object_dump=False
                )
            for name, buffer in self.weights.items():  # before any lookup compiles the code
                self.engine.raw_register_runtime(name, ctypes.c_void_p(buffer.ctypes.data))
        self._functions: dict[str, Callable[[Any], None]] = {}
        for entry in sorted(self.entries):  # compile now: a missing symbol fails here
            self.function(entry)

    def function(self, entry: str) -> Callable[[Any], None]:
        """The packed ``void(void**)`` wrapper of ``entry``'s C interface.

        Raises:
            EmitError: the JIT could not link the code (a symbol no library provides).
        """
        if entry not in self._functions:
            if entry not in self.entries:
                raise SignatureError(
                    f"entry {entry!r} has no C interface in the module (entries: "
                    f"{', '.join(sorted(self.entries)) or 'none'}); set "
                    "llvm.emit_c_interface (record_signature) before lowering"
                )
            with captured_stderr() as messages:
                address = self.engine.raw_lookup(CIFACE_PREFIX + entry)
            if not address:  # calling address 0 would segfault
                raise EmitError(_link_failure(entry, messages.read()))
            self._functions[entry] = _PACKED(address)
        return self._functions[entry]

    def _invoker(self, entry: str, marshalled: Marshalled) -> Callable[[], None]:
        fn = self.function(entry)
        packed = marshalled.packed

        def run() -> None:
            fn(packed)

        run.marshalled = marshalled  # type: ignore[attr-defined]  # keeps buffers alive
        return run


@contextlib.contextmanager
def captured_stderr() -> Iterator[io.StringIO]:
    """Collect what native code writes to fd 2 while the block runs (LLVM's JIT reports
    link errors there, not through an exception); the text is readable afterwards."""
    sys.stderr.flush()
    saved = os.dup(2)
    text = io.StringIO()
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield text
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            text.write(sink.read().decode(errors="replace"))
            text.seek(0)


_MISSING = re.compile(r"Symbols not found: \[([^\]]*)\]")


def _link_failure(entry: str, messages: str) -> str:
    """Why the JIT returned no address for ``entry``: the unresolved symbols, named."""
    found = _MISSING.search(messages)
    if found:
        symbols = ", ".join(s.strip() for s in found.group(1).split(",") if s.strip())
        return (
            f"the JIT cannot link {entry!r}: no loaded library provides {symbols} (a "
            "compiler-rt builtin or runtime function LLVM called); add the library with "
            "the jit stage's shared_libs config"
        )
    detail = messages.strip().splitlines()[-1] if messages.strip() else "no message"
    return f"the JIT could not compile or link {entry!r}: {detail}"


def jit(module: Any, *, opt_level: int = 3, shared_libs: Sequence[str | Path] = ()) -> JitBinary:
    """Build a :class:`JitBinary` (convenience for the emit stage)."""
    return JitBinary(module, opt_level=opt_level, shared_libs=shared_libs)


__all__ = ["EmitError", "JitBinary", "build_key", "check_llvm_level", "jit"]
