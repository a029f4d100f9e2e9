"""Two lowering faults an H200 found that no CPU check had: block foralls of more than three
mapped dims launched a fraction of their blocks (their outputs stayed unwritten), and the
one-thread host kernels claimed 16-byte alignment for vectors at row starts that are not
(``CUDA_ERROR_MISALIGNED_ADDRESS``)."""

from __future__ import annotations

from math import prod
from pathlib import Path

import pytest

import stagegraph as sg
from stagegraph.mlir.bindings import ir, new_context
from stagegraph.mlir.diagnostics import parse_module
from stagegraph.mlir.walk import collect

POOL = """
func.func @main(%x: tensor<4x6x16x16xf32>) -> tensor<4x6x8x8xf32> {
  %ninf = arith.constant -3.4e38 : f32
  %w = tensor.empty() : tensor<2x2xf32>
  %e = tensor.empty() : tensor<4x6x8x8xf32>
  %i = linalg.fill ins(%ninf : f32) outs(%e : tensor<4x6x8x8xf32>) -> tensor<4x6x8x8xf32>
  %r = linalg.pooling_nchw_max {dilations = dense<1> : vector<2xi64>,
                                strides = dense<2> : vector<2xi64>}
       ins(%x, %w : tensor<4x6x16x16xf32>, tensor<2x2xf32>)
       outs(%i : tensor<4x6x8x8xf32>) -> tensor<4x6x8x8xf32>
  return %r : tensor<4x6x8x8xf32>
}
"""


@pytest.fixture(scope="module")
def pool_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("grid") / "pool.mlir"
    path.write_text(POOL)
    return path


def test_a_four_dim_block_forall_launches_every_block(pool_file):
    """The (N, C) tiles of an NCHW pool: 4 x 6 blocks, each of an 8 x 8 output tile."""
    from stagegraph.stages.gpu.plan import host_plan

    lowered = sg.run("gpu", str(pool_file), target="sm_90a", until="lower")
    module = lowered.module.ir
    with module.context:
        plan = host_plan(module, "main")
    configs = [plan.launches[s["kernel"]] for s in plan.steps if s["op"] == "launch"]
    assert len(configs) == 2  # the -inf fill, then the pool
    for config in configs:
        assert prod(config["grid"]) == 4 * 6
        assert config["grid"] == [24, 1, 1]  # one linear dim, not a y/z pair of the first 3


def _forall_module(counts: tuple[int, ...]) -> ir.Module:
    dims = ", ".join(f"%i{k}" for k in range(len(counts)))
    mapping = ", ".join(f"#gpu.block<linear_dim_{len(counts) - 1 - k}>" for k in range(len(counts)))
    text = (
        "func.func @f(%m: memref<" + "x".join(map(str, counts)) + "xf32>) {\n"
        "  %c = arith.constant 1.0 : f32\n"
        f"  scf.forall ({dims}) in ({', '.join(map(str, counts))}) {{\n"
        f"    memref.store %c, %m[{dims}] : memref<" + "x".join(map(str, counts)) + "xf32>\n"
        f"  }} {{mapping = [{mapping}], stagegraph.gpu_op = 7 : i64}}\n"
        "  return\n}\n"
    )
    return parse_module(text, new_context(), source="<forall>")


def test_fold_keeps_three_dims_and_folds_four_into_one_delinearized_dim():
    from stagegraph.stages.gpu.block_grid import fold_block_foralls

    for counts, folded in (((3, 4, 5), False), ((2, 3, 4, 5), True), ((2, 1, 3, 1, 4), True)):
        module = _forall_module(counts)
        with module.context, ir.Location.unknown():
            (forall,) = collect(module, "scf.forall")
            (after,) = fold_block_foralls([forall])
            assert module.operation.verify()
            bounds = list(ir.DenseI64ArrayAttr(after.attributes["staticUpperBound"]))
            mapping = [str(a) for a in ir.ArrayAttr(after.attributes["mapping"])]
            if not folded:
                assert bounds == list(counts) and len(mapping) == 3
                continue
            assert bounds == [prod(counts)] and mapping == ["#gpu.block<linear_dim_0>"]
            (split,) = collect(after, "affine.delinearize_index")
            assert list(ir.DenseI64ArrayAttr(split.attributes["static_basis"])) == list(counts)
            (store,) = collect(after, "memref.store")
            assert list(store.operands)[2:] == list(split.results)  # indices, row-major
            assert ir.IntegerAttr(after.attributes["stagegraph.gpu_op"]).value == 7


KERNELS = """
gpu.module @k {
  llvm.func @one(%p: !llvm.ptr) attributes {gpu.kernel,
      gpu.known_block_size = array<i32: 1, 1, 1>, gpu.known_grid_size = array<i32: 1, 1, 1>} {
    %v = llvm.load %p {alignment = 64 : i64} : !llvm.ptr -> vector<16xf32>
    llvm.store %v, %p {alignment = 64 : i64} : vector<16xf32>, !llvm.ptr
    %s = llvm.load %p {alignment = 4 : i64} : !llvm.ptr -> f32
    llvm.return
  }
  llvm.func @many(%p: !llvm.ptr) attributes {gpu.kernel,
      gpu.known_block_size = array<i32: 256, 1, 1>, gpu.known_grid_size = array<i32: 8, 1, 1>} {
    %v = llvm.load %p {alignment = 16 : i64} : !llvm.ptr -> vector<4xf32>
    llvm.return
  }
}
"""


def test_one_thread_kernels_claim_only_element_alignment():
    from stagegraph.stages.gpu.host_kernels import unalign_one_thread_vectors

    module = parse_module(KERNELS, new_context(), source="<kernels>")
    with module.context:
        assert unalign_one_thread_vectors(module) == 2
        one, many = collect(module, "llvm.func")
        alignments = [ir.IntegerAttr(op.attributes["alignment"]).value
                      for op in collect(one, {"llvm.load", "llvm.store"})]  # fmt: skip
        assert alignments == [4, 4, 4]  # the vectors now, the scalar as it was
        (load,) = collect(many, "llvm.load")
        assert ir.IntegerAttr(load.attributes["alignment"]).value == 16  # threads: kept


def test_a_grid_smaller_than_its_forall_is_a_compile_error(pool_file, monkeypatch):
    """Without the fold, the mapping's fault is caught at compile time, not on the GPU."""
    from stagegraph.stages.gpu import block_grid

    monkeypatch.setattr(block_grid, "fold_block_foralls", lambda foralls: foralls)
    with pytest.raises(sg.errors.StagegraphError,
                       match=r"forall of \[4, 6, 1, 1\] iterations was mapped to a grid of "
                             r"\[1, 1, 6\] blocks \(6 < 24\)"):  # fmt: skip
        sg.run("gpu", str(pool_file), target="sm_90a", until="lower")
