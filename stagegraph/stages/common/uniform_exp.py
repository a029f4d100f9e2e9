"""A vector ``exp`` whose argument is one value in every lane is computed once.

ELU, SELU and CELU reach the payload as ``exp(min(x, 0))``: the ``min`` a vector
``arith.select(x > 0, 0, x)`` of a broadcast zero and the input (torch-mlir's decomposition).
Where a whole vector of ``x`` is positive, every lane of the argument is the broadcast value
and the ~20-instruction exp polynomial computes ``exp(0)`` sixteen times over. PyTorch's ELU
skips its ``expm1`` for such vectors; here the same holds for any select of a uniform value:

    v = select(c, u, x)           (u a vector.broadcast or a splat constant)
    exp(v) -> if all(c) { broadcast(exp(u[0])) } else { exp(v) }

(``select(c, x, u)`` tests ``none(c)``.) The test is a mask reduction and a branch per
vector, a few percent of the exp it may skip; the scalar exp is the same function, so
results are identical either way. Run on the buffer-level module before the exp is
approximated (:mod:`stagegraph.stages.common.math_approx` rewrites both branches).
"""

from __future__ import annotations

from typing import Any

from stagegraph.mlir.walk import collect, defining_op


def compute_uniform_exps_once(module: Any) -> int:
    """Guard every f32 vector ``math.exp`` of a select with a uniform operand (see the
    module docstring); returns how many were guarded."""
    from stagegraph.mlir.bindings import ir

    module = getattr(module, "ir", module)
    count = 0
    with module.context:
        for op in collect(module.operation, "math.exp"):
            value_type = op.results[0].type
            if not isinstance(value_type, ir.VectorType) or ir.VectorType(value_type).rank != 1:
                continue
            if not isinstance(ir.VectorType(value_type).element_type, ir.F32Type):
                continue
            picked = uniform_pick(op.operands[0])
            if picked is None:
                continue
            with ir.InsertionPoint(op), op.location:
                guarded = _guard(op, *picked)
            op.results[0].replace_all_uses_with(guarded)
            op.erase()
            count += 1
    return count


def uniform_pick(value: Any) -> tuple[Any, Any, bool] | None:
    """(condition, uniform vector, whether the uniform value is picked where the condition
    holds) when ``value`` is an ``arith.select`` with one uniform operand, else None."""
    select = defining_op(value)
    if select is None or select.name != "arith.select":
        return None
    condition, when_true, when_false = select.operands
    if not _is_vector(condition):
        return None
    if _uniform(when_true):
        return condition, when_true, True
    if _uniform(when_false):
        return condition, when_false, False
    return None


def _is_vector(value: Any) -> bool:
    from stagegraph.mlir.bindings import ir

    return isinstance(value.type, ir.VectorType)


def _uniform(value: Any) -> bool:
    """A ``vector.broadcast`` of a scalar or a splat ``arith.constant``."""
    from stagegraph.mlir.bindings import ir

    op = defining_op(value)
    if op is None:
        return False
    if op.name == "vector.broadcast":
        return not _is_vector(op.operands[0])
    if op.name == "arith.constant":
        attr = op.attributes["value"]
        return isinstance(attr, ir.DenseElementsAttr) and attr.is_splat
    return False


def _guard(op: Any, condition: Any, uniform: Any, picked_when_true: bool) -> Any:
    """``if (all|none)(condition) { broadcast(exp(uniform[0])) } else { exp(argument) }``."""
    from stagegraph.mlir.bindings import arith, dialect, ir, scf, vector

    math = dialect("math")
    kind = ir.Attribute.parse("#vector.kind<and>" if picked_when_true else "#vector.kind<or>")
    i1 = ir.IntegerType.get_signless(1)
    reduced = vector.reduction(i1, kind, condition)
    if not picked_when_true:  # none of the lanes picks x: not(or(c))
        reduced = arith.xori(reduced, arith.ConstantOp(i1, ir.IntegerAttr.get(i1, 1)).result)
    value_type = op.results[0].type
    branch = scf.IfOp(reduced, [value_type], has_else=True)
    with ir.InsertionPoint(branch.then_block):
        scalar = vector.extract(uniform, [], [0])
        scf.YieldOp([vector.broadcast(value_type, math.exp(scalar))])
    with ir.InsertionPoint(branch.else_block):
        scf.YieldOp([math.exp(op.operands[0])])
    return branch.results[0]
