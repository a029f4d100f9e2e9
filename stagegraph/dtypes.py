"""Element types: MLIR names, numpy storage, sizes, bfloat16 bits and unit roundoffs.

The one table of element types (numpy only, no MLIR): workloads, the verifier, the runtime's
memref marshalling and the cost models all read it. :func:`stagegraph.mlir.types.element_name`
maps an MLIR type to these names.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "NAMES",
    "UNIT_ROUNDOFF",
    "byte_size",
    "decode",
    "from_bf16",
    "is_float",
    "numpy_dtype",
    "to_bf16",
]

_NUMPY = {
    "f64": np.float64,
    "f32": np.float32,
    "f16": np.float16,
    "bf16": np.uint16,  # numpy has no bfloat16: bit patterns stored as uint16
    "i1": np.bool_,
    "i8": np.int8,
    "i16": np.int16,
    "i32": np.int32,
    "i64": np.int64,
    "ui8": np.uint8,
    "ui16": np.uint16,
    "ui32": np.uint32,
    "ui64": np.uint64,
    "index": np.int64,
}

#: Every element type name stagegraph moves between numpy and compiled code.
NAMES = frozenset(_NUMPY)

UNIT_ROUNDOFF = {"f64": 2.0**-53, "f32": 2.0**-24, "f16": 2.0**-11, "bf16": 2.0**-8}
"""u = 2^-p for a p-bit significand: the largest relative error of one round-to-nearest.

Half the machine epsilon (the gap above 1.0): f64 2^-52, f32 2^-23, f16 2^-10, bf16 2^-7.
Rounding-error bounds (Higham, *Accuracy and Stability of Numerical Algorithms*) are stated
in u, so the verifier's constants are too.
"""


def numpy_dtype(dtype: str) -> np.dtype:
    """The numpy storage dtype for an MLIR element type name (bf16 -> uint16 bits)."""
    try:
        return np.dtype(_NUMPY[dtype])
    except KeyError:
        raise TypeError(f"element type {dtype!r} has no numpy equivalent") from None


def byte_size(dtype: str, default: int | None = None) -> int:
    """Bytes per element of an element type name (``default`` for unknown names, else a
    TypeError)."""
    if dtype not in _NUMPY and default is not None:
        return default
    return numpy_dtype(dtype).itemsize


def is_float(dtype: str) -> bool:
    return dtype in UNIT_ROUNDOFF


def to_bf16(values: np.ndarray) -> np.ndarray:
    """Round float values to bfloat16 (nearest even), returned as uint16 bit patterns."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def from_bf16(bits: np.ndarray) -> np.ndarray:
    """Decode uint16 bfloat16 bit patterns to float32."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def decode(array: np.ndarray, dtype: str) -> np.ndarray:
    """Values of ``array`` (stored as ``numpy_dtype(dtype)``) as float64, for comparisons."""
    if dtype == "bf16":
        return from_bf16(array).astype(np.float64)
    return np.asarray(array).astype(np.float64)
