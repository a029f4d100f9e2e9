"""Verification: does a payload's output equal the reference up to rounding?

The criterion (what is compared, why this shape, the constants) is
:mod:`stagegraph.workload.criterion`, pure numpy; this module wraps it in a
:class:`Verdict` with the message users read, after checking count, shape and dtype.
"""

from __future__ import annotations

import typing
from collections.abc import Sequence

import numpy as np

from stagegraph.core.ports import Schema
from stagegraph.dtypes import decode
from stagegraph.workload.criterion import (
    ELEMENTWISE,
    NORMWISE,
    UNIT_ROUNDOFF,
    judge,
    nonfinite_mismatch,
    rms,
    tolerances,
)

if typing.TYPE_CHECKING:
    from stagegraph.workload.tensors import TensorSpec

__all__ = [
    "ELEMENTWISE",
    "NORMWISE",
    "UNIT_ROUNDOFF",
    "Verdict",
    "compare",
    "rms",
    "tolerances",
]


class Verdict(Schema):
    """Result of comparing outputs with the reference; errors are maxima over all outputs.

    ``max_rel_error`` is the elementwise error scaled by ``|ref_i| + S`` and ``tolerance`` the
    elementwise tolerance it is held to; ``ratio`` is the largest error/allowed ratio of
    either check over all outputs (at most 1 when ``ok``).
    """

    ok: bool
    max_abs_error: float
    max_rel_error: float
    tolerance: float = 0.0
    ratio: float = 0.0
    message: str


def compare(
    outputs: Sequence[np.ndarray],
    references: Sequence[np.ndarray],
    specs: Sequence[TensorSpec],
    *,
    reduction_length: int,
    magnitudes: Sequence[float],
    who: str,
) -> Verdict:
    """Check ``outputs`` against ``references`` by the criterion in the module docstring.

    ``magnitudes[i]`` is the floor ``m`` of output ``i``'s scale; ``who`` starts messages.
    The first failing output is reported, with the worst element's index and values.
    """
    if len(outputs) != len(references):
        return _fail(f"{who}: expected {len(references)} outputs, got {len(outputs)}")
    worst_abs = worst_rel = worst_tol = worst_ratio = 0.0
    for i, (out, ref, spec, floor) in enumerate(
        zip(outputs, references, specs, magnitudes, strict=True)
    ):
        out = np.asarray(out)
        if out.shape != tuple(spec.shape):
            return _fail(f"{who}: output {i} has shape {out.shape}, expected {tuple(spec.shape)}")
        if out.dtype != spec.numpy_dtype:
            return _fail(f"{who}: output {i} has dtype {out.dtype}, expected {spec.numpy_dtype}")
        got = decode(out, spec.dtype)
        want = decode(ref, spec.dtype) if ref.dtype == out.dtype else ref.astype(np.float64)
        bad = nonfinite_mismatch(got, want)
        if bad is not None:
            return _fail(f"{who}: output {i} at {bad}: got {got[bad]}, expected {want[bad]}")
        judged = judge(got, want, spec.dtype, reduction_length, floor)
        worst_abs = max(worst_abs, judged.abs_error)
        worst_rel = max(worst_rel, judged.rel_error)
        worst_tol = max(worst_tol, judged.elem_tolerance)
        worst_ratio = max(worst_ratio, judged.ratio)
        if judged.ratio > 1.0:
            at = judged.at
            return Verdict(
                ok=False,
                max_abs_error=judged.abs_error,
                max_rel_error=judged.rel_error,
                tolerance=judged.elem_tolerance,
                ratio=judged.ratio,
                message=f"{who}: output {i} differs: max scaled error {judged.rel_error:.3g} "
                f"(tolerance {judged.elem_tolerance:.3g}) at index {at} "
                f"(got {got[at]:.6g}, expected {want[at]:.6g}); rms error "
                f"{judged.norm_error:.3g} of scale {judged.scale:.3g} "
                f"(tolerance {judged.norm_tolerance:.3g})",
            )
    return Verdict(
        ok=True,
        max_abs_error=worst_abs,
        max_rel_error=worst_rel,
        tolerance=worst_tol,
        ratio=worst_ratio,
        message=f"{who}: ok (max abs error {worst_abs:.3g}, max scaled error {worst_rel:.3g}, "
        f"tolerance {worst_tol:.3g}, {worst_ratio:.2g} of the allowed error)",
    )


def _fail(message: str) -> Verdict:
    inf = float("inf")
    return Verdict(ok=False, max_abs_error=inf, max_rel_error=inf, ratio=inf, message=message)
