"""Softmax-shaped row chains as one kernel per row (``stages.x86.generic.row_chains``, run
by the generic schedule's ``prepare``): the IR after the rewrite, the chains it must leave
alone, and the values of compiled softmaxes (a scaled one, one with kept row dims) against
numpy."""

from __future__ import annotations

import numpy as np
import pytest

import stagegraph as sg
from stagegraph.mlir.diagnostics import parse_payload
from stagegraph.mlir.walk import collect, top_level_ops

B, R = 2, 3
WHOLE = "affine_map<(d0, d1, d2) -> (d0, d1, d2)>"
ROWS = "affine_map<(d0, d1, d2) -> (d0, d1)>"
KEPT = "affine_map<(d0, d1, d2) -> (d0, d1, 0)>"
PARALLEL = '["parallel", "parallel", "parallel"]'
ALONG_ROWS = '["parallel", "parallel", "reduction"]'


def _softmax(length: int, scale: float = 1.0, keep_dims: bool = False,
             return_exp: bool = False) -> str:  # fmt: skip
    """``softmax(scale * (x - max(x)))`` over rows of ``length`` as the importer writes it
    (after the chains are merged): max, exp of the shifted row, sum, divide. ``keep_dims``:
    the row results are ``BxRx1`` (read through a constant-0 map); ``return_exp``: the
    exponentials are a second result (then nothing may be fused)."""
    x_t = f"tensor<{B}x{R}x{length}xf32>"
    r_t = f"tensor<{B}x{R}x1xf32>" if keep_dims else f"tensor<{B}x{R}xf32>"
    row = KEPT if keep_dims else ROWS
    results = f"{x_t}, {x_t}" if return_exp else x_t
    returned = f"%y, %e : {x_t}, {x_t}" if return_exp else f"%y : {x_t}"
    lines = [
        f"func.func @main(%x: {x_t}) -> ({results}) {{",
        "  %ninf = arith.constant 0xFF800000 : f32",
        "  %zero = arith.constant 0.0 : f32",
        f"  %scale = arith.constant {scale} : f32",
        f"  %rows = tensor.empty() : {r_t}",
        f"  %m0 = linalg.fill ins(%ninf : f32) outs(%rows : {r_t}) -> {r_t}",
        f"  %s0 = linalg.fill ins(%zero : f32) outs(%rows : {r_t}) -> {r_t}",
        f"  %whole = tensor.empty() : {x_t}",
        f"  %m = linalg.generic {{indexing_maps = [{WHOLE}, {row}], iterator_types = "
        f"{ALONG_ROWS}}} ins(%x : {x_t}) outs(%m0 : {r_t}) {{",
        "  ^bb0(%a: f32, %o: f32):",
        "    %v = arith.maximumf %a, %o : f32",
        "    linalg.yield %v : f32",
        f"  }} -> {r_t}",
        f"  %e = linalg.generic {{indexing_maps = [{WHOLE}, {row}, {WHOLE}], iterator_types = "
        f"{PARALLEL}}} ins(%x, %m : {x_t}, {r_t}) outs(%whole : {x_t}) {{",
        "  ^bb0(%a: f32, %b: f32, %o: f32):",
        "    %d = arith.subf %a, %b : f32",
        "    %t = arith.mulf %d, %scale : f32",
        "    %v = math.exp %t : f32",
        "    linalg.yield %v : f32",
        f"  }} -> {x_t}",
        f"  %s = linalg.generic {{indexing_maps = [{WHOLE}, {row}], iterator_types = "
        f"{ALONG_ROWS}}} ins(%e : {x_t}) outs(%s0 : {r_t}) {{",
        "  ^bb0(%a: f32, %o: f32):",
        "    %v = arith.addf %a, %o : f32",
        "    linalg.yield %v : f32",
        f"  }} -> {r_t}",
        f"  %y = linalg.generic {{indexing_maps = [{WHOLE}, {row}, {WHOLE}], iterator_types = "
        f"{PARALLEL}}} ins(%e, %s : {x_t}, {r_t}) outs(%whole : {x_t}) {{",
        "  ^bb0(%a: f32, %b: f32, %o: f32):",
        "    %v = arith.divf %a, %b : f32",
        "    linalg.yield %v : f32",
        f"  }} -> {x_t}",
        f"  return {returned}",
        "}",
    ]
    return "\n".join(lines)


def _fuse(text: str, lanes: int):
    from stagegraph.mlir.bindings import ir
    from stagegraph.stages.x86.generic.row_chains import fuse_row_chains

    module = parse_payload(text)
    with module.context, ir.Location.unknown():
        (fn,) = collect(module, "func.func")
        count = fuse_row_chains(fn, lanes)
        assert module.operation.verify()
    return module, fn, count


def test_a_softmax_becomes_one_forall_over_rows_with_three_passes() -> None:
    module, fn, count = _fuse(_softmax(32, scale=0.5), lanes=8)
    assert count == 1
    assert collect(module, "linalg.generic") == []  # the four ops are gone
    assert collect(module, "linalg.fill") == []  # the fills became the folds' inits
    (forall,) = [op for op in top_level_ops(fn) if op.name == "scf.forall"]
    loops = collect(forall, "scf.for")
    assert len(loops) == 3  # max, exp + sum (written into the output row), divide
    assert len(collect(forall, "vector.reduction")) == 2
    # The bodies are cloned onto vectors of 8 lanes x 4 (32 / 8 = 4 accumulators).
    (exp,) = collect(forall, "math.exp")
    assert str(exp.results[0].type) == "vector<32xf32>"
    # The scale (defined outside the generic) is broadcast, not left a scalar.
    (scaled,) = collect(forall, "arith.mulf")
    assert all(str(v.type) == "vector<32xf32>" for v in scaled.operands)
    # Only the exp pass and the divide pass write, both into the output row.
    assert len(collect(forall, "vector.transfer_write")) == 2


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (_softmax(20), "a row of 20 is no whole number of 8-lane vectors"),
        (_softmax(32, return_exp=True), "the exponentials are used outside the chain"),
    ],
)
def test_chains_that_stay_as_they_are(text: str, why: str) -> None:
    module, _, count = _fuse(text, lanes=8)
    assert count == 0, why
    assert len(collect(module, "linalg.generic")) == 4


@pytest.mark.parametrize(("length", "keep_dims"), [(64, False), (48, True)])
def test_compiled_softmax_matches_numpy(tmp_path, length: int, keep_dims: bool) -> None:
    rng = np.random.default_rng(3)
    x = (4.0 * rng.standard_normal((B, R, length))).astype(np.float32)
    shifted = 0.5 * (x - x.max(axis=-1, keepdims=True))
    expected = np.exp(shifted) / np.exp(shifted).sum(axis=-1, keepdims=True)
    path = tmp_path / "softmax.mlir"
    path.write_text(_softmax(length, scale=0.5, keep_dims=keep_dims))
    np.savez(tmp_path / "softmax.npz", in0=x, out0=expected.astype(np.float32))
    result = sg.run("x86", str(path), threads=1)
    assert result.verified is True, result.message


IMPORTED = """
#whole = affine_map<(d0, d1) -> (d0, d1)>
#rows = affine_map<(d0, d1) -> (d0)>
func.func @main(%x: tensor<4x16xf32>) -> tensor<4x16xf32> {
  %c0_i64 = arith.constant 0 : i64
  %ninf = arith.constant 0xFF800000 : f32
  %zero = arith.constant 0.0 : f32
  %i0 = tensor.empty() : tensor<4xi64>
  %i = linalg.fill ins(%c0_i64 : i64) outs(%i0 : tensor<4xi64>) -> tensor<4xi64>
  %r0 = tensor.empty() : tensor<4xf32>
  %m0 = linalg.fill ins(%ninf : f32) outs(%r0 : tensor<4xf32>) -> tensor<4xf32>
  %m:2 = linalg.generic {indexing_maps = [#whole, #rows, #rows],
      iterator_types = ["parallel", "reduction"]}
      ins(%x : tensor<4x16xf32>) outs(%m0, %i : tensor<4xf32>, tensor<4xi64>) {
  ^bb0(%a: f32, %o: f32, %oi: i64):
    %k = linalg.index 1 : index
    %ki = arith.index_cast %k : index to i64
    %v = arith.maximumf %a, %o : f32
    %gt = arith.cmpf ogt, %a, %o : f32
    %w = arith.select %gt, %ki, %oi : i64
    linalg.yield %v, %w : f32, i64
  } -> (tensor<4xf32>, tensor<4xi64>)
  %w0 = tensor.empty() : tensor<4x16xf32>
  %d = linalg.generic {indexing_maps = [#whole, #rows, #whole],
      iterator_types = ["parallel", "parallel"]}
      ins(%x, %m#0 : tensor<4x16xf32>, tensor<4xf32>) outs(%w0 : tensor<4x16xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %v = arith.subf %a, %b : f32
    linalg.yield %v : f32
  } -> tensor<4x16xf32>
  %e = linalg.generic {indexing_maps = [#whole, #whole], iterator_types = ["parallel", "parallel"]}
      ins(%d : tensor<4x16xf32>) outs(%w0 : tensor<4x16xf32>) {
  ^bb0(%a: f32, %o: f32):
    %v = math.exp %a : f32
    linalg.yield %v : f32
  } -> tensor<4x16xf32>
  %s0 = linalg.fill ins(%zero : f32) outs(%r0 : tensor<4xf32>) -> tensor<4xf32>
  %s = linalg.generic {indexing_maps = [#whole, #rows], iterator_types = ["parallel", "reduction"]}
      ins(%e : tensor<4x16xf32>) outs(%s0 : tensor<4xf32>) {
  ^bb0(%a: f32, %o: f32):
    %v = arith.addf %a, %o : f32
    linalg.yield %v : f32
  } -> tensor<4xf32>
  %y = linalg.generic {indexing_maps = [#whole, #rows, #whole],
      iterator_types = ["parallel", "parallel"]}
      ins(%e, %s : tensor<4x16xf32>, tensor<4xf32>) outs(%w0 : tensor<4x16xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %v = arith.divf %a, %b : f32
    linalg.yield %v : f32
  } -> tensor<4x16xf32>
  return %y : tensor<4x16xf32>
}
"""


@pytest.mark.parametrize(("lanes", "fused"), [(8, True), (0, False)])
def test_prepare_fuses_the_imported_softmax_after_merging_its_chains(lanes, fused) -> None:
    """As the importer writes softmax (an argmax beside the max, ``x - max`` and ``exp``
    as two ops): ``prepare`` drops the dead argmax and merges ``exp(x - max)`` first, then
    the chain is one kernel; with no lanes given (the params' choice) it stays."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.stages.x86.generic.prepare import prepare

    module = parse_payload(IMPORTED)
    with module.context, ir.Location.unknown():
        (fn,) = collect(module, "func.func")
        assert prepare(module, fn, row_chain_lanes=lanes)
        assert module.operation.verify()
    generics = collect(module, "linalg.generic")
    assert (generics == [], len(collect(module, "vector.reduction"))) == (
        (True, 2) if fused else (False, 0)
    )
