"""Channels-first convolutions as the implicit GEMM of their patches (``x86.normalize``,
:mod:`stagegraph.stages.x86.conv.gemm`): the IR it makes, the matmul the packed kernel
takes, and values against a direct numpy convolution on pinned x86-64 levels."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import stagegraph as sg
from stagegraph.core.catalog import load_graph
from stagegraph.mlir.bindings import ir, new_context
from stagegraph.mlir.walk import collect
from stagegraph.stages.analysis import analyze
from stagegraph.stages.target import detect_target, resolve_target
from stagegraph.stages.x86.conv.config import ConvGemmConfig
from stagegraph.stages.x86.conv.gemm import convolutions_to_gemm
from stagegraph.stages.x86.matmul.sites import matmul_like_ops

_CONV = {1: "conv_1d_ncw_fcw", 2: "conv_2d_nchw_fchw", 3: "conv_3d_ncdhw_fcdhw"}
# Every convolution through the GEMM (by default the cost model of conv.choice decides).
_ALL_RANKS = ConvGemmConfig(path="gemm")


def _dims(values) -> str:
    return "x".join(str(v) for v in values)


def _out(image, kernel, stride, dilation) -> list[int]:
    return [
        (i - d * (k - 1) - 1) // s + 1
        for i, k, s, d in zip(image, kernel, stride, dilation, strict=True)
    ]


def _payload(n, c, f, image, kernel, stride, dilation, init) -> str:
    """@main(x, w, b): the convolution of ``x`` with ``w`` on an init of zeros
    (``init="zero"``) or the bias ``b`` broadcast (``"bias"``)."""
    rank = len(image)
    out = _out(image, kernel, stride, dilation)
    x, w, y = _dims([n, c, *image]), _dims([f, c, *kernel]), _dims([n, f, *out])
    if init == "zero":
        start = (
            "%z = arith.constant 0.0 : f32\n"
            f"  %i = linalg.fill ins(%z : f32) outs(%e : tensor<{y}xf32>) -> tensor<{y}xf32>"
        )
    else:
        dims = ", ".join(str(d) for d in [0, *range(2, rank + 2)])
        start = (
            f"%i = linalg.broadcast ins(%b : tensor<{f}xf32>) outs(%e : tensor<{y}xf32>) "
            f"dimensions = [{dims}]"
        )
    steps, dil = ", ".join(map(str, stride)), ", ".join(map(str, dilation))
    vec = f"vector<{rank}xi64>"
    return f"""
func.func @main(%x: tensor<{x}xf32>, %w: tensor<{w}xf32>, %b: tensor<{f}xf32>)
    -> tensor<{y}xf32> {{
  %e = tensor.empty() : tensor<{y}xf32>
  {start}
  %r = linalg.{_CONV[rank]}
    {{dilations = dense<[{dil}]> : {vec}, strides = dense<[{steps}]> : {vec}}}
    ins(%x, %w : tensor<{x}xf32>, tensor<{w}xf32>) outs(%i : tensor<{y}xf32>)
    -> tensor<{y}xf32>
  return %r : tensor<{y}xf32>
}}
"""


def _reference(x, w, b, stride, dilation, init) -> np.ndarray:
    """The convolution computed tap by tap in float64."""
    n, f, kernel = x.shape[0], w.shape[0], w.shape[2:]
    out = _out(x.shape[2:], kernel, stride, dilation)
    result = np.zeros((n, f, *out))
    for tap in itertools.product(*(range(k) for k in kernel)):
        window = tuple(
            slice(t * d, t * d + s * (o - 1) + 1, s)
            for t, d, s, o in zip(tap, dilation, stride, out, strict=True)
        )
        picked = x[(slice(None), slice(None), *window)].astype(np.float64)
        weights = w[(slice(None), slice(None), *tap)].astype(np.float64)
        result += np.einsum("nc...,fc->nf...", picked, weights)
    if init == "bias":
        result += b.reshape(1, f, *([1] * len(out)))
    return result.astype(np.float32)


def _rewrite(text: str, config: ConvGemmConfig = _ALL_RANKS):
    """Rewrite count, linalg op names left, and the facts of the rewritten module."""
    with new_context(), ir.Location.unknown():
        module = ir.Module.parse(text)
        count = convolutions_to_gemm(module, config)
        assert module.operation.verify()
        names = [op.name for op in collect(module.operation, lambda op: "linalg." in op.name)]
        return count, names, analyze(module)


# (n, c, f, image, kernel, stride, dilation)
_CASES = {
    "1d": (2, 3, 5, (11,), (3,), (1,), (1,)),
    "1d_strided_dilated": (3, 4, 6, (17,), (3,), (3,), (2,)),
    "2d_one_image": (1, 3, 8, (7, 6), (3, 2), (1, 1), (1, 1)),
    "2d_asymmetric": (2, 3, 5, (9, 8), (2, 3), (2, 1), (1, 2)),
    "3d": (2, 2, 4, (4, 5, 6), (2, 3, 2), (1, 2, 1), (1, 1, 2)),
}


@pytest.mark.parametrize("case", sorted(_CASES))
def test_a_convolution_becomes_one_matmul_the_packed_kernel_takes(case):
    """No convolution is left; one ``linalg.matmul`` of filters x (channels, taps) x
    (images, outputs) that the matmul schedule canonicalizes, and one patch copy."""
    n, c, f, image, kernel, stride, dilation = _CASES[case]
    count, names, facts = _rewrite(_payload(n, c, f, image, kernel, stride, dilation, "bias"))
    assert count == 1
    assert not [name for name in names if name.startswith("linalg.conv")]
    assert names.count("linalg.matmul") == 1
    taps = int(np.prod(kernel))
    out = _out(image, kernel, stride, dilation)
    # one copy makes the patches; these images are too narrow to run one by one (see
    # gemm_blocks.per_image): one GEMM over all, a transpose of the bias init and one of
    # the result (n > 1)
    assert names.count("linalg.generic") == 1
    assert names.count("linalg.transpose") == (2 if n > 1 else 0)
    [matmul] = matmul_like_ops(facts)
    contraction = matmul.contraction
    assert (contraction.m, contraction.k, contraction.n) == (f, c * taps, n * int(np.prod(out)))


def test_few_filters_a_one_tap_window_or_the_config_keep_the_convolution():
    few = _payload(2, 3, 2, (6, 6), (3, 3), (1, 1), (1, 1), "zero")
    assert _rewrite(few)[0] == 0
    assert _rewrite(few, _ALL_RANKS.model_copy(update={"min_filters": 2}))[0] == 1
    many = _payload(2, 3, 8, (6, 6), (3, 3), (1, 1), (1, 1), "zero")
    assert _rewrite(many, ConvGemmConfig())[0] == 0  # the cost model keeps it direct
    assert _rewrite(many, ConvGemmConfig(path="gemm", ranks=frozenset({1, 3})))[0] == 0
    assert _rewrite(many, ConvGemmConfig(conv_gemm=False, path="gemm"))[0] == 0
    assert _rewrite(many, _ALL_RANKS.model_copy(update={"max_patch_elements": 100}))[0] == 0
    line = _payload(4, 32, 32, (66,), (3,), (1,), (1,), "zero")
    assert _rewrite(line, ConvGemmConfig())[0] == 1  # 1-D: the cost model takes the GEMM
    one_tap = _payload(2, 3, 8, (6, 6), (1, 1), (1, 1), (1, 1), "zero")
    count, names, _ = _rewrite(one_tap)
    assert count == 0 and "linalg.conv_2d_nchw_fchw" in names


def _run(tmp_path, case: str, init: str, target: str | None):
    n, c, f, image, kernel, stride, dilation = _CASES[case]
    rng = np.random.default_rng(3)
    x = rng.standard_normal((n, c, *image), dtype=np.float32)
    w = rng.standard_normal((f, c, *kernel), dtype=np.float32)
    b = rng.standard_normal(f, dtype=np.float32)
    path = tmp_path / "conv.mlir"
    path.write_text(_payload(n, c, f, image, kernel, stride, dilation, init))
    expected = _reference(x, w, b, stride, dilation, init)
    np.savez(tmp_path / "conv.npz", in0=x, in1=w, in2=b, out0=expected)
    dumped = tmp_path / "ir"
    graph = load_graph("x86").with_config("normalize", path="gemm")
    report = sg.run(graph, str(path), threads=1, target=target, dump_ir=str(dumped))
    normalized = [p for p in dumped.iterdir() if "normalize" in p.name]
    with new_context():
        module = ir.Module.parse(normalized[0].read_text())
        convs = collect(module.operation, lambda op: op.name.startswith("linalg.conv"))
        matmuls = collect(module.operation, lambda op: op.name == "linalg.matmul")
    return report, len(convs), len(matmuls)


@pytest.mark.parametrize(
    ("case", "init"),
    [("1d", "zero"), ("1d_strided_dilated", "bias"), ("2d_one_image", "bias"),
     ("2d_asymmetric", "zero"), ("3d", "bias")],
)  # fmt: skip
def test_the_gemm_matches_a_direct_convolution_on_avx2(tmp_path, case, init):
    """x86-64-v3 (ymm vectors, 16 registers) runs on every host of this project."""
    report, convs, matmuls = _run(tmp_path, case, init, "x86-64-v3")
    assert report.verified is True, report
    assert (convs, matmuls) == (0, 1)


@pytest.mark.parametrize(("case", "init"), [("2d_asymmetric", "bias"), ("3d", "zero")])
def test_the_gemm_matches_a_direct_convolution_on_avx512(tmp_path, case, init):
    if resolve_target("x86-64-v4").missing_on(detect_target()):
        pytest.skip("the host lacks AVX-512: x86-64-v4 code cannot run here")
    report, convs, matmuls = _run(tmp_path, case, init, "x86-64-v4")
    assert report.verified is True, report
    assert (convs, matmuls) == (0, 1)
