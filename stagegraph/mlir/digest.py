"""Hashing and measuring a module's bytecode as it is written, without holding it.

A module's bytecode carries its weights: for VGG-16, 552 MB. Written into a ``BytesIO``
to be hashed (the engine's memo keys, the JIT's build key) or measured, it was held once
in the buffer and once more by ``getvalue()``: a transient gigabyte for a hash. The
bindings' ``write_bytecode`` writes to any object with a ``write`` method, chunk by chunk,
so these sinks consume the chunks as they come.
"""

from __future__ import annotations

import hashlib
from typing import Any


class _Sink:
    """A file-like object that hashes and counts what is written to it."""

    def __init__(self, digest: Any | None) -> None:
        self.digest = digest
        self.size = 0

    def write(self, chunk: bytes) -> int:
        if self.digest is not None:
            self.digest.update(chunk)
        self.size += len(chunk)
        return len(chunk)


def bytecode_digest(module: Any) -> Any:
    """A ``hashlib.sha256`` object fed with the bytecode of ``module`` (an ``ir.Module``
    or an operation); callers may update it further (build options) before reading it."""
    sink = _Sink(hashlib.sha256())
    getattr(module, "operation", module).write_bytecode(sink)
    return sink.digest


def bytecode_size(module: Any) -> int:
    """Bytes of the bytecode of ``module``, counted as written (nothing kept)."""
    sink = _Sink(None)
    getattr(module, "operation", module).write_bytecode(sink)
    return sink.size


__all__ = ["bytecode_digest", "bytecode_size"]
