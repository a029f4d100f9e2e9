"""IR helpers below the stages: one-walk def-use, direct children, named-op building."""

from __future__ import annotations

from stagegraph.mlir.bindings import func, ir, new_context, tensor
from stagegraph.mlir.build import named_structured_op
from stagegraph.mlir.walk import DefUse, LiveDefUse, children, collect
from stagegraph.stages.analysis import analyze

TWO_USERS = """
func.func @main(%a: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
  %e = tensor.empty() : tensor<4xf32>
  %n = math.exp %a : tensor<4xf32>
  %x = arith.addf %n, %n : tensor<4xf32>
  %y = arith.mulf %a, %x : tensor<4xf32>
  return %x, %y : tensor<4xf32>, tensor<4xf32>
}
"""


def test_def_use_names_owners_and_users() -> None:
    with new_context() as ctx:
        module = ir.Module.parse(TWO_USERS, ctx)
        (fn,) = collect(module.operation, "func.func")
        def_use = DefUse(fn)
        exp, add, mul = (collect(fn, name)[0] for name in ("math.exp", "arith.addf", "arith.mulf"))
        assert def_use.owner(add.results[0]) == add
        assert def_use.owner(fn.regions[0].blocks[0].arguments[0]) is None
        assert def_use.users(exp.results[0]) == [add, add]  # once per operand
        assert [u.name for u in def_use.users(add.results[0])] == ["arith.mulf", "func.return"]
        assert def_use.users(mul.results[0])[0].name == "func.return"


def test_live_def_use_answers_as_def_use_and_follows_rewrites() -> None:
    """The live answers equal the snapshot's on unchanged IR, and after a rewrite they are
    the rewritten IR's while the snapshot still tells the old one."""
    with new_context() as ctx:
        module = ir.Module.parse(TWO_USERS, ctx)
        (fn,) = collect(module.operation, "func.func")
        snapshot, live = DefUse(fn), LiveDefUse()
        values = [r for op in collect(fn) for r in op.results]
        values += list(fn.regions[0].blocks[0].arguments)
        for value in values:
            assert live.owner(value) == snapshot.owner(value)
            assert sorted(u.name for u in live.users(value)) == sorted(
                u.name for u in snapshot.users(value)
            )
        exp, add, mul = (collect(fn, name)[0] for name in ("math.exp", "arith.addf", "arith.mulf"))
        mul.operands[1] = exp.results[0]  # %y = %a * %n: the add keeps only the return
        assert sorted(u.name for u in live.users(exp.results[0])) == [
            "arith.addf", "arith.addf", "arith.mulf"
        ]  # fmt: skip
        assert [u.name for u in live.users(add.results[0])] == ["func.return"]
        assert len(snapshot.users(add.results[0])) == 2  # the snapshot is stale


def test_children_are_the_direct_ops_only() -> None:
    with new_context() as ctx:
        module = ir.Module.parse(TWO_USERS, ctx)
        assert [op.name for op in children(module.operation)] == ["func.func"]
        (fn,) = children(module.operation)
        assert [op.name for op in children(fn)] == [
            "tensor.empty",
            "math.exp",
            "arith.addf",
            "arith.mulf",
            "func.return",
        ]


def test_named_structured_op_has_the_named_ops_body() -> None:
    with new_context(), ir.Location.unknown():
        module = ir.Module.create()
        f32 = ir.F32Type.get()
        a_type = ir.RankedTensorType.get([4, 3], f32)
        b_type = ir.RankedTensorType.get([3, 5], f32)
        with ir.InsertionPoint(module.body):

            @func.FuncOp.from_py_func(a_type, b_type, name="main")
            def main(a, b):
                from stagegraph.mlir.bindings import arith

                empty = tensor.EmptyOp([4, 5], f32).result
                zero = arith.ConstantOp(f32, 0.0).result
                filled = named_structured_op("linalg.fill", [zero], [empty])
                return named_structured_op("linalg.matmul", [a, b], [filled])

        assert module.operation.verify()
        (matmul,) = collect(module.operation, "linalg.matmul")
        assert [op.name for op in children(matmul)] == ["arith.mulf", "arith.addf", "linalg.yield"]
        facts = analyze(module)
        assert [op.op_class for op in facts.ops] == ["elementwise", "matmul"]
        assert facts.ops[1].contraction.m == 4 and facts.ops[1].contraction.n == 5
        assert facts.ops[1].producers == ("%arg0", "%arg1", "linalg.fill")


def test_generic_builds_maps_kinds_and_body() -> None:
    from stagegraph.mlir.bindings import arith
    from stagegraph.mlir.build import generic

    with new_context(), ir.Location.unknown():
        module = ir.Module.create()
        f32 = ir.F32Type.get()
        x_type = ir.RankedTensorType.get([4, 6], f32)
        row_type = ir.RankedTensorType.get([4], f32)
        identity = ir.AffineMap.get_identity(2)
        rows = ir.AffineMap.get(2, 0, [ir.AffineDimExpr.get(0)])
        with ir.InsertionPoint(module.body):

            @func.FuncOp.from_py_func(x_type, row_type, name="main")
            def main(x, init):
                return generic(
                    [x], [init], [identity, rows], ["parallel", "reduction"],
                    lambda v, acc: arith.addf(v, acc),
                )  # fmt: skip

        assert module.operation.verify()
        (op,) = analyze(module).ops
        assert op.op_class == "reduction"
        assert op.iterator_types == ("parallel", "reduction")
        assert op.loop_ranges == (4, 6) and op.body_ops == ("arith.addf",)


CHAIN = """
func.func @main(%a: tensor<4x8xf32>, %b: tensor<8x6xf32>) -> tensor<4x6xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<4x6xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<4x6xf32>) -> tensor<4x6xf32>
  %m = linalg.matmul ins(%a, %b : tensor<4x8xf32>, tensor<8x6xf32>)
                     outs(%f : tensor<4x6xf32>) -> tensor<4x6xf32>
  %r = linalg.add ins(%m, %m : tensor<4x6xf32>, tensor<4x6xf32>)
                  outs(%e : tensor<4x6xf32>) -> tensor<4x6xf32>
  return %r : tensor<4x6xf32>
}
"""


def test_producer_ops_index_each_operands_linalg_producer() -> None:
    with new_context() as ctx:
        facts = analyze(ir.Module.parse(CHAIN, ctx))
    assert [f.name for f in facts.ops] == ["linalg.fill", "linalg.matmul", "linalg.add"]
    fill, matmul, add = (f.producer_ops for f in facts.ops)
    assert fill == (-1, -1)  # a constant and a tensor.empty: no linalg producer
    assert matmul == (-1, -1, 0)  # two arguments, the fill's result
    assert add == (1, 1, -1)
