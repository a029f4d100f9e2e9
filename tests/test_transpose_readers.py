"""A transpose read by several generics and a leading slice, merged into all of them
(``stages.x86.generic.transpose_readers``, run by the generic schedule's ``prepare``):
the IR after the merge (no transpose; the reduction interchanged to read the source in
its own order) and the values through the x86 graph."""

from __future__ import annotations

import numpy as np

import stagegraph as sg
from stagegraph.mlir.diagnostics import parse_payload
from stagegraph.mlir.walk import collect

N, H, W, C = 2, 3, 5, 16
NHWC, NCHW = f"tensor<{N}x{H}x{W}x{C}xf32>", f"tensor<{N}x{C}x{H}x{W}xf32>"
SLICE_T, SUM_T = f"tensor<1x{C}x1x1xf32>", f"tensor<{C}xf32>"
ID4 = "affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>"
CHANNEL = "affine_map<(d0, d1, d2, d3) -> (d1)>"
FIRST = "affine_map<(d0, d1, d2, d3) -> (0, d1, 0, 0)>"
PAYLOAD = f"""
func.func @main(%x: {NHWC}) -> ({SUM_T}, {NCHW}, {SLICE_T}) {{
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : {NCHW}
  %t = linalg.transpose ins(%x : {NHWC}) outs(%e : {NCHW}) permutation = [0, 3, 1, 2]
  %s0 = tensor.empty() : {SUM_T}
  %init = linalg.fill ins(%zero : f32) outs(%s0 : {SUM_T}) -> {SUM_T}
  %sum = linalg.generic {{indexing_maps = [{ID4}, {CHANNEL}],
      iterator_types = ["reduction", "parallel", "reduction", "reduction"]}}
      ins(%t : {NCHW}) outs(%init : {SUM_T}) {{
  ^bb0(%a: f32, %o: f32):
    %r = arith.addf %a, %o : f32
    linalg.yield %r : f32
  }} -> {SUM_T}
  %y = linalg.generic {{indexing_maps = [{ID4}, {CHANNEL}, {ID4}],
      iterator_types = ["parallel", "parallel", "parallel", "parallel"]}}
      ins(%t, %sum : {NCHW}, {SUM_T}) outs(%e : {NCHW}) {{
  ^bb0(%a: f32, %m: f32, %o: f32):
    %r = arith.subf %a, %m : f32
    linalg.yield %r : f32
  }} -> {NCHW}
  %first = tensor.extract_slice %t[0, 0, 0, 0] [1, {C}, 1, 1] [1, 1, 1, 1]
      : {NCHW} to {SLICE_T}
  return %sum, %y, %first : {SUM_T}, {NCHW}, {SLICE_T}
}}
"""


def test_the_transpose_is_merged_into_every_reader() -> None:
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import top_level_ops
    from stagegraph.stages.analysis.ops import declared_iterator_types
    from stagegraph.stages.x86.generic.transpose_readers import merge_transposes_into_readers

    module = parse_payload(PAYLOAD)
    (fn,) = [op for op in top_level_ops(module.operation) if op.name == "func.func"]
    with module.context, ir.Location.unknown():
        assert merge_transposes_into_readers(fn) == 1
        assert module.operation.verify()
    assert collect(module, "linalg.transpose") == []
    reduction, elementwise, moved = collect(module, "linalg.generic")
    source = fn.regions[0].blocks[0].arguments[0]
    # The reduction reads %x in its own order: channels last, the innermost loop parallel.
    assert reduction.operands[0] == source
    maps = [ir.AffineMapAttr(a).value for a in reduction.attributes["indexing_maps"]]
    assert maps[0] == ir.AffineMap.get_identity(4, context=module.context)
    assert declared_iterator_types(reduction) == ("reduction",) * 3 + ("parallel",)
    assert str(maps[1]) == "(d0, d1, d2, d3) -> (d3)"
    # The elementwise reader reads %x through the transpose's map, writes NCHW as before.
    assert elementwise.operands[0] == source
    read = ir.AffineMapAttr(elementwise.attributes["indexing_maps"][0]).value
    assert str(read) == "(d0, d1, d2, d3) -> (d0, d2, d3, d1)"
    # The slice: the channels-last slice of %x (16 elements), transposed by a generic.
    (sliced,) = collect(module, "tensor.extract_slice")
    assert sliced.operands[0] == source
    assert ir.RankedTensorType(sliced.results[0].type).shape == [1, 1, 1, C]
    assert moved.operands[0] == sliced.results[0]


def test_the_merged_readers_compute_the_same_values(tmp_path) -> None:
    x = np.random.default_rng(5).standard_normal((N, H, W, C)).astype(np.float32)
    t = x.transpose(0, 3, 1, 2)
    sums = t.sum(axis=(0, 2, 3), dtype=np.float64)
    outputs = {
        "out0": sums.astype(np.float32),
        "out1": (t - sums[None, :, None, None]).astype(np.float32),
        "out2": t[:1, :, :1, :1].copy(),
    }
    (tmp_path / "t.mlir").write_text(PAYLOAD)
    np.savez(tmp_path / "t.npz", in0=x, **outputs)
    result = sg.run("x86", str(tmp_path / "t.mlir"), threads=1)
    assert result.verified is True, result.message


CENTRED = PAYLOAD.replace(
    f"  return %sum, %y, %first : {SUM_T}, {NCHW}, {SLICE_T}",
    f"""  %c = linalg.generic {{indexing_maps = [{ID4}, {FIRST}, {ID4}],
      iterator_types = ["parallel", "parallel", "parallel", "parallel"]}}
      ins(%t, %first : {NCHW}, {SLICE_T}) outs(%e : {NCHW}) {{
  ^bb0(%a: f32, %f: f32, %o: f32):
    %r = arith.subf %a, %f : f32
    linalg.yield %r : f32
  }} -> {NCHW}
  return %sum, %y, %c : {SUM_T}, {NCHW}, {NCHW}""",
).replace(f"-> ({SUM_T}, {NCHW}, {SLICE_T})", f"-> ({SUM_T}, {NCHW}, {NCHW})")


def test_a_slice_read_only_by_generics_is_read_in_place(tmp_path) -> None:
    """The first elements (a norm's shift) read by a generic: it reads the channels-last
    slice of %x through the composed map, no transpose of the slice left."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import top_level_ops
    from stagegraph.stages.x86.generic.transpose_readers import merge_transposes_into_readers

    module = parse_payload(CENTRED)
    (fn,) = [op for op in top_level_ops(module.operation) if op.name == "func.func"]
    with module.context, ir.Location.unknown():
        assert merge_transposes_into_readers(fn) == 1
        assert module.operation.verify()
    assert len(collect(module, "linalg.generic")) == 3  # no generic moving the slice
    (sliced,) = collect(module, "tensor.extract_slice")
    assert ir.RankedTensorType(sliced.results[0].type).shape == [1, 1, 1, C]
    (centred,) = [u.owner for u in sliced.results[0].uses]
    read = ir.AffineMapAttr(centred.attributes["indexing_maps"][1]).value
    assert str(read) == "(d0, d1, d2, d3) -> (0, 0, 0, d1)"
    x = np.random.default_rng(6).standard_normal((N, H, W, C)).astype(np.float32)
    t = x.transpose(0, 3, 1, 2)
    sums = t.sum(axis=(0, 2, 3), dtype=np.float64)
    (tmp_path / "c.mlir").write_text(CENTRED)
    np.savez(tmp_path / "c.npz", in0=x, out0=sums.astype(np.float32),
             out1=(t - sums[None, :, None, None]).astype(np.float32),
             out2=t - t[:1, :, :1, :1])  # fmt: skip
    result = sg.run("x86", str(tmp_path / "c.mlir"), threads=1)
    assert result.verified is True, result.message


def test_a_reduction_whose_writes_would_transpose_is_left_alone() -> None:
    """A sum over the height writing (N, C, W): read in %x's order its output would be
    written transposed (C after W), so the transpose stays."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import top_level_ops
    from stagegraph.stages.x86.generic.transpose_readers import merge_transposes_into_readers

    out = f"tensor<{N}x{C}x{W}xf32>"
    text = f"""
func.func @main(%x: {NHWC}) -> {out} {{
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : {NCHW}
  %t = linalg.transpose ins(%x : {NHWC}) outs(%e : {NCHW}) permutation = [0, 3, 1, 2]
  %o = tensor.empty() : {out}
  %init = linalg.fill ins(%zero : f32) outs(%o : {out}) -> {out}
  %sum = linalg.generic {{indexing_maps = [{ID4},
      affine_map<(d0, d1, d2, d3) -> (d0, d1, d3)>],
      iterator_types = ["parallel", "parallel", "reduction", "parallel"]}}
      ins(%t : {NCHW}) outs(%init : {out}) {{
  ^bb0(%a: f32, %acc: f32):
    %r = arith.addf %a, %acc : f32
    linalg.yield %r : f32
  }} -> {out}
  return %sum : {out}
}}
"""
    module = parse_payload(text)
    (fn,) = [op for op in top_level_ops(module.operation) if op.name == "func.func"]
    with module.context, ir.Location.unknown():
        assert merge_transposes_into_readers(fn) == 0
    assert len(collect(module, "linalg.transpose")) == 1
