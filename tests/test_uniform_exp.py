"""A vector exp of a select with a uniform operand (ELU/SELU's exp(min(x, 0))) is computed
once per vector when every lane picks that operand (stagegraph.stages.common.uniform_exp):
the IR guards it with a mask reduction, and the values match numpy whether the vectors are
all positive, mixed or all negative."""

from __future__ import annotations

import numpy as np
import pytest

GUARDED = """
func.func @f(%x: vector<16xf32>, %z: f32) -> vector<16xf32> {
  %b = vector.broadcast %z : f32 to vector<16xf32>
  %c = arith.cmpf olt, %b, %x : vector<16xf32>
  %s = arith.select %c, PICKS : vector<16xi1>, vector<16xf32>
  %e = math.exp %s : vector<16xf32>
  return %e : vector<16xf32>
}
"""


@pytest.mark.parametrize("picks, kind", [("%b, %x", "and"), ("%x, %b", "or")])
def test_exp_of_a_uniform_pick_is_guarded(picks, kind):
    from stagegraph.mlir.bindings import ir, new_context
    from stagegraph.mlir.walk import collect
    from stagegraph.stages.common.uniform_exp import compute_uniform_exps_once

    with new_context(), ir.Location.unknown():
        module = ir.Module.parse(GUARDED.replace("PICKS", picks))
        assert compute_uniform_exps_once(module) == 1
        assert module.operation.verify()
        (reduction,) = collect(module.operation, "vector.reduction")
        assert str(reduction.attributes["kind"]) == f"#vector.kind<{kind}>"
        assert len(collect(module.operation, "arith.xori")) == (kind == "or")
        exps = collect(module.operation, "math.exp")
        # one scalar exp in the branch taken when every lane picks the broadcast, one vector
        assert sorted(isinstance(e.results[0].type, ir.VectorType) for e in exps) == [False, True]
        assert len(collect(module.operation, "scf.if")) == 1


def test_other_exps_are_left_alone():
    from stagegraph.mlir.bindings import ir, new_context
    from stagegraph.stages.common.uniform_exp import compute_uniform_exps_once

    with new_context(), ir.Location.unknown():
        module = ir.Module.parse(
            "func.func @f(%x: vector<16xf32>, %y: vector<16xf32>, %c: vector<16xi1>)"
            " -> (vector<16xf32>, vector<16xf32>) {\n"
            "  %a = math.exp %x : vector<16xf32>\n"
            "  %s = arith.select %c, %x, %y : vector<16xi1>, vector<16xf32>\n"
            "  %b = math.exp %s : vector<16xf32>\n"
            "  return %a, %b : vector<16xf32>, vector<16xf32>\n}"
        )
        assert compute_uniform_exps_once(module) == 0  # no uniform operand anywhere


ELU = """
func.func @main(%x: tensor<64x256xf32>) -> tensor<64x256xf32> {
  %e = tensor.empty() : tensor<64x256xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>],
                       iterator_types = ["parallel", "parallel"]}
      ins(%x : tensor<64x256xf32>) outs(%e : tensor<64x256xf32>) {
    ^bb0(%in: f32, %out: f32):
      %zero = arith.constant 0.0 : f32
      %one = arith.constant 1.0 : f32
      %c = arith.cmpf olt, %zero, %in : f32
      %n = arith.select %c, %zero, %in : f32
      %x1 = math.exp %n : f32
      %m = arith.subf %x1, %one : f32
      %p = arith.maximumf %in, %zero : f32
      %y = arith.addf %p, %m : f32
      linalg.yield %y : f32
  } -> tensor<64x256xf32>
  return %r : tensor<64x256xf32>
}
"""


def test_elu_values_for_positive_mixed_and_negative_vectors():
    from stagegraph.core.catalog import load_graph
    from stagegraph.core.engine import Engine
    from stagegraph.mlir.walk import collect

    result = Engine().run(load_graph("x86"), ELU)
    lowered = result.value("lower", "module").ir
    # the guard's mask reduction survived to LLVM: the vector exp is guarded
    assert collect(lowered.operation, "llvm.intr.vector.reduce.and")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 256)).astype(np.float32)  # mixed vectors
    x[:20] = np.abs(x[:20]) + 1e-3  # whole rows positive: the scalar exp(0) branch
    x[20:30] = -np.abs(x[20:30])  # whole rows negative
    got = result.binary.call("main", [x])[0]
    want = np.where(x > 0, x, np.expm1(x.astype(np.float64)))
    assert np.max(np.abs(got - want)) < 1e-6
    assert np.array_equal(got[:20], x[:20])  # exp(0) - 1 = 0 exactly
