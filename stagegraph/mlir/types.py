"""MLIR element types to the names of :mod:`stagegraph.dtypes` (read through the bindings)."""

from __future__ import annotations

from typing import Any

from stagegraph.mlir.bindings import ir

_FLOATS = ((ir.F16Type, "f16"), (ir.BF16Type, "bf16"), (ir.F32Type, "f32"), (ir.F64Type, "f64"))


def element_name(element_type: Any) -> str | None:
    """``f16``, ``bf16``, ``f32``, ``f64``, ``index``, ``iN`` (signless), ``uiN`` (unsigned);
    None for any other type (complex, f8, signed integers, ...)."""
    for cls, name in _FLOATS:
        if isinstance(element_type, cls):
            return name
    if isinstance(element_type, ir.IndexType):
        return "index"
    if isinstance(element_type, ir.IntegerType):
        itype = ir.IntegerType(element_type)
        if itype.is_signless:
            return f"i{itype.width}"
        if itype.is_unsigned:
            return f"ui{itype.width}"
    return None
