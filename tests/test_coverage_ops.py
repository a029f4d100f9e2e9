"""Named aggregates (linalg.softmax) lower on every graph; a lowering that leaves ops behind
is an error naming the op and the stage that should have removed it."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from stagegraph.cli.main import main
from stagegraph.core.catalog import load_graph
from stagegraph.core.engine import Engine

SOFTMAX = """
func.func @main(%x: tensor<4x33xf32>) -> tensor<4x33xf32> {
  %e = tensor.empty() : tensor<4x33xf32>
  %r = linalg.softmax dimension(1) ins(%x : tensor<4x33xf32>)
                      outs(%e : tensor<4x33xf32>) -> tensor<4x33xf32>
  return %r : tensor<4x33xf32>
}
"""


@pytest.mark.parametrize("graph", ["naive", "x86"])
def test_named_softmax_lowers_and_matches_numpy(graph):
    x = np.random.default_rng(0).standard_normal((4, 33)).astype(np.float32) * 4
    result = Engine().run(load_graph(graph), {"payload": SOFTMAX})
    (out,) = result.binary.call("main", [x])
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(out, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)


def _graph_file(tmp_path, stages, edges) -> str:
    path = tmp_path / "partial.yaml"
    graph = {"name": "partial", "inputs": {"payload": {"type": "module:tensor"}},
             "stages": stages, "edges": edges}  # fmt: skip
    path.write_text(yaml.safe_dump(graph))
    return str(path)


def test_lowering_that_leaves_an_op_names_it_and_the_stage(tmp_path, capsys):
    """No linalg-to-loops stage: the matmul reaches the LLVM lowering, which cannot take it."""
    graph = _graph_file(
        tmp_path,
        [{"name": "load", "factory": "verify"}, {"name": "bufferize", "factory": "bufferize"},
         {"name": "lower", "factory": "lower_to_llvm"}, {"name": "emit", "factory": "jit"}],
        ["payload -> load.module", "load.module -> bufferize.module",
         "bufferize.module -> lower.module", "lower.module -> emit.module"],
    )  # fmt: skip
    assert main(["run", graph, "matmul:m=4,n=4,k=4"]) == 2
    err = capsys.readouterr().err
    assert "stage 'lower' of graph 'partial' failed" in err
    assert "linalg.matmul" in err and "should have been removed by the stage that produced" in err
