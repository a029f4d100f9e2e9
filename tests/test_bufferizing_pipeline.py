"""A graph that bufferizes with a pass pipeline, the mlir-opt way, validates and runs wherever
the built-in ``bufferize`` stage does: the entry's signature is recorded, tensor arguments
stay read-only, and returned buffers become out-parameters."""

from __future__ import annotations

import numpy as np

from stagegraph.app.run import run_report
from stagegraph.app.session import Session, SessionRequest
from stagegraph.cli.main import main

GRAPH = """\
name: mlir-opt-way
stages:
  - {name: load, factory: verify}
  - name: bufferize
    factory: pipeline
    config:
      pipeline: "builtin.module(one-shot-bufferize{bufferize-function-boundaries
        function-boundary-type-conversion=identity-layout-map},buffer-deallocation-pipeline)"
  - {name: loops, factory: linalg_to_loops}
  - {name: lower, factory: lower_to_llvm}
  - {name: emit, factory: jit}
edges:
  - payload -> load.module
  - load.module -> bufferize.module
  - bufferize.module -> loops.module
  - loops.module -> lower.module
  - lower.module -> emit.module
"""

# accumulates into its argument %c: bufferized in place, it would change the caller's array
ACCUMULATE = """\
func.func @main(%a: tensor<4x8xf32>, %b: tensor<8x4xf32>, %c: tensor<4x4xf32>)
    -> tensor<4x4xf32> {
  %r = linalg.matmul ins(%a, %b : tensor<4x8xf32>, tensor<8x4xf32>)
                     outs(%c : tensor<4x4xf32>) -> tensor<4x4xf32>
  return %r : tensor<4x4xf32>
}
"""


def test_validates_and_runs(tmp_path, capsys):
    graph = tmp_path / "g.yaml"
    graph.write_text(GRAPH)
    assert main(["validate", str(graph)]) == 0
    assert main(["run", str(graph), "matmul:m=8,n=16,k=4", "--json"]) == 0
    assert '"verified": true' in capsys.readouterr().out


def test_arguments_stay_read_only(tmp_path):
    graph = tmp_path / "g.yaml"
    graph.write_text(GRAPH)
    payload = tmp_path / "acc.mlir"
    payload.write_text(ACCUMULATE)
    request = SessionRequest(graph=str(graph), workload=str(payload))
    with Session(request, cache=False) as session:
        before = [a.copy() for a in session.workload.inputs()]
        report = run_report(session)
        assert report.verified is True, report.message
        assert report.reference == "graph:naive"
        for old, new in zip(before, session.workload.inputs(), strict=True):
            np.testing.assert_array_equal(old, new)
