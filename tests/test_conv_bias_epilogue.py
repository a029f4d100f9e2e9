"""A biased convolution's implicit GEMM blocks add the bias in their epilogue
(:mod:`stagegraph.stages.x86.conv.bias_epilogue`): no broadcast of the bias over the
output, each block's matmul from zero, the add reading the 1-D bias; other inits keep
their form. Values: ``tests/test_matmul_init_epilogue.py`` runs such convolutions."""

from __future__ import annotations

from stagegraph.mlir.bindings import ir, new_context
from stagegraph.mlir.walk import collect, defining_op
from stagegraph.stages.target import resolve_target, target_from_override
from stagegraph.stages.x86.conv.config import ConvGemmConfig
from stagegraph.stages.x86.conv.gemm import convolutions_to_gemm

# 2% of a 1 MB L2 (20 KB): blocks of output rows, as in tests/test_conv_gemm_blocks.py
_SMALL_BLOCKS = ConvGemmConfig(path="gemm", patch_block_l2_fraction=0.02)
_TARGET = target_from_override(**{**resolve_target("x86-64-v4").model_dump(), "l2_bytes": 1 << 20})


def _payload(dimensions: str, init_readers: int = 1) -> str:
    """A 3x3 convolution 8 -> 16 channels of a 17x17 image whose init broadcasts a
    ``[16]`` (dimensions 0, 2, 3: a bias) or ``[15]`` (a row) tensor along ``dimensions``."""
    source = "tensor<16xf32>" if dimensions == "[0, 2, 3]" else "tensor<15xf32>"
    extra = "%i" if init_readers == 2 else "%r"
    return f"""
func.func @main(%x: tensor<2x8x17x17xf32>, %w: tensor<16x8x3x3xf32>, %b: {source})
    -> (tensor<2x16x15x15xf32>, tensor<2x16x15x15xf32>) {{
  %e = tensor.empty() : tensor<2x16x15x15xf32>
  %i = linalg.broadcast ins(%b : {source}) outs(%e : tensor<2x16x15x15xf32>)
    dimensions = {dimensions}
  %r = linalg.conv_2d_nchw_fchw
    {{dilations = dense<1> : vector<2xi64>, strides = dense<1> : vector<2xi64>}}
    ins(%x, %w : tensor<2x8x17x17xf32>, tensor<16x8x3x3xf32>)
    outs(%i : tensor<2x16x15x15xf32>) -> tensor<2x16x15x15xf32>
  return %r, {extra} : tensor<2x16x15x15xf32>, tensor<2x16x15x15xf32>
}}
"""


def _rewritten(text: str):
    module = ir.Module.parse(text)
    assert convolutions_to_gemm(module, _SMALL_BLOCKS, _TARGET) == 1
    assert module.operation.verify()
    return module


def test_a_bias_is_added_in_each_blocks_epilogue():
    with new_context(), ir.Location.unknown():
        module = _rewritten(_payload("[0, 2, 3]"))
        assert not collect(module.operation, "linalg.broadcast")
        [loop] = collect(module.operation, "scf.for")
        assert defining_op(loop.operands[3]).name == "tensor.empty"  # (lb, ub, step, init)
        [matmul] = collect(module.operation, "linalg.matmul")
        assert defining_op(matmul.operands[2]).name == "linalg.fill"
        [adder] = [u.owner.operation for u in matmul.results[0].uses]
        assert adder.name == "linalg.generic"
        bias = adder.operands[1]
        assert isinstance(bias, ir.BlockArgument) and ir.RankedTensorType(bias.type).shape == [16]
        maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(adder.attributes["indexing_maps"])]
        assert maps[1] == ir.AffineMap.get(2, 0, [ir.AffineDimExpr.get(0)])
        assert [op.name for op in adder.regions[0].blocks[0].operations] == [
            "arith.addf",
            "linalg.yield",
        ]


def test_other_inits_stay_the_matmuls_initial_c():
    """A broadcast along other dims, or one read elsewhere too, stays the blocks' init."""
    for text in (_payload("[0, 1, 2]"), _payload("[0, 2, 3]", init_readers=2)):
        with new_context(), ir.Location.unknown():
            module = _rewritten(text)
            assert len(collect(module.operation, "linalg.broadcast")) == 1
            [matmul] = collect(module.operation, "linalg.matmul")
            assert defining_op(matmul.operands[2]).name != "linalg.fill"
