"""Dilated poolings of a padded image read the image itself
(:mod:`stagegraph.stages.x86.generic.unpadded_pools`): no padded tensor in the IR, values
against numpy with odd sizes and padding on pinned x86-64 levels, and the poolings that
keep their padded input (undilated windows, a padding that is not the identity)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import stagegraph as sg
from stagegraph.core.catalog import load_graph
from stagegraph.mlir.bindings import ir, new_context
from stagegraph.mlir.walk import collect
from stagegraph.stages.x86.generic.unpadded_pools import dilated_pools_read_unpadded

_NEG_INF, _POS_INF = "0xFF800000", "0x7F800000"


def _pool3d(size: int, stride: int, dilation: int, pad: int, kind: str, value: str) -> str:
    """A 3x3x3 ``kind`` (maximumf / minimumf) pooling of a 2x3xSxSxS image padded by
    ``pad`` with ``value``, as torch-mlir writes ``MaxPool3d`` (a ``linalg.generic``)."""
    padded = size + 2 * pad
    out = (padded - dilation * 2 - 1) // stride + 1
    d, s = dilation, stride
    image, full = (
        f"tensor<2x3x{size}x{size}x{size}xf32>",
        f"tensor<2x3x{padded}x{padded}x{padded}xf32>",
    )
    result = f"tensor<2x3x{out}x{out}x{out}xf32>"
    return f"""
#in = affine_map<(n, c, a, b, e, i, j, k)
  -> (n, c, a * {s} + i * {d}, b * {s} + j * {d}, e * {s} + k * {d})>
#win = affine_map<(n, c, a, b, e, i, j, k) -> (i, j, k)>
#out = affine_map<(n, c, a, b, e, i, j, k) -> (n, c, a, b, e)>
func.func @main(%x: {image}) -> {result} {{
  %v = arith.constant {value} : f32
  %ident = arith.constant {_NEG_INF if kind == "maximumf" else _POS_INF} : f32
  %p = tensor.pad %x low[0, 0, {pad}, {pad}, {pad}] high[0, 0, {pad}, {pad}, {pad}] {{
  ^bb0(%i0: index, %i1: index, %i2: index, %i3: index, %i4: index):
    tensor.yield %v : f32
  }} : {image} to {full}
  %e = tensor.empty() : {result}
  %f = linalg.fill ins(%ident : f32) outs(%e : {result}) -> {result}
  %w = tensor.empty() : tensor<3x3x3xf32>
  %r = linalg.generic {{indexing_maps = [#in, #win, #out], iterator_types = ["parallel",
      "parallel", "parallel", "parallel", "parallel", "reduction", "reduction", "reduction"]}}
      ins(%p, %w : {full}, tensor<3x3x3xf32>) outs(%f : {result}) {{
  ^bb0(%a: f32, %b: f32, %o: f32):
    %m = arith.{kind} %a, %o : f32
    linalg.yield %m : f32
  }} -> {result}
  return %r : {result}
}}
"""


def _numpy_pool(x: np.ndarray, stride: int, dilation: int, pad: int, kind: str) -> np.ndarray:
    fill = -np.inf if kind == "maximumf" else np.inf
    width = ((0, 0), (0, 0)) + ((pad, pad),) * 3
    padded = np.pad(x, width, constant_values=fill)
    out = (padded.shape[2] - dilation * 2 - 1) // stride + 1
    span = stride * (out - 1) + 1
    taps = [
        padded[:, :, a : a + span : stride, b : b + span : stride, c : c + span : stride]
        for a, b, c in itertools.product(range(0, 3 * dilation, dilation), repeat=3)
    ]
    return (np.max if kind == "maximumf" else np.min)(taps, axis=0)


@pytest.mark.parametrize(
    ("stride", "dilation", "pad", "rewritten"),
    [(2, 3, 1, True), (1, 2, 2, True), (2, 1, 1, False)],
    ids=["dilated-3-strided", "dilated-2", "undilated"],
)
def test_only_dilated_windows_drop_the_padded_tensor(stride, dilation, pad, rewritten):
    with new_context(), ir.Location.unknown():
        module = ir.Module.parse(_pool3d(9, stride, dilation, pad, "maximumf", _NEG_INF))
        fn = module.body.operations[0]
        assert dilated_pools_read_unpadded(fn) == int(rewritten)
        assert module.operation.verify()
        assert bool(collect(module.operation, "tensor.pad")) != rewritten
        assert bool(collect(module.operation, "tensor.extract")) == rewritten


def test_a_padding_other_than_the_identity_stays():
    """A max pooling of an image padded with 0 (not -inf) takes the zeros: kept as it is."""
    with new_context(), ir.Location.unknown():
        module = ir.Module.parse(_pool3d(9, 2, 3, 1, "maximumf", "0.0"))
        assert dilated_pools_read_unpadded(module.body.operations[0]) == 0
        assert collect(module.operation, "tensor.pad")


@pytest.mark.parametrize("level", ["x86-64-v4", "x86-64-v3"])
@pytest.mark.parametrize(
    ("size", "stride", "dilation", "pad", "kind"),
    [(9, 2, 3, 1, "maximumf"), (7, 1, 2, 2, "minimumf"), (10, 3, 2, 1, "maximumf")],
)
def test_unpadded_pools_match_numpy(tmp_path, level, size, stride, dilation, pad, kind):
    """Odd and even sizes, windows reaching into the padding on both sides: the compiled
    pooling equals numpy's over the padded image, and its IR keeps no padded tensor."""
    identity = _NEG_INF if kind == "maximumf" else _POS_INF
    payload = tmp_path / "pool.mlir"
    payload.write_text(_pool3d(size, stride, dilation, pad, kind, identity))
    x = np.random.default_rng(size).standard_normal((2, 3, size, size, size)).astype(np.float32)
    expected = _numpy_pool(x, stride, dilation, pad, kind).astype(np.float32)
    np.savez(tmp_path / "pool.npz", in0=x, out0=expected)
    dumped = tmp_path / "ir"
    report = sg.run(load_graph("x86"), str(payload), threads=1, target=level, dump_ir=str(dumped))
    assert report.verified is True, report
    [scheduled] = [p for p in dumped.iterdir() if "schedule" in p.name]
    with new_context():
        module = ir.Module.parse(scheduled.read_text())
        assert not collect(module.operation, "tensor.pad")
        assert not collect(module.operation, "tensor.insert_slice")  # (a pad's lowering)
