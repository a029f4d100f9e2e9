"""Elementwise consumers that reach a matmul through reshapes move onto its result
(:mod:`stagegraph.stages.common.reshaped_epilogues`): the IR made, the layer the analysis
then sees, and values and passes over memory of a convolution through the implicit GEMM
with a bias add, a residual add and a ReLU after it."""

from __future__ import annotations

import numpy as np
import pytest

import stagegraph as sg
from stagegraph.core.catalog import load_graph
from stagegraph.mlir.bindings import ir, new_context
from stagegraph.mlir.walk import collect
from stagegraph.stages.analysis import analyze
from stagegraph.stages.common.reshaped_epilogues import fuse_epilogues_through_reshapes

_MAP3 = "affine_map<(d0, d1, d2) -> (d0, d1, d2)>"


def _chain(bias_map: str, bias_type: str) -> str:
    """matmul [8, 12] -> expand [1, 8, 3, 4] -> collapse [8, 3, 4] -> add (bias read by
    ``bias_map``) -> ReLU, as the implicit GEMM leaves it for one image."""
    return f"""
func.func @main(%a: tensor<8x5xf32>, %b: tensor<5x12xf32>, %bias: {bias_type})
    -> tensor<8x3x4xf32> {{
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<8x12xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<8x12xf32>) -> tensor<8x12xf32>
  %m = linalg.matmul ins(%a, %b : tensor<8x5xf32>, tensor<5x12xf32>)
    outs(%f : tensor<8x12xf32>) -> tensor<8x12xf32>
  %x = tensor.expand_shape %m [[0, 1], [2, 3]] output_shape [1, 8, 3, 4]
    : tensor<8x12xf32> into tensor<1x8x3x4xf32>
  %c = tensor.collapse_shape %x [[0, 1], [2], [3]] : tensor<1x8x3x4xf32> into tensor<8x3x4xf32>
  %o = tensor.empty() : tensor<8x3x4xf32>
  %s = linalg.generic {{indexing_maps = [{_MAP3}, {bias_map}, {_MAP3}],
      iterator_types = ["parallel", "parallel", "parallel"]}}
      ins(%c, %bias : tensor<8x3x4xf32>, {bias_type}) outs(%o : tensor<8x3x4xf32>) {{
    ^bb0(%i: f32, %j: f32, %out: f32):
      %v = arith.addf %i, %j : f32
      linalg.yield %v : f32
  }} -> tensor<8x3x4xf32>
  %r = linalg.generic {{indexing_maps = [{_MAP3}, {_MAP3}],
      iterator_types = ["parallel", "parallel", "parallel"]}}
      ins(%s : tensor<8x3x4xf32>) outs(%o : tensor<8x3x4xf32>) {{
    ^bb0(%i: f32, %out: f32):
      %v = arith.maximumf %i, %z : f32
      linalg.yield %v : f32
  }} -> tensor<8x3x4xf32>
  return %r : tensor<8x3x4xf32>
}}
"""


def _rewritten(text: str):
    """(ops moved, the matmul's users, generics' loop counts, the layers) after the
    rewrite."""
    with new_context(), ir.Location.unknown():
        module = ir.Module.parse(text)
        moved = fuse_epilogues_through_reshapes(module)
        assert module.operation.verify()
        [matmul] = collect(module.operation, lambda op: op.name == "linalg.matmul")
        users = [use.owner.operation.name for use in matmul.results[0].uses]
        generics = collect(module.operation, lambda op: op.name == "linalg.generic")
        loops = [len(list(op.attributes["iterator_types"])) for op in generics]
        return moved, users, loops, analyze(module).layers


def test_a_per_channel_bias_and_relu_move_onto_the_matmul_and_join_its_layer():
    moved, users, loops, layers = _rewritten(
        _chain("affine_map<(d0, d1, d2) -> (d0)>", "tensor<8xf32>")
    )
    assert moved == 2
    assert users == ["linalg.generic"]  # no reshape between the matmul and its epilogue
    assert loops == [2, 2]  # both run over the matmul's [8, 12]
    [layer] = layers
    assert len(layer.epilogue) == 2 and "arith.addf" in layer.epilogue_ops


def test_a_full_size_operand_is_collapsed_with_the_result():
    moved, users, loops, layers = _rewritten(_chain(_MAP3, "tensor<8x3x4xf32>"))
    assert (moved, users, loops) == (2, ["linalg.generic"], [2, 2])
    assert len(layers[0].epilogue) == 2


def test_an_operand_reading_part_of_a_collapsed_dim_keeps_the_op_where_it_is():
    """The bias reads the rows (3) but not the columns (4) of the matmul's column dim
    (12): no map over [8, 12] reads it, so nothing moves and the layer has no epilogue."""
    moved, users, loops, layers = _rewritten(
        _chain("affine_map<(d0, d1, d2) -> (d1)>", "tensor<3xf32>")
    )
    assert (moved, users, loops) == (0, ["tensor.expand_shape"], [3, 3])
    assert layers[0].epilogue == ()


def test_an_op_reading_two_matmuls_stays_between_them():
    """A residual add of two matmuls (a downsampling block's two convolutions): either
    layer could take it, and the analysis would give it to both; it stays where it is."""
    text = (
        _chain(_MAP3, "tensor<8x3x4xf32>")
        .replace(
            "%o = tensor.empty()",
            "%m2 = linalg.matmul ins(%a, %b : tensor<8x5xf32>, tensor<5x12xf32>)\n"
            "    outs(%f : tensor<8x12xf32>) -> tensor<8x12xf32>\n"
            "  %bias2 = tensor.expand_shape %m2 [[0], [1, 2]] output_shape [8, 3, 4]\n"
            "    : tensor<8x12xf32> into tensor<8x3x4xf32>\n"
            "  %o = tensor.empty()",
        )
        .replace("ins(%c, %bias :", "ins(%c, %bias2 :")
    )
    with new_context(), ir.Location.unknown():
        module = ir.Module.parse(text)
        assert fuse_epilogues_through_reshapes(module) == 0
        assert module.operation.verify()
        users = [
            [use.owner.operation.name for use in op.results[0].uses]
            for op in collect(module.operation, lambda op: op.name == "linalg.matmul")
        ]
    assert users == [["tensor.expand_shape"], ["tensor.expand_shape"]]


def _conv(n: int, c: int, f: int, size: int) -> str:
    """@main(x, w, b, res): ReLU(conv(x, w) + b + res), the 3x3 convolution unpadded."""
    o = size - 2
    x, w, y = f"{n}x{c}x{size}x{size}", f"{f}x{c}x3x3", f"{n}x{f}x{o}x{o}"
    ident = "affine_map<(n, f, h, w) -> (n, f, h, w)>"
    return f"""
func.func @main(%x: tensor<{x}xf32>, %w: tensor<{w}xf32>, %b: tensor<{f}xf32>,
    %res: tensor<{y}xf32>) -> tensor<{y}xf32> {{
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<{y}xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<{y}xf32>) -> tensor<{y}xf32>
  %c = linalg.conv_2d_nchw_fchw {{dilations = dense<1> : vector<2xi64>,
      strides = dense<1> : vector<2xi64>}}
    ins(%x, %w : tensor<{x}xf32>, tensor<{w}xf32>) outs(%f : tensor<{y}xf32>) -> tensor<{y}xf32>
  %r = linalg.generic {{indexing_maps = [{ident}, affine_map<(n, f, h, w) -> (f)>, {ident},
        {ident}], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}}
      ins(%c, %b, %res : tensor<{y}xf32>, tensor<{f}xf32>, tensor<{y}xf32>)
      outs(%e : tensor<{y}xf32>) {{
    ^bb0(%i: f32, %j: f32, %k: f32, %out: f32):
      %s = arith.addf %i, %j : f32
      %t = arith.addf %s, %k : f32
      %v = arith.maximumf %t, %z : f32
      linalg.yield %v : f32
  }} -> tensor<{y}xf32>
  return %r : tensor<{y}xf32>
}}
"""


# (images, channels, filters, image size, patch_block_l2_fraction): one GEMM for one image;
# row blocks in one loop (2% of L2: blocks of 4 of the 16 rows) for two images.
_GEMMS = {
    "whole": (1, 16, 32, 12, 0.0),
    "row_blocks": (2, 8, 32, 18, 0.02),
    "row_blocks_one_image": (1, 8, 64, 18, 0.02),
}


@pytest.mark.parametrize("case", sorted(_GEMMS))
def test_gemm_convolution_bias_residual_relu_verify_in_one_pass(tmp_path, monkeypatch, case):
    """The convolution takes the implicit GEMM (whole, or in row blocks); its bias +
    residual + ReLU run in the matmul's tiles: one pass over memory fewer than with the
    epilogue left after the reshapes or the loop (its own loop reading the output back)."""
    n, c, f, size, fraction = _GEMMS[case]
    o = size - 2
    rng = np.random.default_rng(5)
    x = rng.standard_normal((n, c, size, size), dtype=np.float32)
    w = rng.standard_normal((f, c, 3, 3), dtype=np.float32)
    b = rng.standard_normal(f, dtype=np.float32)
    res = rng.standard_normal((n, f, o, o), dtype=np.float32)
    windows = np.lib.stride_tricks.sliding_window_view(x.astype(np.float64), (3, 3), (2, 3))
    conv = np.einsum("nchwij,fcij->nfhw", windows, w.astype(np.float64))
    expected = np.maximum(conv + b[None, :, None, None] + res, 0).astype(np.float32)
    path = tmp_path / "conv.mlir"
    path.write_text(_conv(n, c, f, size))
    np.savez(tmp_path / "conv.npz", in0=x, in1=w, in2=b, in3=res, out0=expected)
    dumped = tmp_path / "ir"
    graph = load_graph("x86").with_config(
        "normalize", path="gemm", patch_block_l2_fraction=fraction
    )
    report = sg.run(graph, str(path), threads=1, target="x86-64-v3", dump_ir=str(dumped))
    assert report.verified is True, report
    [normalized] = [p for p in dumped.iterdir() if "normalize" in p.name]
    with new_context():
        module = ir.Module.parse(normalized.read_text())
        [matmul] = collect(module.operation, lambda op: op.name == "linalg.matmul")
        [user] = [use.owner.operation for use in matmul.results[0].uses]
        assert user.name == "linalg.generic"
        assert "arith.maximumf" in [op.name for op in collect(user)]
        loops = collect(module.operation, lambda op: op.name == "scf.for")
        assert len(loops) == (1 if fraction else 0)
        assert not collect(module.operation, lambda op: op.name.startswith("linalg.conv"))
        layers = analyze(module).layers
    assert [len(layer.epilogue) for layer in layers] == [1]
    from stagegraph.app.memory_passes import payload_memory_passes
    from stagegraph.stages.common import block_epilogues, reshaped_epilogues

    monkeypatch.setattr(reshaped_epilogues, "fuse_epilogues_through_reshapes", lambda m: 0)
    monkeypatch.setattr(block_epilogues, "sink_epilogues_into_blocks", lambda m: 0)
    apart = payload_memory_passes(str(path), graph, target="x86-64-v3").total
    assert report.memory_passes == apart - 1


_TORCH_BLOCK = """
import torch


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(16, 32, 3, padding=1)

    def forward(self, x, res):
        return torch.relu(self.conv(x) * 0.5 + res)


def get_inputs():
    return [torch.rand(1, 16, 10, 10), torch.rand(1, 32, 10, 10)]


def get_init_inputs():
    return []
"""


def test_a_pytorch_conv_bias_scale_residual_relu_matches_eager_through_the_gemm(tmp_path):
    """From a problem file (its outputs computed by eager PyTorch): the padded convolution
    takes the GEMM; its bias (the init), scale (folded into the weights), residual add and
    ReLU are the matmul's layer."""
    pytest.importorskip("torch")
    path = tmp_path / "block.py"
    path.write_text(_TORCH_BLOCK)
    graph = load_graph("x86").with_config("normalize", path="gemm")
    dumped = tmp_path / "ir"
    report = sg.run(graph, str(path), threads=1, target="x86-64-v3", dump_ir=str(dumped))
    assert report.verified is True, report
    [normalized] = [p for p in dumped.iterdir() if "normalize" in p.name]
    with new_context():
        module = ir.Module.parse(normalized.read_text())
        [matmul] = collect(module.operation, lambda op: op.name == "linalg.matmul")
        assert "stagegraph.conv_path" in matmul.attributes
        users = [use.owner.operation.name for use in matmul.results[0].uses]
        [layer] = analyze(module).layers
    assert users == ["linalg.generic"]
    # the scale folds into the weights (fold_batchnorm); add and ReLU are the epilogue
    assert len(layer.epilogue) == 2
    assert "arith.addf" in layer.epilogue_ops and "arith.select" in layer.epilogue_ops


_LOOP = """
func.func @main(%x: tensor<1x8x18x18xf32>, %w: tensor<16x8x3x3xf32>, %res: tensor<1x16x16x16xf32>)
    -> tensor<16x16x16xf32> {
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<1x16x16x16xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<1x16x16x16xf32>) -> tensor<1x16x16x16xf32>
  %c = linalg.conv_2d_nchw_fchw {dilations = dense<1> : vector<2xi64>,
      strides = dense<1> : vector<2xi64>}
    ins(%x, %w : tensor<1x8x18x18xf32>, tensor<16x8x3x3xf32>)
    outs(%f : tensor<1x16x16x16xf32>) -> tensor<1x16x16x16xf32>
  %cc = tensor.collapse_shape %c [[0, 1], [2], [3]]
    : tensor<1x16x16x16xf32> into tensor<16x16x16xf32>
  %rc = tensor.collapse_shape %res [[0, 1], [2], [3]]
    : tensor<1x16x16x16xf32> into tensor<16x16x16xf32>
  %o = tensor.empty() : tensor<16x16x16xf32>
  %s = linalg.generic {indexing_maps = [{MAP3}, {MAP3}, {MAP3}],
      iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%cc, %rc : tensor<16x16x16xf32>, tensor<16x16x16xf32>)
      outs(%o : tensor<16x16x16xf32>) {
    ^bb0(%i: f32, %j: f32, %out: f32):
      %v = arith.addf %i, %j : f32
      linalg.yield %v : f32
  } -> tensor<16x16x16xf32>
  return %s : tensor<16x16x16xf32>
}
""".replace("{MAP3}", _MAP3)


def test_a_row_block_loops_residual_add_moves_into_the_loop_onto_its_matmul():
    """The residual's reshape (after the convolution, so after the loop) moves before the
    loop; the add reads each block's slice of it, inside the loop, from the matmul."""
    from stagegraph.stages.common.block_epilogues import sink_epilogues_into_blocks
    from stagegraph.stages.target import resolve_target, target_from_override
    from stagegraph.stages.x86.conv.config import ConvGemmConfig
    from stagegraph.stages.x86.conv.gemm import convolutions_to_gemm

    v4 = resolve_target("x86-64-v4")
    target = target_from_override(**{**v4.model_dump(), "l2_bytes": 1 << 20})
    config = ConvGemmConfig(path="gemm", patch_block_l2_fraction=0.02)
    with new_context(), ir.Location.unknown():
        module = ir.Module.parse(_LOOP)
        assert convolutions_to_gemm(module, config, target) == 1
        assert sink_epilogues_into_blocks(module) == 1
        assert fuse_epilogues_through_reshapes(module) == 1
        assert module.operation.verify()
        [loop] = collect(module.operation, lambda op: op.name == "scf.for")
        [matmul] = collect(module.operation, lambda op: op.name == "linalg.matmul")
        [user] = [use.owner.operation for use in matmul.results[0].uses]
        assert user.name == "linalg.generic" and user.parent.name == "scf.for"
        assert len(list(user.attributes["iterator_types"])) == 2  # over the block's [F, cols]
        # nothing but reshapes of the loop's result is left after it
        after = [op.name for op in collect(module.operation) if op.parent.name == "func.func"]
        assert after[after.index("scf.for") + 1 :] == ["tensor.collapse_shape", "func.return"]
        assert loop.results[0].type == ir.RankedTensorType.get([1, 16, 16, 16], ir.F32Type.get())
