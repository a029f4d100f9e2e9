"""Stride-1 transposed convolutions as a GEMM on the real input then shifted adds
(``x86.normalize``, :mod:`stagegraph.stages.x86.conv.col2im`): the IR, the cost model's
choice, and values against a direct numpy transposed convolution."""

from __future__ import annotations

import numpy as np
import pytest

import stagegraph as sg
from stagegraph.core.catalog import load_graph
from stagegraph.mlir.bindings import ir, new_context
from stagegraph.mlir.walk import collect
from stagegraph.stages.analysis import analyze
from stagegraph.stages.x86.conv.col2im import (
    col2im_worth,
    stride1_transposed_to_col2im,
    useful_fraction,
)
from stagegraph.stages.x86.conv.config import ConvGemmConfig
from stagegraph.stages.x86.matmul.sites import matmul_like_ops
from tests.test_transposed_conv import _payload, _reference, _sizes

# (image, kernel, dilation, pad, high) per spatial dim, stride 1 (a zero border only).
_CASES = {
    "1d": ((9,), (3,), (1,), (2,), (2,)),
    "1d_dilated": ((8,), (3,), (2,), (4,), (4,)),
    "2d": ((5, 6), (3, 2), (1, 1), (2, 1), (2, 1)),
    "2d_padded": ((6, 5), (3, 5), (1, 1), (1, 2), (1, 2)),
    "3d": ((3, 4, 2), (3, 2, 3), (1, 1, 1), (2, 1, 2), (2, 1, 2)),
}
_ALWAYS = ConvGemmConfig(add_cost=0.0, gemm_efficiency=1.0, direct_efficiency=0.5)


def _rewritten(text: str, config: ConvGemmConfig = _ALWAYS):
    with new_context(), ir.Location.unknown():
        module = ir.Module.parse(text)
        count = stride1_transposed_to_col2im(module, config)
        assert module.operation.verify()
        names = [op.name for op in collect(module.operation, lambda op: "linalg." in op.name)]
        return count, names, analyze(module)


def _live_taps(image, kernel, dilation, pad, out) -> int:
    """Taps that land at least one real input inside the output, counted by brute force."""
    count = 1
    for size, k_size, d, p, o_size in zip(image, kernel, dilation, pad, out, strict=True):
        count *= sum(any(0 <= i - k * d + p < o_size for i in range(size)) for k in range(k_size))
    return count


@pytest.mark.parametrize("case", sorted(_CASES))
def test_a_padded_convolution_becomes_a_matmul_on_the_real_input_and_shifted_adds(case):
    image, kernel, dilation, pad, high = _CASES[case]
    n, c, f = 2, 3, 5
    ones = (1,) * len(image)
    _, out = _sizes(image, ones, kernel, dilation, pad, high)
    text = _payload(n, c, f, image, ones, kernel, dilation, pad, high, init="bias")
    count, names, facts = _rewritten(text)
    assert count == 1
    assert not [name for name in names if name.startswith("linalg.conv")]
    assert names.count("linalg.matmul") == 1
    [matmul] = matmul_like_ops(facts)  # the packed kernel's, all images at once
    taps = int(np.prod(kernel))
    assert (matmul.contraction.m, matmul.contraction.k) == (f * taps, c)
    assert matmul.contraction.n == n * int(np.prod(image))  # the real input, not the padded
    adds = [name for name in names if name == "linalg.generic"]
    assert len(adds) == _live_taps(image, kernel, dilation, pad, out)  # one per live tap
    assert names.count("linalg.transpose") == 2  # the filter by tap, the input by channel


def test_the_cost_model_takes_it_when_the_border_wastes_enough():
    # a 3x3x3 window on a 6^3 input padded by 2: 42% of the flops are useful
    u = useful_fraction((6, 6, 6), (8, 8, 8), (3, 3, 3), (2, 2, 2), (1, 1, 1))
    assert u == pytest.approx((6 * 3 / 24) ** 3)
    assert col2im_worth(12, u, ConvGemmConfig())
    # "same" padding: little is wasted, the direct path stays
    u = useful_fraction((16, 16), (16, 16), (3, 7), (1, 3), (1, 1))
    assert u > 0.8 and not col2im_worth(32, u, ConvGemmConfig())
    image, kernel, dilation, pad, high = _CASES["2d"]
    text = _payload(1, 3, 4, image, (1, 1), kernel, dilation, pad, high, init="zero")
    assert _rewritten(text, ConvGemmConfig(col2im=False))[0] == 0
    assert _rewritten(text, ConvGemmConfig(conv_gemm=False))[0] == 0
    # products: 1 image x 4 filters x 6 taps x 30 positions = 720 elements
    bounded = _ALWAYS.model_copy(update={"col2im_max_elements": 719})
    assert _rewritten(text, bounded)[0] == 0
    assert _rewritten(text, bounded.model_copy(update={"col2im_max_elements": 720}))[0] == 1


def test_a_strided_insert_or_a_nonzero_border_is_left_alone():
    image, kernel, dilation, pad, high = _CASES["2d"]
    strided = _payload(1, 3, 4, image, (2, 2), kernel, dilation, pad, high, init="zero")
    assert _rewritten(strided)[0] == 0
    ones = _payload(1, 3, 4, image, (1, 1), kernel, dilation, pad, high, "zero", "ones")
    assert _rewritten(ones)[0] == 0


@pytest.mark.parametrize(("case", "init"), [("1d_dilated", "bias"), ("2d_padded", "zero"),
                                            ("3d", "bias")])  # fmt: skip
@pytest.mark.parametrize("target", ["x86-64-v3"])  # runs on every host of the project
def test_col2im_matches_a_direct_transposed_convolution(tmp_path, case, init, target):
    """Odd channel counts; the graph's normalize config forces the rewrite (with 3
    channels the default cost model leaves these to the other paths)."""
    image, kernel, dilation, pad, high = _CASES[case]
    n, c, f = 2, 3, 5
    ones = (1,) * len(image)
    _, out = _sizes(image, ones, kernel, dilation, pad, high)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((n, c, *image), dtype=np.float32)
    w = rng.standard_normal((f, c, *kernel), dtype=np.float32)
    b = rng.standard_normal(f, dtype=np.float32)
    path = tmp_path / "t.mlir"
    path.write_text(_payload(n, c, f, image, ones, kernel, dilation, pad, high, init))
    expected = _reference(x, w, b, ones, kernel, dilation, pad, out, init)
    np.savez(tmp_path / "t.npz", in0=x, in1=w, in2=b, out0=expected)
    dumped = tmp_path / "ir"
    graph = load_graph("x86").with_config("normalize", add_cost=0.0, direct_efficiency=0.5)
    report = sg.run(graph, str(path), threads=1, target=target, dump_ir=str(dumped))
    assert report.verified is True, report
    [normalized] = [p for p in dumped.iterdir() if "normalize" in p.name]
    with new_context():
        module = ir.Module.parse(normalized.read_text())
        assert not collect(module.operation, lambda op: op.name.startswith("linalg.conv"))
        assert len(collect(module.operation, lambda op: op.name == "linalg.matmul")) == 1
