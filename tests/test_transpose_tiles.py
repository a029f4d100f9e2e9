"""Elementwise ops that transpose take a cache line of their transposed input per tile
(stagegraph.stages.x86.generic.transpose_tiles)."""

from __future__ import annotations

import numpy as np
import pytest

from stagegraph.mlir.diagnostics import parse_payload
from stagegraph.stages.analysis import analyze
from stagegraph.stages.target import Target
from stagegraph.stages.x86.generic.params import heuristic_generic_params, tile_sizes_for
from stagegraph.stages.x86.generic.transpose_tiles import (
    line_tiles,
    square_tiles,
    transposed_inputs,
)

AVX512 = Target(isa=frozenset({"avx512f"}), vector_bits=512, l1d_bytes=48 * 1024)


def _nhwc_to_nchw(channels: int, dtype: str = "f32", named: bool = False) -> str:
    """A channels-last [1, 8, 48, C] tensor back to NCHW, plus one (a result's transpose
    folded into its epilogue), or as a named ``linalg.transpose``."""
    src, dst = f"tensor<1x8x48x{channels}x{dtype}>", f"tensor<1x{channels}x8x48x{dtype}>"
    if named:
        body = f"%r = linalg.transpose ins(%x : {src}) outs(%e : {dst}) permutation = [0, 3, 1, 2]"
    else:
        body = f"""%r = linalg.generic {{indexing_maps = [affine_map<(n, c, h, w) -> (n, h, w, c)>,
        affine_map<(n, c, h, w) -> (n, c, h, w)>],
        iterator_types = ["parallel", "parallel", "parallel", "parallel"]}}
      ins(%x : {src}) outs(%e : {dst}) {{
  ^bb0(%a: {dtype}, %o: {dtype}):
    %one = arith.constant 1.0 : {dtype}
    %s = arith.addf %a, %one : {dtype}
    linalg.yield %s : {dtype}
  }} -> {dst}"""
    return f"""
func.func @main(%x: {src}) -> {dst} {{
  %e = tensor.empty() : {dst}
  {body}
  return %r : {dst}
}}
"""


def _tiles(text: str) -> tuple[list[int], list[int]]:
    facts = analyze(parse_payload(text))
    (op,) = [o for o in facts.ops if o.op_class == "elementwise"]
    before = tile_sizes_for(op, heuristic_generic_params(facts, AVX512))
    return before, line_tiles(op, before)


@pytest.mark.parametrize("named", [False, True])
def test_transposed_input_takes_a_cache_line_of_its_contiguous_dim(named):
    before, after = _tiles(_nhwc_to_nchw(64, named=named))
    assert before[1] == 1  # one channel per tile: each line read for one element
    assert after == [*before[:1], 16, *before[2:]]  # 16 f32 = 64 bytes; the rest as it was


def test_the_line_is_counted_in_bytes_of_the_input_and_divides_the_extent():
    assert _tiles(_nhwc_to_nchw(64, "f64"))[1][1] == 8
    assert _tiles(_nhwc_to_nchw(24))[1][1] == 12  # a static divisor near the line, no masks


def test_ops_that_do_not_transpose_keep_their_tiles():
    from tests.test_generic_schedule import CHAIN

    facts = analyze(parse_payload(CHAIN))
    params = heuristic_generic_params(facts, AVX512)
    for op in facts.ops:
        assert transposed_inputs(op) == []
        assert line_tiles(op, tile_sizes_for(op, params)) == tile_sizes_for(op, params)


def _forall_trip_counts(text: str) -> list[tuple[int, ...]]:
    """The static trip counts of every ``scf.forall`` after the generic schedule."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.stages.x86.generic.schedule import (
        apply_generic_schedule,
        build_generic_schedule,
    )

    module = parse_payload(text)
    facts = analyze(module)
    with module.context, ir.Location.unknown():
        schedule = build_generic_schedule(facts, heuristic_generic_params(facts, AVX512))
        apply_generic_schedule(module, schedule, facts)
    found = []

    def visit(op):
        if op.name == "scf.forall":
            found.append(tuple(ir.DenseI64ArrayAttr(op.attributes["staticUpperBound"])))
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return found


def test_the_schedule_tiles_the_channels_by_lines():
    # [n, c, h, w] = [1, 64, 8, 48]: 64 channels in 4 tiles of 16 (it was 64 tiles of 1)
    (trips,) = _forall_trip_counts(_nhwc_to_nchw(64))
    assert 4 in trips and 64 not in trips


@pytest.mark.parametrize("channels", [64, 24, 20])
@pytest.mark.parametrize("named", [False, True])
def test_transposes_compute_the_same_values(channels, named):
    from stagegraph.runtime.jit import JitBinary
    from stagegraph.stages.x86.generic.schedule import lower_generic

    module = parse_payload(_nhwc_to_nchw(channels, named=named))
    lower_generic(module, heuristic_generic_params(analyze(module), AVX512))
    x = np.random.default_rng(0).standard_normal((1, 8, 48, channels), dtype=np.float32)
    (out,) = JitBinary(module, opt_level=2).call("main", [x])
    expected = x.transpose(0, 3, 1, 2) + (0.0 if named else 1.0)
    np.testing.assert_array_equal(out, expected.astype(np.float32))


def test_f32_line_transposes_on_avx512_become_16x16_shuffles():
    facts = analyze(parse_payload(_nhwc_to_nchw(64)))
    (op,) = [o for o in facts.ops if o.op_class == "elementwise"]
    sizes = line_tiles(op, tile_sizes_for(op, heuristic_generic_params(facts, AVX512)))
    assert square_tiles(op, sizes, lanes=16) == ([1, 16, 1, 16], True)
    assert square_tiles(op, sizes, lanes=8) == (sizes, False)  # AVX2: element by element
    f64 = analyze(parse_payload(_nhwc_to_nchw(64, "f64"))).ops[0]
    f64_sizes = line_tiles(f64, tile_sizes_for(f64, heuristic_generic_params(facts, AVX512)))
    assert square_tiles(f64, f64_sizes, lanes=16)[1] is False  # no f64 shuffle lowering


def test_the_schedule_lowers_square_tiles_with_shuffles():
    from stagegraph.mlir.bindings import ir
    from stagegraph.stages.x86.generic.schedule import (
        apply_generic_schedule,
        build_generic_schedule,
    )

    def shuffles(text: str) -> int:
        module = parse_payload(text)
        facts = analyze(module)
        with module.context, ir.Location.unknown():
            schedule = build_generic_schedule(facts, heuristic_generic_params(facts, AVX512))
            apply_generic_schedule(module, schedule, facts)
        count = 0

        def visit(op):
            nonlocal count
            count += op.name == "vector.shuffle"
            return ir.WalkResult.ADVANCE

        module.operation.walk(visit)
        return count

    assert shuffles(_nhwc_to_nchw(64)) > 0
    assert shuffles(_nhwc_to_nchw(20)) == 0  # 10-channel tiles: element by element
