"""Reading the elements of ``dense_resource`` attributes (the importer's weights).

PyTorch's importer stores every weight as a ``dense_resource`` blob. The Python bindings
can create such an attribute from a buffer but not read one back, nor re-type one (parsing
``dense_resource<key>`` again declares a new, empty blob under a renamed key). Reading is
what :mod:`stagegraph.stages.common.flat_globals` needs: LLVM translates a constant global
of a ``64x3x7x7`` shape into one LLVM constant per innermost row (ResNet-18's weights: four
million uniqued constants, 9 of the 12 seconds its ``emit`` took), and a one-dimensional
global of the same bytes into one.

The MLIR C API, on which the bindings are built, reads one element per call
(``mlirDense<T>ResourceElementsAttrGetValue``). Called per element from Python it would
take seconds; here a small loop compiled once per process (:func:`_copier`) calls it for
every element, with the attribute's C handle (the bindings' ``_CAPIPtr`` capsule) and the
getter's address as arguments: 12 million floats in about 0.1 s.

The getters dereference the blob without checking that it exists, so an attribute whose
blob is absent (a payload printed with elided resources, ``dense_resource<__elided__>``) is
refused first (:func:`has_blob`): the bytecode writer writes a blob only when there is one,
so a scratch module holding the attribute is at least as large as the blob exactly when the
blob exists. That test needs the blob to outweigh the scratch module's own bytes (a few
hundred, the key included), so only blobs of :data:`MIN_BYTES` or more are read; a smaller
global costs LLVM little anyway.
"""

from __future__ import annotations

import ctypes
import functools
import importlib
from pathlib import Path
from typing import Any

import numpy as np

from stagegraph.mlir.bindings import ROOT, execution_engine, ir
from stagegraph.mlir.digest import bytecode_size

#: C API getter suffix and numpy dtype per element type (signless integers and floats; the
#: C API has no getter for f16/bf16, whose globals stay as they are).
_ELEMENTS = {
    "f32": ("Float", np.float32),
    "f64": ("Double", np.float64),
    "i8": ("Int8", np.int8),
    "i16": ("Int16", np.int16),
    "i32": ("Int32", np.int32),
    "i64": ("Int64", np.int64),
}

#: Smallest blob read (bytes): see the module's docstring.
MIN_BYTES = 4096

_LOOP = """
llvm.func @copy_{t}(%attr: !llvm.ptr, %get: !llvm.ptr, %out: !llvm.ptr, %n: i64) {{
  %zero = llvm.mlir.constant(0 : i64) : i64
  %one = llvm.mlir.constant(1 : i64) : i64
  llvm.br ^loop(%zero : i64)
^loop(%i: i64):
  %done = llvm.icmp "sge" %i, %n : i64
  llvm.cond_br %done, ^exit, ^body
^body:
  %v = llvm.call %get(%attr, %i) : !llvm.ptr, (!llvm.ptr, i64) -> {t}
  %p = llvm.getelementptr %out[%i] : (!llvm.ptr, i64) -> !llvm.ptr, {t}
  llvm.store %v, %p : {t}, !llvm.ptr
  %next = llvm.add %i, %one : i64
  llvm.br ^loop(%next : i64)
^exit:
  llvm.return
}}
"""


def _as(kind: Any, attr: Any) -> Any | None:
    """``attr`` as the attribute class ``kind``, or ``None`` (attributes read from an op come
    back as plain ``ir.Attribute``; the class constructors check and cast)."""
    try:
        return kind(attr)
    except ValueError:
        return None


def element_key(element_type: Any) -> str | None:
    """``"f32"``, ``"i64"``, ... for the element types whose resources can be read, else
    ``None`` (f16, bf16, unsigned or signed-marked integers, i1, vectors)."""
    if isinstance(element_type, ir.F32Type):
        return "f32"
    if isinstance(element_type, ir.F64Type):
        return "f64"
    if isinstance(element_type, ir.IntegerType):
        integer = ir.IntegerType(element_type)
        key = f"i{integer.width}"
        return key if integer.is_signless and key in _ELEMENTS else None
    return None


@functools.cache
def _capi_library() -> ctypes.CDLL:
    """The C API library the bindings are built on (already loaded by them; opening it
    again returns the same copy, whose attributes the capsules point into)."""
    folder = Path(next(iter(importlib.import_module(ROOT).__path__))) / "_mlir_libs"
    for path in sorted(folder.glob("lib*.so*")):
        library = ctypes.CDLL(str(path))
        if hasattr(library, "mlirDenseFloatResourceElementsAttrGetValue"):
            return library
    raise ImportError(f"no MLIR C API library with resource getters in {folder}")


@functools.cache
def _copier() -> tuple[Any, dict[str, Any]]:
    """The compiled copy loops (one per element type) and their packed entry points; the
    engine is kept alive with them for the process."""
    context = ir.Context()
    module = ir.Module.parse("".join(_LOOP.format(t=t) for t in _ELEMENTS), context)
    engine = execution_engine.ExecutionEngine(module, opt_level=2)
    packed = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
    return engine, {t: packed(engine.raw_lookup(f"copy_{t}")) for t in _ELEMENTS}


def _capsule_pointer(capsule: object) -> int:
    """The C handle inside a bindings capsule (own prototypes: ``ctypes.pythonapi``'s
    shared function objects are left as they are)."""
    api = ctypes.pythonapi
    get_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(("PyCapsule_GetName", api))
    get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
        ("PyCapsule_GetPointer", api)
    )
    return get_pointer(capsule, get_name(capsule))


def has_blob(attr: Any, nbytes: int) -> bool:
    """Whether the ``dense_resource`` attribute has its data (the bytecode of a scratch
    module holding it carries the blob only when it exists)."""
    from stagegraph.mlir.bindings import arith

    with attr.context, ir.Location.unknown(attr.context):
        scratch = ir.Module.create()
        with ir.InsertionPoint(scratch.body):
            arith.ConstantOp(attr.type, attr)
        size = bytecode_size(scratch)  # counted as written: the blob is not copied
    return size >= nbytes


def resource_values(attr: Any, into: np.ndarray | None = None) -> np.ndarray | None:
    """The elements of a ``dense_resource`` attribute as a one-dimensional array (row-major
    order), or ``None`` when its element type has no C API getter, it is smaller than
    :data:`MIN_BYTES` or it has no data. ``into``: a contiguous buffer of exactly the
    elements' bytes to write them into (no second copy of a large weight); its view as
    the element type is returned."""
    shaped = ir.ShapedType(attr.type)
    key = element_key(shaped.element_type)
    if key is None or _as(ir.DenseResourceElementsAttr, attr) is None:
        return None
    suffix, dtype = _ELEMENTS[key]
    count = int(np.prod(shaped.shape, dtype=np.int64))
    nbytes = count * np.dtype(dtype).itemsize
    if nbytes < MIN_BYTES or not has_blob(attr, nbytes):
        return None
    getter = getattr(_capi_library(), f"mlirDense{suffix}ResourceElementsAttrGetValue")
    _engine, loops = _copier()
    if into is not None and into.nbytes != nbytes:
        raise ValueError(f"resource_values: {into.nbytes} bytes given for {nbytes}")
    out = np.empty(count, dtype) if into is None else into.view(dtype)
    arguments = [
        ctypes.c_void_p(_capsule_pointer(attr._CAPIPtr)),
        ctypes.c_void_p(ctypes.cast(getter, ctypes.c_void_p).value),
        ctypes.c_void_p(out.ctypes.data),
        ctypes.c_int64(count),
    ]
    pointers = (ctypes.c_void_p * len(arguments))(
        *(ctypes.cast(ctypes.pointer(a), ctypes.c_void_p) for a in arguments)
    )
    loops[key](ctypes.cast(pointers, ctypes.c_void_p))
    return out


def flat_bytes(attr: Any, name: str) -> Any | None:
    """The elements' bytes (row-major, the target's byte order) as a one-dimensional ``i8``
    attribute of the same kind (a new ``dense_resource`` blob named ``name``, or a dense
    attribute), or ``None`` when they cannot be read (splats, element types without a
    getter, a missing blob, fewer than two elements)."""
    shaped = ir.ShapedType(attr.type)
    if element_key(shaped.element_type) is None:
        return None
    if int(np.prod(shaped.shape, dtype=np.int64)) < 2:  # one element would make a splat
        return None
    dense = _as(ir.DenseElementsAttr, attr)
    with attr.context, ir.Location.unknown(attr.context):
        byte = ir.IntegerType.get_signless(8)
        if _as(ir.DenseResourceElementsAttr, attr) is not None:
            values = resource_values(attr)
            if values is None:
                return None
            raw = values.view(np.int8)
            flat_type = ir.RankedTensorType.get([raw.size], byte)
            return ir.DenseResourceElementsAttr.get_from_buffer(raw, name, flat_type)
        if dense is None or dense.is_splat:
            return None
        return ir.DenseElementsAttr.get(np.array(dense).reshape(-1).view(np.int8), type=byte)


__all__ = ["element_key", "flat_bytes", "has_blob", "resource_values"]
