"""Elementwise chains merged before the generic schedule (``prepare.fuse_elementwise_chains``):
which producers merge (single use, no broadcast, elementwise or reduction consumer, no
product of two inputs into a sum), that the result still verifies and computes the same,
and that the schedule's work stays linear in the chain length (one sub-sequence per chain,
no producer left to fuse into tile loops)."""

from __future__ import annotations

import numpy as np
import pytest

from stagegraph.mlir.diagnostics import parse_payload
from stagegraph.stages.analysis import analyze

_UNARY = ("math.exp", "arith.negf", "math.tanh")


def chain_payload(n: int, rows: int = 6, cols: int = 40) -> str:
    """``n`` elementwise generics in one chain: unary ops alternating with adds of ``%b``."""
    t = f"tensor<{rows}x{cols}xf32>"
    lines = [
        "#id = affine_map<(d0, d1) -> (d0, d1)>",
        f"func.func @main(%a: {t}, %b: {t}) -> {t} {{",
        f"  %e = tensor.empty() : {t}",
    ]
    value = "%a"
    for i in range(n):
        if i % 2:
            ins, types, args = f"{value}, %b", f"{t}, {t}", "%x: f32, %y: f32, %o: f32"
            body = "%r = arith.addf %x, %y : f32"
            maps = "[#id, #id, #id]"
        else:
            op = _UNARY[(i // 2) % len(_UNARY)]
            ins, types, args = value, t, "%x: f32, %o: f32"
            body = f"%r = {op} %x : f32"
            maps = "[#id, #id]"
        lines += [
            f'  %v{i} = linalg.generic {{indexing_maps = {maps}, iterator_types = ["parallel", '
            f'"parallel"]}} ins({ins} : {types}) outs(%e : {t}) {{',
            f"  ^bb0({args}):",
            f"    {body}",
            "    linalg.yield %r : f32",
            f"  }} -> {t}",
        ]
        value = f"%v{i}"
    lines += [f"  return {value} : {t}", "}"]
    return "\n".join(lines)


def chain_reference(n: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    ufuncs = {"math.exp": np.exp, "arith.negf": np.negative, "math.tanh": np.tanh}
    value = a
    for i in range(n):
        value = value + b if i % 2 else ufuncs[_UNARY[(i // 2) % len(_UNARY)]](value)
    return value


# What must not merge: %t has two users; %bc is read with a broadcast (the row vector
# %c would be recomputed per row); %s feeds a reduction; %p feeds a matmul.
GUARDED = """
#id = affine_map<(d0, d1) -> (d0, d1)>
#row = affine_map<(d0, d1) -> (d1)>
func.func @main(%a: tensor<8x16xf32>, %c: tensor<16xf32>, %w: tensor<16x4xf32>)
    -> (tensor<8x16xf32>, tensor<8xf32>, tensor<8x4xf32>) {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<8x16xf32>
  %e1 = tensor.empty() : tensor<16xf32>
  %t = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%a : tensor<8x16xf32>) outs(%e : tensor<8x16xf32>) {
  ^bb0(%x: f32, %o: f32):
    %r = math.exp %x : f32
    linalg.yield %r : f32
  } -> tensor<8x16xf32>
  %bc = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>],
                        iterator_types = ["parallel"]}
      ins(%c : tensor<16xf32>) outs(%e1 : tensor<16xf32>) {
  ^bb0(%x: f32, %o: f32):
    %r = math.tanh %x : f32
    linalg.yield %r : f32
  } -> tensor<16xf32>
  %u = linalg.generic {indexing_maps = [#id, #row, #id], iterator_types = ["parallel", "parallel"]}
      ins(%t, %bc : tensor<8x16xf32>, tensor<16xf32>) outs(%e : tensor<8x16xf32>) {
  ^bb0(%x: f32, %y: f32, %o: f32):
    %r = arith.addf %x, %y : f32
    linalg.yield %r : f32
  } -> tensor<8x16xf32>
  %s = linalg.generic {indexing_maps = [#id, #id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%t, %u : tensor<8x16xf32>, tensor<8x16xf32>) outs(%e : tensor<8x16xf32>) {
  ^bb0(%x: f32, %y: f32, %o: f32):
    %r = arith.mulf %x, %y : f32
    linalg.yield %r : f32
  } -> tensor<8x16xf32>
  %e8 = tensor.empty() : tensor<8xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%e8 : tensor<8xf32>) -> tensor<8xf32>
  %sum = linalg.generic {indexing_maps = [#id, affine_map<(d0, d1) -> (d0)>],
                         iterator_types = ["parallel", "reduction"]}
      ins(%s : tensor<8x16xf32>) outs(%acc : tensor<8xf32>) {
  ^bb0(%x: f32, %o: f32):
    %r = arith.addf %x, %o : f32
    linalg.yield %r : f32
  } -> tensor<8xf32>
  %p = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%a : tensor<8x16xf32>) outs(%e : tensor<8x16xf32>) {
  ^bb0(%x: f32, %o: f32):
    %r = arith.negf %x : f32
    linalg.yield %r : f32
  } -> tensor<8x16xf32>
  %q = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%p : tensor<8x16xf32>) outs(%e : tensor<8x16xf32>) {
  ^bb0(%x: f32, %o: f32):
    %r = math.exp %x : f32
    linalg.yield %r : f32
  } -> tensor<8x16xf32>
  %e4 = tensor.empty() : tensor<8x4xf32>
  %acc4 = linalg.fill ins(%zero : f32) outs(%e4 : tensor<8x4xf32>) -> tensor<8x4xf32>
  %m = linalg.matmul ins(%q, %w : tensor<8x16xf32>, tensor<16x4xf32>)
                     outs(%acc4 : tensor<8x4xf32>) -> tensor<8x4xf32>
  return %u, %sum, %m : tensor<8x16xf32>, tensor<8xf32>, tensor<8x4xf32>
}
"""


def _prepare(text: str):
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.functions import entry_function
    from stagegraph.stages.x86.generic.elementwise_fusion import fuse_elementwise_chains

    module = parse_payload(text)
    with module.context, ir.Location.unknown():
        merged = fuse_elementwise_chains(entry_function(module, "main"))
        assert module.operation.verify()
    return module, merged


def _generics(module) -> int:
    from stagegraph.mlir.walk import collect

    return len(collect(module.operation, "linalg.generic"))


@pytest.mark.parametrize("n", [1, 2, 7, 40])
def test_chain_becomes_one_generic(n):
    module, merged = _prepare(chain_payload(n))
    assert merged == n - 1
    assert _generics(module) == 1
    (op,) = analyze(module).ops
    # %a, and %b once: every add reads %b through the same map (one input, read once)
    assert op.op_class == "elementwise" and len(op.inputs) == 1 + min(1, n // 2)


def test_only_single_use_unbroadcast_elementwise_producers_merge():
    module, merged = _prepare(GUARDED)
    assert merged == 0
    assert _generics(module) == 7


def test_merged_chain_computes_the_same():
    from stagegraph.runtime.jit import JitBinary
    from stagegraph.stages.x86.generic.params import GenericParams
    from stagegraph.stages.x86.generic.schedule import lower_generic

    n = 9
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((6, 40), dtype=np.float32) for _ in range(2))
    module = parse_payload(chain_payload(n))
    lower_generic(module, GenericParams(lanes=8, inner_tile=16))
    (out,) = JitBinary(module, opt_level=2).call("main", [a, b])
    np.testing.assert_allclose(out, chain_reference(n, a, b), rtol=1e-5, atol=1e-5)


def test_guarded_payload_still_runs():
    from stagegraph.runtime.jit import JitBinary
    from stagegraph.stages.x86.generic.params import GenericParams
    from stagegraph.stages.x86.generic.schedule import lower_generic

    rng = np.random.default_rng(1)
    a = rng.standard_normal((8, 16), dtype=np.float32)
    c = rng.standard_normal(16, dtype=np.float32)
    module = parse_payload(GUARDED)
    lower_generic(module, GenericParams(lanes=8, inner_tile=16))
    outs = JitBinary(module, opt_level=2).call("main", [a, c, np.eye(16, 4, dtype=np.float32)])
    t = np.exp(a)
    u = t + np.tanh(c)
    np.testing.assert_allclose(outs[0], u, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(outs[1], (t * u).sum(axis=1), rtol=1e-4, atol=1e-4)


def _schedule_size(n: int) -> tuple[int, int, int]:
    """(transform ops in the rebuilt schedule, producers labelled for fusion, sub-sequences)
    for the generic schedule of an ``n``-op chain."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.functions import entry_function
    from stagegraph.mlir.walk import collect
    from stagegraph.stages.x86.generic.labels import FUSE_ATTR, annotate_generic_ops
    from stagegraph.stages.x86.generic.params import GenericParams
    from stagegraph.stages.x86.generic.prepare import prepare
    from stagegraph.stages.x86.generic.schedule import build_generic_schedule

    module = parse_payload(chain_payload(n))
    with module.context, ir.Location.unknown():
        prepare(module, entry_function(module, "main"))
        facts = analyze(module)
        fused = annotate_generic_ops(module, facts)
        schedule = build_generic_schedule(
            facts, GenericParams(lanes=8, inner_tile=16), fused_roots=set(fused.values())
        )
        labelled = len(collect(module.operation, lambda op: FUSE_ATTR in op.attributes))
        assert labelled == len(fused)
        ops = collect(schedule.operation)
        sequences = [op for op in ops if op.name == "transform.sequence"]
        fusions = [op for op in ops if op.name == "transform.structured.fuse_into_containing_op"]
        assert not fusions
    return len(ops), labelled, len(sequences)


def test_schedule_work_does_not_grow_with_the_chain():
    small, large = _schedule_size(8), _schedule_size(32)
    assert small == large  # one merged op: the same schedule whatever the chain length
    assert small[1] == 0 and small[2] == 1


# PyTorch's variance: x widened to f64 once, read by the mean's sum and by x - mean, whose
# square reads x - mean twice.
VARIANCE = """
#id = affine_map<(d0, d1) -> (d0, d1)>
#row = affine_map<(d0, d1) -> (d0)>
#vec = affine_map<(d0) -> (d0)>
func.func @main(%a: tensor<4x32xf32>) -> tensor<4xf64> {
  %zero = arith.constant 0.0 : f64
  %n = arith.constant 32.0 : f64
  %e = tensor.empty() : tensor<4x32xf64>
  %er = tensor.empty() : tensor<4xf64>
  %acc = linalg.fill ins(%zero : f64) outs(%er : tensor<4xf64>) -> tensor<4xf64>
  %w = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%a : tensor<4x32xf32>) outs(%e : tensor<4x32xf64>) {
  ^bb0(%x: f32, %o: f64):
    %r = arith.extf %x : f32 to f64
    linalg.yield %r : f64
  } -> tensor<4x32xf64>
  %sum = linalg.generic {indexing_maps = [#id, #row], iterator_types = ["parallel", "reduction"]}
      ins(%w : tensor<4x32xf64>) outs(%acc : tensor<4xf64>) {
  ^bb0(%x: f64, %o: f64):
    %r = arith.addf %x, %o : f64
    linalg.yield %r : f64
  } -> tensor<4xf64>
  %mean = linalg.generic {indexing_maps = [#vec, #vec], iterator_types = ["parallel"]}
      ins(%sum : tensor<4xf64>) outs(%er : tensor<4xf64>) {
  ^bb0(%x: f64, %o: f64):
    %r = arith.divf %x, %n : f64
    linalg.yield %r : f64
  } -> tensor<4xf64>
  %d = linalg.generic {indexing_maps = [#id, #row, #id], iterator_types = ["parallel", "parallel"]}
      ins(%w, %mean : tensor<4x32xf64>, tensor<4xf64>) outs(%e : tensor<4x32xf64>) {
  ^bb0(%x: f64, %m: f64, %o: f64):
    %r = arith.subf %x, %m : f64
    linalg.yield %r : f64
  } -> tensor<4x32xf64>
  %sq = linalg.generic {indexing_maps = [#id, #id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%d, %d : tensor<4x32xf64>, tensor<4x32xf64>) outs(%e : tensor<4x32xf64>) {
  ^bb0(%x: f64, %y: f64, %o: f64):
    %r = arith.mulf %x, %y : f64
    linalg.yield %r : f64
  } -> tensor<4x32xf64>
  %ss = linalg.generic {indexing_maps = [#id, #row], iterator_types = ["parallel", "reduction"]}
      ins(%sq : tensor<4x32xf64>) outs(%acc : tensor<4xf64>) {
  ^bb0(%x: f64, %o: f64):
    %r = arith.addf %x, %o : f64
    linalg.yield %r : f64
  } -> tensor<4xf64>
  return %ss : tensor<4xf64>
}
"""


def test_cheap_producer_is_copied_per_reader_and_double_reads_merge():
    """The widening is copied for the second reader, ``(x - m) * (x - m)`` merges with
    ``x - m`` although it reads it twice, and both chains merge into their sums: no f64
    copy of x is stored or computed outside a reduction, and the variance is right."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.functions import entry_function
    from stagegraph.runtime.jit import JitBinary
    from stagegraph.stages.x86.generic.elementwise_fusion import (
        duplicate_cheap_producers,
        fuse_elementwise_chains,
    )
    from stagegraph.stages.x86.generic.schedule import lower_generic

    module = parse_payload(VARIANCE)
    with module.context, ir.Location.unknown():
        fn = entry_function(module, "main")
        assert duplicate_cheap_producers(fn) == 1
        # extf into the first sum; extf into x - m, x - m into the square, that into its sum
        assert fuse_elementwise_chains(fn) == 4
        assert module.operation.verify()
    ops = analyze(module).ops
    reductions = [op.body_ops for op in ops if op.op_class == "reduction"]
    assert ("arith.extf", "arith.addf") in reductions
    assert ("arith.extf", "arith.subf", "arith.mulf", "arith.addf") in reductions
    assert all(op.outputs[0].shape == (4,) for op in ops if op.op_class != "reduction")
    a = np.random.default_rng(2).standard_normal((4, 32), dtype=np.float32)
    module = parse_payload(VARIANCE)
    lower_generic(module)
    (out,) = JitBinary(module, opt_level=2).call("main", [a])
    x = a.astype(np.float64)
    np.testing.assert_allclose(out, ((x - x.mean(axis=1, keepdims=True)) ** 2).sum(axis=1))


# RMSNorm's sum of squares over the channels (an outer dim), and a sum of products of two
# inputs: inlined, that product would make the sum a contraction (a batched dot product),
# which the generic schedule leaves to loops.
SQUARES_AND_PRODUCTS = """
#id = affine_map<(d0, d1, d2) -> (d0, d1, d2)>
#out = affine_map<(d0, d1, d2) -> (d0, d2)>
func.func @main(%a: tensor<2x8x16xf32>, %b: tensor<2x8x16xf32>)
    -> (tensor<2x16xf32>, tensor<2x16xf32>) {
  %zero = arith.constant 0.0 : f32
  %two = arith.constant 2 : i64
  %e = tensor.empty() : tensor<2x8x16xf32>
  %er = tensor.empty() : tensor<2x16xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%er : tensor<2x16xf32>) -> tensor<2x16xf32>
  %sq = linalg.generic {indexing_maps = [#id, #id],
                        iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%a : tensor<2x8x16xf32>) outs(%e : tensor<2x8x16xf32>) {
  ^bb0(%x: f32, %o: f32):
    %r = math.fpowi %x, %two : f32, i64
    linalg.yield %r : f32
  } -> tensor<2x8x16xf32>
  %ss = linalg.generic {indexing_maps = [#id, #out],
                        iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%sq : tensor<2x8x16xf32>) outs(%acc : tensor<2x16xf32>) {
  ^bb0(%x: f32, %o: f32):
    %r = arith.addf %x, %o : f32
    linalg.yield %r : f32
  } -> tensor<2x16xf32>
  %p = linalg.generic {indexing_maps = [#id, #id, #id],
                       iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%a, %b : tensor<2x8x16xf32>, tensor<2x8x16xf32>) outs(%e : tensor<2x8x16xf32>) {
  ^bb0(%x: f32, %y: f32, %o: f32):
    %r = arith.mulf %x, %y : f32
    linalg.yield %r : f32
  } -> tensor<2x8x16xf32>
  %dot = linalg.generic {indexing_maps = [#id, #out],
                         iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%p : tensor<2x8x16xf32>) outs(%acc : tensor<2x16xf32>) {
  ^bb0(%x: f32, %o: f32):
    %r = arith.addf %x, %o : f32
    linalg.yield %r : f32
  } -> tensor<2x16xf32>
  return %ss, %dot : tensor<2x16xf32>, tensor<2x16xf32>
}
"""


def test_square_merges_into_its_sum_but_a_product_of_inputs_does_not():
    from stagegraph.runtime.jit import JitBinary
    from stagegraph.stages.x86.generic.schedule import lower_generic

    module, merged = _prepare(SQUARES_AND_PRODUCTS)
    assert merged == 1
    bodies = {op.body_ops: op.op_class for op in analyze(module).ops}
    assert bodies[("math.fpowi", "arith.addf")] == "reduction"
    assert bodies[("arith.mulf",)] == "elementwise"  # the product stays apart
    rng = np.random.default_rng(3)
    a, b = (rng.standard_normal((2, 8, 16), dtype=np.float32) for _ in range(2))
    module = parse_payload(SQUARES_AND_PRODUCTS)
    lower_generic(module)
    ss, dot = JitBinary(module, opt_level=2).call("main", [a, b])
    np.testing.assert_allclose(ss, (a * a).sum(axis=1), rtol=1e-5)
    np.testing.assert_allclose(dot, (a * b).sum(axis=1), rtol=1e-5, atol=1e-5)
