"""math.tanh on f32 as a rational function: accurate across f32, and no libm/libmvec call."""

from __future__ import annotations

import numpy as np

TANH = """
func.func @main(%x: tensor<64x256xf32>) -> tensor<64x256xf32> {
  %e = tensor.empty() : tensor<64x256xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>],
                       iterator_types = ["parallel", "parallel"]}
      ins(%x : tensor<64x256xf32>) outs(%e : tensor<64x256xf32>) {
    ^bb0(%in: f32, %out: f32):
      %t = math.tanh %in : f32
      linalg.yield %t : f32
  } -> tensor<64x256xf32>
  return %r : tensor<64x256xf32>
}
"""


def test_tanh_is_rewritten_in_arith():
    from stagegraph.mlir.bindings import ir, new_context
    from stagegraph.mlir.walk import collect
    from stagegraph.stages.common.math_approx import approximate_tanh

    with new_context(), ir.Location.unknown():
        module = ir.Module.parse(
            "func.func @f(%x: vector<8xf32>, %y: f64) -> (vector<8xf32>, f64) {\n"
            "  %a = math.tanh %x : vector<8xf32>\n  %b = math.tanh %y : f64\n"
            "  return %a, %b : vector<8xf32>, f64\n}"
        )
        assert approximate_tanh(module) == 1  # f32 only: the f64 tanh keeps libm's accuracy
        assert module.operation.verify()
        names = [op.name for op in collect(module.operation)]
        assert names.count("math.tanh") == 1 and "arith.divf" in names
        assert names.count("arith.select") == 1


def test_tanh_matches_float64_across_f32():
    from stagegraph.core.catalog import load_graph
    from stagegraph.core.engine import Engine
    from stagegraph.mlir.walk import collect

    result = Engine().run(load_graph("x86"), TANH)
    lowered = result.value("lower", "module").ir
    callees = {str(op.attributes["callee"]) for op in collect(lowered.operation, "llvm.call")}
    assert not [c for c in callees if "tanh" in c]  # neither libm's tanhf nor libmvec's
    grid = np.concatenate([
        np.linspace(-12, 12, 64 * 256 - 8, dtype=np.float32),
        np.array([0.0, -0.0, 1e-4, -3e-4, 1e-30, 8.0, -7.99, 30.0], dtype=np.float32),
    ]).reshape(64, 256)  # fmt: skip
    got = result.binary.call("main", [grid])[0]
    want = np.tanh(grid.astype(np.float64))
    assert np.max(np.abs(got - want)) < 5e-7
    tiny = np.abs(grid) < 4e-4
    assert np.array_equal(got[tiny], grid[tiny])  # tanh(x) = x there, signed zero included
    assert np.all(np.abs(got) <= 1.0)


EXP = TANH.replace("math.tanh", "math.exp")


def test_exp_is_rewritten_in_arith_for_f32_only():
    from stagegraph.mlir.bindings import ir, new_context
    from stagegraph.mlir.walk import collect
    from stagegraph.stages.common.math_approx import approximate_exp

    with new_context(), ir.Location.unknown():
        module = ir.Module.parse(
            "func.func @f(%x: vector<8xf32>, %s: f32, %y: f64) -> (vector<8xf32>, f32, f64) {\n"
            "  %a = math.exp %x : vector<8xf32>\n  %b = math.exp %s : f32\n"
            "  %c = math.exp %y : f64\n  return %a, %b, %c : vector<8xf32>, f32, f64\n}"
        )
        assert approximate_exp(module) == 2  # f64 keeps libm's accuracy
        assert module.operation.verify()
        names = [op.name for op in collect(module.operation)]
        assert names.count("math.exp") == 1 and names.count("arith.bitcast") == 2


def test_exp_matches_float64_across_f32_with_its_limits():
    from stagegraph.core.catalog import load_graph
    from stagegraph.core.engine import Engine
    from stagegraph.mlir.walk import collect

    result = Engine().run(load_graph("x86"), EXP)
    lowered = result.value("lower", "module").ir
    callees = {str(op.attributes["callee"]) for op in collect(lowered.operation, "llvm.call")}
    assert not [c for c in callees if "exp" in c]  # neither libm's expf nor libmvec's
    special = [0.0, -0.0, 1.0, -1.0, 88.0, 88.7, -87.0, -100.0, -104.0, -200.0, 89.0, 1e-8]
    grid = np.concatenate([
        np.linspace(-110, 89, 64 * 256 - len(special) - 3, dtype=np.float32),
        np.array(special, dtype=np.float32),
        np.array([-np.inf, np.inf, np.nan], dtype=np.float32),
    ]).reshape(64, 256)  # fmt: skip
    got = result.binary.call("main", [grid])[0].ravel()
    flat = grid.ravel()
    with np.errstate(over="ignore"):
        want = np.exp(flat.astype(np.float64))
    tiny = 3 * np.finfo(np.float32).tiny  # results below flush to 0
    normal = (want >= tiny) & (want <= np.finfo(np.float32).max)
    assert np.max(np.abs(got[normal] - want[normal]) / want[normal]) < 2e-7
    assert np.max(np.abs(got[want < tiny] - want[want < tiny])) < tiny
    assert got[flat == -np.inf][0] == 0.0 and got[flat == np.inf][0] == np.inf
    assert np.all(np.isinf(got[(want > np.finfo(np.float32).max) & np.isfinite(flat)]))
    assert np.isnan(got[np.isnan(flat)][0])
