"""Repeated groups of ops (the steps of an unrolled recurrent network) are scheduled and
compiled once: one private function per distinct group, a call at every site
(``stages.common.dedup``)."""

from __future__ import annotations

import numpy as np
import pytest

from stagegraph.mlir.diagnostics import parse_payload

_ID = "#id = affine_map<(d0, d1) -> (d0, d1)>"


def _step(s: int, rows: int, k: int, n: int, w: str) -> str:
    return f"""
  %e{s} = tensor.empty() : tensor<{rows}x{n}xf32>
  %z{s} = linalg.fill ins(%zero : f32) outs(%e{s} : tensor<{rows}x{n}xf32>)
      -> tensor<{rows}x{n}xf32>
  %m{s} = linalg.matmul ins(%h{s}, %{w} : tensor<{rows}x{k}xf32>, tensor<{k}x{n}xf32>)
                       outs(%z{s} : tensor<{rows}x{n}xf32>) -> tensor<{rows}x{n}xf32>
  %h{s + 1} = linalg.generic {{indexing_maps = [#id, #id],
                              iterator_types = ["parallel", "parallel"]}}
      ins(%m{s} : tensor<{rows}x{n}xf32>) outs(%e{s} : tensor<{rows}x{n}xf32>) {{
  ^bb0(%x: f32, %o: f32):
    %r = math.tanh %x : f32
    linalg.yield %r : f32
  }} -> tensor<{rows}x{n}xf32>"""


# Five steps of an 8x16 @ 16x16 layer, a 16 -> 32 step, then three steps of 8x32 @ 32x32.
SMALL, WIDE = 5, 3
PAYLOAD = (
    f"""{_ID}
func.func @main(%h0: tensor<8x16xf32>, %w: tensor<16x16xf32>, %u: tensor<16x32xf32>,
                %v: tensor<32x32xf32>) -> tensor<8x32xf32> {{
  %zero = arith.constant 0.0 : f32"""
    + "".join(_step(s, 8, 16, 16, "w") for s in range(SMALL))
    + _step(SMALL, 8, 16, 32, "u")
    + "".join(_step(s, 8, 32, 32, "v") for s in range(SMALL + 1, SMALL + 1 + WIDE))
    + f"""
  return %h{SMALL + 1 + WIDE} : tensor<8x32xf32>
}}
"""
)


def _scheduled(text: str, threads: int = 1, roll: bool = False):
    """``text`` parsed and through the x86 schedule stage, repeated groups deduplicated
    however small the payload (and the calls left as they are unless ``roll``: rolling
    them into loops is tests/test_roll.py's)."""
    from stagegraph.core.ports import Module
    from stagegraph.mlir.bindings import ir
    from stagegraph.stages.analysis import analyze
    from stagegraph.stages.common.costmodel import CostModelConfig
    from stagegraph.stages.target import detect_target
    from stagegraph.stages.x86.ir_stages import ScheduleConfig, schedule
    from stagegraph.stages.x86.params_stage import heuristic

    payload = parse_payload(text)
    with payload.context, ir.Location.unknown():
        facts = analyze(payload)
        params = heuristic.fn(facts, detect_target(), CostModelConfig(threads=threads))
        config = ScheduleConfig(deduplicate_above=0, roll_steps=roll)
        schedule.fn(Module["tensor"](payload), facts, params, config)
        assert payload.operation.verify()
    return payload, params


def _functions(payload) -> dict[str, object]:
    from stagegraph.mlir.functions import function_name

    return {
        function_name(op.operation): op.operation
        for op in payload.body.operations
        if op.operation.name == "func.func"
    }


def test_identical_sites_share_one_scheduled_function():
    from stagegraph.mlir.walk import collect

    payload, _ = _scheduled(PAYLOAD)
    functions = _functions(payload)
    main = functions.pop("main")
    # One function per repeated shape; the single 16 -> 32 step stays in main.
    assert len(functions) == 2
    calls = collect(main, "func.call")
    callees = [call.attributes["callee"].value for call in calls]
    assert sorted(callees.count(name) for name in functions) == [WIDE, SMALL]
    assert len(collect(main, "linalg.matmul")) == 0  # the single step was scheduled in place
    for fn in functions.values():
        assert fn.attributes["sym_visibility"].value == "private"
        assert not collect(fn, lambda op: op.name.startswith("linalg."))  # scheduled
        assert not collect(fn, lambda op: "stagegraph.origin" in op.attributes)


def test_payload_without_repetition_keeps_one_function():
    payload, _ = _scheduled(
        f"""{_ID}
func.func @main(%h0: tensor<8x16xf32>, %w: tensor<16x16xf32>) -> tensor<8x16xf32> {{
  %zero = arith.constant 0.0 : f32{_step(0, 8, 16, 16, "w")}
  return %h1 : tensor<8x16xf32>
}}
"""
    )
    assert list(_functions(payload)) == ["main"]


@pytest.mark.parametrize("roll", [False, True])
def test_deduplicated_payload_computes_the_same(roll):
    from stagegraph.core.ports import Module
    from stagegraph.mlir.bindings import ir
    from stagegraph.runtime.jit import JitBinary
    from stagegraph.stages.common.emit import runtime_libraries
    from stagegraph.stages.common.passes import BufferizeConfig, bufferize
    from stagegraph.stages.target import detect_target
    from stagegraph.stages.x86.ir_stages import LowerConfig, lower

    payload, params = _scheduled(PAYLOAD, roll=roll)
    with payload.context, ir.Location.unknown():
        bufferize.fn(Module["tensor"](payload), BufferizeConfig())
        lower.fn(Module["buffer"](payload), params, detect_target(), LowerConfig())
        calls = [op for op in payload.body.operations if op.operation.name == "llvm.func"]
        assert sum("no_inline" in op.operation.attributes for op in calls) == 2
        binary = JitBinary(payload, shared_libs=runtime_libraries(payload))
    rng = np.random.default_rng(0)
    h0 = rng.standard_normal((8, 16), dtype=np.float32)
    w, u, v = (
        (rng.standard_normal(shape, dtype=np.float32) / 4).astype(np.float32)
        for shape in ((16, 16), (16, 32), (32, 32))
    )
    (out,) = binary.call("main", [h0, w, u, v])
    expected = h0
    for _ in range(SMALL):
        expected = np.tanh(expected @ w)
    expected = np.tanh(expected @ u)
    for _ in range(WIDE):
        expected = np.tanh(expected @ v)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)


def test_small_payloads_are_not_deduplicated_by_default():
    from stagegraph.core.ports import Module
    from stagegraph.mlir.bindings import ir
    from stagegraph.stages.analysis import analyze
    from stagegraph.stages.common.costmodel import CostModelConfig
    from stagegraph.stages.target import detect_target
    from stagegraph.stages.x86.ir_stages import schedule
    from stagegraph.stages.x86.params_stage import heuristic

    payload = parse_payload(PAYLOAD)
    with payload.context, ir.Location.unknown():
        facts = analyze(payload)
        params = heuristic.fn(facts, detect_target(), CostModelConfig(threads=1))
        schedule.fn(Module["tensor"](payload), facts, params)
    assert list(_functions(payload)) == ["main"]


def test_structure_key_tells_shapes_and_weights_apart():
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import collect
    from stagegraph.stages.common.dedup import clone_into_group, structure_key
    from stagegraph.stages.common.scope import outline

    payload = parse_payload(PAYLOAD)
    with payload.context, ir.Location.unknown():
        keys = []
        for matmul in collect(payload.operation, "linalg.matmul"):
            tanh = next(iter(matmul.results[0].uses)).owner.operation
            scope = outline([matmul, tanh], clone_into_group)
            keys.append(structure_key(scope.function))
            scope.inline()
        assert payload.operation.verify()
    assert len(set(keys[:SMALL])) == 1
    assert len(set(keys)) == 3
    # Weights are arguments, never cloned: a dense constant is not clonable, a splat is.
    dense = parse_payload(
        """
func.func @main() -> (tensor<2xf32>, tensor<2xf32>) {
  %a = arith.constant dense<[1.0, 2.0]> : tensor<2xf32>
  %b = arith.constant dense<3.0> : tensor<2xf32>
  return %a, %b : tensor<2xf32>, tensor<2xf32>
}
"""
    )
    a, b = collect(dense.operation, "arith.constant")
    assert not clone_into_group(a) and clone_into_group(b)
