"""One image's implicit GEMM in blocks of output rows whose patch matrix fits L2
(:mod:`stagegraph.stages.x86.conv.gemm_blocks`): the block size from the target, the IR
(one ``scf.for`` around one matmul), and values against numpy on a pinned x86-64 level."""

from __future__ import annotations

import numpy as np
import pytest

import stagegraph as sg
from stagegraph.core.catalog import load_graph
from stagegraph.mlir.bindings import ir, new_context
from stagegraph.mlir.walk import collect
from stagegraph.stages.target import resolve_target, target_from_override
from stagegraph.stages.x86.conv.config import ConvGemmConfig
from stagegraph.stages.x86.conv.gemm import ConvShape, convolutions_to_gemm
from stagegraph.stages.x86.conv.gemm_blocks import block_rows, per_image

_V4 = resolve_target("x86-64-v4")


def _with_l2(target, size: int):
    return target_from_override(**{**target.model_dump(), "l2_bytes": size})


def _layer(c: int, size: int, stride: int = 1, n: int = 1) -> ConvShape:
    out = (size - 1) // stride + 1
    return ConvShape(n, c, c, (3, 3), (out, out), (stride, stride), (1, 1))


def test_blocks_fit_half_of_l2_in_whole_register_panels():
    """ResNet-18's 64-channel layer (56 rows of 576 x 56 patches, 129 KB each): 8 rows in
    half of a 2 MB L2 (448 columns: 14 panels of 32 on AVX-512), 4 in half of 1 MB."""
    shape, config = _layer(64, 56), ConvGemmConfig()
    assert block_rows(shape, _with_l2(_V4, 2 << 20), config, "f32") == 8
    assert block_rows(shape, _with_l2(_V4, 1 << 20), config, "f32") == 4
    # per image: several images block alike; a patch matrix that fits or the knob at 0: whole
    assert block_rows(_layer(64, 56, n=2), _with_l2(_V4, 2 << 20), config, "f32") == 8
    assert block_rows(_layer(256, 14), _with_l2(_V4, 2 << 20), config, "f32") == 14
    # ResNet-18's 7x7/2 first layer: 112 rows of 147 x 112 patches, 14 a block
    conv1 = ConvShape(1, 3, 64, (7, 7), (112, 112), (2, 2), (1, 1))
    assert block_rows(conv1, _with_l2(_V4, 2 << 20), config, "f32") == 14
    off = ConvGemmConfig(patch_block_l2_fraction=0)
    assert block_rows(shape, _with_l2(_V4, 2 << 20), off, "f32") == 56


def test_no_block_size_that_leaves_partial_panels():
    """28 rows of 28 columns: r rows make 28r columns, a multiple of 32 only for r a
    multiple of 8, none of which divides 28: the matrix stays whole."""
    shape = _layer(512, 28)
    assert block_rows(shape, _with_l2(_V4, 2 << 20), ConvGemmConfig(), "f32") == 28


def test_blocks_of_many_panels_may_end_in_a_partial_one():
    """AlexNet's 11x11/4 first layer (KernelBench l1_050: 55 rows of 363 x 55 patches, a
    4.4 MB matrix): no divisor of 55 makes whole panels of 32, but 11 rows (605 columns,
    18 panels and 29 columns) fill half of a 2 MB L2 and hold at least
    ``partial_block_min_panels`` panels; 128 channels at 28^2 would take 7 rows (196
    columns, 6 panels): too few, the matrix stays whole; the knob raised, 55 too."""
    config, l2 = ConvGemmConfig(), _with_l2(_V4, 2 << 20)
    alexnet = ConvShape(2, 3, 96, (11, 11), (55, 55), (4, 4), (1, 1))
    assert block_rows(alexnet, l2, config, "f32") == 11
    assert block_rows(_layer(128, 28), l2, config, "f32") == 28
    strict = ConvGemmConfig(partial_block_min_panels=10**6)
    assert block_rows(alexnet, l2, strict, "f32") == 55


def test_partial_panel_blocks_match_numpy(tmp_path):
    """Blocks of 5 rows of 10 outputs (50 columns: one panel of 32 and 18 on AVX2's 16)
    with the tail rule at one panel: the blocked GEMM with partial panels verifies."""
    c, f, size = 3, 16, 12
    rng = np.random.default_rng(12)
    x = rng.standard_normal((1, c, size, size), dtype=np.float32)
    w = rng.standard_normal((f, c, 3, 3), dtype=np.float32)
    b = rng.standard_normal(f, dtype=np.float32)
    out = np.broadcast_to(b.reshape(1, f, 1, 1).astype(np.float64), (1, f, 10, 10)).copy()
    for i in range(3):
        for j in range(3):
            window = x[:, :, i : i + 10, j : j + 10].astype(np.float64)
            out += np.einsum("nchw,fc->nfhw", window, w[:, :, i, j].astype(np.float64))
    payload = tmp_path / "conv.mlir"
    payload.write_text(_payload(c, f, size))
    np.savez(tmp_path / "conv.npz", in0=x, in1=w, in2=b, out0=out.astype(np.float32))
    # 2% of AVX2's L2 is too small for one row: the least rows, 10 / max_patch_blocks 2
    graph = load_graph("x86").with_config(
        "normalize", path="gemm", patch_block_l2_fraction=0.0001, max_patch_blocks=2,
        partial_block_min_panels=1,
    )  # fmt: skip
    dumped = tmp_path / "ir"
    report = sg.run(graph, str(payload), threads=1, target="x86-64-v3", dump_ir=str(dumped))
    assert report.verified is True, report
    [normalized] = [p for p in dumped.iterdir() if "normalize" in p.name]
    with new_context():
        module = ir.Module.parse(normalized.read_text())
        [matmul] = collect(module.operation, lambda op: op.name == "linalg.matmul")
        assert ir.RankedTensorType(matmul.operands[1].type).shape == [27, 50]


def _payload(c: int, f: int, size: int) -> str:
    out = size - 2
    x, w, y = f"1x{c}x{size}x{size}", f"{f}x{c}x3x3", f"1x{f}x{out}x{out}"
    return f"""
func.func @main(%x: tensor<{x}xf32>, %w: tensor<{w}xf32>, %b: tensor<{f}xf32>)
    -> tensor<{y}xf32> {{
  %e = tensor.empty() : tensor<{y}xf32>
  %i = linalg.broadcast ins(%b : tensor<{f}xf32>) outs(%e : tensor<{y}xf32>)
    dimensions = [0, 2, 3]
  %r = linalg.conv_2d_nchw_fchw
    {{dilations = dense<1> : vector<2xi64>, strides = dense<1> : vector<2xi64>}}
    ins(%x, %w : tensor<{x}xf32>, tensor<{w}xf32>) outs(%i : tensor<{y}xf32>)
    -> tensor<{y}xf32>
  return %r : tensor<{y}xf32>
}}
"""


# 2% of L2 (a 1 MB L2: 20 KB) takes 4 rows of 8 x 9 x 16 patches (4.6 KB a row).
_SMALL_BLOCKS = ConvGemmConfig(path="gemm", patch_block_l2_fraction=0.02)


def test_the_blocks_are_one_loop_around_one_matmul():
    with new_context(), ir.Location.unknown():
        module = ir.Module.parse(_payload(8, 16, 18))
        count = convolutions_to_gemm(module, _SMALL_BLOCKS, _with_l2(_V4, 1 << 20))
        assert count == 1 and module.operation.verify()
        [loop] = collect(module.operation, lambda op: op.name == "scf.for")
        [matmul] = collect(module.operation, lambda op: op.name == "linalg.matmul")
        assert matmul.parent.name == "scf.for"  # inside the loop body
        shapes = [list(ir.RankedTensorType(v.type).shape) for v in matmul.operands]
        assert shapes == [[16, 72], [72, 4 * 16], [16, 4 * 16]]
        # 16 output rows in blocks of 4
        bounds = [ir.IntegerAttr(loop.operands[i].owner.attributes["value"]).value for i in (0, 1)]
        assert bounds == [0, 4]
        assert not collect(module.operation, lambda op: op.name.startswith("linalg.conv"))


@pytest.mark.parametrize("fraction", [0.02, 0.0])
def test_blocked_and_whole_gemms_match_numpy_on_avx2(tmp_path, fraction):
    c, f, size = 8, 16, 18
    rng = np.random.default_rng(11)
    x = rng.standard_normal((1, c, size, size), dtype=np.float32)
    w = rng.standard_normal((f, c, 3, 3), dtype=np.float32)
    b = rng.standard_normal(f, dtype=np.float32)
    out = np.broadcast_to(b.reshape(1, f, 1, 1).astype(np.float64), (1, f, 16, 16)).copy()
    for i in range(3):
        for j in range(3):
            window = x[:, :, i : i + 16, j : j + 16].astype(np.float64)
            out += np.einsum("nchw,fc->nfhw", window, w[:, :, i, j].astype(np.float64))
    payload = tmp_path / "conv.mlir"
    payload.write_text(_payload(c, f, size))
    np.savez(tmp_path / "conv.npz", in0=x, in1=w, in2=b, out0=out.astype(np.float32))
    graph = load_graph("x86").with_config(
        "normalize", path="gemm", patch_block_l2_fraction=fraction
    )
    dumped = tmp_path / "ir"
    report = sg.run(graph, str(payload), threads=1, target="x86-64-v3", dump_ir=str(dumped))
    assert report.verified is True, report
    [normalized] = [p for p in dumped.iterdir() if "normalize" in p.name]
    with new_context():
        module = ir.Module.parse(normalized.read_text())
        loops = collect(module.operation, lambda op: op.name == "scf.for")
    assert len(loops) == (1 if fraction else 0)


def test_several_images_run_one_by_one_into_the_output_layout():
    """Two images: one loop over (image, row block) accumulating into the init's own
    [N, F, H, W] layout, so neither the bias init nor the result is transposed."""
    text = _payload(8, 16, 18).replace("tensor<1x", "tensor<2x")
    with new_context(), ir.Location.unknown():
        module = ir.Module.parse(text)
        count = convolutions_to_gemm(module, _SMALL_BLOCKS, _with_l2(_V4, 1 << 20))
        assert count == 1 and module.operation.verify()
        [loop] = collect(module.operation, lambda op: op.name == "scf.for")
        bounds = [ir.IntegerAttr(loop.operands[i].owner.attributes["value"]).value for i in (0, 1)]
        assert bounds == [0, 2 * 4]  # 2 images x 4 blocks of 4 rows
        assert not collect(module.operation, lambda op: op.name == "linalg.transpose")
        assert ir.RankedTensorType(loop.results[0].type).shape == [2, 16, 16, 16]


def test_narrow_images_share_one_gemm():
    """Images of at least 4 register panels of outputs (128 columns on AVX-512, 64 on
    AVX2) run one by one; 32 images of 19 outputs (KernelBench l1_076) share one GEMM."""
    config = ConvGemmConfig()
    narrow = ConvShape(32, 32, 64, (3,), (19,), (3,), (4,))
    assert not per_image(narrow, _V4, config, "f32")
    wide = ConvShape(2, 8, 16, (3, 3), (16, 16), (1, 1), (1, 1))
    assert per_image(wide, _V4, config, "f32")
    edge = ConvShape(2, 8, 16, (3, 3), (8, 12), (1, 1), (1, 1))  # 96 outputs
    v3 = resolve_target("x86-64-v3")
    assert per_image(edge, v3, config, "f32") and not per_image(edge, _V4, config, "f32")
