"""Constant globals of an LLVM-dialect module become one-dimensional byte arrays.

Lowering ``memref.global`` keeps the memref's shape: a ``512x256x3x3`` weight becomes an
``!llvm.array<512 x array<256 x array<3 x array<3 x f32>>>>`` global, which MLIR's
translation to LLVM IR builds as one LLVM constant per innermost row of three floats
(uniqued, hashed) and nested arrays above them. For ResNet-18 that is four million
constants: 9 of the 12 seconds its ``emit`` took, against a tenth of a second for the same
bytes as one ``!llvm.array<N x f32>``. As bytes (``!llvm.array<4N x i8>``) the code
generator writes the initializer in one piece rather than element by element: 0.4 s less
for ResNet-18's 11.7 million weights.

The bytes and their order are the same either way (arrays of scalars have no padding), and
every user reaches a global through ``llvm.mlir.addressof``, an opaque pointer, and GEPs
and loads that carry their own element type and alignment; so only the global's type and
initializer change, and its alignment stays at least the element's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from stagegraph.mlir.bindings import ir
from stagegraph.mlir.bindings import llvm_types as llvm
from stagegraph.mlir.resources import flat_bytes
from stagegraph.mlir.walk import children


def _innermost(array_type: Any) -> tuple[Any, int, int]:
    """The scalar element type of nested LLVM arrays, their element count and depth."""
    count, depth, current = 1, 0, array_type
    while isinstance(current, llvm.ArrayType):
        array = llvm.ArrayType(current)
        count *= array.num_elements
        depth += 1
        current = array.element_type
    return current, count, depth


_CHANGED = ("global_type", "value", "alignment")


@contextlib.contextmanager
def flat_globals_while(module: Any) -> Iterator[int]:
    """The module's constant globals flattened (:func:`flatten_constant_globals`) while the
    block runs (it writes an object file; yields how many changed), and as they were
    after it. The JIT needs no flat globals (it gets large ones as buffers,
    :mod:`stagegraph.mlir.jit_weights`), so lowering leaves them nested, and a flat copy
    of the weights is made only for a file that carries them."""
    saved: list[tuple[Any, dict[str, Any]]] = []
    try:
        with module.context:
            yield flatten_constant_globals(module, saved)
    finally:
        for op, before in saved:
            with op.context:
                for name in _CHANGED:
                    if name in before:
                        op.attributes[name] = before[name]
                    elif name in op.attributes:
                        del op.attributes[name]


def flatten_constant_globals(module: Any, saved: list[Any] | None = None) -> int:
    """Give every initialized global of nested arrays of scalars a one-dimensional byte
    type and initializer in ``module`` (LLVM dialect); returns how many changed. Globals whose
    elements cannot be read (f16/bf16 ``dense_resource`` blobs, splats) stay as they are:
    slower to translate, equally correct. ``saved``: gets each changed op with its
    attributes as they were."""
    changed = 0
    for op in children(module.operation):  # iterating the body would import the llvm module
        if op.name != "llvm.mlir.global" or "value" not in op.attributes:
            continue
        global_type = ir.TypeAttr(op.attributes["global_type"]).value
        element, count, depth = _innermost(global_type)
        value = op.attributes["value"]
        if depth < 2 or not isinstance(value.type, ir.ShapedType):
            continue
        shaped = ir.ShapedType(value.type)
        if shaped.element_type != element or shaped.rank != depth:
            continue
        name = ir.StringAttr(op.attributes["sym_name"]).value
        flat = flat_bytes(value, f"{name}_bytes")
        if flat is None:
            continue
        if saved is not None:
            saved.append((op, {n: op.attributes[n] for n in _CHANGED if n in op.attributes}))
        size = ir.ShapedType(flat.type).shape[0]
        byte = ir.IntegerType.get_signless(8, module.context)
        op.attributes["global_type"] = ir.TypeAttr.get(llvm.ArrayType.get(byte, size))
        op.attributes["value"] = flat
        aligned = (
            ir.IntegerAttr(op.attributes["alignment"]).value if "alignment" in op.attributes else 0
        )
        op.attributes["alignment"] = ir.IntegerAttr.get(
            ir.IntegerType.get_signless(64, module.context), max(aligned, size // count)
        )
        changed += 1
    return changed


__all__ = ["flat_globals_while", "flatten_constant_globals"]
