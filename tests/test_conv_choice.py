"""The per-convolution choice between the direct path and the implicit GEMM
(:mod:`stagegraph.stages.x86.conv.choice`): what the cost model picks on pinned targets
for real-size and small shapes, the decision stamped on the IR, the ``path``/``paths``
knobs overriding it, and values of both paths against numpy."""

from __future__ import annotations

import numpy as np
import pytest

import stagegraph as sg
from stagegraph.core.catalog import load_graph
from stagegraph.mlir.bindings import ir, new_context
from stagegraph.mlir.walk import collect
from stagegraph.stages.target import resolve_target, target_from_override
from stagegraph.stages.x86.conv.choice import (
    PATH_ATTRIBUTE,
    choose_path,
    conv_key,
    direct_cycles,
    stamped_choices,
)
from stagegraph.stages.x86.conv.config import ConvGemmConfig
from stagegraph.stages.x86.conv.gemm import ConvShape, convolutions_to_gemm

_V4, _V3 = resolve_target("x86-64-v4"), resolve_target("x86-64-v3")


def _old_paths(**fields) -> ConvGemmConfig:
    """The direct-or-GEMM choice this file pins: Winograd off (tests/test_winograd.py)."""
    return ConvGemmConfig(**{"winograd": False, **fields})


def _conv(n, c, f, size, k, stride) -> ConvShape:
    """A padded ``k``x``k`` 2-D convolution of a ``size``x``size`` image (PyTorch's
    ``padding=k//2``), as the payload's padded input sees it."""
    out = (size + 2 * (k // 2) - k) // stride + 1
    return ConvShape(n, c, f, (k, k), (out, out), (stride, stride), (1, 1))


# ResNet-18 and VGG-16 at batch 1 on 224x224 images: convolutions the GEMM measured faster
# (benchmarks/conv_paths.py, docs/measurements.md) and ones the direct path did.
_GEMM = {
    "resnet18 conv1 7x7/2": _conv(1, 3, 64, 224, 7, 2),
    "resnet18 layer3 3x3": _conv(1, 256, 256, 14, 3, 1),
    "resnet18 layer4 3x3/2": _conv(1, 256, 512, 14, 3, 2),
    "resnet18 layer4 3x3": _conv(1, 512, 512, 7, 3, 1),
    "vgg16 block3": _conv(1, 256, 256, 56, 3, 1),
    "vgg16 block4": _conv(1, 512, 512, 28, 3, 1),
}
_DIRECT = {
    "8 images, 32 channels, 14x14": ConvShape(8, 32, 32, (3, 3), (14, 14), (1, 1), (1, 1)),
    "16 images, 16 channels": ConvShape(16, 16, 16, (3, 3), (14, 14), (1, 1), (1, 1)),
}
# 64-128 channels: direct 1.04-1.29x faster than the GEMM on AVX-512 once the result's
# transpose reads whole cache lines (docs/measurements.md, "Transposes that read whole
# cache lines"; ResNet-18's 64->128 3x3/2 layer measured a tie, 1.00 [0.96, 1.12], and is
# left out). On AVX2 the 224^2 layer measured direct 1.19x faster, ResNet-18's layer1 1.12x
# (session 22, docs/measurements.md, "Few input channels: direct or GEMM"); the others keep
# the GEMM. VGG-16's first layer (3 channels) runs direct since session 22: see
# tests/test_conv_few_channels.py.
_DIRECT_V4 = {
    "resnet18 layer1 3x3": _conv(1, 64, 64, 56, 3, 1),
    "resnet18 layer2 3x3": _conv(1, 128, 128, 28, 3, 1),
    "vgg16 block1 second": _conv(1, 64, 64, 224, 3, 1),
    "vgg16 block2": _conv(1, 128, 128, 112, 3, 1),
}
_DIRECT_V3 = ("vgg16 block1 second", "resnet18 layer1 3x3")


@pytest.mark.parametrize("target", [_V4, _V3], ids=["v4", "v3"])
@pytest.mark.parametrize("name", sorted(_GEMM))
def test_the_cost_model_sends_real_size_layers_to_the_gemm(name, target):
    choice = choose_path(_GEMM[name], target, _old_paths())
    assert (choice.path, choice.decided_by) == ("gemm", "cost model"), choice


@pytest.mark.parametrize("name", sorted(_DIRECT_V4))
def test_the_cost_model_runs_64_to_128_channel_layers_direct_on_avx512(name):
    choice = choose_path(_DIRECT_V4[name], _V4, _old_paths())
    assert (choice.path, choice.decided_by) == ("direct", "cost model"), choice
    on_avx2 = choose_path(_DIRECT_V4[name], _V3, _old_paths())
    assert on_avx2.path == ("direct" if name in _DIRECT_V3 else "gemm"), on_avx2


@pytest.mark.parametrize("target", [_V4, _V3], ids=["v4", "v3"])
@pytest.mark.parametrize("name", sorted(_DIRECT))
def test_the_cost_model_keeps_direct_shapes_direct(name, target):
    choice = choose_path(_DIRECT[name], target, _old_paths())
    assert (choice.path, choice.decided_by) == ("direct", "cost model"), choice


def test_a_3d_convolution_of_32_channels_stays_direct_on_avx512():
    """One 16^3 volume of 32 channels (measured: GEMM 0.29x the direct path): 27 taps of
    32 channels make a large patch matrix per row block for 32 filters to share."""
    shape = ConvShape(1, 32, 32, (3, 3, 3), (16, 16, 16), (1, 1, 1), (1, 1, 1))
    assert choose_path(shape, _V4, _old_paths()).path == "direct"


def test_the_estimates_read_the_target():
    """A filter past L2 streams from L3 once per output row: a larger L2 removes that
    cost; a wider FMA makes both paths faster."""
    shape = _GEMM["resnet18 layer4 3x3"]  # a 9.4 MB filter
    config = _old_paths()
    small, large = (
        target_from_override(**{**_V4.model_dump(), "l2_bytes": size})
        for size in (2 << 20, 32 << 20)
    )
    assert direct_cycles(shape, large, config) < 0.8 * direct_cycles(shape, small, config)
    assert direct_cycles(shape, _V4, config) < direct_cycles(shape, _V3, config)


def test_the_key_names_every_size():
    shape = ConvShape(2, 3, 8, (3, 5), (7, 6), (2, 1), (1, 2))
    assert conv_key(shape) == "conv2d.n2.c3.f8.k3x5.o7x6.s2x1.d1x2"


def _payload(n, c, f, image, kernel) -> str:
    """@main(x, w): a stride-1 channels-first 2-D convolution on a zero init."""
    out = [i - k + 1 for i, k in zip(image, kernel, strict=True)]

    def dims(values):
        return "x".join(str(v) for v in values)

    x, w, y = dims([n, c, *image]), dims([f, c, *kernel]), dims([n, f, *out])
    return f"""
func.func @main(%x: tensor<{x}xf32>, %w: tensor<{w}xf32>) -> tensor<{y}xf32> {{
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<{y}xf32>
  %i = linalg.fill ins(%z : f32) outs(%e : tensor<{y}xf32>) -> tensor<{y}xf32>
  %r = linalg.conv_2d_nchw_fchw
    {{dilations = dense<1> : vector<2xi64>, strides = dense<1> : vector<2xi64>}}
    ins(%x, %w : tensor<{x}xf32>, tensor<{w}xf32>) outs(%i : tensor<{y}xf32>)
    -> tensor<{y}xf32>
  return %r : tensor<{y}xf32>
}}
"""


# A layer4-like convolution (512 channels, 9x9 -> 7x7) and a small one (8 images of 16x16).
_BIG = _payload(1, 512, 512, (9, 9), (3, 3))
_SMALL = _payload(8, 32, 32, (16, 16), (3, 3))


def _normalized(text: str, config: ConvGemmConfig, target=_V4):
    """(rewrite count, stamped choices, names of the ops carrying a choice)."""
    with new_context(), ir.Location.unknown():
        module = ir.Module.parse(text)
        count = convolutions_to_gemm(module, config, target)
        assert module.operation.verify()
        stamped = collect(module.operation, lambda op: PATH_ATTRIBUTE in op.attributes)
        return count, stamped_choices(module), [op.name for op in stamped]


def test_the_decision_is_stamped_on_the_op_that_runs_it():
    count, [choice], names = _normalized(_BIG, _old_paths())
    assert count == 1 and names == ["linalg.matmul"]
    assert choice.path == "gemm" and choice.gemm_cycles < choice.direct_cycles
    assert choice.key == "conv2d.n1.c512.f512.k3x3.o7x7.s1x1.d1x1"
    count, [choice], names = _normalized(_SMALL, _old_paths())
    assert count == 0 and names == ["linalg.conv_2d_nchw_fchw"]
    assert choice.path == "direct" and choice.decided_by == "cost model"


def test_the_knobs_override_the_cost_model():
    key = "conv2d.n1.c512.f512.k3x3.o7x7.s1x1.d1x1"
    count, [choice], names = _normalized(_BIG, _old_paths(paths={key: "direct"}))
    assert count == 0 and names == ["linalg.conv_2d_nchw_fchw"]
    assert (choice.path, choice.decided_by) == ("direct", "paths")
    count, [choice], _ = _normalized(_SMALL, _old_paths(path="gemm"))
    assert count == 1 and (choice.path, choice.decided_by) == ("gemm", "path")
    # a key of another shape leaves this one to the cost model
    count, [choice], _ = _normalized(_BIG, _old_paths(paths={"conv2d.n9": "direct"}))
    assert count == 1 and choice.decided_by == "cost model"
    assert _normalized(_BIG, _old_paths(conv_gemm=False))[:2] == (0, [])


def test_a_path_outside_the_choices_is_refused():
    with pytest.raises(ValueError, match="direct"):
        ConvGemmConfig(paths={"conv2d.n1": "im2col"})


@pytest.mark.parametrize("path", ["direct", "gemm"])
def test_both_paths_match_numpy_on_avx2(tmp_path, path):
    """Through the x86 graph pinned to x86-64-v3: the knob picks the path the normalized
    IR shows, and the values match a float64 numpy convolution."""
    n, c, f, image, kernel = 2, 8, 16, (9, 10), (3, 3)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((n, c, *image), dtype=np.float32)
    w = rng.standard_normal((f, c, *kernel), dtype=np.float32)
    out = np.zeros((n, f, image[0] - 2, image[1] - 2))
    for i in range(3):
        for j in range(3):
            window = x[:, :, i : i + image[0] - 2, j : j + image[1] - 2].astype(np.float64)
            out += np.einsum("nchw,fc->nfhw", window, w[:, :, i, j].astype(np.float64))
    payload = tmp_path / "conv.mlir"
    payload.write_text(_payload(n, c, f, image, kernel))
    np.savez(tmp_path / "conv.npz", in0=x, in1=w, out0=out.astype(np.float32))
    key = "conv2d.n2.c8.f16.k3x3.o7x8.s1x1.d1x1"
    graph = load_graph("x86").with_config("normalize", paths={key: path})
    dumped = tmp_path / "ir"
    report = sg.run(graph, str(payload), threads=1, target="x86-64-v3", dump_ir=str(dumped))
    assert report.verified is True, report
    [normalized] = [p for p in dumped.iterdir() if "normalize" in p.name]
    with new_context():
        module = ir.Module.parse(normalized.read_text())
        [choice] = stamped_choices(module)
        matmuls = collect(module.operation, lambda op: op.name == "linalg.matmul")
    assert (choice.key, choice.path, choice.decided_by) == (key, path, "paths")
    assert len(matmuls) == (1 if path == "gemm" else 0)


def test_the_x86_graph_feeds_its_target_to_normalize():
    graph = load_graph("x86")
    sources = {e.src for e in graph.in_edges("normalize")}
    assert "target" in sources
