"""Runs of identical steps of the entry (an unrolled recurrent network's time steps, each a
few calls of deduplicated functions) are rolled into one ``scf.for`` when the IR proves the
loop computes the same (``stages.common.roll``)."""

from __future__ import annotations

import numpy as np
import pytest

from stagegraph.mlir.diagnostics import parse_payload

STEPS, ROWS, WIDTH = 5, 8, 16

_MAPS = "#id = affine_map<(d0, d1) -> (d0, d1)>"


def _rnn(reverse: bool = False) -> str:
    """An unrolled tanh RNN as an importer writes it: every step's input sliced first, then
    per step h = tanh(h @ w + x[t]), the outputs concatenated in time order (``reverse``:
    the steps run from the last time step to the first, as a backward direction does)."""
    t, r, w = STEPS, ROWS, WIDTH
    order = list(range(t))[::-1] if reverse else list(range(t))
    lines = [
        _MAPS,
        f"func.func @main(%x: tensor<{t}x{r}x{w}xf32>, %h0: tensor<{r}x{w}xf32>, "
        f"%w: tensor<{w}x{w}xf32>) -> (tensor<{t}x{r}x{w}xf32>, tensor<{r}x{w}xf32>) {{",
        "  %zero = arith.constant 0.0 : f32",
    ]
    for s in range(t):
        lines.append(
            f"  %x{s} = tensor.extract_slice %x[{s}, 0, 0] [1, {r}, {w}] [1, 1, 1]"
            f" : tensor<{t}x{r}x{w}xf32> to tensor<{r}x{w}xf32>"
        )
    for n, s in enumerate(order):
        lines.append(f"""
  %e{n} = tensor.empty() : tensor<{r}x{w}xf32>
  %z{n} = linalg.fill ins(%zero : f32) outs(%e{n} : tensor<{r}x{w}xf32>) -> tensor<{r}x{w}xf32>
  %m{n} = linalg.matmul ins(%h{n}, %w : tensor<{r}x{w}xf32>, tensor<{w}x{w}xf32>)
                       outs(%z{n} : tensor<{r}x{w}xf32>) -> tensor<{r}x{w}xf32>
  %h{n + 1} = linalg.generic {{indexing_maps = [#id, #id, #id],
                              iterator_types = ["parallel", "parallel"]}}
      ins(%m{n}, %x{s} : tensor<{r}x{w}xf32>, tensor<{r}x{w}xf32>)
      outs(%e{n} : tensor<{r}x{w}xf32>) {{
  ^bb0(%a: f32, %b: f32, %o: f32):
    %sum = arith.addf %a, %b : f32
    %y = math.tanh %sum : f32
    linalg.yield %y : f32
  }} -> tensor<{r}x{w}xf32>
  %o{n} = tensor.expand_shape %h{n + 1} [[0, 1], [2]] output_shape [1, {r}, {w}]
      : tensor<{r}x{w}xf32> into tensor<1x{r}x{w}xf32>""")
    outputs = [f"%o{order.index(s)}" for s in range(t)]  # time order
    types = ", ".join([f"tensor<1x{r}x{w}xf32>"] * t)
    lines.append(
        f"  %out = tensor.concat dim(0) {', '.join(outputs)} : ({types}) -> tensor<{t}x{r}x{w}xf32>"
    )
    lines.append(f"  return %out, %h{t} : tensor<{t}x{r}x{w}xf32>, tensor<{r}x{w}xf32>\n}}")
    return "\n".join(lines)


def _expected(x, h0, w, reverse: bool):
    h = h0
    out = np.empty_like(x)
    for s in reversed(range(len(x))) if reverse else range(len(x)):
        h = np.tanh(h @ w + x[s])
        out[s] = h
    return out, h


def _scheduled(text: str, roll: bool = True):
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
        params = heuristic.fn(facts, detect_target(), CostModelConfig(threads=1))
        config = ScheduleConfig(deduplicate_above=0, roll_steps=roll)
        schedule.fn(Module["tensor"](payload), facts, params, config)
        assert payload.operation.verify()
    return payload, params


def _main(payload):
    from stagegraph.mlir.functions import entry_function

    return entry_function(payload, "main")


@pytest.mark.parametrize("reverse", [False, True])
def test_unrolled_steps_become_one_loop(reverse):
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import collect, top_level_ops

    payload, _ = _scheduled(_rnn(reverse))
    main = _main(payload)
    top = [op.name for op in top_level_ops(main)]
    assert top.count("scf.for") == 1
    assert "func.call" not in top and "tensor.concat" not in top
    (loop,) = collect(main, "scf.for")
    bounds = [ir.IntegerAttr(v.owner.attributes["value"]).value for v in loop.operands[:2]]
    assert bounds == [0, STEPS]
    # One step in the body: one call, its input sliced at an offset from the induction
    # variable, its output inserted into the concatenation.
    assert len(collect(loop, "func.call")) == 1
    (piece,) = collect(loop, "tensor.extract_slice")
    assert len(piece.operands) == 2  # the source and the dynamic time offset
    assert len(collect(loop, "tensor.insert_slice")) == 1


def test_rolling_can_be_turned_off():
    from stagegraph.mlir.walk import collect

    payload, _ = _scheduled(_rnn(), roll=False)
    main = _main(payload)
    assert not collect(main, "scf.for")
    assert len(collect(main, "func.call")) == STEPS


@pytest.mark.parametrize("reverse", [False, True])
def test_rolled_steps_compute_the_same(reverse):
    from stagegraph.core.ports import Module
    from stagegraph.mlir.bindings import ir
    from stagegraph.runtime.jit import JitBinary
    from stagegraph.stages.common.emit import runtime_libraries
    from stagegraph.stages.common.passes import BufferizeConfig, bufferize
    from stagegraph.stages.target import detect_target
    from stagegraph.stages.x86.ir_stages import LowerConfig, lower

    payload, params = _scheduled(_rnn(reverse))
    with payload.context, ir.Location.unknown():
        bufferize.fn(Module["tensor"](payload), BufferizeConfig())
        lower.fn(Module["buffer"](payload), params, detect_target(), LowerConfig())
        binary = JitBinary(payload, shared_libs=runtime_libraries(payload))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((STEPS, ROWS, WIDTH), dtype=np.float32)
    h0 = rng.standard_normal((ROWS, WIDTH), dtype=np.float32)
    w = (rng.standard_normal((WIDTH, WIDTH), dtype=np.float32) / 4).astype(np.float32)
    inputs = [x.copy(), h0.copy(), w.copy()]
    out, last = binary.call("main", [x, h0, w])
    for given, kept in zip([x, h0, w], inputs, strict=True):
        np.testing.assert_array_equal(given, kept)  # the carried state is a copy of h0
    expected_out, expected_last = _expected(x, h0, w, reverse)
    np.testing.assert_allclose(out, expected_out, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(last, expected_last, rtol=1e-4, atol=1e-5)


def _roll(text: str) -> tuple[int, object]:
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.functions import entry_function
    from stagegraph.stages.common.roll import roll_repeated

    payload = parse_payload(text)
    with payload.context, ir.Location.unknown():
        rolled = roll_repeated(entry_function(payload, "main"), {"step"})
        assert payload.operation.verify()
    return rolled, payload


_STEP = "func.func private @step(tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>\n"


def test_steps_reading_an_earlier_step_are_not_rolled():
    # Each step reads the step two before it: neither carried nor invariant.
    body = "\n".join(
        f"  %h{s} = func.call @step(%h{s - 1}, %h{s - 2}) : "
        "(tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>"
        for s in range(2, 7)
    )
    text = (
        _STEP + "func.func @main(%h0: tensor<4xf32>, %h1: tensor<4xf32>) -> tensor<4xf32> {\n"
        f"{body}\n  return %h6 : tensor<4xf32>\n}}"
    )
    rolled, _ = _roll(text)
    assert rolled == 0


def test_steps_whose_results_are_read_later_one_by_one_are_not_rolled():
    # Every step's result is returned on its own: no loop can yield them all.
    body = "\n".join(
        f"  %h{s} = func.call @step(%h{s - 1}, %w) : "
        "(tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>"
        for s in range(1, 5)
    )
    text = (
        _STEP + "func.func @main(%h0: tensor<4xf32>, %w: tensor<4xf32>) -> "
        "(tensor<4xf32>, tensor<4xf32>) {\n"
        f"{body}\n  return %h2, %h4 : tensor<4xf32>, tensor<4xf32>\n}}"
    )
    rolled, _ = _roll(text)
    assert rolled == 0


def test_calls_of_functions_not_known_pure_are_not_rolled():
    body = "\n".join(
        f"  %h{s} = func.call @other(%h{s - 1}, %w) : "
        "(tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>"
        for s in range(1, 5)
    )
    text = (
        "func.func private @other(tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>\n"
        "func.func @main(%h0: tensor<4xf32>, %w: tensor<4xf32>) -> tensor<4xf32> {\n"
        f"{body}\n  return %h4 : tensor<4xf32>\n}}"
    )
    rolled, _ = _roll(text)
    assert rolled == 0


def test_a_carried_step_rolls_and_yields_its_last_value():
    from stagegraph.mlir.walk import collect

    body = "\n".join(
        f"  %h{s} = func.call @step(%h{s - 1}, %w) : "
        "(tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>"
        for s in range(1, 5)
    )
    text = (
        _STEP + "func.func @main(%h0: tensor<4xf32>, %w: tensor<4xf32>) -> tensor<4xf32> {\n"
        f"{body}\n  return %h4 : tensor<4xf32>\n}}"
    )
    rolled, payload = _roll(text)
    assert rolled == 1
    (loop,) = collect(payload.operation, "scf.for")
    (ret,) = collect(payload.operation, "func.return")
    assert ret.operands[0].owner == loop  # the loop's last h is returned


def test_next_run_finds_the_longest_repetition():
    from stagegraph.stages.common.roll_runs import Run, next_run

    assert next_run([9, 1, 2, 3, 1, 2, 3, 1, 2, 3, 7]) == Run(1, 3, 3)
    assert next_run([-1, -2, -3, -4]) is None  # ops no step may hold never match
    assert next_run([4, 4, 4, 5]) == Run(0, 1, 3)
