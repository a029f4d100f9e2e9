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


DYNAMIC_MATMUL = """
func.func @main(%a: tensor<?x8xf32>, %b: tensor<8x12xf32>) -> tensor<?x12xf32> {
  %c0 = arith.constant 0 : index
  %m = tensor.dim %a, %c0 : tensor<?x8xf32>
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty(%m) : tensor<?x12xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<?x12xf32>) -> tensor<?x12xf32>
  %r = linalg.matmul ins(%a, %b : tensor<?x8xf32>, tensor<8x12xf32>)
                     outs(%f : tensor<?x12xf32>) -> tensor<?x12xf32>
  return %r : tensor<?x12xf32>
}
"""


@pytest.mark.parametrize("graph", ["naive", "x86"])
def test_dynamic_sizes_are_specialized_from_the_npz(tmp_path, capsys, graph):
    import json

    payload = tmp_path / "dynmm.mlir"
    payload.write_text(DYNAMIC_MATMUL)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((6, 8), np.float32), rng.standard_normal((8, 12), np.float32)
    np.savez(tmp_path / "dynmm.npz", in0=a, in1=b, out0=a @ b)
    assert main(["run", graph, str(payload), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["verified"] is True
    assert report["specialized"] == {"argument 0": [6, 8], "result 0": [6, 12]}


def test_dynamic_sizes_without_data_are_refused(tmp_path, capsys):
    payload = tmp_path / "dynmm.mlir"
    payload.write_text(DYNAMIC_MATMUL)
    assert main(["run", "naive", str(payload)]) == 2
    err = capsys.readouterr().err
    assert "argument #0 of @main has a dynamic shape" in err and "dynmm.npz" in err


ACCUMULATE_INTO_ARGUMENT = """
func.func @main(%a: tensor<12x8xf32>, %b: tensor<8x20xf32>, %c: tensor<12x20xf32>)
    -> tensor<12x20xf32> {
  %r = linalg.matmul ins(%a, %b : tensor<12x8xf32>, tensor<8x20xf32>)
                     outs(%c : tensor<12x20xf32>) -> tensor<12x20xf32>
  return %r : tensor<12x20xf32>
}
"""


@pytest.mark.parametrize("graph", ["naive", "x86"])
def test_an_op_accumulating_into_an_argument_leaves_the_callers_array_alone(tmp_path, graph):
    """``C + A B`` into the argument C: bufferization must copy C, not write the caller's
    array (every call changed its own input, so two runs gave different results)."""
    import stagegraph as sg
    from stagegraph.runtime.jit import JitBinary

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((12, 8), np.float32), rng.standard_normal((8, 20), np.float32)
    c = rng.standard_normal((12, 20), np.float32)
    payload = tmp_path / "acc.mlir"
    payload.write_text(ACCUMULATE_INTO_ARGUMENT)
    np.savez(tmp_path / "acc.npz", in0=a, in1=b, in2=c, out0=c + a @ b)
    threads = {"threads": 1} if graph == "x86" else {}
    assert sg.run(graph, str(payload), **threads).verified is True
    # Called directly, twice: the argument is unchanged and both results are C + A B.
    binary = sg.run(graph, str(payload), until="emit", **threads).value("emit")
    assert isinstance(binary, JitBinary)
    kept = c.copy()
    first = binary.call("main", [a, b, c])[0]
    second = binary.call("main", [a, b, c])[0]
    np.testing.assert_array_equal(c, kept)
    np.testing.assert_allclose(first, kept + a @ b, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(first, second)


def test_inputs_are_marked_read_only_and_other_argument_attributes_kept():
    from stagegraph.mlir.bindings import ir, new_context
    from stagegraph.stages.common.passes import inputs_read_only

    with new_context():
        module = ir.Module.parse(
            "func.func @f(%x: tensor<4xf32> {test.kept = 1 : i32}, %n: index) -> tensor<4xf32> {\n"
            "  return %x : tensor<4xf32>\n}\n"
            "func.func private @g(%x: tensor<4xf32>) -> tensor<4xf32> {\n"
            "  return %x : tensor<4xf32>\n}\n"
        )
        assert inputs_read_only(module) == 1
        public, private = (op.operation for op in module.body.operations)
        attrs = [ir.DictAttr(d) for d in ir.ArrayAttr(public.attributes["arg_attrs"])]
        assert "test.kept" in attrs[0] and not ir.BoolAttr(attrs[0]["bufferization.writable"]).value
        assert "bufferization.writable" not in attrs[1]
        assert "arg_attrs" not in private.attributes
