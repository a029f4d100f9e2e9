"""math.erf on f32 as a rational function (stagegraph.stages.common.math_approx): rewritten
in arith for f32 only, accurate across f32 against float64, no libm/libmvec call left."""

from __future__ import annotations

import math

import numpy as np

from tests.test_math_approx import TANH

ERF = TANH.replace("math.tanh", "math.erf")


def test_erf_is_rewritten_in_arith_for_f32_only():
    from stagegraph.mlir.bindings import ir, new_context
    from stagegraph.mlir.walk import collect
    from stagegraph.stages.common.math_approx import approximate_erf

    with new_context(), ir.Location.unknown():
        module = ir.Module.parse(
            "func.func @f(%x: vector<8xf32>, %s: f32, %y: f64) -> (vector<8xf32>, f32, f64) {\n"
            "  %a = math.erf %x : vector<8xf32>\n  %b = math.erf %s : f32\n"
            "  %c = math.erf %y : f64\n  return %a, %b, %c : vector<8xf32>, f32, f64\n}"
        )
        assert approximate_erf(module) == 2  # f64 keeps libm's accuracy
        assert module.operation.verify()
        names = [op.name for op in collect(module.operation)]
        assert names.count("math.erf") == 1 and names.count("arith.divf") == 2


def test_erf_matches_float64_across_f32():
    from stagegraph.core.catalog import load_graph
    from stagegraph.core.engine import Engine
    from stagegraph.mlir.walk import collect

    result = Engine().run(load_graph("x86"), ERF)
    lowered = result.value("lower", "module").ir
    callees = {str(op.attributes["callee"]) for op in collect(lowered.operation, "llvm.call")}
    assert not [c for c in callees if "erf" in c]  # neither libm's erff nor libmvec's
    special = [0.0, -0.0, 1e-30, -1e-20, 1e-6, 3.9, 4.0, 4.5, -6.0, 50.0]
    grid = np.concatenate([
        np.linspace(-6, 6, 64 * 256 - len(special) - 2, dtype=np.float32),
        np.array(special, dtype=np.float32),
        np.array([-np.inf, np.inf], dtype=np.float32),
    ]).reshape(64, 256)  # fmt: skip
    got = result.binary.call("main", [grid])[0].ravel()
    flat = grid.ravel()
    want = np.array([math.erf(float(v)) for v in flat])
    assert np.max(np.abs(got - want)) < 5e-7
    small = (np.abs(flat) < 1) & (flat != 0)
    assert np.max(np.abs(got[small] - want[small]) / np.abs(want[small])) < 3e-7
    assert got[flat == np.inf][0] == 1.0 and got[flat == -np.inf][0] == -1.0
    assert np.all(np.abs(got) <= 1.0)
