"""Channels-last 3-D poolings become a 2-D pooling over height and width then a 1-D one
over depth (stagegraph.stages.x86.pool3d): the IR holds those ops instead, and sums and
maxima with strides and dilations match numpy on the x86 graph."""

from __future__ import annotations

import numpy as np
import pytest

from stagegraph.cli.main import main

POOL = """
func.func @main(%x: IMAGE) -> RESULT {
  %init = arith.constant INIT : f32
  %w = tensor.empty() : tensor<3x2x3xf32>
  %e = tensor.empty() : RESULT
  %f = linalg.fill ins(%init : f32) outs(%e : RESULT) -> RESULT
  %p = linalg.pooling_ndhwc_KIND
      {dilations = dense<DIL> : vector<3xi64>, strides = dense<STR> : vector<3xi64>}
      ins(%x, %w : IMAGE, tensor<3x2x3xf32>) outs(%f : RESULT) -> RESULT
  return %p : RESULT
}
""".replace("IMAGE", "tensor<2x7x8x9x3xf32>").replace("RESULT", "tensor<2xODxOHxOWx3xf32>")
WINDOW = (3, 2, 3)


def pool_text(kind: str, strides: list[int], dilations: list[int]) -> tuple[str, list[int]]:
    image = (7, 8, 9)
    out = [(n - d * (k - 1) - 1) // s + 1
           for n, k, s, d in zip(image, WINDOW, strides, dilations, strict=True)]  # fmt: skip
    init = "0.0" if kind == "sum" else "0xFF800000"
    text = POOL.replace("KIND", kind).replace("INIT", init)
    text = text.replace("DIL", str(dilations).replace(" ", "")).replace(
        "STR", str(strides).replace(" ", "")
    )
    return text.replace("ODxOHxOW", "x".join(map(str, out))), out


def reference(x: np.ndarray, kind: str, strides: list[int], dilations: list[int],
              out: list[int]) -> np.ndarray:  # fmt: skip
    result = np.zeros((2, *out, 3), dtype=np.float64)
    combine = np.sum if kind == "sum" else np.max
    for od in range(out[0]):
        for oh in range(out[1]):
            for ow in range(out[2]):
                window = x[
                    :,
                    od * strides[0] : od * strides[0] + dilations[0] * 2 + 1 : dilations[0],
                    oh * strides[1] : oh * strides[1] + dilations[1] * 1 + 1 : dilations[1],
                    ow * strides[2] : ow * strides[2] + dilations[2] * 2 + 1 : dilations[2],
                ]
                result[:, od, oh, ow] = combine(window, axis=(1, 2, 3))  # fmt: skip
    return result.astype(np.float32)


def test_3d_pooling_is_separated():
    from stagegraph.core.catalog import load_graph
    from stagegraph.core.engine import Engine
    from stagegraph.mlir.walk import collect

    text, _ = pool_text("max", [2, 1, 2], [1, 2, 1])
    result = Engine().run(load_graph("x86"), text, until="normalize")
    module = result.value("normalize", "module").ir
    names = [
        op.name for op in collect(module.operation, lambda o: o.name.startswith("linalg.pool"))
    ]
    assert names == ["linalg.pooling_nhwc_max", "linalg.pooling_nwc_max"]


@pytest.mark.parametrize("kind", ["sum", "max"])
@pytest.mark.parametrize("strides, dilations", [([1, 1, 1], [1, 1, 1]), ([2, 1, 2], [1, 2, 1])])
def test_separated_pooling_matches_numpy(tmp_path, capsys, kind, strides, dilations):
    text, out = pool_text(kind, strides, dilations)
    x = np.random.default_rng(7).standard_normal((2, 7, 8, 9, 3)).astype(np.float32)
    path = tmp_path / "pool3d.mlir"
    path.write_text(text)
    np.savez(path.with_suffix(".npz"), in0=x, out0=reference(x, kind, strides, dilations, out))
    assert main(["run", "x86", str(path)]) == 0, capsys.readouterr()
    assert "VERIFIED" in capsys.readouterr().out


# torch-mlir's AvgPool3d: NCDHW transposed to NDHWC, pooled, transposed back.
CHANNELS_FIRST = """
func.func @main(%x: tensor<2x3x7x8x9xf32>) -> tensor<2x3x3x7x4xf32> {
  %zero = arith.constant 0.0 : f32
  %w = tensor.empty() : tensor<3x2x3xf32>
  %t = tensor.empty() : tensor<2x7x8x9x3xf32>
  %last = linalg.transpose ins(%x : tensor<2x3x7x8x9xf32>) outs(%t : tensor<2x7x8x9x3xf32>)
      permutation = [0, 2, 3, 4, 1]
  %e = tensor.empty() : tensor<2x3x7x4x3xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<2x3x7x4x3xf32>) -> tensor<2x3x7x4x3xf32>
  %p = linalg.pooling_ndhwc_sum
      {dilations = dense<1> : vector<3xi64>, strides = dense<[2, 1, 2]> : vector<3xi64>}
      ins(%last, %w : tensor<2x7x8x9x3xf32>, tensor<3x2x3xf32>) outs(%f : tensor<2x3x7x4x3xf32>)
      -> tensor<2x3x7x4x3xf32>
  %b = tensor.empty() : tensor<2x3x3x7x4xf32>
  %first = linalg.transpose ins(%p : tensor<2x3x7x4x3xf32>) outs(%b : tensor<2x3x3x7x4xf32>)
      permutation = [0, 4, 1, 2, 3]
  return %first : tensor<2x3x3x7x4xf32>
}
"""


def test_channels_first_pooling_drops_both_transposes(tmp_path, capsys):
    from stagegraph.core.catalog import load_graph
    from stagegraph.core.engine import Engine
    from stagegraph.mlir.walk import collect

    result = Engine().run(load_graph("x86"), CHANNELS_FIRST, until="normalize")
    module = result.value("normalize", "module").ir
    names = [op.name for op in collect(module.operation, lambda o: o.name.startswith("linalg."))]
    assert "linalg.transpose" not in names
    assert [n for n in names if "pooling" in n] == [
        "linalg.pooling_nchw_sum",
        "linalg.pooling_nwc_sum",
    ]
    x = np.random.default_rng(8).standard_normal((2, 3, 7, 8, 9)).astype(np.float32)
    last = reference(x.transpose(0, 2, 3, 4, 1), "sum", [2, 1, 2], [1, 1, 1], [3, 7, 4])
    path = tmp_path / "avgpool3d.mlir"
    path.write_text(CHANNELS_FIRST)
    np.savez(path.with_suffix(".npz"), in0=x, out0=last.transpose(0, 4, 1, 2, 3))
    assert main(["run", "x86", str(path)]) == 0, capsys.readouterr()
    assert "VERIFIED" in capsys.readouterr().out
