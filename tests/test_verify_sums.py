"""A result that is a sum of n terms is judged at the size of its partial sums (sqrt(n) times
its terms), even when the terms cancel: the GroupNorm-then-sum case, where the error of the
group mean is added n times and the old floor (the inputs' size) failed correct code."""

from __future__ import annotations

import numpy as np

from stagegraph.workload import parse_workload
from stagegraph.workload.tensors import TensorSpec
from stagegraph.workload.verify import compare, rms

N = 127  # the group size of the reported failure (tolerance 8.6e-5 = 128 u sqrt(127))


def group_norm_sum(x: np.ndarray, dtype: type, drop_last: bool = False) -> np.ndarray:
    g = x.astype(dtype)
    mean = g.mean(-1, keepdims=True, dtype=dtype)
    var = ((g - mean) ** 2).mean(-1, keepdims=True, dtype=dtype)
    y = (g - mean) / np.sqrt(var + dtype(1e-5))
    return (y[..., :-1] if drop_last else y).sum(-1, dtype=dtype)


def test_cancelling_sum_passes_at_the_partial_sums_scale_and_a_dropped_term_fails():
    rng = np.random.default_rng(0)  # ratio 1.22 with the old floor, as reported (1.2)
    x = rng.uniform(-1, 1, (64, 8, N)) + rng.uniform(-20, 20, (64, 8, 1))  # offset groups
    ref = group_norm_sum(x, np.float64)
    assert np.abs(ref).max() < 1e-9  # every output cancels to zero
    got = group_norm_sum(x, np.float32)
    dropped = group_norm_sum(x, np.float32, drop_last=True)
    spec = [TensorSpec(shape=ref.shape, dtype="f32")]

    def verdict(out, floor):
        return compare([out], [ref], spec, reduction_length=N, magnitudes=[floor], who="gn")

    assert not verdict(got, rms(x)).ok  # the old floor: rounding judged as a miscompile
    good = verdict(got, rms(x) * np.sqrt(N))
    assert good.ok and good.ratio < 0.5, good.message
    wrong = verdict(dropped, rms(x) * np.sqrt(N))
    assert not wrong.ok and wrong.ratio > 100, wrong.message


SUM = """\
#in = affine_map<(d0, d1) -> (d0, d1)>
#out = affine_map<(d0, d1) -> (d0)>
func.func @main(%x: tensor<4x6xf32>) -> (tensor<4x1xf32>, tensor<4xf32>, tensor<4xf32>) {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<4xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<4xf32>) -> tensor<4xf32>
  %s = linalg.generic {indexing_maps = [#in, #out], iterator_types = ["parallel", "reduction"]}
      ins(%x : tensor<4x6xf32>) outs(%f : tensor<4xf32>) {
  ^bb0(%a: f32, %acc: f32):
    %v = arith.addf %a, %acc : f32
    linalg.yield %v : f32
  } -> tensor<4xf32>
  %m = linalg.generic {indexing_maps = [#in, #out], iterator_types = ["parallel", "reduction"]}
      ins(%x : tensor<4x6xf32>) outs(%f : tensor<4xf32>) {
  ^bb0(%a: f32, %acc: f32):
    %v = arith.maximumf %a, %acc : f32
    linalg.yield %v : f32
  } -> tensor<4xf32>
  %k = tensor.expand_shape %s [[0, 1]] output_shape [4, 1] : tensor<4xf32> into tensor<4x1xf32>
  %d = arith.constant dense<6.0> : tensor<4xf32>
  %mean = arith.divf %s, %d : tensor<4xf32>
  return %k, %m, %mean : tensor<4x1xf32>, tensor<4xf32>, tensor<4xf32>
}
"""


def test_only_sum_results_get_the_wider_floor(tmp_path):
    from stagegraph.workload.sum_outputs import summed_terms

    path = tmp_path / "sums.mlir"
    path.write_text(SUM)
    workload = parse_workload(str(path))
    assert summed_terms(workload.payload(), workload.entry) == [6, 1, 1]  # sum, max, mean
    with workload.session():
        inputs = rms(workload.inputs()[0])
        floors = workload.magnitudes()
    np.testing.assert_allclose(floors, [inputs * np.sqrt(6), inputs, inputs])
