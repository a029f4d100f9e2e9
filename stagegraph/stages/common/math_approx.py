"""Fast approximations of ``math`` ops, written out in ``arith`` before lowering to LLVM.

``math.tanh`` on f32 becomes a clamped odd rational function (degree 13 over degree 6,
Eigen's coefficients, the ones MLIR's polynomial-approximation patterns use; those patterns
are not exposed as a pass in the bindings). It is a dozen multiply-adds and one division
per vector, where glibc's libmvec ``tanhf`` takes several times that, and tanh sits in GELU,
LSTM and GRU cells. Its absolute error is below 4e-7 on all of f32 (checked against float64
in the tests), far inside the verification criterion's ``128 u (|ref| + S)``.

``math.exp`` on f32 becomes Cephes' ``expf``: x = n ln 2 + r with |r| <= ln 2 / 2, a
degree-7 polynomial for e^r, and 2^n built in the exponent bits (results that would be
below about 3e-38, flush to 0). glibc's libmvec ``expf`` is a call per vector and takes a
scalar slow path per lane for inputs out of its range, among them the -inf of every masked
attention score (a third of a causal attention's run time was in it). Relative error below
2e-7 wherever the result is above 3e-38, checked against float64 in the tests.

``math.erf`` on f32 becomes an odd rational function (degree 13 over degree 8 in x, Eigen's
``generic_fast_erf_float`` coefficients) on x clamped to +-4, beyond which erf is +-1 in
f32: a dozen multiply-adds and one division per vector, where libmvec's ``erff`` is a call
per vector several times that (exact GELU, ``0.5 x (1 + erf(x / sqrt 2))``, ran at 0.7-0.8x
PyTorch's speed with it). Absolute error below 5e-7 on all of f32, relative below 3e-7 for
|x| < 1, checked against float64 in the tests.

``math.log`` and ``math.log1p`` on f32 become Cephes' ``logf`` (the mantissa's log as a
degree-9 polynomial, the exponent times ln 2 in two parts), log1p through Kahan's
``log(u) x / (u - 1)``. Measured against libmvec's calls (interleaved, thread CPU time:
Mish, softplus, log-softmax, logsumexp payloads) it runs at the same speed; it is used so
that compiled code and the artifacts C programs link need no libmvec for them, and it
covers scalar code too. Relative error below 3e-7 on f32's positive range, checked against
float64 in the tests.
"""

from __future__ import annotations

from collections.abc import Callable
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
    return _replace_f32(module, "math.tanh", _tanh)


def _replace_f32(module: Any, name: str, build: Any) -> int:
    """Replace every f32 op ``name`` (scalar or vector) of ``module`` by ``build(operand,
    value type, element type)``; returns how many were replaced (other types keep libm's
    accuracy)."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import collect

    module = getattr(module, "ir", module)
    count = 0
    with module.context:
        for op in collect(module.operation, name):
            value_type = op.results[0].type
            element = (
                value_type.element_type if isinstance(value_type, ir.VectorType) else value_type
            )
            if not isinstance(element, ir.F32Type):
                continue
            with ir.InsertionPoint(op), op.location:
                approximation = build(op.operands[0], value_type, element)
            op.results[0].replace_all_uses_with(approximation)
            op.erase()
            count += 1
    return count


def _odd_rational(
    x: Any, value_type: Any, element: Any, clamp: float, alpha: tuple, beta: tuple
) -> tuple[Any, Callable[[float], Any]]:
    """``x P(x^2) / Q(x^2)`` on ``x`` clamped to ``+-clamp`` (the form of both the tanh and
    the erf approximation), with FMA-contractible Horner steps; returns it and the builder
    of constants of ``value_type``, for the caller's last step."""
    from stagegraph.mlir.bindings import arith

    steps = _Steps(value_type, element)
    const, contract = steps.const, steps.contract

    def horner(square: Any, coefficients: tuple[float, ...]) -> Any:
        acc = const(coefficients[-1])
        for c in reversed(coefficients[:-1]):
            acc = arith.addf(arith.mulf(square, acc, fastmath=contract), const(c),
                             fastmath=contract)  # fmt: skip
        return acc

    clamped = arith.minimumf(arith.maximumf(x, const(-clamp)), const(clamp))
    square = arith.mulf(clamped, clamped, fastmath=contract)
    numerator = arith.mulf(clamped, horner(square, alpha), fastmath=contract)
    return arith.divf(numerator, horner(square, beta)), const


def _tanh(x: Any, value_type: Any, element: Any) -> Any:
    """tanh(x) = x * P(x^2) / Q(x^2) on x clamped to +-_CLAMP; x itself where |x| < _TINY."""
    from stagegraph.mlir.bindings import arith, dialect

    math = dialect("math")
    ratio, const = _odd_rational(x, value_type, element, _CLAMP, _ALPHA, _BETA)
    tiny = arith.cmpf(arith.CmpFPredicate.OLT, math.absf(x), const(_TINY))
    return arith.select(tiny, x, ratio)


class _Steps:
    """Constants of one value type (scalar or vector f32, and its i32 twin) and FMA-
    contractible steps: what the exp and log approximations are written in."""

    def __init__(self, value_type: Any, element: Any) -> None:
        from stagegraph.mlir.bindings import ir

        self.value_type, self.element = value_type, element
        self.contract = ir.Attribute.parse("#arith.fastmath<contract>")  # LLVM fuses FMAs
        self.i32 = ir.IntegerType.get_signless(32)
        self.vector = isinstance(value_type, ir.VectorType)
        self.int_type = ir.VectorType.get(value_type.shape, self.i32) if self.vector else self.i32

    def _splat(self, attr: Any, of_type: Any) -> Any:
        from stagegraph.mlir.bindings import arith, ir

        if self.vector:
            attr = ir.DenseElementsAttr.get_splat(of_type, attr)
        return arith.ConstantOp(of_type, attr).result

    def const(self, value: float) -> Any:
        from stagegraph.mlir.bindings import ir

        return self._splat(ir.FloatAttr.get(self.element, value), self.value_type)

    def iconst(self, value: int) -> Any:
        from stagegraph.mlir.bindings import ir

        return self._splat(ir.IntegerAttr.get(self.i32, value), self.int_type)

    def fma(self, a: Any, b: Any, c: Any) -> Any:
        from stagegraph.mlir.bindings import arith

        return arith.addf(arith.mulf(a, b, fastmath=self.contract), c, fastmath=self.contract)


#: Clamp of exp's argument: at the low end n = -126, whose 2^(n-1) has no exponent bits (0);
#: at the high end n = 128 and e^x is inf.
_EXP_LOW, _EXP_HIGH = -87.5, 88.8
_LOG2E = 1.44269504088896341
#: ln 2 in two parts (Cephes): n * _LN2_HIGH is exact for the n that occur.
_LN2_HIGH, _LN2_LOW = 0.693359375, -2.12194440e-4
#: e^r = 1 + r + r^2 (p5 + r (p4 + ... r p0)) on |r| <= ln 2 / 2 (Cephes expf).
_EXP_P = (5.0000001201e-1, 1.6666665459e-1, 4.1665795894e-2, 8.3334519073e-3,
          1.3981999507e-3, 1.9875691500e-4)  # fmt: skip


def approximate_exp(module: Any) -> int:
    """Replace every f32 ``math.exp`` (scalar or vector) in ``module`` by Cephes' ``expf``
    written in ``arith``; returns how many were replaced."""
    return _replace_f32(module, "math.exp", _exp)


def _exp(x: Any, value_type: Any, element: Any) -> Any:
    """e^x = e^r * 2^n1 * 2^n2 with n = round(x log2 e) = n1 + n2, r = x - n ln 2."""
    from stagegraph.mlir.bindings import arith, dialect

    math = dialect("math")
    steps = _Steps(value_type, element)
    const, fma = steps.const, steps.fma

    def power_of_two(n: Any) -> Any:  # 2^n from the exponent bits (-127: 0, 128: inf)
        bits = arith.shli(arith.addi(n, steps.iconst(127)), steps.iconst(23))
        return arith.bitcast(value_type, bits)

    clamped = arith.minimumf(arith.maximumf(x, const(_EXP_LOW)), const(_EXP_HIGH))
    n_float = math.floor(fma(clamped, const(_LOG2E), const(0.5)))
    r = fma(n_float, const(-_LN2_HIGH), clamped)
    r = fma(n_float, const(-_LN2_LOW), r)
    poly = const(_EXP_P[-1])
    for c in reversed(_EXP_P[:-1]):
        poly = fma(poly, r, const(c))
    square = arith.mulf(r, r, fastmath=steps.contract)
    e_r = fma(poly, square, arith.addf(r, const(1.0)))
    # 2^(n-1) * 2: n = 128 (x up to ln FLT_MAX) stays finite where it should; below about
    # x = -87 (e^x < 2.4e-38, n = -126) the exponent bits clear: 0, flushed as most fast
    # exps do.
    n_less_one = arith.subi(arith.fptosi(steps.int_type, n_float), steps.iconst(1))
    return arith.mulf(arith.mulf(e_r, power_of_two(n_less_one)), const(2.0))


#: Beyond +-_ERF_CLAMP erf is +-1 in f32.
_ERF_CLAMP = 4.0
#: Odd numerator coefficients alpha_1 .. alpha_13 (Eigen's generic_fast_erf_float).
_ERF_ALPHA = (-1.60960333262415e-02, -2.95459980854025e-03, -7.34990630326855e-04,
              -5.69250639462346e-05, -2.10102402082508e-06, 2.77068142495902e-08,
              -2.72614225801306e-10)  # fmt: skip
#: Even denominator coefficients beta_0 .. beta_8.
_ERF_BETA = (-1.42647390514189e-02, -7.37332916720468e-03, -1.68282697438203e-03,
             -2.13374055278905e-04, -1.45660718464996e-05)  # fmt: skip


def approximate_erf(module: Any) -> int:
    """Replace every f32 ``math.erf`` (scalar or vector) in ``module`` by the rational
    approximation; returns how many were replaced."""
    return _replace_f32(module, "math.erf", _erf)


def _erf(x: Any, value_type: Any, element: Any) -> Any:
    """erf(x) = x P(x^2) / Q(x^2) on x clamped to +-_ERF_CLAMP, the result to [-1, 1]."""
    from stagegraph.mlir.bindings import arith

    ratio, const = _odd_rational(x, value_type, element, _ERF_CLAMP, _ERF_ALPHA, _ERF_BETA)
    # Near the clamp the ratio rounds one ulp past 1: keep |erf| <= 1 (1 - erf(x) >= 0).
    return arith.minimumf(arith.maximumf(ratio, const(-1.0)), const(1.0))


_INF, _NAN = float("inf"), float("nan")
#: Below it an f32 is subnormal: scaled by 2^23 before its exponent bits are read.
_FLT_MIN = 1.17549435e-38
_SQRT_HALF = 0.707106781186547524
#: log(1 + f) = f - f^2 / 2 + f^3 P(f) on sqrt(1/2) - 1 <= f < sqrt(2) - 1 (Cephes logf),
#: P's coefficients from the highest power down.
_LOG_P = (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1,
          1.4249322787e-1, -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1,
          3.3333331174e-1)  # fmt: skip


def approximate_log(module: Any) -> int:
    """Replace every f32 ``math.log`` and ``math.log1p`` (scalar or vector) in ``module`` by
    Cephes' ``logf`` written in ``arith``; returns how many were replaced."""
    return _replace_f32(module, "math.log", _log) + _replace_f32(module, "math.log1p", _log1p)


def _log(x: Any, value_type: Any, element: Any) -> Any:
    """log(x) = e ln 2 + log(m), x = m 2^e with m in [sqrt(1/2), sqrt(2)); NaN below 0,
    -inf at 0, inf at inf; subnormal inputs are scaled into the normal range first."""
    from stagegraph.mlir.bindings import arith

    steps = _Steps(value_type, element)
    const, iconst, fma = steps.const, steps.iconst, steps.fma

    def compare(predicate: Any, a: Any, b: Any) -> Any:
        return arith.cmpf(predicate, a, b)

    less = arith.CmpFPredicate.OLT
    subnormal = compare(less, x, const(_FLT_MIN))
    bits = arith.bitcast(
        steps.int_type, arith.select(subnormal, arith.mulf(x, const(8388608.0)), x)
    )
    biased = arith.andi(arith.shrui(bits, iconst(23)), iconst(255))
    exponent = arith.sitofp(value_type, arith.subi(biased, iconst(126)))
    mantissa = arith.bitcast(
        value_type, arith.ori(arith.andi(bits, iconst(0x007FFFFF)), iconst(0x3F000000))
    )  # in [0.5, 1)
    low = compare(less, mantissa, const(_SQRT_HALF))
    exponent = arith.subf(exponent, arith.select(low, const(1.0), const(0.0)))
    exponent = arith.subf(exponent, arith.select(subnormal, const(23.0), const(0.0)))
    f = arith.subf(arith.select(low, arith.addf(mantissa, mantissa), mantissa), const(1.0))
    square = arith.mulf(f, f, fastmath=steps.contract)
    poly = const(_LOG_P[0])
    for c in _LOG_P[1:]:
        poly = fma(poly, f, const(c))
    y = arith.mulf(arith.mulf(poly, f, fastmath=steps.contract), square, fastmath=steps.contract)
    y = fma(exponent, const(_LN2_LOW), y)
    y = fma(square, const(-0.5), y)
    result = fma(exponent, const(_LN2_HIGH), arith.addf(f, y))
    negative_or_nan = compare(arith.CmpFPredicate.ULT, x, const(0.0))
    result = arith.select(negative_or_nan, const(_NAN), result)
    result = arith.select(compare(arith.CmpFPredicate.OEQ, x, const(0.0)), const(-_INF), result)
    return arith.select(compare(arith.CmpFPredicate.OEQ, x, const(_INF)), x, result)


def _log1p(x: Any, value_type: Any, element: Any) -> Any:
    """log1p(x) = log(u) x / (u - 1), u = 1 + x (exact where u rounds to 1: x itself), which
    keeps log1p's relative accuracy for small x that log(1 + x) alone would lose."""
    from stagegraph.mlir.bindings import arith

    const = _Steps(value_type, element).const
    u = arith.addf(x, const(1.0))
    d = arith.subf(u, const(1.0))
    scaled = arith.mulf(_log(u, value_type, element), arith.divf(x, d))
    exact = arith.cmpf(arith.CmpFPredicate.OEQ, d, const(0.0))
    infinite = arith.cmpf(arith.CmpFPredicate.OEQ, u, const(_INF))
    return arith.select(infinite, u, arith.select(exact, x, scaled))
