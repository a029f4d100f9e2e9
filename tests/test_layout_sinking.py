"""Channels-last carried between convolutions (``stages.x86.generic.layout_sinking``, run by
the generic schedule's ``prepare`` after the convolutions go channels-last): the IR after
the sinking (no transpose left between two convolutions, the ops in between on the
channels-last tensor) and the values through the x86 graph against numpy."""

from __future__ import annotations

import numpy as np
import pytest

import stagegraph as sg
from stagegraph.mlir.diagnostics import parse_payload
from stagegraph.mlir.walk import collect, top_level_ops

# Batch 2 (no unit dims): conv -> bias + ReLU -> pad -> conv -> residual add -> 2x2 max pool.
N, C, F, S = 2, 8, 16, 6  # batch, input channels, filters, input size (3x3: S - 2 out)
OUT = S - 2
X_T, W1_T, W2_T = (
    f"tensor<{N}x{C}x{S}x{S}xf32>",
    f"tensor<{F}x{C}x3x3xf32>",
    f"tensor<{F}x{F}x3x3xf32>",
)
Y_T, P_T, POOL_T = (
    f"tensor<{N}x{F}x{OUT}x{OUT}xf32>",
    f"tensor<{N}x{F}x{S}x{S}xf32>",
    f"tensor<{N}x{F}x2x2xf32>",
)
ID4 = "affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>"
CHANNEL = "affine_map<(d0, d1, d2, d3) -> (d1)>"
ATTRS = "{dilations = dense<1> : tensor<2xi64>, strides = dense<1> : tensor<2xi64>}"
POOL = "{dilations = dense<1> : tensor<2xi64>, strides = dense<2> : tensor<2xi64>}"
CHAIN = f"""
func.func @main(%x: {X_T}, %w1: {W1_T}, %w2: {W2_T}, %b: tensor<{F}xf32>) -> {POOL_T} {{
  %zero = arith.constant 0.0 : f32
  %least = arith.constant -3.4e38 : f32
  %e = tensor.empty() : {Y_T}
  %z = linalg.fill ins(%zero : f32) outs(%e : {Y_T}) -> {Y_T}
  %c1 = linalg.conv_2d_nchw_fchw {ATTRS} ins(%x, %w1 : {X_T}, {W1_T}) outs(%z : {Y_T}) -> {Y_T}
  %r = linalg.generic {{indexing_maps = [{ID4}, {CHANNEL}, {ID4}],
      iterator_types = ["parallel", "parallel", "parallel", "parallel"]}}
      ins(%c1, %b : {Y_T}, tensor<{F}xf32>) outs(%e : {Y_T}) {{
  ^bb0(%a: f32, %bias: f32, %o: f32):
    %s = arith.addf %a, %bias : f32
    %m = arith.maximumf %s, %zero : f32
    linalg.yield %m : f32
  }} -> {Y_T}
  %p = tensor.pad %r low[0, 0, 1, 1] high[0, 0, 1, 1] {{
  ^bb0(%i0: index, %i1: index, %i2: index, %i3: index):
    tensor.yield %zero : f32
  }} : {Y_T} to {P_T}
  %c2 = linalg.conv_2d_nchw_fchw {ATTRS} ins(%p, %w2 : {P_T}, {W2_T}) outs(%z : {Y_T}) -> {Y_T}
  %sum = linalg.generic {{indexing_maps = [{ID4}, {ID4}, {ID4}],
      iterator_types = ["parallel", "parallel", "parallel", "parallel"]}}
      ins(%c2, %r : {Y_T}, {Y_T}) outs(%e : {Y_T}) {{
  ^bb0(%a: f32, %c: f32, %o: f32):
    %s = arith.addf %a, %c : f32
    linalg.yield %s : f32
  }} -> {Y_T}
  %pe = tensor.empty() : {POOL_T}
  %pi = linalg.fill ins(%least : f32) outs(%pe : {POOL_T}) -> {POOL_T}
  %window = tensor.empty() : tensor<2x2xf32>
  %pool = linalg.pooling_nchw_max {POOL} ins(%sum, %window : {Y_T}, tensor<2x2xf32>)
      outs(%pi : {POOL_T}) -> {POOL_T}
  return %pool : {POOL_T}
}}
"""


def _rewritten(text: str, sink: bool = True) -> tuple[object, object, int, int]:
    """The payload after the channels-last rewrite (and the sinking): the module, its
    function, and its transposes before and after the sinking."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.stages.x86.conv.rewrites import conv_to_channels_last
    from stagegraph.stages.x86.generic.layout_sinking import (
        count_transposes,
        sink_channels_last_transposes,
    )
    from stagegraph.stages.x86.generic.prepare import erase_unused_tensor_ops

    module = parse_payload(text)
    (fn,) = [op for op in top_level_ops(module.operation) if op.name == "func.func"]
    with module.context, ir.Location.unknown():
        assert conv_to_channels_last(fn) == 2
        before = count_transposes(fn)
        if sink:
            assert sink_channels_last_transposes(fn) > 0
            erase_unused_tensor_ops(fn)
        assert module.operation.verify()
        return module, fn, before, count_transposes(fn)


def _between(first: object, second: object) -> list[str]:
    """Names of the ops on the producer paths from ``second``'s image back to ``first``."""
    from stagegraph.stages.x86.generic.linalg_parts import result_owner

    names, work, seen = [], [second.operands[0]], set()
    while work:
        owner = result_owner(work.pop())
        if owner is None or owner == first or owner in seen:
            continue
        seen.add(owner)
        names.append(owner.name)
        work.extend(owner.operands)
    return names


def test_no_transpose_is_left_between_the_two_convolutions() -> None:
    from stagegraph.mlir.bindings import ir

    module, fn, before, after = _rewritten(CHAIN)
    first, second = collect(module, "linalg.conv_2d_nhwc_hwcf")
    path = _between(first, second)
    assert "linalg.transpose" not in path
    assert "tensor.pad" in path and "linalg.generic" in path
    # Left: the input's and the two filters' and the result's (after the pool: NCHW out);
    # gone: each convolution's result back to NCHW and the second one's input.
    assert (before, after) == (8, 4)
    (pool,) = collect(module, "linalg.pooling_nhwc_max")
    assert ir.RankedTensorType(pool.results[0].type).shape == [N, 2, 2, F]
    # The ops in between run channels-last: the pad pads H and W, now dims 1 and 2.
    (pad,) = collect(module, "tensor.pad")
    assert list(ir.DenseI64ArrayAttr(pad.attributes["static_low"])) == [0, 1, 1, 0]
    relu = next(op for op in collect(module, "linalg.generic") if op.operands[0] == first.result)
    maps = [str(ir.AffineMapAttr(a).value) for a in relu.attributes["indexing_maps"]]
    assert maps == [
        "(d0, d1, d2, d3) -> (d0, d1, d2, d3)",
        "(d0, d1, d2, d3) -> (d3)",
        "(d0, d1, d2, d3) -> (d0, d1, d2, d3)",
    ]
    (last,) = [op for op in top_level_ops(fn) if op.name == "linalg.transpose"][-1:]
    assert last.operands[0] == pool.results[0]  # converted back only for the result


def test_without_a_convolution_nothing_moves() -> None:
    from stagegraph.mlir.bindings import ir
    from stagegraph.stages.x86.generic.layout_sinking import sink_channels_last_transposes

    text = """
func.func @main(%x: tensor<2x3x4xf32>) -> tensor<4x2x3xf32> {
  %e = tensor.empty() : tensor<4x2x3xf32>
  %t = linalg.transpose ins(%x : tensor<2x3x4xf32>) outs(%e : tensor<4x2x3xf32>) permutation = [2, 0, 1]
  %n = linalg.generic {indexing_maps = [affine_map<(a, b, c) -> (a, b, c)>, affine_map<(a, b, c) -> (a, b, c)>],
      iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%t : tensor<4x2x3xf32>) outs(%e : tensor<4x2x3xf32>) {
  ^bb0(%a: f32, %o: f32):
    %m = arith.negf %a : f32
    linalg.yield %m : f32
  } -> tensor<4x2x3xf32>
  return %n : tensor<4x2x3xf32>
}
"""  # noqa: E501
    module = parse_payload(text)
    (fn,) = [op for op in top_level_ops(module.operation) if op.name == "func.func"]
    with module.context, ir.Location.unknown():
        assert sink_channels_last_transposes(fn) == 0  # a user's transpose stays as it was
    assert len(collect(module, "linalg.transpose")) == 1


def _conv(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """NCHW x FCHW, 3x3, stride 1, no padding (float64)."""
    n, _, h, width = x.shape
    out = np.zeros((n, w.shape[0], h - 2, width - 2))
    for i in range(3):
        for j in range(3):
            window = x[:, :, i : i + h - 2, j : j + width - 2]
            out += np.einsum("nchw,fc->nfhw", window, w[:, :, i, j])
    return out


def _chain_reference(x, w1, w2, b) -> np.ndarray:
    r = np.maximum(_conv(x, w1) + b[None, :, None, None], 0.0)
    total = _conv(np.pad(r, ((0, 0), (0, 0), (1, 1), (1, 1))), w2) + r
    return total.reshape(N, F, 2, 2, 2, 2).max(axis=(3, 5))


@pytest.mark.parametrize("chained", [True, False])
def test_the_chain_computes_the_same_values(tmp_path, chained: bool) -> None:
    """Through the x86 graph (both convolutions on the direct, channels-last path; the
    target pinned), with and without the sinking (in ``x86.normalize`` and in the
    schedule's ``prepare``), against numpy."""
    from stagegraph.core.catalog import load_graph

    rng = np.random.default_rng(3)
    x = rng.standard_normal((N, C, S, S)).astype(np.float32)
    w1 = rng.standard_normal((F, C, 3, 3)).astype(np.float32)
    w2 = rng.standard_normal((F, F, 3, 3)).astype(np.float32)
    b = rng.standard_normal(F).astype(np.float32)
    (tmp_path / "chain.mlir").write_text(CHAIN)
    expected = _chain_reference(*(a.astype(np.float64) for a in (x, w1, w2, b)))
    np.savez(tmp_path / "chain.npz", in0=x, in1=w1, in2=w2, in3=b, out0=expected.astype(np.float32))
    graph = load_graph("x86").with_config("normalize", path="direct", chain_channels_last=chained)
    result = sg.run(
        graph, str(tmp_path / "chain.mlir"), threads=1, target="x86-64-v3",
        param={"conv_chain_channels_last": chained},
    )  # fmt: skip
    assert result.verified is True, result.message


# Batch 1 as the PyTorch import gives it (unit dims dropped between convolutions): conv ->
# a per-channel mean (reduction, shifted by the first element: a leading slice) subtracted
# -> pad -> concatenated with itself -> conv.
V_X, V_Y, V_C = "tensor<1x8x6x6xf32>", "tensor<1x16x4x4xf32>", "tensor<16x4x4xf32>"
V_P, V_CAT, V_W2 = "tensor<16x6x6xf32>", "tensor<1x32x6x6xf32>", "tensor<16x32x3x3xf32>"
ID3 = "affine_map<(d0, d1, d2) -> (d0, d1, d2)>"
UNIT = f"""
func.func @main(%x: {V_X}, %w1: {W1_T}, %w2: {V_W2}) -> {V_Y} {{
  %zero = arith.constant 0.0 : f32
  %sixteen = arith.constant 16.0 : f32
  %e = tensor.empty() : {V_Y}
  %z = linalg.fill ins(%zero : f32) outs(%e : {V_Y}) -> {V_Y}
  %c1 = linalg.conv_2d_nchw_fchw {ATTRS} ins(%x, %w1 : {V_X}, {W1_T}) outs(%z : {V_Y}) -> {V_Y}
  %flat = tensor.collapse_shape %c1 [[0, 1], [2], [3]] : {V_Y} into {V_C}
  %first = tensor.extract_slice %flat[0, 0, 0] [16, 1, 1] [1, 1, 1] : {V_C} to tensor<16x1x1xf32>
  %s0 = tensor.empty() : tensor<16xf32>
  %s = linalg.fill ins(%zero : f32) outs(%s0 : tensor<16xf32>) -> tensor<16xf32>
  %sum = linalg.generic {{indexing_maps = [{ID3}, affine_map<(d0, d1, d2) -> (d0, 0, 0)>,
      affine_map<(d0, d1, d2) -> (d0)>], iterator_types = ["parallel", "reduction", "reduction"]}}
      ins(%flat, %first : {V_C}, tensor<16x1x1xf32>) outs(%s : tensor<16xf32>) {{
  ^bb0(%a: f32, %f: f32, %o: f32):
    %d = arith.subf %a, %f : f32
    %r = arith.addf %d, %o : f32
    linalg.yield %r : f32
  }} -> tensor<16xf32>
  %ce = tensor.empty() : {V_C}
  %centred = linalg.generic {{indexing_maps = [{ID3}, affine_map<(d0, d1, d2) -> (d0)>, {ID3}],
      iterator_types = ["parallel", "parallel", "parallel"]}}
      ins(%flat, %sum : {V_C}, tensor<16xf32>) outs(%ce : {V_C}) {{
  ^bb0(%a: f32, %m: f32, %o: f32):
    %mean = arith.divf %m, %sixteen : f32
    %r = arith.subf %a, %mean : f32
    linalg.yield %r : f32
  }} -> {V_C}
  %p = tensor.pad %centred low[0, 1, 1] high[0, 1, 1] {{
  ^bb0(%i0: index, %i1: index, %i2: index):
    tensor.yield %zero : f32
  }} : {V_C} to {V_P}
  %wide = tensor.expand_shape %p [[0, 1], [2], [3]] output_shape [1, 16, 6, 6]
      : {V_P} into tensor<1x16x6x6xf32>
  %cat = tensor.concat dim(1) %wide, %wide : (tensor<1x16x6x6xf32>, tensor<1x16x6x6xf32>) -> {V_CAT}
  %c2 = linalg.conv_2d_nchw_fchw {ATTRS} ins(%cat, %w2 : {V_CAT}, {V_W2}) outs(%z : {V_Y}) -> {V_Y}
  return %c2 : {V_Y}
}}
"""


def test_unit_dims_norms_slices_and_concatenations_carry_channels_last() -> None:
    from stagegraph.mlir.bindings import ir
    from stagegraph.stages.analysis.ops import declared_iterator_types

    module, _, before, after = _rewritten(UNIT)
    first, second = collect(module, "linalg.conv_2d_nhwc_hwcf")
    path = _between(first, second)
    assert "linalg.transpose" not in path
    assert {"tensor.concat", "tensor.pad", "linalg.generic"} <= set(path)
    assert (before, after) == (8, 4)  # input, two filters, result
    (cat,) = collect(module, "tensor.concat")
    assert ir.IntegerAttr(cat.attributes["dim"]).value == 3  # the channels, last
    # The statistics read the result in its own order: the channels innermost, parallel.
    (reduction,) = [op for op in collect(module, "linalg.generic") if len(op.operands) == 3
                    and "reduction" in declared_iterator_types(op)]  # fmt: skip
    assert declared_iterator_types(reduction) == ("reduction", "reduction", "parallel")
    (sliced,) = collect(module, "tensor.extract_slice")
    assert ir.RankedTensorType(sliced.results[0].type).shape == [1, 1, 16]


def _unit_reference(x, w1, w2) -> np.ndarray:
    c1 = _conv(x, w1)[0]
    centred = c1 - (c1 - c1[:, :1, :1]).sum(axis=(1, 2), keepdims=True) / 16.0
    padded = np.pad(centred, ((0, 0), (1, 1), (1, 1)))[None]
    return _conv(np.concatenate([padded, padded], axis=1), w2)


def test_the_unit_dim_chain_computes_the_same_values(tmp_path) -> None:
    from stagegraph.core.catalog import load_graph

    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, C, S, S)).astype(np.float32)
    w1 = rng.standard_normal((F, C, 3, 3)).astype(np.float32)
    w2 = rng.standard_normal((F, 2 * F, 3, 3)).astype(np.float32)
    (tmp_path / "unit.mlir").write_text(UNIT)
    expected = _unit_reference(*(a.astype(np.float64) for a in (x, w1, w2)))
    np.savez(tmp_path / "unit.npz", in0=x, in1=w1, in2=w2, out0=expected.astype(np.float32))
    graph = load_graph("x86").with_config("normalize", path="direct")
    result = sg.run(graph, str(tmp_path / "unit.mlir"), threads=1, target="x86-64-v3")
    assert result.verified is True, result.message


def test_normalize_carries_channels_last_and_keeps_the_path_decisions() -> None:
    """``x86.normalize`` (before the schedule cuts a model into groups) rewrites the direct
    convolutions channels-last with nothing between them; each keeps its stamped path."""
    from stagegraph.core.catalog import load_graph
    from stagegraph.core.engine import Engine
    from stagegraph.stages.x86.conv.choice import PATH_ATTRIBUTE, stamped_choices

    graph = load_graph("x86").with_config("normalize", path="direct")
    module = Engine().run(graph, CHAIN, until="normalize").module.ir
    first, second = collect(module, "linalg.conv_2d_nhwc_hwcf")
    assert "linalg.transpose" not in _between(first, second)
    assert collect(module, "linalg.conv_2d_nchw_fchw") == []
    assert all(PATH_ATTRIBUTE in op.attributes for op in (first, second))
    assert [choice.path for choice in stamped_choices(module)] == ["direct", "direct"]
    off = graph.with_config("normalize", chain_channels_last=False)
    kept = Engine().run(off, CHAIN, until="normalize").module.ir
    assert len(collect(kept, "linalg.conv_2d_nchw_fchw")) == 2  # left to the schedule


# A max over the width and its position (linalg.index) after a convolution: the loops are
# renumbered channels-last, the index op follows its loop.
ARGMAX = f"""
func.func @main(%x: {X_T}, %w1: {W1_T}) -> (tensor<{N}x{F}x{OUT}xf32>, tensor<{N}x{F}x{OUT}xi64>) {{
  %zero = arith.constant 0.0 : f32
  %least = arith.constant -3.4e38 : f32
  %none = arith.constant 0 : i64
  %e = tensor.empty() : {Y_T}
  %z = linalg.fill ins(%zero : f32) outs(%e : {Y_T}) -> {Y_T}
  %c1 = linalg.conv_2d_nchw_fchw {ATTRS} ins(%x, %w1 : {X_T}, {W1_T}) outs(%z : {Y_T}) -> {Y_T}
  %me = tensor.empty() : tensor<{N}x{F}x{OUT}xf32>
  %m0 = linalg.fill ins(%least : f32) outs(%me : tensor<{N}x{F}x{OUT}xf32>) -> tensor<{N}x{F}x{OUT}xf32>
  %ie = tensor.empty() : tensor<{N}x{F}x{OUT}xi64>
  %i0 = linalg.fill ins(%none : i64) outs(%ie : tensor<{N}x{F}x{OUT}xi64>) -> tensor<{N}x{F}x{OUT}xi64>
  %r:2 = linalg.generic {{indexing_maps = [{ID4}, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>,
      affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>],
      iterator_types = ["parallel", "parallel", "parallel", "reduction"]}}
      ins(%c1 : {Y_T}) outs(%m0, %i0 : tensor<{N}x{F}x{OUT}xf32>, tensor<{N}x{F}x{OUT}xi64>) {{
  ^bb0(%a: f32, %m: f32, %i: i64):
    %k = linalg.index 3 : index
    %ki = arith.index_cast %k : index to i64
    %gt = arith.cmpf ogt, %a, %m : f32
    %nm = arith.select %gt, %a, %m : f32
    %ni = arith.select %gt, %ki, %i : i64
    linalg.yield %nm, %ni : f32, i64
  }} -> (tensor<{N}x{F}x{OUT}xf32>, tensor<{N}x{F}x{OUT}xi64>)
  return %r#0, %r#1 : tensor<{N}x{F}x{OUT}xf32>, tensor<{N}x{F}x{OUT}xi64>
}}
"""  # noqa: E501


def test_a_loop_index_follows_its_renumbered_loop(tmp_path) -> None:
    from stagegraph.core.catalog import load_graph
    from stagegraph.mlir.bindings import ir
    from stagegraph.stages.analysis.ops import declared_iterator_types
    from stagegraph.stages.x86.generic.layout_sinking import sink_channels_last_transposes

    module = parse_payload(ARGMAX)
    (fn,) = [op for op in top_level_ops(module.operation) if op.name == "func.func"]
    with module.context, ir.Location.unknown():
        from stagegraph.stages.x86.conv.rewrites import conv_to_channels_last

        assert conv_to_channels_last(fn) == 1
        assert sink_channels_last_transposes(fn) > 0
        assert module.operation.verify()
    (reduction,) = [op for op in collect(module, "linalg.generic") if len(op.results) == 2]
    # N, H, W, C: the width (the reduced loop) is loop 2 now, and the index asks for it
    assert declared_iterator_types(reduction)[2] == "reduction"
    (index,) = collect(reduction, "linalg.index")
    assert ir.IntegerAttr(index.attributes["dim"]).value == 2
    rng = np.random.default_rng(6)
    x = rng.standard_normal((N, C, S, S)).astype(np.float32)
    w1 = rng.standard_normal((F, C, 3, 3)).astype(np.float32)
    c1 = _conv(x.astype(np.float64), w1.astype(np.float64)).astype(np.float32)
    (tmp_path / "argmax.mlir").write_text(ARGMAX)
    np.savez(tmp_path / "argmax.npz", in0=x, in1=w1, out0=c1.max(axis=3),
             out1=c1.argmax(axis=3).astype(np.int64))  # fmt: skip
    graph = load_graph("x86").with_config("normalize", path="direct")
    result = sg.run(graph, str(tmp_path / "argmax.mlir"), threads=1, target="x86-64-v3")
    assert result.verified is True, result.message
