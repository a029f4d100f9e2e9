"""Reductions to a scalar split into parallel rows (gpu.split_reductions): the choice of
rows, the IR the split leaves for the cost model, its values (the GPU schedule run on the
CPU, against the naive graph) and the kernels it compiles to."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import stagegraph as sg
from stagegraph.stages.gpu.split_reduction import row_split, rows_bound
from stagegraph.stages.gpu.target import resolve_gpu_target

#: A sum of squares of a 2-D tensor, plus a scalar broadcast into the body: one
#: reduction to a scalar whose elementwise producer normalize fused into it.
SUM_OF_SQUARES = """
#map = affine_map<(d0, d1) -> (d0, d1)>
#scalar = affine_map<(d0, d1) -> ()>
module {
  func.func @main(%arg0: tensor<ROWSxCOLSxf32>, %arg1: tensor<f32>) -> tensor<f32> {
    %zero = arith.constant 0.000000e+00 : f32
    %e = tensor.empty() : tensor<f32>
    %init = linalg.fill ins(%zero : f32) outs(%e : tensor<f32>) -> tensor<f32>
    %sum = linalg.generic {indexing_maps = [#map, #scalar, #scalar],
        iterator_types = ["reduction", "reduction"]}
        ins(%arg0, %arg1 : tensor<ROWSxCOLSxf32>, tensor<f32>) outs(%init : tensor<f32>) {
    ^bb0(%in: f32, %s: f32, %acc: f32):
      %d = arith.subf %in, %s : f32
      %q = arith.mulf %d, %d : f32
      %r = arith.addf %q, %acc : f32
      linalg.yield %r : f32
    } -> tensor<f32>
    return %sum : tensor<f32>
  }
}
"""

#: The largest element of a 1-D tensor (maximumf: -inf is the rows' starting value).
MAXIMUM = """
#map = affine_map<(d0) -> (d0)>
#scalar = affine_map<(d0) -> ()>
module {
  func.func @main(%arg0: tensor<Nxf32>) -> tensor<f32> {
    %low = arith.constant -1.000000e+30 : f32
    %e = tensor.empty() : tensor<f32>
    %init = linalg.fill ins(%low : f32) outs(%e : tensor<f32>) -> tensor<f32>
    %max = linalg.generic {indexing_maps = [#map, #scalar], iterator_types = ["reduction"]}
        ins(%arg0 : tensor<Nxf32>) outs(%init : tensor<f32>) {
    ^bb0(%in: f32, %acc: f32):
      %r = arith.maximumf %in, %acc : f32
      linalg.yield %r : f32
    } -> tensor<f32>
    return %max : tensor<f32>
  }
}
"""

#: A hinge-like loss: each row scaled by a vector broadcast along the columns, then summed.
BROADCAST = """
#map = affine_map<(d0, d1) -> (d0, d1)>
#col = affine_map<(d0, d1) -> (d1)>
#scalar = affine_map<(d0, d1) -> ()>
module {
  func.func @main(%arg0: tensor<ROWSxCOLSxf32>, %arg1: tensor<COLSxf32>) -> tensor<f32> {
    %zero = arith.constant 0.000000e+00 : f32
    %e = tensor.empty() : tensor<f32>
    %init = linalg.fill ins(%zero : f32) outs(%e : tensor<f32>) -> tensor<f32>
    %sum = linalg.generic {indexing_maps = [#map, #col, #scalar],
        iterator_types = ["reduction", "reduction"]}
        ins(%arg0, %arg1 : tensor<ROWSxCOLSxf32>, tensor<COLSxf32>) outs(%init : tensor<f32>) {
    ^bb0(%in: f32, %w: f32, %acc: f32):
      %p = arith.mulf %in, %w : f32
      %r = arith.addf %p, %acc : f32
      linalg.yield %r : f32
    } -> tensor<f32>
    return %sum : tensor<f32>
  }
}
"""


def contiguous_graph(name: str = "gpu_cpu"):
    """``gpu_cpu`` (or ``gpu``) with the split stage's ``contiguous`` on: the reductions the
    cost model would spread over blocks itself are split too."""
    from stagegraph.core.graph import Graph
    from stagegraph.graphs import gpu, gpu_cpu
    from stagegraph.stages.gpu.split_reduction import gpu_split_reductions

    graph = (gpu_cpu if name == "gpu_cpu" else gpu).build()
    stages = [gpu_split_reductions("split", contiguous=True) if s.name == "split" else s
              for s in graph.stages.values()]  # fmt: skip
    return Graph(name, stages, graph.edges, graph.inputs.values(), default_splice="bufferized")


def payload(tmp_path: Path, text: str, name: str, **sizes: int) -> Path:
    for key, value in sizes.items():
        text = text.replace(key, str(value))
    path = tmp_path / f"{name}.mlir"
    path.write_text(text)
    return path


def generics(module) -> list:
    from stagegraph.mlir.walk import collect

    return collect(module, "linalg.generic")


def shape_of(value) -> list[int]:
    from stagegraph.mlir.bindings import ir

    return list(ir.RankedTensorType(value.type).shape)


def kinds_of(op) -> list[str]:
    from stagegraph.mlir.bindings import ir

    kinds = ir.ArrayAttr(op.attributes["iterator_types"])
    return [str(k).split("<")[-1].rstrip(">") for k in kinds]


# -- the rows --------------------------------------------------------------------------


def test_rows_fill_the_sms_with_rows_of_two_warps_at_least():
    h200 = resolve_gpu_target("h200")
    fill = h200.sm_count * h200.max_threads_per_sm // h200.warp_size
    assert rows_bound(10**8, h200) == fill == 8448  # a long reduction: a row per warp held
    assert rows_bound(8000, h200) == 8000 // 64  # a short one: rows of two warps at least
    a100 = resolve_gpu_target("sm_80")
    assert rows_bound(10**8, a100) == a100.sm_count * 64  # read from the target, not fixed


def test_row_split_takes_a_divisor_or_leaves_a_remainder():
    assert row_split(57344, 264) == (256, 224)  # the largest divisor up to the bound
    assert row_split(8191, 127) == (127, 64)  # a prime: the bound, 63 elements left over
    assert row_split(100, 1) == (1, 100)  # too short to split


# -- the IR ----------------------------------------------------------------------------


def test_a_sum_to_a_scalar_becomes_parallel_rows_then_their_sum(tmp_path):
    path = payload(tmp_path, SUM_OF_SQUARES, "squares", ROWS=7, COLS=1000)
    module = sg.run("gpu", str(path), target="h200", until="split").module.ir
    partial, final = generics(module)
    # 7000 elements (not whole warps): at most 7000 // 64 = 109 rows; 100 divides 7000, so
    # 100 rows of 70, then one thread adds the 100 partial sums into the payload's own
    # initial value.
    assert kinds_of(partial) == ["parallel", "reduction"]
    assert shape_of(partial.operands[0]) == [100, 70] and shape_of(partial.results[0]) == [100]
    assert shape_of(partial.operands[1]) == []  # the broadcast scalar stays a scalar
    assert kinds_of(final) == ["reduction"] and shape_of(final.results[0]) == []
    assert final.operands[0] == partial.results[0]
    assert final.operands[1].owner.name == "linalg.fill"  # the payload's initial value
    body = [op.name for op in partial.regions[0].blocks[0].operations]
    assert body == ["arith.subf", "arith.mulf", "arith.addf", "linalg.yield"]
    params = sg.run("gpu", str(path), target="h200", until="select").value("select")
    assert any(p.mapped for p in params.kernels)  # the cost model maps the partial rows


def test_whole_warps_of_contiguous_input_are_left_to_the_cost_model(tmp_path):
    path = payload(tmp_path, SUM_OF_SQUARES, "squares", ROWS=224, COLS=256)
    module = sg.run("gpu", str(path), target="h200", until="split").module.ir
    (op,) = generics(module)  # gpu.full_reduction spreads it over blocks in one kernel
    assert kinds_of(op) == ["reduction", "reduction"]


def test_partial_sums_fold_again_until_few_remain(tmp_path):
    path = payload(tmp_path, SUM_OF_SQUARES, "squares", ROWS=224, COLS=256)
    module = sg.run(contiguous_graph("gpu"), str(path), target="h200", until="split").module.ir
    rows = [shape_of(op.results[0]) for op in generics(module)]
    assert rows == [[896], [14], []]  # 57344 = 896 x 64; 896 partials = 14 x 64; then 14


def test_a_remainder_continues_the_fold(tmp_path):
    path = payload(tmp_path, MAXIMUM, "maximum", N=8191)
    module = sg.run("gpu", str(path), target="h200", until="split").module.ir
    partial, final, tail = generics(module)
    assert shape_of(partial.operands[0]) == [127, 64]
    assert shape_of(tail.operands[0]) == [63]  # 8191 - 127 * 64
    assert tail.operands[1] == final.results[0]  # the fold goes on from the rows' result
    fill = partial.operands[1].owner
    from stagegraph.mlir.bindings import ir

    neutral = ir.FloatAttr(fill.operands[0].owner.attributes["value"]).value
    assert neutral == float("-inf")  # each row starts from maximumf's neutral element


def test_a_broadcast_operand_makes_the_leading_loop_the_rows(tmp_path):
    path = payload(tmp_path, BROADCAST, "broadcast", ROWS=96, COLS=200)
    module = sg.run("gpu", str(path), target="h200", until="split").module.ir
    partial, *finals = generics(module)
    assert kinds_of(partial) == ["parallel", "reduction"]  # the op's own loops, d0 parallel
    assert shape_of(partial.operands[1]) == [200] and shape_of(partial.results[0]) == [96]
    assert shape_of(finals[-1].results[0]) == []


def test_other_reductions_are_left_alone(tmp_path):
    from tests.test_gpu_graph import PAYLOAD  # row sums: a parallel loop already

    before = sg.run("gpu", str(PAYLOAD), until="normalize").module.ir
    after = sg.run("gpu", str(PAYLOAD), until="split").module.ir
    assert [kinds_of(op) for op in generics(after)] == [kinds_of(op) for op in generics(before)]
    short = payload(tmp_path, MAXIMUM, "short", N=100)  # under two rows of two warps
    module = sg.run("gpu", str(short), target="h200", until="split").module.ir
    (op,) = generics(module)
    assert kinds_of(op) == ["reduction"]


# -- values and kernels ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "sizes"),
    [
        (SUM_OF_SQUARES, {"ROWS": 7, "COLS": 1000}),
        (MAXIMUM, {"N": 8191}),
        (BROADCAST, {"ROWS": 96, "COLS": 200}),
        (SUM_OF_SQUARES, {"ROWS": 224, "COLS": 256}),
    ],
    ids=["divisible", "remainder", "broadcast", "contiguous"],
)
def test_split_reductions_keep_their_values_on_the_cpu(tmp_path, text, sizes):
    path = payload(tmp_path, text, "values", **sizes)
    report = sg.run(contiguous_graph(), str(path))
    assert report.verified, report.message


def test_the_partial_rows_launch_more_than_one_thread(tmp_path):
    pytest.importorskip("llvmlite")
    path = payload(tmp_path, BROADCAST, "broadcast", ROWS=256, COLS=200)
    out = tmp_path / "artifact"
    sg.run("gpu", str(path), target="h200", emit="object", output=str(out))
    manifest = json.loads((out / "manifest.json").read_text())
    threads = [
        k["launch"]["grid"][0] * k["launch"]["grid"][1] * k["launch"]["block"][0]
        * k["launch"]["block"][1] for k in manifest["kernels"]
    ]  # fmt: skip
    assert max(threads) >= 256  # the 256 partial rows, at least a thread each
