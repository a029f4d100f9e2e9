"""Stride-1 transposed convolutions run col2im in blocks of images whose GEMM products fit
``col2im_block_l2_fraction`` of L2 (``conv.col2im.images_per_block``): one loop over the blocks
around one matmul of a block's columns, and values against a direct numpy transposed
convolution."""

from __future__ import annotations

import numpy as np
import pytest

import stagegraph as sg
from stagegraph.core.catalog import load_graph
from stagegraph.mlir.bindings import ir, new_context
from stagegraph.mlir.walk import collect
from stagegraph.stages.analysis import analyze
from stagegraph.stages.target import named_x86_target
from stagegraph.stages.x86.conv.col2im import images_per_block, stride1_transposed_to_col2im
from stagegraph.stages.x86.matmul.sites import matmul_like_ops
from tests.test_conv_col2im import _ALWAYS, _CASES
from tests.test_transposed_conv import _payload, _reference, _sizes


def test_images_per_block_is_the_largest_divisor_that_fits_the_cache():
    # KernelBench's l1_065 (16 filters x 21 taps x 256 positions per image), half of a
    # 2 MB L2 in f32 elements: 2 images per block at 8 images or at 128
    per_image, cached = 16 * 21 * 256, (1 << 20) // 4
    assert images_per_block(128, per_image, 1 << 22, cached) == 2
    assert images_per_block(8, per_image, 1 << 22, cached) == 2
    assert images_per_block(8, per_image, 1 << 22, 8 * per_image) == 8  # one block
    assert images_per_block(6, 10, 1000, 45) == 3  # 4 would fit, but does not divide 6
    assert images_per_block(5, 10, 1000, 45) == 1
    assert images_per_block(4, 100, 1000, 50) == 1  # past the cache: one image a block
    assert images_per_block(4, 10, 9, 100) == 0  # one image's products past the limit


_TARGET = named_x86_target("x86-64-v3")


def _fraction(case: str, f: int, images: float) -> float:
    """``col2im_block_l2_fraction`` whose share of ``_TARGET``'s L2 holds the f32
    products of ``images`` images."""
    image, kernel, *_ = _CASES[case]
    per_image = f * int(np.prod(kernel)) * int(np.prod(image))
    return images * per_image * 4 / _TARGET.l2_bytes


@pytest.mark.parametrize("case", ["1d", "2d_padded", "3d"])
def test_a_batch_too_large_for_one_gemm_loops_over_blocks_of_images(case):
    """Four images, room for two and a half: a loop of two steps of two images, around one matmul
    whose columns are two images' input positions."""
    image, kernel, dilation, pad, high = _CASES[case]
    n, c, f = 4, 3, 5
    text = _payload(n, c, f, image, (1,) * len(image), kernel, dilation, pad, high, "bias")
    config = _ALWAYS.model_copy(update={"col2im_block_l2_fraction": _fraction(case, f, 2.5)})
    with new_context(), ir.Location.unknown():
        module = ir.Module.parse(text)
        assert stride1_transposed_to_col2im(module, config, _TARGET) == 1
        assert module.operation.verify()
        (loop,) = collect(module.operation, lambda op: op.name == "scf.for")
        [step] = [ir.IntegerAttr(o.owner.attributes["value"]).value for o in loop.operands[2:3]]
        assert step == 2
        (matmul,) = collect(module.operation, lambda op: op.name == "linalg.matmul")
        assert matmul.parent.name == "scf.for"  # inside the loop over image blocks
        (site,) = matmul_like_ops(analyze(module))
        assert site.contraction.n == 2 * int(np.prod(image))
        assert not collect(module.operation, lambda op: op.name.startswith("linalg.conv"))


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
    graph = load_graph("x86").with_config(  # room for 4.5 images: 3 divide 6
        "normalize", add_cost=0.0, direct_efficiency=0.5,
        col2im_block_l2_fraction=_fraction(case, f, 4.5),
    )  # fmt: skip
    dumped = tmp_path / "ir"
    report = sg.run(graph, str(path), threads=1, target="x86-64-v3", dump_ir=str(dumped))
    assert report.verified is True, report
    [normalized] = [p for p in dumped.iterdir() if "normalize" in p.name]
    with new_context():
        module = ir.Module.parse(normalized.read_text())
        assert len(collect(module.operation, lambda op: op.name == "scf.for")) == 1
        assert not collect(module.operation, lambda op: op.name.startswith("linalg.conv"))
