"""Fast approximations of ``math`` ops, written out in ``arith`` before lowering to LLVM.

``math.tanh`` on f32 becomes a clamped odd rational function (degree 13 over degree 6,
Eigen's coefficients, the ones MLIR's polynomial-approximation patterns use; those patterns
are not exposed as a pass in the bindings). It is a dozen multiply-adds and one division
per vector, where glibc's libmvec ``tanhf`` takes several times that, and tanh sits in GELU,
LSTM and GRU cells. Its absolute error is below 4e-7 on all of f32 (checked against float64
in the tests), far inside the verification criterion's ``128 u (|ref| + S)``.
"""

from __future__ import annotations

from typing import Any

#: The clamp: beyond it tanh is 1 to f32 precision.
_CLAMP = 7.99881172180175781
#: Below it tanh(x) = x to f32 precision (and the rational function would lose digits).
_TINY = 0.0004
#: Odd numerator coefficients alpha_1 .. alpha_13.
_ALPHA = (
    4.89352455891786e-03,
    6.37261928875436e-04,
    1.48572235717979e-05,
    5.12229709037114e-08,
    -8.60467152213735e-11,
    2.00018790482477e-13,
    -2.76076847742355e-16,
)
#: Even denominator coefficients beta_0 .. beta_6.
_BETA = (4.89352518554385e-03, 2.26843463243900e-03, 1.18534705686654e-04, 1.19825839466702e-06)


def approximate_tanh(module: Any) -> int:
    """Replace every f32 ``math.tanh`` (scalar or vector) in ``module`` by the rational
    approximation; returns how many were replaced."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import collect

    module = getattr(module, "ir", module)
    count = 0
    with module.context:
        for op in collect(module.operation, "math.tanh"):
            value_type = op.results[0].type
            element = (
                value_type.element_type if isinstance(value_type, ir.VectorType) else value_type
            )
            if not isinstance(element, ir.F32Type):
                continue
            with ir.InsertionPoint(op), op.location:
                approximation = _tanh(op.operands[0], value_type, element)
            op.results[0].replace_all_uses_with(approximation)
            op.erase()
            count += 1
    return count


def _tanh(x: Any, value_type: Any, element: Any) -> Any:
    """tanh(x) = x * P(x^2) / Q(x^2) on x clamped to +-_CLAMP; x itself where |x| < _TINY."""
    from stagegraph.mlir.bindings import arith, dialect, ir

    math = dialect("math")
    contract = ir.Attribute.parse("#arith.fastmath<contract>")  # let LLVM fuse into FMAs

    def const(value: float) -> Any:
        attr = ir.FloatAttr.get(element, value)
        if isinstance(value_type, ir.VectorType):
            attr = ir.DenseElementsAttr.get_splat(value_type, attr)
        return arith.ConstantOp(value_type, attr).result

    def horner(square: Any, coefficients: tuple[float, ...]) -> Any:
        acc = const(coefficients[-1])
        for c in reversed(coefficients[:-1]):
            acc = arith.addf(arith.mulf(square, acc, fastmath=contract), const(c),
                             fastmath=contract)  # fmt: skip
        return acc

    clamped = arith.minimumf(arith.maximumf(x, const(-_CLAMP)), const(_CLAMP))
    square = arith.mulf(clamped, clamped, fastmath=contract)
    numerator = arith.mulf(clamped, horner(square, _ALPHA), fastmath=contract)
    ratio = arith.divf(numerator, horner(square, _BETA))
    tiny = arith.cmpf(arith.CmpFPredicate.OLT, math.absf(x), const(_TINY))
    return arith.select(tiny, x, ratio)
