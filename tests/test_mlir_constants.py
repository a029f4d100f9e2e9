"""Zero constants (stagegraph/mlir/constants.py): built and recognised the same way."""

from __future__ import annotations

import pytest

pytest.importorskip("stagegraph.mlir.bindings")


@pytest.mark.parametrize("type_text", ["vector<6x16xf32>", "vector<4xi32>", "vector<8xbf16>"])
def test_zeros_is_a_splat_zero_constant_of_the_type(type_text):
    from stagegraph.mlir.bindings import ir, new_context
    from stagegraph.mlir.constants import is_zero, zeros

    with new_context(), ir.Location.unknown():
        module = ir.Module.create()
        with ir.InsertionPoint(module.body):
            value = zeros(ir.Type.parse(type_text))
        assert str(value.type) == type_text
        assert value.owner.name == "arith.constant" and is_zero(value)


@pytest.mark.parametrize(
    ("constant", "expected"),
    [
        ("arith.constant -0.0 : f32", True),
        ("arith.constant 0 : i32", True),
        ("arith.constant dense<0.0> : vector<2xf32>", True),
        ("arith.constant 1.5 : f32", False),
        ("arith.constant dense<[0.0, 1.0]> : vector<2xf32>", False),
        ("arith.constant dense<2> : vector<2xi8>", False),
    ],
)
def test_is_zero_reads_the_constant(constant, expected):
    from stagegraph.mlir.bindings import ir, new_context
    from stagegraph.mlir.constants import is_zero
    from stagegraph.mlir.walk import collect

    with new_context(), ir.Location.unknown():
        module = ir.Module.parse(f"func.func @f() {{\n  %v = {constant}\n  return\n}}")
        (op,) = collect(module, "arith.constant")
        assert is_zero(op.results[0]) is expected


def test_a_function_argument_is_not_a_zero_constant():
    from stagegraph.mlir.bindings import ir, new_context
    from stagegraph.mlir.constants import is_zero
    from stagegraph.mlir.walk import collect

    with new_context(), ir.Location.unknown():
        module = ir.Module.parse("func.func @f(%x: f32) {\n  return\n}")
        (fn,) = collect(module, "func.func")
        assert not is_zero(fn.regions[0].blocks[0].arguments[0])
