"""Refuse a payload with a tensor of no elements before it is compiled.

A zero-sized layer (``nn.Linear(8, 0)``) imports as a constant and results with a
dimension of 0. Nothing downstream is written for them: the JIT's code generator divides
by the extent (a SIGFPE that takes the process down). Such a payload used to be refused
by accident, when the engine copied the module for the schedule stage (its bytecode did
not parse back); copies are now made only where needed, so the load stage checks for it.
"""

from __future__ import annotations

from typing import Any

from stagegraph.errors import PayloadError
from stagegraph.mlir.bindings import ir
from stagegraph.mlir.walk import collect


def _empty_shape(value_type: Any) -> list[int] | None:
    if not isinstance(value_type, ir.RankedTensorType):
        return None
    shaped = ir.ShapedType(value_type)
    shape = [shaped.get_dim_size(i) if shaped.is_static_dim(i) else -1
             for i in range(shaped.rank)]  # fmt: skip
    return shape if 0 in shape else None


def refuse_empty_tensors(module: Any) -> None:
    """Raise when a constant or a function's argument or result is a tensor with a
    dimension of 0.

    Raises:
        PayloadError: names the op (or function) and the shape.
    """
    for op in collect(module.operation, lambda o: o.name in ("arith.constant", "func.func")):
        if op.name == "func.func":
            kind = ir.FunctionType(ir.TypeAttr(op.attributes["function_type"]).value)
            types = [*kind.inputs, *kind.results]
            where = f"function @{ir.StringAttr(op.attributes['sym_name']).value}'s signature"
        else:
            types, where = [op.results[0].type], "a constant"
        for value_type in types:
            shape = _empty_shape(value_type)
            if shape is not None:
                raise PayloadError(
                    f"the payload has a tensor with a dimension of 0 ({where}: "
                    f"{'x'.join(map(str, shape))}); a layer without elements cannot be "
                    "compiled (remove it, or give it a nonzero size)"
                )


__all__ = ["refuse_empty_tensors"]
