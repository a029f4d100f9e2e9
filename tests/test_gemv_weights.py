"""A Linear at batch 1 is a GEMV on the weight's own rows (``matmul.weight_rows``): no
transpose of the weight runs per call, the weight is read as contiguous rows in vectors
of the target's width, it stays one constant, and the results verify (bias + ReLU, N not
a multiple of the vector width, batch 1 and 3, constant and argument weights). At a few
rows the constant is transposed once at compile time and read unpacked where it cannot
be prepacked."""

from __future__ import annotations

import pytest

import stagegraph as sg
from stagegraph.mlir.bindings import ir
from stagegraph.mlir.walk import collect
from stagegraph.stages.target import resolve_target
from stagegraph.stages.x86.generic.params import GEMV_ROWS
from tests.test_linear_layers import _constant_shapes, _linear, _tensor_shapes

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
    # The weight: GEMV_ROWS rows at once, each a whole number of vectors along k.
    tiles = [v.shape for v in reads if v.rank == 2]
    assert tiles and all(r == GEMV_ROWS and c % lanes == 0 and K % c == 0 for r, c in tiles)


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


@pytest.mark.parametrize(("m", "k", "n"), [(1, K, N), (3, K, N), (1, 96, 997), (1, 40, 1001)])
def test_linear_bias_relu_verifies_at_few_rows(tmp_path, m, k, n):
    """Also N = 997 (prime: one weight row per tile), 1001 (seven rows) with k = 40 (not
    a whole number of 16-lane vectors)."""
    assert sg.run("x86", _linear(tmp_path, m, k, n), threads=1).verified is True


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


def test_a_few_rows_read_the_weight_transposed_once_at_compile_time(tmp_path):
    """Batch 3: the constant's transpose is folded when compiled (one [K, N] constant, no
    transpose, no [N, K] copy left), and with N = 1000 (no whole 32-column panels to
    prepack) the kernel reads it unpacked: no packing of B at run time."""
    path = _linear(tmp_path, 3, K, N)
    scheduled = sg.run("x86", path, threads=1, target="x86-64-v4", until="schedule")
    assert scheduled.params.matmul[0].pack is False
    module = scheduled.module.ir
    assert collect(module, {"linalg.transpose", "linalg.pack"}) == []
    assert (K, N) in _constant_shapes(module) and (N, K) not in _constant_shapes(module)


def test_few_rows_pack_b_only_where_it_pays():
    """A B that is not prepacked at compile time is read unpacked when all of M is one
    register tile (each B element then serves those rows once either way); a prepackable
    constant (N = 1024) stays packed, and many rows keep the per-call choice."""
    from stagegraph.stages.x86.matmul.heuristic import heuristic_matmul_params

    v4 = resolve_target("x86-64-v4")
    assert heuristic_matmul_params(3, N, K, "f32", v4, constant_b=True).pack is False
    assert heuristic_matmul_params(3, 1024, K, "f32", v4, constant_b=True).pack is True
    assert heuristic_matmul_params(1, 4096, 4096, "f32", v4).pack is False  # argument B
    many = heuristic_matmul_params(256, 4096, 4096, "f32", v4)
    assert many.reg_m < 256 and many.pack is True  # B far past the caches: packed per call


@pytest.mark.parametrize(("n", "prepacked"), [(256, True), (200, False)])
def test_one_row_against_a_constant_b_k_n_runs_on_the_kernel(tmp_path, n, prepacked):
    """``x @ W`` with a constant ``W[k, n]`` at batch 1: the kernel's one-row tile reads
    B's rows along n, packed at compile time where N makes whole panels, else as it
    lies; either way no packing of B runs per call, and the values verify."""
    path = _linear(tmp_path, 1, 128, n, transposed=False)
    scheduled = sg.run("x86", path, threads=1, target="x86-64-v4", until="schedule")
    assert len(scheduled.params.matmul) == 1 and scheduled.params.matmul[0].pack is prepacked
    assert collect(scheduled.module.ir, {"linalg.pack", "linalg.transpose"}) == []
    assert sg.run("x86", path, threads=1).verified is True


def test_a_weight_shared_with_many_rows_is_not_folded():
    """A transpose also read by a matmul of many rows is left for the packed kernel (which
    transposes while packing at compile time); alone under few rows, it is folded."""
    from stagegraph.mlir.bindings import new_context
    from stagegraph.mlir.diagnostics import parse_module
    from stagegraph.stages.x86.matmul.weight_rows import fold_few_row_transposes

    def module(rows: list[int]) -> str:
        lines = []
        for i, m in enumerate(rows):
            lines.append(f"""
  %o{i} = tensor.empty() : tensor<{m}x4xf32>
  %mm{i} = linalg.matmul ins(%x{i}, %wt : tensor<{m}x8xf32>, tensor<8x4xf32>)
      outs(%o{i} : tensor<{m}x4xf32>) -> tensor<{m}x4xf32>""")
        args = ", ".join(f"%x{i}: tensor<{m}x8xf32>" for i, m in enumerate(rows))
        results = ", ".join(f"tensor<{m}x4xf32>" for m in rows)
        returned = ", ".join(f"%mm{i}" for i in range(len(rows)))
        return f"""
func.func @main({args}) -> ({results}) {{
  %w = arith.constant dense<1.0> : tensor<4x8xf32>
  %e = tensor.empty() : tensor<8x4xf32>
  %wt = linalg.transpose ins(%w : tensor<4x8xf32>) outs(%e : tensor<8x4xf32>) permutation = [1, 0]
  {"".join(lines)}
  return {returned} : {results}
}}"""

    context = new_context()
    with context, ir.Location.unknown():
        few, mixed = (parse_module(module(r), context, "test") for r in ([2, 8], [2, 16]))
        assert fold_few_row_transposes(few) == 1 and fold_few_row_transposes(mixed) == 0
        assert collect(few, "linalg.transpose") == []
        assert len(collect(mixed, "linalg.transpose")) == 1
        assert few.operation.verify()
