"""Give a function with dynamic tensor dimensions the static shapes its inputs fix.

A payload exported with dynamic sizes (``tensor<?x8xf32>``) cannot be scheduled or
benchmarked as it is; when the data it runs on is known (the ``.npz`` beside a ``.mlir``
file), each dynamic argument and result gets that static type, a ``tensor.cast`` back to the
declared type keeps the body valid, and canonicalization folds the casts into the ops, which
then see static shapes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from stagegraph.errors import PayloadError


def fits(declared: Sequence[int], actual: Sequence[int]) -> bool:
    """Whether a static ``actual`` shape is an instance of a ``declared`` one (-1 or the
    bindings' dynamic marker for any size)."""
    from stagegraph.mlir.bindings import ir

    return len(declared) == len(actual) and all(
        ir.ShapedType.is_dynamic_size(d) or d == a for d, a in zip(declared, actual, strict=True)
    )


def specialize(
    module: Any,
    function: Any,
    arguments: Mapping[int, Sequence[int]],
    results: Mapping[int, Sequence[int]],
) -> None:
    """Retype ``function``'s dynamic arguments and results (index -> static shape) in place,
    then canonicalize ``module`` so the static shapes reach the ops.

    Raises:
        PayloadError: a shape that does not fit the declared type.
    """
    from stagegraph.mlir.bindings import ir, passmanager, tensor
    from stagegraph.mlir.walk import collect

    block = function.regions[0].blocks[0]
    kind = ir.TypeAttr(function.attributes["function_type"]).value
    inputs, outputs = list(kind.inputs), list(kind.results)
    with ir.Location.unknown(module.context):
        for index, shape in sorted(arguments.items()):
            arg = block.arguments[index]
            declared = ir.RankedTensorType(arg.type)
            if not fits(declared.shape, shape):
                raise PayloadError(f"argument #{index}: {list(shape)} does not fit {declared}")
            static = ir.RankedTensorType.get(list(shape), declared.element_type)
            arg.set_type(static)
            with ir.InsertionPoint.at_block_begin(block):
                cast = tensor.CastOp(declared, arg)
            arg.replace_all_uses_except(cast.result, cast.operation)
            inputs[index] = static
        (ret,) = collect(function, lambda op: op.name == "func.return" and op.parent == function)
        for index, shape in sorted(results.items()):
            declared = ir.RankedTensorType(outputs[index])
            if not fits(declared.shape, shape):
                raise PayloadError(f"result #{index}: {list(shape)} does not fit {declared}")
            static = ir.RankedTensorType.get(list(shape), declared.element_type)
            with ir.InsertionPoint(ret):
                ret.operands[index] = tensor.CastOp(static, ret.operands[index]).result
            outputs[index] = static
        function.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(inputs, outputs))
    passmanager.PassManager.parse("builtin.module(canonicalize,cse)", module.context).run(
        module.operation
    )
