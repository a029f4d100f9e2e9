"""The verification criterion: does an output equal its reference up to rounding?

Pure numpy (and :mod:`stagegraph.dtypes`), no pydantic: :mod:`stagegraph.workload.verify`
wraps it in a :class:`~stagegraph.workload.verify.Verdict` for every workload, and
``benchmarks/gpu_check.py`` applies the same rule on a GPU machine that lacks pydantic.

What is compared
    Each output of the compiled payload with the same output of the reference (PyTorch's
    result in a KernelBench ``.npz``, numpy in float64 for Python workloads), after checking
    count, shape and storage dtype. Integer and boolean outputs must match exactly. For float
    outputs NaN must sit where the reference has NaN and infinities must match exactly; the
    finite elements pass two checks (``d = got - ref`` in float64, N elements):

    ``S = max(rms(ref), m)``
        the scale of the output: its own root-mean-square, or ``m``, the magnitude of the
        values that produced it (:meth:`stagegraph.workload.Workload.magnitudes`: the largest
        RMS of the float inputs by default; for a matmul ``sqrt(k) * rms(A) * rms(B)``),
        whichever is larger.
    normwise
        ``rms(d) <= NORMWISE * u * sqrt(n) * S``
    elementwise
        ``|d_i| <= ELEMENTWISE * u * sqrt(n) * (|ref_i| + S)``

    ``u`` is the unit roundoff of the output's element type (:data:`UNIT_ROUNDOFF`) and ``n``
    the workload's reduction length (the longest chain of accumulated terms, at least 1).

Why this shape
    * ``sqrt(n)``, not the worst-case ``n``: rounding errors of a sum of ``n`` terms behave
      like a random walk, so the error grows like ``sqrt(n) * u`` with overwhelming
      probability (Higham & Mary, "A new approach to probabilistic rounding error analysis",
      SISC 2019). The worst-case bound ``n * u`` would, for long reductions, accept the
      ``1/sqrt(n)`` relative change caused by dropping one of the ``n`` terms.
    * The floor ``m``: an output can be tiny because terms of ordinary size cancelled (the
      mean of GroupNorm output is ~1e-8; a BatchNorm running mean can be ~1e-10). Its
      absolute rounding error is set by the size of the cancelled terms, not by the result,
      so judging it relative to itself fails correct code. ``m`` is measured on data the
      workload has (inputs, shapes), never on the output under test. A result that is a sum
      of ``n`` terms gets ``sqrt(n)`` times the terms' size, the size of its partial sums:
      summing a GroupNorm group adds the error of the group mean ``n`` times, so its
      error grows like ``u * n^1.5`` while the result cancels to ~0 (a KernelBench
      GroupNorm-then-sum failed at 1.2x the tolerance with the inputs' size as floor;
      ``tests/test_verify_sums.py`` reproduces it and shows a dropped term still fails
      by >300x). Only sum results get it (:mod:`stagegraph.workload.sum_outputs`): a
      blanket ``sqrt(n)`` floor cost the floor-dominated l2_093 mutations 16x of margin.
    * The elementwise check adds ``S`` to ``|ref_i|`` for the same reason (an element near
      zero among larger neighbours is judged against the neighbours), and catches a wrong
      result confined to a few elements (a pooling window off by one at the border) that the
      normwise check would average away. Its constant is 4x the normwise one because the
      largest of millions of rounding errors lies several standard deviations out.

Constants and why
    ``NORMWISE = 32`` and ``ELEMENTWISE = 128``. Of 155 KernelBench payloads (the 95 of
    level 1 that compile, the 50 of level 2, 10 of level 3, not the minutes-long recurrent
    ones; x86 graph, plus naive for four of level 2), the worst reaches 12 (normwise) and 22
    (elementwise) of these units: ``l2_075``, GroupNorm over groups of one channel, where
    ``x * rstd - mean * rstd`` cancels terms ~300x larger than the result. All others stay
    below 3 and 12. PyTorch's kernels sum in another order and both sides' errors count, so
    the constants leave 2.5x headroom over the worst correct payload. A miscompile changes
    the result by far more: dropping one of ``n`` summed terms changes it by ~``1/sqrt(n)``
    relative, which exceeds ``32 * u * sqrt(n)`` for ``n < 1/(32 u)`` (500,000 terms in
    f32); a dropped bias, a transposed operand or a shifted window changes it by O(1)
    relative (``tests/test_verify.py`` fails each by 100x to 100,000x, including edited
    KernelBench payloads whose output is near zero).

    The precision of bf16 outputs is too low for that argument: with ``u = 2^-8`` the
    normwise tolerance for ``n = 64`` is 1.0, so only gross errors fail. bf16 *inputs* with
    f32 outputs (a bf16 matmul accumulating in f32) are judged at f32 precision.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from stagegraph.dtypes import UNIT_ROUNDOFF, is_float

NORMWISE = 32.0
"""Factor of ``u * sqrt(n)`` allowed for ``rms(got - ref) / S``."""

ELEMENTWISE = 128.0
"""Factor of ``u * sqrt(n)`` allowed for ``|got_i - ref_i| / (|ref_i| + S)``."""


def tolerances(dtype: str, reduction_length: int) -> tuple[float, float]:
    """(normwise, elementwise) tolerances for an output of ``dtype``; (0, 0) for integers."""
    if not is_float(dtype):
        return 0.0, 0.0
    growth = UNIT_ROUNDOFF[dtype] * math.sqrt(max(1, reduction_length))
    return NORMWISE * growth, ELEMENTWISE * growth


def rms(values: np.ndarray) -> float:
    """Root-mean-square of the finite values (0 for none): a scale that outliers barely move."""
    values = np.asarray(values, dtype=np.float64)
    finite = values[np.isfinite(values)]
    return float(np.sqrt(np.mean(np.square(finite)))) if finite.size else 0.0


def nonfinite_mismatch(got: np.ndarray, want: np.ndarray) -> tuple[int, ...] | None:
    """First index where NaN/inf placement differs between output and reference."""
    mismatch = (
        (np.isnan(got) != np.isnan(want))
        | (np.isinf(want) & (got != want))
        | (np.isinf(got) & ~np.isinf(want))
    )
    if not mismatch.any():
        return None
    return tuple(int(x) for x in np.argwhere(mismatch)[0])


@dataclass(frozen=True)
class OutputError:
    """One output judged: its errors, tolerances and ``ratio`` (the larger error/allowed
    ratio of the two checks; at most 1 passes), and ``at``, the worst element."""

    abs_error: float
    rel_error: float
    norm_error: float
    scale: float
    elem_tolerance: float
    norm_tolerance: float
    ratio: float
    at: tuple[int, ...]


def judge(got: np.ndarray, want: np.ndarray, dtype: str, reduction_length: int,
          floor: float) -> OutputError:  # fmt: skip
    """The two checks of the module docstring on one output (``got`` and ``want`` as float64
    or integer arrays of the same shape, NaN/inf placement already matched; ``floor``: the
    magnitude ``m``)."""
    norm_tol, elem_tol = tolerances(dtype, reduction_length)
    finite = np.isfinite(want)
    with np.errstate(invalid="ignore"):  # inf - inf where both are inf: masked here
        diff = np.where(finite, np.abs(got - want), 0.0)
    scale = max(rms(want), float(floor))
    # tiny keeps 0/0 at 0 when the reference and the floor are both exactly zero
    scaled = diff / (np.where(finite, np.abs(want), 0.0) + scale + np.finfo(np.float64).tiny)
    rel_err = float(scaled.max(initial=0.0))
    norm_err = rms(diff) / (scale + np.finfo(np.float64).tiny)
    at = np.unravel_index(int(np.argmax(scaled)), scaled.shape) if scaled.size else ()
    return OutputError(
        abs_error=float(diff.max(initial=0.0)), rel_error=rel_err, norm_error=norm_err,
        scale=scale, elem_tolerance=elem_tol, norm_tolerance=norm_tol,
        ratio=max(_ratio(rel_err, elem_tol), _ratio(norm_err, norm_tol)),
        at=tuple(int(x) for x in at),
    )  # fmt: skip


def _ratio(error: float, tolerance: float) -> float:
    """error / tolerance, where a zero tolerance (integers) allows only a zero error."""
    if tolerance > 0.0:
        return error / tolerance
    return 0.0 if error == 0.0 else math.inf
