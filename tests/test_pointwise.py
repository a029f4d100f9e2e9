"""Pointwise convolutions run as matmuls (``x86.normalize``), checked against numpy."""

from __future__ import annotations

import numpy as np
import pytest

import stagegraph as sg
from stagegraph.mlir.bindings import ir, new_context
from stagegraph.mlir.walk import collect
from stagegraph.stages.analysis import analyze
from stagegraph.stages.x86.conv.pointwise import pointwise_convolutions_to_matmuls


def _conv(layout: str, n: int, c: int, f: int, hw: int, kernel: int, stride: int, init: str):
    """Text of @main(x, w, b) = conv(x, w) on an init of ``init`` (zero fill or bias)."""
    out = (hw - kernel) // stride + 1
    if layout == "nchw":
        x, w, y = f"{n}x{c}x{hw}x{hw}", f"{f}x{c}x{kernel}x{kernel}", f"{n}x{f}x{out}x{out}"
        name, bias_dims = "conv_2d_nchw_fchw", "[0, 2, 3]"
    else:
        x, w, y = f"{n}x{hw}x{hw}x{c}", f"{kernel}x{kernel}x{c}x{f}", f"{n}x{out}x{out}x{f}"
        name, bias_dims = "conv_2d_nhwc_hwcf", "[0, 1, 2]"
    if init == "zero":
        start = (
            "%z = arith.constant 0.0 : f32\n"
            f"  %i = linalg.fill ins(%z : f32) outs(%e : tensor<{y}xf32>) -> tensor<{y}xf32>"
        )
    else:
        start = (
            f"%i = linalg.broadcast ins(%b : tensor<{f}xf32>) outs(%e : tensor<{y}xf32>) "
            f"dimensions = {bias_dims}"
        )
    return f"""
func.func @main(%x: tensor<{x}xf32>, %w: tensor<{w}xf32>, %b: tensor<{f}xf32>)
    -> tensor<{y}xf32> {{
  %e = tensor.empty() : tensor<{y}xf32>
  {start}
  %r = linalg.{name}
    {{dilations = dense<1> : vector<2xi64>, strides = dense<{stride}> : vector<2xi64>}}
    ins(%x, %w : tensor<{x}xf32>, tensor<{w}xf32>) outs(%i : tensor<{y}xf32>) -> tensor<{y}xf32>
  return %r : tensor<{y}xf32>
}}
"""


def _reference(layout: str, x, w, b, stride: int, init: str) -> np.ndarray:
    if layout == "nchw":
        picked = x[:, :, ::stride, ::stride]
        out = np.einsum("fc,nchw->nfhw", w[:, :, 0, 0], picked)
        bias = b[None, :, None, None]
    else:
        picked = x[:, ::stride, ::stride, :]
        out = np.einsum("nhwc,cf->nhwf", picked, w[0, 0])
        bias = b[None, None, None, :]
    return out + bias if init == "bias" else out


def _normalized(text: str) -> tuple[int, list[str]]:
    with new_context(), ir.Location.unknown():
        module = ir.Module.parse(text)
        count = pointwise_convolutions_to_matmuls(module)
        assert module.operation.verify()
        names = [op.name for op in collect(module.operation, lambda op: "linalg." in op.name)]
        facts = analyze(module)
    classes = [op.op_class for op in facts.ops]
    return count, [*names, *classes]


@pytest.mark.parametrize(
    ("layout", "n", "stride", "made"),
    [
        ("nchw", 3, 1, "linalg.batch_matmul"),
        ("nchw", 1, 1, "linalg.matmul"),
        ("nchw", 2, 2, "linalg.batch_matmul"),
        ("nhwc", 2, 1, "linalg.matmul"),
        ("nhwc", 1, 2, "linalg.matmul"),
    ],
)
def test_pointwise_convolution_becomes_a_matmul_the_analysis_sees(layout, n, stride, made):
    text = _conv(layout, n, c=5, f=8, hw=6, kernel=1, stride=stride, init="zero")
    count, names = _normalized(text)
    assert count == 1
    assert made in names and not any("conv" in name for name in names)
    assert "matmul" in names  # the analysis classifies it as a matmul: matmul params


def test_wider_windows_stay_convolutions():
    count, names = _normalized(_conv("nchw", 2, c=4, f=8, hw=6, kernel=3, stride=1, init="zero"))
    assert count == 0 and "linalg.conv_2d_nchw_fchw" in names


@pytest.mark.parametrize(
    ("layout", "n", "stride", "init"),
    [
        ("nchw", 3, 1, "zero"),
        ("nchw", 2, 2, "bias"),
        ("nchw", 1, 1, "bias"),
        ("nhwc", 2, 1, "bias"),
        ("nhwc", 2, 2, "zero"),
    ],
)
def test_pointwise_convolution_runs_on_x86_and_matches_numpy(tmp_path, layout, n, stride, init):
    """Odd sizes (channels 5, filters 12, 7x7 pixels) leave partial register tiles; a bias
    init is a matmul accumulating into a packed C that is not zero."""
    c, f, hw = 5, 12, 7
    rng = np.random.default_rng(0)
    if layout == "nchw":
        x = rng.standard_normal((n, c, hw, hw), dtype=np.float32)
        w = rng.standard_normal((f, c, 1, 1), dtype=np.float32)
    else:
        x = rng.standard_normal((n, hw, hw, c), dtype=np.float32)
        w = rng.standard_normal((1, 1, c, f), dtype=np.float32)
    b = rng.standard_normal(f, dtype=np.float32)
    path = tmp_path / "pw.mlir"
    path.write_text(_conv(layout, n, c, f, hw, kernel=1, stride=stride, init=init))
    expected = _reference(layout, x, w, b, stride, init)
    np.savez(tmp_path / "pw.npz", in0=x, in1=w, in2=b, out0=expected)
    report = sg.run("x86", str(path), threads=1)
    assert report.verified is True, report


def test_matmul_accumulating_into_a_bias_compiles_and_matches_numpy(tmp_path):
    """``C = bias + A B`` with C's init not a fill: the packed C starts from the init."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((13, 9), dtype=np.float32)
    bm = rng.standard_normal((9, 20), dtype=np.float32)
    bias = rng.standard_normal(20, dtype=np.float32)
    path = tmp_path / "acc.mlir"
    path.write_text(
        """
func.func @main(%a: tensor<13x9xf32>, %b: tensor<9x20xf32>, %bias: tensor<20xf32>)
    -> tensor<13x20xf32> {
  %e = tensor.empty() : tensor<13x20xf32>
  %i = linalg.broadcast ins(%bias : tensor<20xf32>) outs(%e : tensor<13x20xf32>) dimensions = [0]
  %r = linalg.matmul ins(%a, %b : tensor<13x9xf32>, tensor<9x20xf32>)
    outs(%i : tensor<13x20xf32>) -> tensor<13x20xf32>
  return %r : tensor<13x20xf32>
}
"""
    )
    np.savez(tmp_path / "acc.npz", in0=a, in1=bm, in2=bias, out0=a @ bm + bias)
    report = sg.run("x86", str(path), threads=1)
    assert report.verified is True, report


GROUPED = """
func.func @main(%x: tensor<2x3x4x5x5xf32>, %w: tensor<3x6x4x1x1xf32>)
    -> tensor<2x3x6x{o}x{o}xf32> {{
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<2x3x6x{o}x{o}xf32>
  %i = linalg.fill ins(%z : f32) outs(%e : tensor<2x3x6x{o}x{o}xf32>) -> tensor<2x3x6x{o}x{o}xf32>
  %r = linalg.conv_2d_ngchw_gfchw
    {{dilations = dense<1> : vector<2xi64>, strides = dense<{s}> : vector<2xi64>}}
    ins(%x, %w : tensor<2x3x4x5x5xf32>, tensor<3x6x4x1x1xf32>)
    outs(%i : tensor<2x3x6x{o}x{o}xf32>) -> tensor<2x3x6x{o}x{o}xf32>
  return %r : tensor<2x3x6x{o}x{o}xf32>
}}
"""


@pytest.mark.parametrize("stride", [1, 2])
def test_grouped_pointwise_convolution_is_a_batch_matmul_per_image_and_group(tmp_path, stride):
    out = (5 - 1) // stride + 1
    text = GROUPED.format(o=out, s=stride)
    count, names = _normalized(text)
    assert count == 1 and "linalg.batch_matmul" in names
    assert not any("conv" in name for name in names)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 3, 4, 5, 5), dtype=np.float32)
    w = rng.standard_normal((3, 6, 4, 1, 1), dtype=np.float32)
    expected = np.einsum("gfc,ngchw->ngfhw", w[:, :, :, 0, 0], x[:, :, :, ::stride, ::stride])
    (tmp_path / "g.mlir").write_text(text)
    np.savez(tmp_path / "g.npz", in0=x, in1=w, out0=expected)
    assert sg.run("x86", str(tmp_path / "g.mlir"), threads=1).verified is True


@pytest.mark.parametrize("kernel", [1, 3])
def test_convolution_without_strides_or_dilations_attributes_runs(tmp_path, kernel):
    """Named convolutions may omit ``strides``/``dilations`` (all 1)."""
    out = 5 - kernel + 1
    text = f"""
func.func @main(%x: tensor<2x4x5x5xf32>, %w: tensor<8x4x{kernel}x{kernel}xf32>)
    -> tensor<2x8x{out}x{out}xf32> {{
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<2x8x{out}x{out}xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<2x8x{out}x{out}xf32>)
    -> tensor<2x8x{out}x{out}xf32>
  %r = linalg.conv_2d_nchw_fchw ins(%x, %w : tensor<2x4x5x5xf32>,
    tensor<8x4x{kernel}x{kernel}xf32>) outs(%f : tensor<2x8x{out}x{out}xf32>)
    -> tensor<2x8x{out}x{out}xf32>
  return %r : tensor<2x8x{out}x{out}xf32>
}}
"""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 4, 5, 5), dtype=np.float32)
    w = rng.standard_normal((8, 4, kernel, kernel), dtype=np.float32)
    windows = np.lib.stride_tricks.sliding_window_view(x, (kernel, kernel), axis=(2, 3))
    expected = np.einsum("nchwij,fcij->nfhw", windows, w)
    (tmp_path / "c.mlir").write_text(text)
    np.savez(tmp_path / "c.npz", in0=x, in1=w, out0=expected)
    assert sg.run("x86", str(tmp_path / "c.mlir"), threads=1).verified is True
