"""Few input channels into many filters (KernelBench's level-2 Conv2d + epilogue modules, a
small CNN's first layers): the cost model of :mod:`stagegraph.stages.x86.conv.choice` runs
them on the direct path on pinned targets (its short-reduction term ``gemm_depth_half``
and the smaller channel penalty), the big layers keep the GEMM; the direct kernel takes a
vector's worth of input channels in one reduction step (``conv_whole_channels``); and a
Conv2d + GELU + global average pool module taken that way matches numpy."""

from __future__ import annotations

import math

import numpy as np
import pytest

import stagegraph as sg
from stagegraph.core.catalog import load_graph
from stagegraph.mlir.bindings import ir, new_context
from stagegraph.mlir.diagnostics import parse_payload
from stagegraph.mlir.functions import entry_function
from stagegraph.mlir.walk import collect
from stagegraph.stages.analysis import analyze
from stagegraph.stages.target import detect_target, named_x86_target, resolve_target
from stagegraph.stages.x86.conv.choice import choose_path, gemm_cycles, stamped_choices
from stagegraph.stages.x86.conv.config import ConvGemmConfig
from stagegraph.stages.x86.conv.conv_shape import ConvShape
from stagegraph.stages.x86.generic.params import GenericParams, heuristic_generic_params
from stagegraph.stages.x86.generic.plan import convolution_plan
from stagegraph.stages.x86.generic.prepare import prepare
from tests.test_generic_schedule import _conv2d_nchw

_V4, _V3 = resolve_target("x86-64-v4"), resolve_target("x86-64-v3")
_AVX512 = pytest.mark.skipif(
    "avx512f" not in detect_target().isa, reason="host has no AVX-512 (v3 runs instead)"
)


def _padded(n: int, c: int, f: int, size: int, k: int, stride: int = 1) -> ConvShape:
    """A ``k``x``k`` convolution of a ``size``x``size`` image padded by ``k//2``."""
    out = (size + 2 * (k // 2) - k) // stride + 1
    return ConvShape(n, c, f, (k, k), (out, out), (stride, stride), (1, 1))


# Measured on an AVX-512 Xeon, one thread, thread CPU time under load (docs/measurements.md,
# "Few input channels: direct or GEMM"): direct / GEMM time 0.71-0.89.
_DIRECT_V4 = {
    "l2_067 8 -> 64 at 14x30, 16 images": ConvShape(16, 8, 64, (3, 3), (14, 30), (1, 1), (1, 1)),
    "8 -> 64 at 32^2, 16 images": _padded(16, 8, 64, 32, 3),
    "8 -> 128 at 64^2, 4 images": _padded(4, 8, 128, 64, 3),
    "16 -> 64 at 112^2": _padded(1, 16, 64, 112, 3),
    "4 -> 64 at 64^2, 4 images": _padded(4, 4, 64, 64, 3),
    "8 -> 64 5x5 at 32^2, 8 images": _padded(8, 8, 64, 32, 5),
    "3 -> 64 at 224^2 (VGG-16's first)": _padded(1, 3, 64, 224, 3),
}

# Deep reductions: the short-reduction term leaves these on the GEMM on both tiers.
# The choice between the direct kernel and the GEMM: Winograd (which 3x3 stride-1 layers of
# 256 channels now take) is off here; tests/test_winograd.py tests its choice.
_DIRECT_OR_GEMM = ConvGemmConfig(winograd=False)

_GEMM = {
    "256 -> 256 at 14^2": _padded(1, 256, 256, 14, 3),
    "512 -> 512 at 28^2": _padded(1, 512, 512, 28, 3),
    "256 -> 512 3x3/2 at 14^2": _padded(1, 256, 512, 14, 3, 2),
}


@pytest.mark.parametrize("name", sorted(_DIRECT_V4))
def test_few_channels_into_many_filters_run_direct_on_avx512(name):
    choice = choose_path(_DIRECT_V4[name], _V4, _DIRECT_OR_GEMM)
    assert (choice.path, choice.decided_by) == ("direct", "cost model"), choice


@pytest.mark.parametrize("target", [_V4, _V3], ids=["v4", "v3"])
@pytest.mark.parametrize("name", sorted(_GEMM))
def test_deep_reductions_keep_the_gemm(name, target):
    choice = choose_path(_GEMM[name], target, _DIRECT_OR_GEMM)
    assert choice.path == "gemm", choice


def test_the_short_reduction_term_slows_only_short_gemms():
    """``gemm_depth_half`` scales the GEMM's estimate by ``(D + half) / D`` (``D`` the
    channels times taps): 72 deep it weighs 1.67x, 2304 deep 1.02x; at 0 and the old
    channel penalty the l2_067 shape goes back to the GEMM."""
    short, deep = _DIRECT_V4["l2_067 8 -> 64 at 14x30, 16 images"], _GEMM["256 -> 256 at 14^2"]
    off = ConvGemmConfig(gemm_depth_half=0.0)
    for shape, depth in ((short, 72), (deep, 2304)):
        assert shape.depth == depth
        # the patch copy is the same on both sides: only the matmul's part grows
        with_term, without = gemm_cycles(shape, _V4, ConvGemmConfig()), gemm_cycles(shape, _V4, off)
        assert with_term > without
    ratio = gemm_cycles(deep, _V4, ConvGemmConfig()) / gemm_cycles(deep, _V4, off)
    assert ratio == pytest.approx(1.0 + 48.0 / 2304, rel=0.02)
    old = ConvGemmConfig(gemm_depth_half=0.0, direct_channels_half=3.7)
    assert choose_path(short, _V4, old).path == "gemm"


_PAYLOAD = """
#id = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>
#pool = affine_map<(d0, d1, d2, d3) -> (d0, d1)>
module {{
  func.func @main(%x: tensor<{n}x{c}x{h}x{w}xf32>, %k: tensor<{f}x{c}x3x3xf32>,
                  %b: tensor<{f}xf32>) -> tensor<{n}x{f}xf32> {{
    %zero = arith.constant 0.0 : f32
    %one = arith.constant 1.0 : f32
    %half = arith.constant 0.5 : f32
    %sqrt2 = arith.constant 1.41421354 : f32
    %count = arith.constant {count}.0 : f32
    %e = tensor.empty() : tensor<{n}x{f}x{oh}x{ow}xf32>
    %bias = linalg.broadcast ins(%b : tensor<{f}xf32>) outs(%e : tensor<{n}x{f}x{oh}x{ow}xf32>)
      dimensions = [0, 2, 3]
    %y = linalg.conv_2d_nchw_fchw
      {{dilations = dense<1> : vector<2xi64>, strides = dense<1> : vector<2xi64>}}
      ins(%x, %k : tensor<{n}x{c}x{h}x{w}xf32>, tensor<{f}x{c}x3x3xf32>)
      outs(%bias : tensor<{n}x{f}x{oh}x{ow}xf32>) -> tensor<{n}x{f}x{oh}x{ow}xf32>
    %g = linalg.generic {{indexing_maps = [#id, #id],
        iterator_types = ["parallel", "parallel", "parallel", "parallel"]}}
        ins(%y : tensor<{n}x{f}x{oh}x{ow}xf32>) outs(%e : tensor<{n}x{f}x{oh}x{ow}xf32>) {{
    ^bb0(%in: f32, %out: f32):
      %s = arith.divf %in, %sqrt2 : f32
      %r = math.erf %s : f32
      %p = arith.addf %r, %one : f32
      %q = arith.mulf %p, %half : f32
      %v = arith.mulf %in, %q : f32
      linalg.yield %v : f32
    }} -> tensor<{n}x{f}x{oh}x{ow}xf32>
    %pe = tensor.empty() : tensor<{n}x{f}xf32>
    %z = linalg.fill ins(%zero : f32) outs(%pe : tensor<{n}x{f}xf32>) -> tensor<{n}x{f}xf32>
    %sum = linalg.generic {{indexing_maps = [#id, #pool],
        iterator_types = ["parallel", "parallel", "reduction", "reduction"]}}
        ins(%g : tensor<{n}x{f}x{oh}x{ow}xf32>) outs(%z : tensor<{n}x{f}xf32>) {{
    ^bb0(%in: f32, %acc: f32):
      %a = arith.addf %in, %acc : f32
      linalg.yield %a : f32
    }} -> tensor<{n}x{f}xf32>
    %mean = linalg.generic {{indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>,
        affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]}}
        ins(%sum : tensor<{n}x{f}xf32>) outs(%pe : tensor<{n}x{f}xf32>) {{
    ^bb0(%in: f32, %out: f32):
      %m = arith.divf %in, %count : f32
      linalg.yield %m : f32
    }} -> tensor<{n}x{f}xf32>
    return %mean : tensor<{n}x{f}xf32>
  }}
}}
"""


def _reference(x: np.ndarray, k: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Conv2d (valid, stride 1) + bias, exact GELU, mean over the image, in float64."""
    n, _, h, w = x.shape
    oh, ow = h - 2, w - 2
    y = np.zeros((n, k.shape[0], oh, ow)) + b[None, :, None, None]
    for i in range(3):
        for j in range(3):
            window = x[:, :, i : i + oh, j : j + ow].astype(np.float64)
            y += np.einsum("nchw,fc->nfhw", window, k[:, :, i, j].astype(np.float64))
    erf = np.vectorize(math.erf)
    return (y * 0.5 * (1.0 + erf(y / math.sqrt(2.0)))).mean(axis=(2, 3))


@pytest.mark.parametrize("target", [pytest.param("x86-64-v4", marks=_AVX512), "x86-64-v3"])
def test_a_conv_gelu_global_pool_module_runs_direct_and_matches_numpy(tmp_path, target):
    """8 channels into 64 filters (l2_067's channels at a smaller image): the cost model
    stamps the direct path, no matmul is left, and the values match float64 numpy."""
    n, c, f, h, w = 2, 8, 64, 9, 12
    rng = np.random.default_rng(7)
    x = rng.standard_normal((n, c, h, w), dtype=np.float32)
    k = (rng.standard_normal((f, c, 3, 3)) / 8).astype(np.float32)
    b = rng.standard_normal(f, dtype=np.float32)
    count = (h - 2) * (w - 2)
    text = _PAYLOAD.format(n=n, c=c, f=f, h=h, w=w, oh=h - 2, ow=w - 2, count=count)
    payload = tmp_path / "conv_gelu_pool.mlir"
    payload.write_text(text)
    out = _reference(x, k, b).astype(np.float32)
    np.savez(tmp_path / "conv_gelu_pool.npz", in0=x, in1=k, in2=b, out0=out)
    dumped = tmp_path / "ir"
    report = sg.run(load_graph("x86"), str(payload), threads=1, target=target,
                    dump_ir=str(dumped))  # fmt: skip
    assert report.verified is True, report
    [normalized] = [p for p in dumped.iterdir() if "normalize" in p.name]
    with new_context():
        module = ir.Module.parse(normalized.read_text())
        [choice] = stamped_choices(module)
        matmuls = collect(module.operation, lambda op: op.name == "linalg.matmul")
    assert (choice.path, choice.decided_by) == ("direct", "cost model"), choice
    assert choice.key == "conv2d.n2.c8.f64.k3x3.o7x10.s1x1.d1x1"
    assert matmuls == []


def _channel_step(channels: int, target: str, **changes: int) -> int:
    """The input-channel tile of one reduction step of a channels-last 3x3 convolution of
    ``channels`` into 32 filters, as the generic schedule plans it for ``target``."""
    text, _ = _conv2d_nchw(2, channels, 32, (8, 20), (3, 3), (1, 1), (1, 1))
    module = parse_payload(text)
    with module.context, ir.Location.unknown():
        prepare(module, entry_function(module, "main"))
    facts = analyze(module)
    (conv,) = facts.ops_of("convolution")
    assert conv.name == "linalg.conv_2d_nhwc_hwcf"
    params = heuristic_generic_params(facts, named_x86_target(target))
    params = GenericParams(**{**params.model_dump(), **changes})
    sizes, _ = convolution_plan(conv, params)
    [channel_dim] = conv.convolution.input_channel
    return sizes[channel_dim]


@pytest.mark.parametrize(
    ("channels", "target", "step", "in_halves"),
    [(16, "x86-64-v4", 16, 8), (12, "x86-64-v4", 12, 6), (32, "x86-64-v4", 8, 8),
     (8, "x86-64-v3", 8, 4), (16, "x86-64-v3", 4, 4)],
)  # fmt: skip
def test_a_vector_of_input_channels_is_one_reduction_step(channels, target, step, in_halves):
    """Up to a vector's lanes of input channels (16 on AVX-512, 8 on AVX2) per step;
    more keep ``conv_reduction_tile``'s steps (a divisor up to half a vector), as every
    count does at ``conv_whole_channels=0``."""
    assert _channel_step(channels, target) == step
    assert _channel_step(channels, target, conv_whole_channels=0) == in_halves
