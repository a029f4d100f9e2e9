"""Calling convention of compiled entry points: signatures and numpy ↔ memref marshalling.

An entry point is called through its C interface (``_mlir_ciface_<name>``): ranked memrefs
are passed as pointers to descriptors ``{allocated, aligned, offset, sizes[r], strides[r]}``,
scalars by value. After ``lowering.BUFFERIZE`` results are caller-allocated out-parameters,
so a :class:`Signature` records which arguments are outputs; the runner allocates them.

The signature is read from the IR (entry ``func.func`` types) at the tensor or buffer level
and recorded on the function as attributes (:func:`record_signature`) so that it can be read
back from the LLVM-level module, where memref types are gone. This module imports the MLIR
bindings only inside the functions that read IR: loading and calling a shared library does
not need them.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np

from stagegraph.core.ports import Binary, Schema
from stagegraph.dtypes import NAMES, numpy_dtype
from stagegraph.errors import SignatureError
from stagegraph.mlir.functions import find_function
from stagegraph.mlir.walk import children

SIGNATURE_ATTR = "stagegraph.signature"
OUTPUTS_ATTR = "stagegraph.outputs"
C_INTERFACE_ATTR = "llvm.emit_c_interface"
CIFACE_PREFIX = "_mlir_ciface_"

#: MLIR element type name -> numpy storage dtype (bf16 as raw uint16 bits).
DTYPES: dict[str, np.dtype] = {name: numpy_dtype(name) for name in sorted(NAMES)}

#: Scalars passed by value through the C interface (no half types: they travel in vector
#: registers, which ctypes cannot express).
_SCALAR_CTYPES: dict[str, Any] = {
    "f32": ctypes.c_float,
    "f64": ctypes.c_double,
    "i1": ctypes.c_bool,
    "i8": ctypes.c_int8,
    "i16": ctypes.c_int16,
    "i32": ctypes.c_int32,
    "i64": ctypes.c_int64,
    "ui8": ctypes.c_uint8,
    "ui16": ctypes.c_uint16,
    "ui32": ctypes.c_uint32,
    "ui64": ctypes.c_uint64,
    "index": ctypes.c_int64,
}


class Arg(Schema):
    """One argument of an entry point: a ranked memref (``shape`` given) or a scalar."""

    dtype: str
    shape: tuple[int | None, ...] | None = None
    output: bool = False

    @property
    def is_scalar(self) -> bool:
        return self.shape is None

    @property
    def np_dtype(self) -> np.dtype:
        return DTYPES[self.dtype]

    def allocate(self) -> np.ndarray:
        """A zeroed array for an output memref (static shapes only)."""
        if self.shape is None or None in self.shape:
            raise SignatureError(f"cannot allocate an output of dynamic shape {self.shape}")
        return np.zeros(self.shape, dtype=self.np_dtype)


class Signature(Schema):
    """Arguments of an entry point in calling order (inputs and out-parameters)."""

    entry: str
    args: tuple[Arg, ...]

    @property
    def inputs(self) -> tuple[Arg, ...]:
        return tuple(a for a in self.args if not a.output)

    @property
    def outputs(self) -> tuple[Arg, ...]:
        return tuple(a for a in self.args if a.output)

    def assemble(self, inputs: Sequence[Any]) -> tuple[list[Any], list[np.ndarray]]:
        """All arguments in order (inputs given, outputs freshly allocated) and the outputs."""
        ins = self.inputs
        if len(inputs) != len(ins):
            raise SignatureError(f"{self.entry}: expected {len(ins)} inputs, got {len(inputs)}")
        given = iter(inputs)
        args: list[Any] = []
        outs: list[np.ndarray] = []
        for i, spec in enumerate(self.args):
            if spec.output:
                outs.append(spec.allocate())
                args.append(outs[-1])
            else:
                args.append(coerce(self.entry, i, spec, next(given)))
        return args, outs


def coerce(entry: str, index: int, spec: Arg, value: Any) -> Any:
    """Check one input against its spec; scalars become numpy scalars of the right type."""
    if spec.is_scalar:
        if isinstance(value, np.ndarray):
            if value.ndim != 0:  # a 0-d array (as workloads and .npz files hold) is a scalar
                raise SignatureError(f"{entry}: argument #{index} is a {spec.dtype} scalar")
            value = value.item()
        return spec.np_dtype.type(value)
    array = np.asarray(value)
    if array.dtype != spec.np_dtype:
        raise SignatureError(
            f"{entry}: argument #{index} has dtype {array.dtype}, expected {spec.np_dtype} "
            f"({spec.dtype})"
        )
    assert spec.shape is not None
    if len(array.shape) != len(spec.shape) or any(
        s is not None and s != d for s, d in zip(spec.shape, array.shape, strict=True)
    ):
        raise SignatureError(
            f"{entry}: argument #{index} has shape {array.shape}, expected {spec.shape}"
        )
    return np.ascontiguousarray(array)


# --------------------------------------------------------------------------- marshalling

_DESCRIPTORS: dict[int, type[ctypes.Structure]] = {}


def descriptor_type(rank: int) -> type[ctypes.Structure]:
    """The ctypes struct of a ranked memref descriptor (element pointers as ``void*``)."""
    if rank not in _DESCRIPTORS:
        fields: list[tuple[str, Any]] = [
            ("allocated", ctypes.c_void_p),
            ("aligned", ctypes.c_void_p),
            ("offset", ctypes.c_int64),
        ]
        if rank:
            fields += [("sizes", ctypes.c_int64 * rank), ("strides", ctypes.c_int64 * rank)]
        _DESCRIPTORS[rank] = type(f"MemRef{rank}D", (ctypes.Structure,), {"_fields_": fields})
    return _DESCRIPTORS[rank]


def to_descriptor(array: np.ndarray) -> ctypes.Structure:
    """A descriptor viewing ``array`` (no copy); the array must outlive the call."""
    if any(s < 0 or s % array.itemsize for s in array.strides):
        raise SignatureError("memref arguments need non-negative, element-aligned strides")
    desc = descriptor_type(array.ndim)()
    desc.allocated = desc.aligned = array.ctypes.data
    desc.offset = 0
    if array.ndim:
        desc.sizes[:] = array.shape
        desc.strides[:] = [s // array.itemsize for s in array.strides]
    return desc


def from_descriptor(desc: ctypes.Structure, dtype: np.dtype) -> np.ndarray:
    """A numpy view of the memory a descriptor points at (no copy)."""
    dtype = np.dtype(dtype)
    rank = len(desc.sizes) if hasattr(desc, "sizes") else 0
    shape = tuple(desc.sizes[:rank]) if rank else ()
    elem_strides = tuple(desc.strides[:rank]) if rank else ()
    strides = tuple(s * dtype.itemsize for s in elem_strides)
    extent = 1 + sum((n - 1) * s for n, s in zip(shape, elem_strides, strict=True))
    if 0 in shape:
        extent = 0
    buffer = (ctypes.c_char * (extent * dtype.itemsize)).from_address(
        desc.aligned + desc.offset * dtype.itemsize
    )
    flat = np.frombuffer(buffer, dtype=dtype)
    return np.lib.stride_tricks.as_strided(flat, shape=shape, strides=strides)


class Marshalled:
    """Arguments converted once for the C interface; keeps every buffer alive while held.

    ``values`` are the by-value C arguments (descriptor pointers, scalars) with their
    ``argtypes``; ``packed`` is the ``void*[]`` that the JIT's packed wrappers take.
    """

    def __init__(self, args: Sequence[Any]) -> None:
        self.arrays: list[Any] = []
        self.values: list[Any] = []
        self.argtypes: list[Any] = []
        for value in args:
            if isinstance(value, np.ndarray):
                if not value.flags.c_contiguous:
                    raise SignatureError("memref arguments must be C-contiguous arrays")
                desc = to_descriptor(value)
                self.arrays.append((value, desc))
                self.values.append(ctypes.c_void_p(ctypes.addressof(desc)))
                self.argtypes.append(ctypes.c_void_p)
            elif isinstance(value, np.generic):
                ctype = _ctype_of(np.dtype(type(value)))
                self.values.append(ctype(value.item()))
                self.argtypes.append(ctype)
            else:
                raise SignatureError(
                    f"argument {value!r} must be a numpy array or numpy scalar (e.g. np.int64)"
                )
        self.packed = (ctypes.c_void_p * len(self.values))(
            *[ctypes.addressof(v) for v in self.values]
        )


def _ctype_of(dtype: np.dtype) -> Any:
    for name, ctype in _SCALAR_CTYPES.items():
        if DTYPES[name] == dtype and name != "index":
            return ctype
    raise SignatureError(f"scalar arguments of dtype {dtype} are not supported")


class CallableBinary(Binary):
    """A binary whose entry points take the C interface; shared by the JIT and .so paths.

    Subclasses provide :meth:`_invoker` (a zero-argument callable for marshalled arguments)
    and ``signatures`` (entry name -> :class:`Signature`).
    """

    signatures: dict[str, Signature]

    def signature(self, entry: str) -> Signature:
        """The recorded signature of ``entry``; raises :class:`SignatureError` if unknown."""
        try:
            return self.signatures[entry]
        except KeyError:
            known = ", ".join(sorted(self.signatures)) or "none"
            raise SignatureError(
                f"no recorded signature for entry {entry!r} (recorded: {known}); call "
                "record_signature(module, entry) before lowering to LLVM"
            ) from None

    def call(self, entry: str, inputs: Sequence[Any]) -> list[np.ndarray]:
        """Call ``entry`` on ``inputs`` and return its freshly allocated outputs."""
        args, outs = self.signature(entry).assemble(inputs)
        self.call_into(entry, args)
        return outs

    def call_into(self, entry: str, args: Sequence[Any]) -> None:
        """Call ``entry`` with every argument given (outputs preallocated), in order."""
        self.bind(entry, args)()

    def bind(self, entry: str, args: Sequence[Any]) -> Any:
        """Marshal ``args`` once; the returned zero-argument callable runs ``entry`` again.

        For tuners calling the same kernel thousands of times on the same buffers.
        """
        return self._invoker(entry, Marshalled(args))

    def _invoker(self, entry: str, marshalled: Marshalled) -> Any:  # pragma: no cover
        raise NotImplementedError


# --------------------------------------------------------------------------- reading IR


def element_name(element_type: Any) -> str:
    """MLIR element type -> the names in :data:`DTYPES` (read through the bindings)."""
    from stagegraph.mlir.types import element_name as name_of

    name = name_of(element_type)
    if name is None or name not in DTYPES:
        raise SignatureError(f"unsupported element type {element_type}")
    return name


def calling_types(function_type: Any) -> tuple[list[Any], list[bool]]:
    """Argument types of the C call after bufferization, and which of them are outputs.

    Tensors become identity-layout memrefs and tensor results become trailing out-params.
    """
    from stagegraph.mlir.bindings import ir

    def as_buffer(t: Any) -> Any:
        if isinstance(t, ir.RankedTensorType):
            rt = ir.RankedTensorType(t)
            return ir.MemRefType.get(rt.shape, rt.element_type)
        return t

    results = list(function_type.results)
    for t in results:
        if not isinstance(t, ir.RankedTensorType):
            raise SignatureError(
                f"result of type {t} cannot become an out-parameter (only ranked tensors can)"
            )
    types = [as_buffer(t) for t in function_type.inputs] + [as_buffer(t) for t in results]
    return types, [False] * len(function_type.inputs) + [True] * len(results)


def signature_from_types(entry: str, types: Sequence[Any], outputs: Sequence[bool]) -> Signature:
    """Build a :class:`Signature` from memref/scalar MLIR types."""
    from stagegraph.mlir.bindings import ir

    args = []
    for i, (t, out) in enumerate(zip(types, outputs, strict=True)):
        if isinstance(t, ir.MemRefType):
            mt = ir.MemRefType(t)
            dyn = ir.ShapedType.get_dynamic_size()
            shape = tuple(None if d == dyn else d for d in mt.shape)
            args.append(Arg(dtype=element_name(mt.element_type), shape=shape, output=out))
        elif isinstance(t, ir.ShapedType):
            raise SignatureError(f"{entry}: argument #{i} of type {t} is not a ranked memref")
        else:
            name = element_name(t)
            if name not in _SCALAR_CTYPES:
                raise SignatureError(f"{entry}: scalar argument #{i} of type {t} unsupported")
            args.append(Arg(dtype=name, output=False))
    return Signature(entry=entry, args=tuple(args))


def record_signature(module: Any, entry: str, outputs: Sequence[bool] | None = None) -> Signature:
    """Record ``entry``'s calling convention on the function and request its C interface.

    Call at the tensor level (tensor results become outputs) or at the buffer level (then
    say which arguments are outputs, unless already recorded). The attributes survive
    lowering to the LLVM dialect, where :func:`read_signature` finds them.

    Raises:
        SignatureError: the function is missing, already lowered, or not callable.
    """
    from stagegraph.mlir.bindings import ir

    op = _func_op(module, entry)
    with module.context:
        ftype = ir.FunctionType(ir.TypeAttr(op.attributes["function_type"]).value)
        types, outs = calling_types(ftype)
        if outputs is not None:
            if len(outputs) != len(types):
                raise SignatureError(
                    f"{entry}: {len(outputs)} output flags for {len(types)} arguments"
                )
            outs = list(outputs)
        elif not ftype.results and OUTPUTS_ATTR in op.attributes:
            outs = [bool(x) for x in ir.DenseBoolArrayAttr(op.attributes[OUTPUTS_ATTR])]
        sig = signature_from_types(entry, types, outs)
        op.attributes[SIGNATURE_ATTR] = ir.TypeAttr.get(ir.FunctionType.get(types, []))
        op.attributes[OUTPUTS_ATTR] = ir.DenseBoolArrayAttr.get(outs)
        op.attributes[C_INTERFACE_ATTR] = ir.UnitAttr.get()
    return sig


def read_signature(module: Any, entry: str) -> Signature:
    """The signature recorded on ``entry`` (any level), else derived from its tensor types.

    Raises:
        SignatureError: nothing recorded and the types do not say which args are outputs.
    """
    from stagegraph.mlir.bindings import ir

    op = find_function(module, entry)
    if op is None:
        raise SignatureError(f"no function named {entry!r} in the module")
    with module.context:
        if SIGNATURE_ATTR in op.attributes:
            ftype = ir.FunctionType(ir.TypeAttr(op.attributes[SIGNATURE_ATTR]).value)
            outs = [bool(x) for x in ir.DenseBoolArrayAttr(op.attributes[OUTPUTS_ATTR])]
            return signature_from_types(entry, list(ftype.inputs), outs)
        if op.operation.name != "func.func":
            raise SignatureError(
                f"{entry!r} is already lowered to LLVM and has no recorded signature; call "
                "record_signature(module, entry) before lowering"
            )
        ftype = ir.FunctionType(ir.TypeAttr(op.attributes["function_type"]).value)
        if not any(isinstance(t, ir.RankedTensorType) for t in [*ftype.inputs, *ftype.results]):
            raise SignatureError(
                f"{entry!r} takes buffers but records no outputs; call "
                "record_signature(module, entry, outputs=[...])"
            )
        types, outs = calling_types(ftype)
        return signature_from_types(entry, types, outs)


def read_signatures(module: Any) -> dict[str, Signature]:
    """Every recorded signature of the module, by entry name (skips C-interface copies)."""
    sigs = {}
    for op in children(module.operation):
        if SIGNATURE_ATTR not in op.attributes or "sym_name" not in op.attributes:
            continue
        name = op.attributes["sym_name"].value
        if not name.startswith(CIFACE_PREFIX):
            sigs[name] = read_signature(module, name)
    return sigs


def _func_op(module: Any, entry: str) -> Any:
    op = find_function(module, entry)
    if op is None:
        raise SignatureError(f"no function named {entry!r} in the module")
    if op.operation.name != "func.func":
        raise SignatureError(f"{entry!r} is already lowered to LLVM ({op.operation.name})")
    return op
