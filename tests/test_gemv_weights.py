"""A Linear at batch 1 is a GEMV on the weight's own rows (``matmul.weight_rows``): no
transpose of the weight runs per call, the weight is read as contiguous rows in vectors
of the target's width, it stays one constant, and the results verify (bias + ReLU, N not
a multiple of the vector width, batch 1 and 3, constant and argument weights)."""

from __future__ import annotations

import pytest

import stagegraph as sg
from stagegraph.mlir.bindings import ir
from stagegraph.mlir.walk import collect
from stagegraph.stages.target import resolve_target
from tests.test_linear_layers import _linear, _tensor_shapes

K, N = 1024, 1000  # N: not a multiple of 16 lanes


@pytest.mark.parametrize("target", ["x86-64-v4", "x86-64-v3"])
def test_one_row_reads_the_constant_weight_rows_in_place(tmp_path, target):
    """ResNet's classifier shape at batch 1: after scheduling, no transpose and no
    unvectorized matmul is left, nothing touches a [K, N] copy of the weight, and the
    weight is read in vectors of whole registers of ``target``."""
    lanes = resolve_target(target).vector_bits // 32
    path = _linear(tmp_path, 1, K, N)
    module = sg.run("x86", path, threads=1, target=target, until="schedule").module.ir
    assert collect(module, {"linalg.transpose", "linalg.matmul", "linalg.generic"}) == []
    shapes = [s for name in ("tensor.extract_slice", "vector.transfer_read", "scf.forall")
              for s in _tensor_shapes(module, name)]  # fmt: skip
    assert (K, N) not in shapes  # no transposed copy of the weight
    assert (N, K) in shapes  # the weight itself, sliced into rows
    reads = [ir.VectorType(op.results[0].type) for op in collect(module, "vector.transfer_read")]
    widest = max(v.shape[-1] for v in reads if v.rank == 1)
    assert widest >= 4 * lanes and widest % lanes == 0 and K % widest == 0


def test_the_weight_stays_one_constant(tmp_path):
    """Nothing is copied at compile time: the bufferized module holds the weight once, in
    its own [N, K] layout, and the bias."""
    path = _linear(tmp_path, 1, K, N)
    bufferized = sg.run("x86", path, threads=1, target="x86-64-v4", until="bufferized")
    globals_ = sorted(
        tuple(ir.MemRefType(ir.TypeAttr(op.attributes["type"]).value).shape)
        for op in collect(bufferized.module.ir, "memref.global")
    )
    assert globals_ == [(N,), (N, K)]


@pytest.mark.parametrize("m", [1, 3])
def test_linear_bias_relu_verifies_at_few_rows(tmp_path, m):
    assert sg.run("x86", _linear(tmp_path, m, K, N), threads=1).verified is True


@pytest.mark.parametrize("transposed", [True, False])
def test_an_argument_weight_at_one_row_verifies(tmp_path, transposed):
    """A weight passed in: read in place through its transpose ([N, K]), or as given
    ([K, N]: the generic schedule's matrix-vector product, as before)."""
    path = _linear(tmp_path, 1, 256, 200, transposed=transposed, constant=False)
    scheduled = sg.run("x86", path, threads=1, target="x86-64-v4", until="schedule")
    assert collect(scheduled.module.ir, "linalg.transpose") == []
    assert sg.run("x86", path, threads=1).verified is True


def test_only_one_row_matmuls_are_rewritten():
    """With two rows the packed kernel keeps the matmul (and packs a constant weight at
    compile time): its transpose stays for that kernel's own handling."""
    from stagegraph.mlir.bindings import new_context
    from stagegraph.mlir.diagnostics import parse_module
    from stagegraph.stages.x86.matmul.weight_rows import read_transposed_weights_in_place

    def module(m: int) -> str:
        return f"""
func.func @main(%x: tensor<{m}x8xf32>, %w: tensor<4x8xf32>) -> tensor<{m}x4xf32> {{
  %e = tensor.empty() : tensor<8x4xf32>
  %wt = linalg.transpose ins(%w : tensor<4x8xf32>) outs(%e : tensor<8x4xf32>) permutation = [1, 0]
  %o = tensor.empty() : tensor<{m}x4xf32>
  %mm = linalg.matmul ins(%x, %wt : tensor<{m}x8xf32>, tensor<8x4xf32>)
      outs(%o : tensor<{m}x4xf32>) -> tensor<{m}x4xf32>
  return %mm : tensor<{m}x4xf32>
}}"""

    context = new_context()
    with context, ir.Location.unknown():
        one, two = (parse_module(module(m), context, "test") for m in (1, 2))
        assert read_transposed_weights_in_place(one) == 1
        assert read_transposed_weights_in_place(two) == 0
        assert collect(one, "linalg.transpose") == []
        assert len(collect(two, "linalg.transpose")) == 1
        assert one.operation.verify()
