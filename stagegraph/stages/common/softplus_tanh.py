"""``tanh(softplus(x))`` (Mish's gate, ``x * tanh(softplus(x))``) as one exponential and
one division.

PyTorch's softplus imports as ``select(x > threshold, x, log1p(exp(x)))`` (threshold 20);
Mish then takes its tanh. Vectorized, that is an exp, a ``log1p`` (a libmvec call per
vector: there is no inline approximation of it) and a tanh per element: the epilogue of a
Linear + Mish + Mish payload took as long as its matmul (l2_029, 256^3: 68% of the FMA
peak against 85-100% for the payloads with cheap epilogues; Xeon, 1 thread).

With ``e = exp(x)``, ``tanh(log(1 + e)) = ((1 + e)^2 - 1) / ((1 + e)^2 + 1) = n / (n + 2)``
where ``n = e (e + 2)``: exact algebra, rounding to a few ulps in f32. :func:`fold_softplus_tanh`
rewrites each f32 ``math.tanh`` (scalar or vector) of either form

- ``tanh(log1p(exp(x)))``, or
- ``tanh(select(x > c, x, log1p(exp(x))))`` with ``tanh(c)`` already 1 in f32 (the
  softplus threshold; beyond it both forms are 1),

to ``n / (n + 2)`` with ``e = exp(min(x, CLAMP))``: past :data:`CLAMP` the quotient is 1 in
f32 as tanh is, and the clamp keeps ``n`` finite (``e^2`` overflows from x = 44). Ops left
without uses (the log1p, its exp, the select and its comparison) are erased.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stagegraph.mlir.walk import collect

#: exp's argument is clamped here: tanh(softplus(x)) and n / (n + 2) are both 1 in f32 from
#: x = 9.1 on, and e^CLAMP squared stays far from overflow.
CLAMP = 20.0


def fold_softplus_tanh(module: Any) -> int:
    """Rewrite every f32 ``tanh(softplus(x))`` of ``module`` (see the module doc); returns
    how many."""
    from stagegraph.mlir.bindings import ir

    module = getattr(module, "ir", module)
    count = 0
    with module.context:
        for tanh in collect(module.operation, "math.tanh"):
            value_type = tanh.results[0].type
            vector = isinstance(value_type, ir.VectorType)
            element = value_type.element_type if vector else value_type
            x = _softplus_argument(tanh.operands[0]) if isinstance(element, ir.F32Type) else None
            if x is None:
                continue
            feeding = _owner(tanh.operands[0])
            with ir.InsertionPoint(tanh), tanh.location:
                gate = _gate(x, value_type, element)
            tanh.results[0].replace_all_uses_with(gate)
            tanh.erase()
            _erase_unused(feeding)
            count += 1
    return count


def _owner(value: Any) -> Any | None:
    """The op defining ``value`` (None for a block argument)."""
    from stagegraph.mlir.bindings import ir

    owner = value.owner
    return owner.operation if isinstance(owner, ir.Operation | ir.OpView) else None


def _softplus_argument(value: Any) -> Any | None:
    """``x`` when ``value`` is ``log1p(exp(x))`` or ``select(x > c, x, log1p(exp(x)))`` with
    ``tanh(c)`` rounding to 1 in f32; else None."""
    op = _owner(value)
    if op is None:
        return None
    if op.name == "math.log1p":
        exp = _owner(op.operands[0])
        return exp.operands[0] if exp is not None and exp.name == "math.exp" else None
    if op.name != "arith.select":
        return None
    condition, when_true, when_false = op.operands
    x = _softplus_argument(when_false)
    compare = _owner(condition)
    if x is None or when_true != x or compare is None or compare.name != "arith.cmpf":
        return None
    predicate = _predicate(compare)
    if predicate not in ("ogt", "oge", "ugt", "uge") or compare.operands[0] != x:
        return None
    threshold = _splat_value(compare.operands[1])
    if threshold is None or np.float32(np.tanh(threshold)) != np.float32(1.0):
        return None
    return x


def _predicate(compare: Any) -> str:
    from stagegraph.mlir.bindings import arith, ir

    value = ir.IntegerAttr(compare.attributes["predicate"]).value
    return arith.CmpFPredicate(value).name.lower()


def _splat_value(value: Any) -> float | None:
    """The float of a scalar or splat ``arith.constant`` (or a broadcast of a scalar one)."""
    from stagegraph.mlir.bindings import ir

    op = _owner(value)
    if op is None:
        return None
    if op.name == "vector.broadcast":
        return _splat_value(op.operands[0])
    if op.name != "arith.constant":
        return None
    attr = op.attributes["value"]
    if isinstance(attr, ir.FloatAttr):
        return attr.value
    if isinstance(attr, ir.DenseFPElementsAttr) and attr.is_splat:
        return ir.FloatAttr(attr.get_splat_value()).value
    return None


def _gate(x: Any, value_type: Any, element: Any) -> Any:
    """``n / (n + 2)``, ``n = e (e + 2)``, ``e = exp(min(x, CLAMP))``."""
    from stagegraph.mlir.bindings import arith, dialect, ir

    math = dialect("math")

    def const(number: float) -> Any:
        attr = ir.FloatAttr.get(element, number)
        if isinstance(value_type, ir.VectorType):
            attr = ir.DenseElementsAttr.get_splat(value_type, attr)
        return arith.ConstantOp(value_type, attr).result

    two = const(2.0)
    e = math.exp(arith.minimumf(x, const(CLAMP)))
    n = arith.mulf(e, arith.addf(e, two))
    return arith.divf(n, arith.addf(n, two))


def _erase_unused(op: Any | None) -> None:
    """Erase ``op`` if nothing uses it, then its operands' defining ops the same way (the
    softplus chain: select, comparison, log1p, exp). Only those kinds: pure ops."""
    erasable = {"arith.select", "arith.cmpf", "math.log1p", "math.exp"}
    if op is None or op.name not in erasable or any(list(r.uses) for r in op.results):
        return
    operands = [_owner(v) for v in op.operands]
    op.erase()
    for owner in operands:
        _erase_unused(owner)
