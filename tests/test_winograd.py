"""Winograd F(m, 3) for 3x3 stride-1 2-D convolutions (:mod:`stagegraph.stages.x86.conv.winograd`):
its matrices against a float64 correlation, the IR ``x86.normalize`` makes when the cost
model or the knobs choose it (and does not make when they do not), the filter transform of
constant weights folded at compile time, values through the x86 graph against PyTorch on
odd sizes with padding, bias and ReLU, and the cost model's choice on pinned targets."""

from __future__ import annotations

import numpy as np
import pytest

import stagegraph as sg
from stagegraph.core.catalog import load_graph
from stagegraph.mlir.bindings import ir, new_context
from stagegraph.mlir.walk import collect
from stagegraph.stages.target import resolve_target
from stagegraph.stages.x86.conv.choice import PATH_ATTRIBUTE, choose_path, stamped_choices
from stagegraph.stages.x86.conv.config import ConvGemmConfig
from stagegraph.stages.x86.conv.conv_shape import ConvShape
from stagegraph.stages.x86.conv.gemm import convolutions_to_gemm
from stagegraph.stages.x86.conv.path_params import ConvPathParams, normalize_paths
from stagegraph.stages.x86.conv.winograd_math import (
    conv2d_winograd,
    filter_transform,
    matrices,
)

_V4, _V3 = resolve_target("x86-64-v4"), resolve_target("x86-64-v3")


def _correlation(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The unpadded stride-1 correlation in float64 (what linalg.conv_2d_nchw_fchw sums)."""
    n, _, h, width = x.shape
    out = np.zeros((n, w.shape[0], h - 2, width - 2))
    for i in range(3):
        for j in range(3):
            window = x[:, :, i : i + h - 2, j : j + width - 2].astype(np.float64)
            out += np.einsum("nchw,fc->nfhw", window, w[:, :, i, j].astype(np.float64))
    return out


@pytest.mark.parametrize("m", [2, 4])
def test_the_matrices_compute_the_correlation(m):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 5, 11, 9))  # 9x7 outputs: not whole tiles of 2 or 4
    w = rng.standard_normal((3, 5, 3, 3))
    np.testing.assert_allclose(conv2d_winograd(x, w, m), _correlation(x, w), atol=1e-9)
    assert filter_transform(w.astype(np.float32), m).shape == ((m + 2) ** 2, 5, 3)
    assert filter_transform(w.astype(np.float32), m).dtype == np.float32


def test_an_unknown_tile_is_refused():
    with pytest.raises(ValueError, match="F\\(3, 3\\)"):
        matrices(3)


def _payload(n, c, f, image, constant_weights: bool) -> str:
    """@main: a stride-1 3x3 NCHW convolution on a zero init; the weights a dense constant
    or the second argument."""
    out = [s - 2 for s in image]

    def dims(values):
        return "x".join(str(v) for v in values)

    x, w, y = dims([n, c, *image]), dims([f, c, 3, 3]), dims([n, f, *out])
    weights = np.linspace(-1, 1, f * c * 9).reshape(f, c, 3, 3)
    dense = "[" + ", ".join(f"{v:.6f}" for v in weights.reshape(-1)) + "]"
    args = f"%x: tensor<{x}xf32>" + ("" if constant_weights else f", %w: tensor<{w}xf32>")
    constant = (
        f"%w0 = arith.constant dense<{dense}> : tensor<{f * c * 9}xf32>\n"
        f"  %w = tensor.expand_shape %w0 [[0, 1, 2, 3]] output_shape [{f}, {c}, 3, 3]"
        f" : tensor<{f * c * 9}xf32> into tensor<{w}xf32>"
        if constant_weights
        else ""
    )
    return f"""
func.func @main({args}) -> tensor<{y}xf32> {{
  {constant}
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


def _normalized(text: str, config: ConvGemmConfig):
    """(names of the ops of @main after the rewrite, stamped choices, generics' iterator
    kinds) of ``text`` normalized by ``convolutions_to_gemm`` for x86-64-v4."""
    with new_context(), ir.Location.unknown():
        module = ir.Module.parse(text)
        convolutions_to_gemm(module, config, _V4)
        assert module.operation.verify()
        names = [op.name for op in collect(module.operation)]
        generics = collect(module.operation, lambda op: op.name == "linalg.generic")
        kinds = [str(op.attributes["iterator_types"]) for op in generics]
        results = [len(op.results) for op in generics]
        stamped = collect(module.operation, lambda op: PATH_ATTRIBUTE in op.attributes)
        return names, stamped_choices(module), kinds, results, [op.name for op in stamped]


@pytest.mark.parametrize("m", [2, 4])
def test_the_rewrite_makes_alpha_squared_matmuls_and_folds_constant_filters(m):
    text = _payload(2, 4, 8, (9, 8), constant_weights=True)
    names, [choice], kinds, results, stamped = _normalized(
        text, ConvGemmConfig(path="winograd", winograd_tile=m)
    )
    side = m + 2
    assert "linalg.conv_2d_nchw_fchw" not in names
    assert names.count("linalg.matmul") == side * side
    assert (choice.path, choice.decided_by) == ("winograd", "path")
    assert stamped == ["linalg.matmul"]  # one stamp per convolution
    # the input transform (alpha^2 results) and the output transform (m^2), no reduction:
    # the filter's transform was computed at compile time
    assert sorted(results) == sorted([side * side, m * m])
    assert not any("reduction" in k for k in kinds)
    assert names.count("linalg.transpose") == 2  # to channels-last and back


@pytest.mark.parametrize("constant_weights", [True, False])
def test_the_loop_form_makes_one_matmul(constant_weights):
    """``winograd_loop``: one matmul in an ``scf.for`` over the 36 taps, reading slices
    of the stacked transformed inputs and filters (one ``[36, C, F]`` constant)."""
    text = _payload(2, 4, 8, (9, 8), constant_weights=constant_weights)
    names, [choice], kinds, results, stamped = _normalized(
        text, ConvGemmConfig(path="winograd", winograd_loop=True)
    )
    assert names.count("linalg.matmul") == 1 and names.count("scf.for") == 1
    assert choice.path == "winograd" and stamped == ["linalg.matmul"]
    assert sorted(results) == sorted([36, 16, *([1] if not constant_weights else [])])
    assert sum("reduction" in k for k in kinds) == (0 if constant_weights else 1)


def test_the_loop_form_matches_pytorch(tmp_path):
    pytest.importorskip("torch")
    problem = tmp_path / "conv_relu.py"
    problem.write_text(_PROBLEM)
    graph = load_graph("x86").with_config("normalize", path="winograd", winograd_loop=True)
    report = sg.run(graph, str(problem), threads=1, target="x86-64-v4")
    assert report.verified is True, report


def test_weights_that_are_arguments_are_transformed_per_call():
    text = _payload(1, 4, 8, (6, 6), constant_weights=False)
    names, [choice], kinds, _, _ = _normalized(text, ConvGemmConfig(path="winograd"))
    assert choice.path == "winograd" and names.count("linalg.matmul") == 36
    assert sum("reduction" in k for k in kinds) == 1  # the contraction with G (x) G


def test_winograd_off_keeps_the_old_paths():
    text = _payload(2, 4, 8, (9, 8), constant_weights=True)
    key = "conv2d.n2.c4.f8.k3x3.o7x6.s1x1.d1x1"
    off, pinned = (
        ConvGemmConfig(winograd=False, path="winograd"),
        ConvGemmConfig(paths={key: "direct"}),
    )
    for config in (off, pinned):
        names, [choice], _, _, _ = _normalized(text, config)
        assert choice.path != "winograd" and choice.winograd_cycles >= 0
        assert "linalg.conv_2d_nchw_fchw" in names or names.count("linalg.matmul") == 1


_PROBLEM = """import torch
import torch.nn as nn
n, cin, cout, h, w = 2, 5, 16, 11, 9
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1, bias=True)
    def forward(self, x):
        return torch.relu(self.conv(x))
def get_inputs():
    return [torch.rand(n, cin, h, w)]
def get_init_inputs():
    return []
"""


@pytest.mark.parametrize(("m", "target"), [(2, "x86-64-v3"), (4, "x86-64-v4")])
def test_values_match_pytorch_with_padding_bias_and_relu(tmp_path, m, target):
    """Odd 11x9 outputs (not whole tiles), padding 1, two images, a bias (the init) and a
    ReLU epilogue, through the whole x86 graph, verified against PyTorch eager."""
    pytest.importorskip("torch")
    problem = tmp_path / "conv_relu.py"
    problem.write_text(_PROBLEM)
    graph = load_graph("x86").with_config("normalize", path="winograd", winograd_tile=m)
    dumped = tmp_path / "ir"
    report = sg.run(graph, str(problem), threads=1, target=target, dump_ir=str(dumped))
    assert report.verified is True, report
    [normalized] = [p for p in dumped.iterdir() if "normalize" in p.name]
    with new_context():
        module = ir.Module.parse(normalized.read_text())
        [choice] = stamped_choices(module)
        matmuls = collect(module.operation, lambda op: op.name == "linalg.matmul")
    assert choice.path == "winograd" and len(matmuls) == (m + 2) ** 2


def _conv(n, c, f, size) -> ConvShape:
    return ConvShape(n, c, f, (3, 3), (size, size), (1, 1), (1, 1))


# 3x3 layers of ResNet-18, VGG-16 and UNet at 224^2, measured 1.2-2.1x faster as F(4, 3)
# than on the old paths (docs/measurements.md, "Winograd convolutions").
_WINOGRAD = {
    "64 at 56": _conv(1, 64, 64, 56),
    "64 at 224": _conv(1, 64, 64, 224),
    "128 at 28": _conv(1, 128, 128, 28),
    "128 at 112": _conv(1, 128, 128, 112),
    "256 at 14": _conv(1, 256, 256, 14),
    "256 at 56": _conv(1, 256, 256, 56),
    "512 at 28": _conv(1, 512, 512, 28),
}
# measured slower: 512 channels at 7^2 (4 tile positions: 0.63x), 16 channels (0.75x),
# 3 input channels (0.33x); and shapes Winograd does not take
_OLD = {
    "512 at 7": _conv(1, 512, 512, 7),
    "16 images of 16 channels": _conv(16, 16, 16, 14),
    "3 channels at 224": _conv(1, 3, 64, 224),
    "stride 2": ConvShape(1, 64, 64, (3, 3), (28, 28), (2, 2), (1, 1)),
    "dilation 2": ConvShape(1, 64, 64, (3, 3), (28, 28), (1, 1), (2, 2)),
    "5x5": ConvShape(1, 64, 64, (5, 5), (28, 28), (1, 1), (1, 1)),
}


@pytest.mark.parametrize("target", [_V4, _V3], ids=["v4", "v3"])
@pytest.mark.parametrize("name", sorted(_WINOGRAD))
def test_the_cost_model_picks_winograd_for_wide_layers(name, target):
    choice = choose_path(_WINOGRAD[name], target, ConvGemmConfig())
    assert (choice.path, choice.decided_by) == ("winograd", "cost model"), choice
    assert choice.winograd_cycles < min(choice.direct_cycles, choice.gemm_cycles)


@pytest.mark.parametrize("target", [_V4, _V3], ids=["v4", "v3"])
@pytest.mark.parametrize("name", sorted(_OLD))
def test_the_cost_model_keeps_the_old_path_where_winograd_loses(name, target):
    choice = choose_path(_OLD[name], target, ConvGemmConfig())
    assert choice.path in ("direct", "gemm"), choice
    # forcing it does not apply Winograd to a shape it cannot take
    forced = choose_path(_OLD[name], target, ConvGemmConfig(path="winograd"))
    assert (forced.path == "winograd") == (_OLD[name].strides == (1, 1) and
                                           _OLD[name].taps == (3, 3) and
                                           _OLD[name].dilations == (1, 1))  # fmt: skip


def test_the_margin_keeps_regnets_small_layer_on_the_direct_path():
    """KernelBench's RegNet (l3_027) at its shipped size: 64 channels at 7x14, 8 images,
    estimated 1.11x faster as Winograd on AVX-512, ran 0.97 [0.93, 1.00] of the direct
    path; ``winograd_margin`` keeps it direct (measured on an AVX-512 host only)."""
    shape = ConvShape(8, 64, 64, (3, 3), (7, 14), (1, 1), (1, 1))
    choice = choose_path(shape, _V4, ConvGemmConfig())
    assert choice.path == "direct" and choice.winograd_cycles < choice.direct_cycles
    assert choose_path(shape, _V4, ConvGemmConfig(winograd_margin=1.0)).path == "winograd"


def test_the_tuner_flag_becomes_the_path():
    key = "conv2d.n1.c64.f64.k3x3.o56x56.s1x1.d1x1"
    paths = normalize_paths({key: ConvPathParams(winograd=True), "other": {"gemm": True}})
    assert paths == {key: "winograd", "other": "gemm"}
    choice = choose_path(_conv(1, 64, 64, 56), _V4, ConvGemmConfig(paths={key: "direct"}))
    assert (choice.path, choice.decided_by) == ("direct", "paths")
    pinned = choose_path(_conv(1, 64, 64, 56), _V4, ConvGemmConfig(paths={key: "winograd"}))
    assert (pinned.path, pinned.decided_by) == ("winograd", "paths")


_CHAIN = """import torch
import torch.nn as nn
n, c, h, w = 2, 16, 10, 9
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(c, c, 3, padding=1, bias=True)
        self.b = nn.Conv2d(c, c, 3, padding=1, bias=False)
    def forward(self, x):
        return self.b(torch.relu(self.a(x))) + x
def get_inputs():
    return [torch.rand(n, c, h, w)]
def get_init_inputs():
    return []
"""


@pytest.mark.parametrize("chained", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_the_layout_between_two_winograd_layers_stays_channels_last(tmp_path, chained):
    """Two Winograd layers with a bias, a ReLU and a residual add: with the chain's
    layout carried (``chain_channels_last``) the transposes between them cancel (one in,
    one out), else each layer keeps its two; both verify against PyTorch."""
    pytest.importorskip("torch")
    problem = tmp_path / "chain.py"
    problem.write_text(_CHAIN)
    graph = load_graph("x86").with_config("normalize", path="winograd", chain_channels_last=chained)
    dumped = tmp_path / "ir"
    report = sg.run(graph, str(problem), threads=1, target="x86-64-v4", dump_ir=str(dumped))
    assert report.verified is True, report
    [normalized] = [p for p in dumped.iterdir() if "normalize" in p.name]
    with new_context():
        module = ir.Module.parse(normalized.read_text())
        transposes = collect(module.operation, lambda op: op.name == "linalg.transpose")
        assert [c.path for c in stamped_choices(module)] == ["winograd", "winograd"]
    assert len(transposes) == (2 if chained else 4)
