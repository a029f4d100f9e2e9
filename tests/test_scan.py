"""``tm_tensor.scan`` payloads (KernelBench's cumulative sums) rewritten into upstream ops
compile and verify on the naive and x86 graphs."""

from __future__ import annotations

import numpy as np
import pytest

from stagegraph.cli.main import main
from tests.conftest import KERNELBENCH

SCAN = """
func.func @main(%a: tensor<6x37xf32>, %init: tensor<6xf32>) -> (tensor<6x37xf32>, tensor<6xf32>) {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<6x37xf32>
  %o = linalg.fill ins(%zero : f32) outs(%e : tensor<6x37xf32>) -> tensor<6x37xf32>
  %r:2 = tm_tensor.scan dimension(1) inclusive(INCLUSIVE) ins(%a : tensor<6x37xf32>)
      outs(%o, %init : tensor<6x37xf32>, tensor<6xf32>) {
  ^bb0(%x: f32, %y: f32):
    %z = arith.addf %x, %y : f32
    tm_tensor.yield %z : f32
  } -> tensor<6x37xf32>, tensor<6xf32>
  return %r#0, %r#1 : tensor<6x37xf32>, tensor<6xf32>
}
"""


@pytest.mark.parametrize("graph", ["naive", "x86"])
@pytest.mark.parametrize("inclusive", [True, False])
def test_scan_matches_numpy(tmp_path, capsys, graph, inclusive):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((6, 37)).astype(np.float32)
    init = rng.standard_normal(6).astype(np.float32)
    if inclusive:
        out = np.cumsum(a, axis=1, dtype=np.float64)
    else:  # out[k] = init + a[..k-1]
        out = init[:, None] + np.concatenate([np.zeros((6, 1)), np.cumsum(a, axis=1)[:, :-1]], 1)
    acc = out[:, -1] if inclusive else out[:, -1] + a[:, -1]
    path = tmp_path / "scan.mlir"
    path.write_text(SCAN.replace("INCLUSIVE", str(inclusive).lower()))
    np.savez(path.with_suffix(".npz"), in0=a, in1=init, out0=out.astype(np.float32),
             out1=acc.astype(np.float32))  # fmt: skip
    code = main(["run", graph, str(path)])
    assert code == 0, capsys.readouterr()
    assert "VERIFIED" in capsys.readouterr().out


@pytest.mark.parametrize("stem", ["l1_089_cumsum", "l1_091_cumsum_reverse", "l1_093_masked_cumsum"])
def test_kernelbench_cumsums_verify(capsys, stem):
    path = KERNELBENCH / f"{stem}.mlir"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    assert main(["run", "x86", str(path)]) == 0, capsys.readouterr()
