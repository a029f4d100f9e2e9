"""The payload's thread count: the cost model's choice, a tunable the tuner varies, and the
``num_threads`` every OpenMP region of the lowered payload runs on."""

from __future__ import annotations

import pytest

import stagegraph as sg
from stagegraph.app.session import SessionRequest
from stagegraph.mlir.bindings import ir
from stagegraph.mlir.walk import collect
from stagegraph.stages.x86.threads import serial_below
from stagegraph.tune.options import TuneOptions
from stagegraph.tune.runner import Problem

MATMUL = "matmul:m=256,n=256,k=256"  # 33.5 MFLOP: worth two threads
ELEMENTWISE = """
func.func @main(%x: tensor<64x64xf32>) -> tensor<64x64xf32> {
  %e = tensor.empty() : tensor<64x64xf32>
  %y = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>,
      affine_map<(i, j) -> (i, j)>], iterator_types = ["parallel", "parallel"]}
      ins(%x : tensor<64x64xf32>) outs(%e : tensor<64x64xf32>) {
    ^bb0(%a: f32, %o: f32):
      %s = arith.mulf %a, %a : f32
      linalg.yield %s : f32
  } -> tensor<64x64xf32>
  return %y : tensor<64x64xf32>
}
"""


def _region_threads(module) -> list[int]:
    """The constant ``num_threads`` of every ``omp.parallel`` in a lowered module."""
    counts = []
    for region in collect(module, "omp.parallel"):
        sizes = list(ir.DenseI32ArrayAttr(region.attributes["operandSegmentSizes"]))
        value = region.operands[sum(sizes[:3])]  # async, allocate x2, then num_threads
        counts.append(ir.IntegerAttr(value.owner.attributes["value"]).value)
    return counts


def _problem(workload: str, threads: int) -> Problem:
    request = SessionRequest(graph="x86", workload=workload, threads=threads, target="x86-64-v4")
    return Problem(TuneOptions(session=request))


def test_the_heuristic_threads_contractions_and_keeps_memory_bound_payloads_serial(tmp_path):
    path = tmp_path / "square.mlir"
    path.write_text(ELEMENTWISE)
    matmul = sg.run("x86", MATMUL, threads=2, target="x86-64-v4", until="select")
    square = sg.run("x86", str(path), threads=2, target="x86-64-v4", until="select")
    assert (matmul.params.threads, matmul.params.granted_threads) == (2, 2)
    assert (square.params.threads, square.params.granted_threads) == (1, 2)


@pytest.mark.parametrize("threads", [1, 2])
def test_the_thread_count_reaches_every_parallel_region_and_verifies(threads):
    pytest.importorskip("stagegraph.runtime.openmp").library_path()
    param = {"threads": threads}
    lowered = sg.run("x86", MATMUL, threads=2, param=param, until="lower")
    counts = _region_threads(lowered.module.ir)
    if threads == 1:
        assert counts == []  # one thread: no OpenMP at all
    else:
        assert counts and set(counts) == {threads}
    assert sg.run("x86", MATMUL, threads=2, param=param).verified is True


def test_the_tuner_varies_the_payload_threads_within_the_granted_cores():
    problem = _problem(MATMUL, threads=2)
    space = problem.space
    assert "payload.threads" in space.variables
    assert space.values_of(problem.base)["payload.threads"] == problem.base.threads == 2
    assert "payload.threads_within_granted_cores" in space.constraints
    assert space.variables["payload.threads"].domain.describe() == {"low": 1, "high": 2}
    one = dict(space.values_of(problem.base), **{"payload.threads": 1})
    assert space.contains(one) and space.to_params(one).payload_threads() == 1
    granted_one = _problem(MATMUL, threads=1).space
    base = granted_one.values_of(granted_one.base)
    assert base["payload.threads"] == 1
    assert not granted_one.contains(dict(base, **{"payload.threads": 2}))
    assert granted_one.violated(dict(base, **{"payload.threads": 2})) == [
        "payload.threads_within_granted_cores"
    ]


def test_a_loop_splits_only_as_far_as_its_trips():
    from stagegraph.mlir.diagnostics import parse_payload
    from stagegraph.stages.common.serial_loops import (
        loop_work,
        serialize_small_parallel_loops,
        splittable_work,
    )

    text = """
    func.func @main(%m: memref<TRIPSx1048576xf32>) {
      %c0 = arith.constant 0 : index
      %c16 = arith.constant 16 : index
      %c1048576 = arith.constant 1048576 : index
      %one = arith.constant dense<1.0> : vector<16xf32>
      scf.forall (%i) in (TRIPS) {
        scf.for %j = %c0 to %c1048576 step %c16 {
          vector.store %one, %m[%i, %j] : memref<TRIPSx1048576xf32>, vector<16xf32>
        }
      }
      return
    }"""
    works = {}
    for trips in (1, 2, 3):
        module = parse_payload(text.replace("TRIPS", str(trips)))
        forall = collect(module, "scf.forall")[0]
        works[trips] = (loop_work(forall), splittable_work(forall, 2))
    assert works[1][1] == 0 and works[2][1] == works[2][0]  # one trip: nothing to split
    assert works[3][1] == works[3][0] * 2 // 3  # three on two threads: 2 trips' time
    assert works[1][0] > serial_below(2)  # big, yet not worth a fork on one trip
    one = parse_payload(text.replace("TRIPS", "1"))
    assert serialize_small_parallel_loops(one, serial_below(2), 2) == 1
    assert collect(one, "scf.forall") == []
    two = parse_payload(text.replace("TRIPS", "2"))
    assert serialize_small_parallel_loops(two, serial_below(2), 2) == 0
