"""Stride-1 transposed convolutions whose GEMM products exceed ``col2im_max_elements`` run
col2im in blocks of images (``conv.col2im.images_per_block``): one loop over the blocks
around one matmul of a block's columns, and values against a direct numpy transposed
convolution."""

from __future__ import annotations

import numpy as np
import pytest

import stagegraph as sg
from stagegraph.core.catalog import load_graph
from stagegraph.mlir.bindings import ir, new_context
from stagegraph.mlir.walk import collect
from stagegraph.stages.x86.conv.col2im import images_per_block, stride1_transposed_to_col2im
from stagegraph.stages.x86.conv.config import ConvGemmConfig
from stagegraph.stages.x86.matmul.sites import matmul_like_ops
from tests.test_conv_col2im import _ALWAYS, _CASES, _rewritten
from tests.test_transposed_conv import _payload, _reference, _sizes


def test_images_per_block_is_the_largest_divisor_that_fits():
    # KernelBench's l1_065 at 16x: 128 images of 16 filters x 21 taps x 256 positions
    assert images_per_block(128, 16 * 21 * 256, 1 << 22) == 32
    assert images_per_block(8, 16 * 21 * 256, 1 << 22) == 8  # the shipped size: one block
    assert images_per_block(6, 10, 45) == 3  # 4 would fit, but does not divide 6
    assert images_per_block(5, 10, 45) == 1
    assert images_per_block(4, 10, 9) == 0  # one image's products already too many


def _products_per_image(case: str, f: int) -> int:
    image, kernel, *_ = _CASES[case]
    return f * int(np.prod(kernel)) * int(np.prod(image))


@pytest.mark.parametrize("case", ["1d", "2d_padded", "3d"])
def test_a_batch_too_large_for_one_gemm_loops_over_blocks_of_images(case):
    """Four images, room for two: a loop of two steps of two images, around one matmul
    whose columns are two images' input positions."""
    image, kernel, dilation, pad, high = _CASES[case]
    n, c, f = 4, 3, 5
    text = _payload(n, c, f, image, (1,) * len(image), kernel, dilation, pad, high, "bias")
    config = _ALWAYS.model_copy(update={"col2im_max_elements": 2 * _products_per_image(case, f)})
    with new_context(), ir.Location.unknown():
        module = ir.Module.parse(text)
        assert stride1_transposed_to_col2im(module, config) == 1
        assert module.operation.verify()
        (loop,) = collect(module.operation, lambda op: op.name == "scf.for")
        [step] = [ir.IntegerAttr(o.owner.attributes["value"]).value for o in loop.operands[2:3]]
        assert step == 2
        (matmul,) = collect(module.operation, lambda op: op.name == "linalg.matmul")
        assert matmul.parent.name == "scf.for"  # inside the loop over image blocks
    assert _rewritten(text, config)[0] == 1
    _, names, facts = _rewritten(text, config)
    [site] = matmul_like_ops(facts)
    assert site.contraction.n == 2 * int(np.prod(image))
    assert not [name for name in names if name.startswith("linalg.conv")]


@pytest.mark.parametrize(("case", "init"), [("2d_padded", "zero"), ("3d", "bias")])
def test_blocks_of_images_match_a_direct_transposed_convolution(tmp_path, case, init):
    """Six images in blocks of three (x86-64-v3: runs on every host of the project)."""
    image, kernel, dilation, pad, high = _CASES[case]
    n, c, f = 6, 3, 5
    ones = (1,) * len(image)
    _, out = _sizes(image, ones, kernel, dilation, pad, high)
    rng = np.random.default_rng(9)
    x = rng.standard_normal((n, c, *image), dtype=np.float32)
    w = rng.standard_normal((f, c, *kernel), dtype=np.float32)
    b = rng.standard_normal(f, dtype=np.float32)
    path = tmp_path / "t.mlir"
    path.write_text(_payload(n, c, f, image, ones, kernel, dilation, pad, high, init))
    expected = _reference(x, w, b, ones, kernel, dilation, pad, out, init)
    np.savez(tmp_path / "t.npz", in0=x, in1=w, in2=b, out0=expected)
    most = 4 * _products_per_image(case, f)  # 3 images fit, 6 do not; 4 does not divide 6
    graph = load_graph("x86").with_config(
        "normalize", add_cost=0.0, direct_efficiency=0.5, col2im_max_elements=most
    )
    dumped = tmp_path / "ir"
    report = sg.run(graph, str(path), threads=1, target="x86-64-v3", dump_ir=str(dumped))
    assert report.verified is True, report
    [normalized] = [p for p in dumped.iterdir() if "normalize" in p.name]
    with new_context():
        module = ir.Module.parse(normalized.read_text())
        assert len(collect(module.operation, lambda op: op.name == "scf.for")) == 1
        assert not collect(module.operation, lambda op: op.name.startswith("linalg.conv"))
    assert ConvGemmConfig().col2im_max_elements == 1 << 22  # the default these tests scale
