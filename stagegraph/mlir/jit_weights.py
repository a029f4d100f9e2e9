"""Large constant globals handed to the JIT as memory it already has, not as LLVM constants.

A model's weights are constant globals of the LLVM-dialect module. Given to LLVM with their
initializers, every weight byte is copied again and again while the JIT builds the code:
into an LLVM ``ConstantDataArray`` by the translation, into the object file the code
generator writes (a growing buffer), into the JIT's object cache, and into the loaded
sections. VGG-16's 552 MB of weights took ``emit`` from 2.9 to 5.9 GB of resident memory,
and their code generation (writing every byte into the object) was most of its time.

The JIT needs no initializer to run the code, only the address of the bytes. So while the
execution engine translates the module (:func:`weights_outside`), each large constant
global becomes an external declaration, its bytes are read once into an aligned numpy
buffer, and the JIT resolves the symbol to that buffer (``raw_register_runtime`` defines an
absolute symbol; the code reaches a non-``dso_local`` declaration through its GOT, so the
buffer may lie anywhere in the address space). Afterwards the globals get their
initializers back: the module is unchanged, and an object file or shared library emitted
from it still carries its weights.

Small globals keep their initializers (:data:`MIN_DETACHED_BYTES`): LLVM may fold loads
from a small constant table, and their copies cost nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from stagegraph.mlir.bindings import ir
from stagegraph.mlir.resources import _ELEMENTS, _as, element_key, resource_values
from stagegraph.mlir.walk import children

#: Globals of at least this many bytes are handed over as memory (smaller ones stay LLVM
#: constants).
MIN_DETACHED_BYTES = 64 * 1024
#: The least alignment of a buffer (a cache line: vector loads of any width stay aligned).
MIN_ALIGNMENT = 64
#: Attributes that an external declaration must not carry: ``dso_local`` would let LLVM
#: address the buffer PC-relative (it may lie more than 2 GB from the code).
_DECLARATION_DROPS = ("value", "dso_local")


def aligned_empty(nbytes: int, alignment: int) -> np.ndarray:
    """An uninitialized ``uint8`` array of ``nbytes`` whose data starts at a multiple of
    ``alignment`` (a view into a slightly larger allocation, which it keeps alive)."""
    raw = np.empty(nbytes + alignment, np.uint8)
    offset = (-raw.ctypes.data) % alignment
    return raw[offset : offset + nbytes]


def _read_into(value: Any, buffer: np.ndarray) -> bool:
    """Write a constant global's initializer (a ``dense_resource`` blob or a dense
    attribute) into ``buffer`` as row-major bytes; False when it cannot be read (a missing
    blob, a splat)."""
    if _as(ir.DenseResourceElementsAttr, value) is not None:
        return resource_values(value, into=buffer) is not None
    dense = _as(ir.DenseElementsAttr, value)
    if dense is None or dense.is_splat:
        return False
    buffer[:] = np.ascontiguousarray(np.array(dense)).reshape(-1).view(np.uint8)
    return True


def _detachable_bytes(op: Any, min_bytes: int) -> int | None:
    """The size of a constant global of at least ``min_bytes`` with a static shaped
    initializer, else None. Reads only builtin attributes: reading the llvm ones (its
    linkage) loads the llvm dialect's Python module (0.06 s), which compiles without large
    weights need not pay."""
    if op.name != "llvm.mlir.global" or "value" not in op.attributes:
        return None
    if "constant" not in op.attributes:
        return None
    value = op.attributes["value"]
    if not isinstance(value.type, ir.ShapedType):
        return None
    shaped = ir.ShapedType(value.type)
    key = element_key(shaped.element_type)
    if key is None or not shaped.has_static_shape:
        return None
    itemsize = np.dtype(_ELEMENTS[key][1]).itemsize
    nbytes = int(np.prod(shaped.shape, dtype=np.int64)) * itemsize
    return nbytes if nbytes >= min_bytes else None


def _detach(op: Any, min_bytes: int) -> np.ndarray | None:
    """Make one constant global an external declaration; its bytes in an aligned buffer,
    or None (left as it is)."""
    nbytes = _detachable_bytes(op, min_bytes)
    if nbytes is None:
        return None
    value = op.attributes["value"]
    alignment = (
        ir.IntegerAttr(op.attributes["alignment"]).value if "alignment" in op.attributes else 0
    )
    buffer = aligned_empty(nbytes, max(MIN_ALIGNMENT, alignment))
    if not _read_into(value, buffer):
        return None
    for name in _DECLARATION_DROPS:
        if name in op.attributes:
            del op.attributes[name]
    op.attributes["linkage"] = ir.Attribute.parse("#llvm.linkage<external>", op.context)
    return buffer


@contextlib.contextmanager
def weights_outside(
    module: Any, min_bytes: int = MIN_DETACHED_BYTES
) -> Iterator[dict[str, np.ndarray]]:
    """While the block runs, the module's large constant globals are external declarations;
    yields their bytes by symbol name (register each with the JIT before anything is
    looked up, and keep the buffers alive as long as the code). On exit every global is as
    it was (initializer, linkage and flags)."""
    saved: list[tuple[Any, dict[str, Any]]] = []
    buffers: dict[str, np.ndarray] = {}
    try:
        with module.context:
            for op in children(module.operation):
                if _detachable_bytes(op, min_bytes) is None:
                    continue
                before = {name: op.attributes[name] for name in (*_DECLARATION_DROPS, "linkage")
                          if name in op.attributes}  # fmt: skip
                buffer = _detach(op, min_bytes)
                if buffer is not None:
                    saved.append((op, before))
                    buffers[ir.StringAttr(op.attributes["sym_name"]).value] = buffer
        yield buffers
    finally:
        for op, before in saved:
            with op.context:
                for name, attr in before.items():
                    op.attributes[name] = attr


__all__ = ["MIN_DETACHED_BYTES", "aligned_empty", "weights_outside"]
