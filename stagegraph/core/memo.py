"""The engine's in-process memo of stage results, bounded in bytes.

A memo entry keeps each module output as bytecode (the next stage changes the module
itself), so an entry costs what the module weighs: for a model, its weights. Kept for
every stage, VGG-16's 552 MB of weights were held once per stage (gigabytes for a run
that never asks for them again). So the memo keeps frozen modules within a byte budget
(:data:`MEMO_BYTES`), evicting the least recently used entries first; a module larger
than the whole budget is not kept at all, and its stage simply runs again when asked.
Hashes (the keys of the stages downstream) are computed as the bytecode is written,
without holding it; in a run whose payload module is past the budget (its stages' modules
carry the same weights) module outputs are neither frozen nor hashed: writing and
hashing VGG-16's bytecode after every stage cost more CPU than most stages
(:func:`unmemoized_hash`), unless a persistent cache (``--cache DIR``) needs real keys.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Any

from stagegraph.core.ports import Module

#: Bytes of frozen modules the memo keeps at most (every dev payload's modules fit; a
#: real-size model's do not, and its stages rerun on a second run instead).
MEMO_BYTES = 512 * 2**20


class _BoundedSink:
    """A file-like object that hashes everything written to it and keeps it only while it
    stays within ``limit`` bytes (past that, the kept chunks are dropped)."""

    def __init__(self, limit: int) -> None:
        self.digest = hashlib.sha256()
        self.limit = limit
        self.size = 0
        self.chunks: list[bytes] | None = []

    def write(self, chunk: bytes) -> int:
        self.digest.update(chunk)
        self.size += len(chunk)
        if self.chunks is not None:
            self.chunks.append(bytes(chunk))
            if self.size > self.limit:
                self.chunks = None
        return len(chunk)


class FrozenModule:
    """A module output as the memo keeps it: its bytecode. Parsing it back is left to a run
    that hits the memo: a one-shot compile never pays for it."""

    __slots__ = ("context", "data", "digest", "kind", "level")

    def __init__(self, module: Module, data: bytes, digest: str) -> None:
        self.kind = type(module)
        self.level = module.level
        self.context = module.ir.context
        self.data = data
        self.digest = digest

    def content_hash(self) -> str:
        """The same hash as :meth:`Module.content_hash` of the module it was made from."""
        return self.digest

    def thaw(self) -> Module:
        """A fresh module, equal to the frozen one, in the context it came from."""
        from stagegraph.mlir.bindings import ir

        return self.kind(ir.Module.parse(self.data, self.context), self.level)


def freeze(module: Module, limit: int) -> tuple[FrozenModule | None, str, int]:
    """The module's bytecode hash and size, and its frozen copy when the bytecode has at
    most ``limit`` bytes (else None: only the hash is made, nothing is held)."""
    sink = _BoundedSink(limit)
    module.ir.operation.write_bytecode(sink)
    digest = sink.digest.hexdigest()
    if sink.chunks is None:
        return None, digest, sink.size
    return FrozenModule(module, b"".join(sink.chunks), digest), digest, sink.size


def unmemoized_hash() -> str:
    """A hash no other value has: for a module the memo will not keep (a run whose
    payload is past the budget), so that no bytecode is written only to hash it, and no
    later stage is served on it."""
    import uuid

    return f"unmemoized-{uuid.uuid4().hex}"


def _entry_bytes(stored: dict[str, Any]) -> int:
    return sum(len(v.data) for v in stored.values() if isinstance(v, FrozenModule))


class Memo:
    """Stage results by memo key, least recently used first out past ``budget`` bytes of
    frozen modules."""

    def __init__(self, budget: int = MEMO_BYTES) -> None:
        self.budget = budget
        self.used = 0
        self._entries: OrderedDict[str, tuple[dict[str, Any], dict[str, str]]] = OrderedDict()

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> tuple[dict[str, Any], dict[str, str]]:
        """The entry (and it becomes the most recently used)."""
        self._entries.move_to_end(key)
        return self._entries[key]

    def put(self, key: str, stored: dict[str, Any], hashes: dict[str, str]) -> None:
        """Keep an entry, evicting the oldest ones until its frozen modules fit."""
        if key in self._entries:
            self.used -= _entry_bytes(self._entries.pop(key)[0])
        size = _entry_bytes(stored)
        if size > self.budget:
            return
        while self._entries and self.used + size > self.budget:
            _, (old, _) = self._entries.popitem(last=False)
            self.used -= _entry_bytes(old)
        self._entries[key] = (stored, hashes)
        self.used += size

    def clear(self) -> None:
        self._entries.clear()
        self.used = 0


__all__ = ["MEMO_BYTES", "FrozenModule", "Memo", "freeze", "unmemoized_hash"]
