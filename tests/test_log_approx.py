"""math.log and math.log1p on f32 as Cephes' logf in arith
(stagegraph.stages.common.math_approx): no libm or libmvec call, accurate across f32 with
its limits (subnormals, 0, negatives, inf, NaN), and log1p keeps its relative accuracy near 0.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.test_math_approx import TANH

SPECIAL = [0.0, -0.0, 1.0, -1.0, 1e-30, 1e-38, 1e-45, 3e-39, 1e-7, -1e-7, 3.4e38, -0.5,
           0.70710677, 0.7071068, 1.4142135, 2.0, 0.5]  # fmt: skip


def test_log_and_log1p_are_rewritten_in_arith_for_f32_only():
    from stagegraph.mlir.bindings import ir, new_context
    from stagegraph.mlir.walk import collect
    from stagegraph.stages.common.math_approx import approximate_log

    with new_context(), ir.Location.unknown():
        module = ir.Module.parse(
            "func.func @f(%x: vector<14xf32>, %s: f32, %y: f64) -> (vector<14xf32>, f32, f64) {\n"
            "  %a = math.log1p %x : vector<14xf32>\n  %b = math.log %s : f32\n"
            "  %c = math.log %y : f64\n  return %a, %b, %c : vector<14xf32>, f32, f64\n}"
        )
        assert approximate_log(module) == 2  # f64 keeps libm's accuracy
        assert module.operation.verify()
        names = [op.name for op in collect(module.operation)]
        assert names.count("math.log") == 1 and "math.log1p" not in names
        assert names.count("arith.bitcast") == 4  # two logs: the bits out and the mantissa in


def _grid() -> np.ndarray:
    return np.concatenate([
        np.geomspace(1e-37, 1e37, 60 * 256, dtype=np.float32),
        np.linspace(-0.999, 10, 4 * 256 - len(SPECIAL) - 3, dtype=np.float32),
        np.array(SPECIAL, dtype=np.float32),
        np.array([-np.inf, np.inf, np.nan], dtype=np.float32),
    ]).reshape(64, 256)  # fmt: skip


@pytest.mark.parametrize(("op", "reference"), [("math.log", np.log), ("math.log1p", np.log1p)])
def test_log_matches_float64_across_f32_with_its_limits(op, reference):
    from stagegraph.core.catalog import load_graph
    from stagegraph.core.engine import Engine
    from stagegraph.mlir.walk import collect

    result = Engine().run(load_graph("x86"), TANH.replace("math.tanh", op))
    lowered = result.value("lower", "module").ir
    callees = {str(op.attributes["callee"]) for op in collect(lowered.operation, "llvm.call")}
    assert not [c for c in callees if "log" in c]  # neither libm's nor libmvec's
    grid = _grid()
    got = result.binary.call("main", [grid])[0].ravel().astype(np.float64)
    flat = grid.ravel().astype(np.float64)
    with np.errstate(all="ignore"):
        want = reference(flat)
    finite = np.isfinite(want) & (want != 0)
    assert np.max(np.abs(got[finite] - want[finite]) / np.abs(want[finite])) < 3e-7
    limits = ~finite
    assert np.array_equal(got[limits], want[limits], equal_nan=True)  # -inf, inf, NaN, 0
    if op == "math.log1p":  # log1p(x) = x where 1 + x rounds to 1, signed zero included
        exact = (np.abs(flat) < 1e-8) & np.isfinite(flat)
        assert np.array_equal(got[exact], flat[exact])
        assert np.array_equal(np.signbit(got[flat == 0.0]), np.signbit(flat[flat == 0.0]))
