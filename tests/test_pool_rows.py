"""Poolings narrower than a vector but at least half one run along their output rows
(``generic/plan.py``'s ``POOL_ROW_PARTS_OF_A_VECTOR``): the choice on pinned targets, the
vectors the schedule makes, and values against numpy with padding and odd sizes."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from stagegraph.mlir.diagnostics import parse_payload
from stagegraph.stages.analysis import analyze
from stagegraph.stages.target import resolve_target
from stagegraph.stages.x86.generic.params import heuristic_generic_params


def _padded_max_pool(channels: int, size: int, window: int, pad: int) -> str:
    """A ``window``-square, stride-1 max pooling of a 2 x ``channels`` x ``size`` x
    ``size`` NCHW image padded by ``pad`` with -inf (torch-mlir's ``MaxPool2d`` form)."""
    padded = size + 2 * pad
    out = padded - window + 1
    image, full = (
        f"tensor<2x{channels}x{size}x{size}xf32>",
        f"tensor<2x{channels}x{padded}x{padded}xf32>",
    )
    result = f"tensor<2x{channels}x{out}x{out}xf32>"
    return f"""
func.func @main(%x: {image}) -> {result} {{
  %ninf = arith.constant 0xFF800000 : f32
  %p = tensor.pad %x low[0, 0, {pad}, {pad}] high[0, 0, {pad}, {pad}] {{
  ^bb0(%a: index, %b: index, %c: index, %d: index):
    tensor.yield %ninf : f32
  }} : {image} to {full}
  %w = tensor.empty() : tensor<{window}x{window}xf32>
  %e = tensor.empty() : {result}
  %f = linalg.fill ins(%ninf : f32) outs(%e : {result}) -> {result}
  %r = linalg.pooling_nchw_max {{dilations = dense<1> : vector<2xi64>,
      strides = dense<1> : vector<2xi64>}}
      ins(%p, %w : {full}, tensor<{window}x{window}xf32>) outs(%f : {result}) -> {result}
  return %r : {result}
}}
"""


def _numpy_max_pool(x: np.ndarray, window: int, pad: int) -> np.ndarray:
    padded = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)), constant_values=-np.inf)
    out = padded.shape[2] - window + 1
    return np.max(
        [
            padded[:, :, a : a + out, b : b + out]
            for a, b in itertools.product(range(window), repeat=2)
        ],
        axis=0,
    )


def _pool_op(module):
    facts = analyze(module)
    (pool,) = [op for op in facts.ops if op.op_class == "pooling"]
    return facts, pool


@pytest.mark.parametrize("level", ["x86-64-v4", "x86-64-v3"])
def test_rows_of_half_a_vector_or_more_vectorize_along_width(level):
    """On each pinned tier, an output width of half the lanes or more vectorizes along its
    rows, one narrower does not (the lanes come from the target, not from the test)."""
    from stagegraph.stages.x86.generic.plan import pools_along_width

    target = resolve_target(level)
    lanes = target.vector_bits // 32
    for width, along in ((lanes // 2, True), (lanes - 1, True), (lanes // 2 - 1, False)):
        # output width = size + 2 * pad - window + 1 with window 3, pad 1: size itself
        module = parse_payload(_padded_max_pool(3, width, 3, 1))
        facts, pool = _pool_op(module)
        params = heuristic_generic_params(facts, target)
        assert params.lanes == lanes
        assert pools_along_width(pool, params) == along, (level, width)


@pytest.mark.parametrize(("size", "window", "pad"), [(16, 4, 1), (13, 3, 1), (11, 2, 0)])
def test_row_vectors_compute_padded_max_pools(size, window, pad):
    """Widths of 15, 13 and 10 outputs (under a 16-lane vector, at least half of it):
    every window offset is one ``vector<width>`` maximum (no per-channel lane shuffles),
    and the pooled values equal numpy's over the -inf padded image, odd sizes included."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import collect
    from stagegraph.runtime.jit import JitBinary
    from stagegraph.stages.x86.generic.plan import pools_along_width
    from stagegraph.stages.x86.generic.schedule import (
        apply_generic_schedule,
        build_generic_schedule,
        lower_generic,
    )

    target = resolve_target("x86-64-v4")
    text = _padded_max_pool(5, size, window, pad)
    module = parse_payload(text)
    facts, pool = _pool_op(module)
    params = heuristic_generic_params(facts, target)
    width = size + 2 * pad - window + 1
    assert width < params.lanes <= 2 * width and pools_along_width(pool, params)
    with module.context, ir.Location.unknown():
        apply_generic_schedule(module, build_generic_schedule(facts, params), facts)
    shapes = {
        tuple(ir.VectorType(op.results[0].type).shape)
        for op in collect(module.operation, "arith.maximumf")
    }
    assert shapes == {(width,)}

    compiled = parse_payload(text)
    lower_generic(compiled, params)
    x = np.random.default_rng(size).standard_normal((2, 5, size, size)).astype(np.float32)
    (out,) = JitBinary(compiled, opt_level=2).call("main", [x])
    np.testing.assert_array_equal(out, _numpy_max_pool(x, window, pad))
