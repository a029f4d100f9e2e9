"""A B packed per call that one row block reads is cut into column blocks whose packed
slice stays in L2 (``matmul.heuristic.B_SLICE_L2_PARTS``): the NCHW 1x1 convolutions of
MobileNet (few filters and channels, many pixels). Choices on pinned targets, which
matmuls the params stage lets take them (``sites.packs_b_from_memory``), and values of a
pointwise convolution that takes several column blocks, against numpy."""

from __future__ import annotations

import numpy as np
import pytest

import stagegraph as sg
from stagegraph.mlir.bindings import ir
from stagegraph.mlir.diagnostics import parse_payload
from stagegraph.stages.analysis import analyze
from stagegraph.stages.common.costmodel import CostModelConfig
from stagegraph.stages.target import resolve_target
from stagegraph.stages.x86.matmul.heuristic import (
    A_REPACK_L2_PARTS,
    B_SLICE_L2_PARTS,
    heuristic_matmul_params,
)
from stagegraph.stages.x86.params_stage import heuristic


def _params(m: int, n: int, k: int, target_name: str, **options):
    return heuristic_matmul_params(
        m, n, k, "f32", resolve_target(target_name), l2_b_slice=True, **options
    )


def _slice_bytes(params, k: int) -> int:
    return (params.tile_k or k) * params.tile_n * 4


@pytest.mark.parametrize("target_name", ["x86-64-v4", "x86-64-v3"])
@pytest.mark.parametrize(("m", "n", "k"), [(64, 12544, 32), (64, 4096, 64), (32, 12544, 27)])
def test_small_a_keeps_the_packed_b_slice_in_l2(target_name, m, n, k):
    """MobileNet's first 1x1 convolutions (filters x pixels x channels): the B slice of a
    column block takes at most a quarter of L2, in whole register panels, and the column
    blocks divide the columns (static blocks)."""
    target = resolve_target(target_name)
    params = _params(m, n, k, target_name)
    assert params.pack and params.tile_m >= m  # one row block reads each B slice
    assert params.tile_n < n
    assert params.tile_n % params.reg_n == 0
    assert _slice_bytes(params, k) <= target.l2_bytes // B_SLICE_L2_PARTS
    assert n % params.tile_n == 0


@pytest.mark.parametrize("target_name", ["x86-64-v4", "x86-64-v3"])
def test_columns_in_no_whole_panels_keep_their_block(target_name):
    """4900 columns are no whole number of register panels: no static block divides them,
    so the column block stays the L3 one (all of them, rounded up to whole panels)."""
    assert _params(16, 4900, 32, target_name).tile_n >= 4900


def test_the_slice_budget_follows_the_targets_l2():
    """The pinned v3 target has half the L2 of v4: its column blocks are narrower."""
    v3, v4 = resolve_target("x86-64-v3"), resolve_target("x86-64-v4")
    assert v3.l2_bytes < v4.l2_bytes
    narrow = _params(64, 12544, 32, "x86-64-v3")
    wide = _params(64, 12544, 32, "x86-64-v4")
    assert narrow.tile_n < wide.tile_n


@pytest.mark.parametrize("target_name", ["x86-64-v4", "x86-64-v3"])
def test_large_a_or_several_row_blocks_keep_the_l3_column_block(target_name):
    """Where A's block would be packed again per column block at a real cost (m x kc past
    1/A_REPACK_L2_PARTS of L2), or where several row blocks re-read each B slice, the
    column block stays the L3 one: its slice is larger than the L2 budget."""
    target = resolve_target(target_name)
    for m, n, k in [(1024, 1024, 1024), (2048, 4096, 256)]:
        params = _params(m, n, k, target_name)
        kc = params.tile_k or k
        assert params.tile_m < m or m * kc * 4 * A_REPACK_L2_PARTS > target.l2_bytes
        assert _slice_bytes(params, k) > target.l2_bytes // B_SLICE_L2_PARTS


def test_a_constant_b_or_a_fused_producer_is_not_cut_for_l2():
    """A B packed at compile time is not packed per call: no slice to keep in L2 (the
    one-row Linear layers stream their weight, see stream_params); without
    ``l2_b_slice`` (a producer fused into B's packing) the column block is the L3 one."""
    per_call = _params(64, 12544, 32, "x86-64-v4")
    constant = _params(64, 12544, 32, "x86-64-v4", constant_b=True)
    fused = heuristic_matmul_params(64, 12544, 32, "f32", resolve_target("x86-64-v4"))
    assert constant.tile_n > per_call.tile_n
    assert fused.tile_n == 12544


_MATMUL = """
func.func @main(%w: tensor<64x32xf32>, %x: tensor<1x32x112x112xf32>) -> tensor<64x12544xf32> {{
  %b = tensor.collapse_shape %x [[0, 1], [2, 3]]
    : tensor<1x32x112x112xf32> into tensor<32x12544xf32>
  {producer}
  %e = tensor.empty() : tensor<64x12544xf32>
  %z = arith.constant 0.0 : f32
  %i = linalg.fill ins(%z : f32) outs(%e : tensor<64x12544xf32>) -> tensor<64x12544xf32>
  %r = linalg.matmul ins(%w, {b} : tensor<64x32xf32>, tensor<32x12544xf32>)
    outs(%i : tensor<64x12544xf32>) -> tensor<64x12544xf32>
  return %r : tensor<64x12544xf32>
}}
"""

_EXP = """%s = tensor.empty() : tensor<32x12544xf32>
  %g = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>],
      iterator_types = ["parallel", "parallel"]}
      ins(%b : tensor<32x12544xf32>) outs(%s : tensor<32x12544xf32>) {
    ^bb0(%in: f32, %out: f32):
      %y = math.exp %in : f32
      linalg.yield %y : f32
  } -> tensor<32x12544xf32>"""


@pytest.mark.parametrize(("producer", "b", "cut"), [("", "%b", True), (_EXP, "%g", False)])
def test_the_params_stage_cuts_only_a_b_read_from_memory(producer, b, cut):
    """The x86 heuristic's matmul params on x86-64-v4: a B that is a reshaped argument (a
    1x1 convolution's pixels) takes L2 column blocks; a B made by a linalg.generic (which
    the schedule may fuse into B's packing: an implicit GEMM's patch gather) keeps one."""
    payload = parse_payload(_MATMUL.format(producer=producer, b=b))
    with payload.context, ir.Location.unknown():
        facts = analyze(payload)
        params = heuristic.fn(facts, resolve_target("x86-64-v4"), CostModelConfig(threads=1))
    (site,) = params.matmul
    assert (site.tile_n < 12544) is cut


_POINTWISE = """
func.func @main(%x: tensor<1x{c}x{hw}x{hw}xf32>, %w: tensor<{f}x{c}x1x1xf32>)
    -> tensor<1x{f}x{hw}x{hw}xf32> {{
  %e = tensor.empty() : tensor<1x{f}x{hw}x{hw}xf32>
  %z = arith.constant 0.0 : f32
  %i = linalg.fill ins(%z : f32) outs(%e : tensor<1x{f}x{hw}x{hw}xf32>)
    -> tensor<1x{f}x{hw}x{hw}xf32>
  %r = linalg.conv_2d_nchw_fchw
    {{dilations = dense<1> : vector<2xi64>, strides = dense<1> : vector<2xi64>}}
    ins(%x, %w : tensor<1x{c}x{hw}x{hw}xf32>, tensor<{f}x{c}x1x1xf32>)
    outs(%i : tensor<1x{f}x{hw}x{hw}xf32>) -> tensor<1x{f}x{hw}x{hw}xf32>
  return %r : tensor<1x{f}x{hw}x{hw}xf32>
}}
"""


def test_pointwise_convolution_over_several_column_blocks_matches_numpy(tmp_path):
    """32 channels, 16 filters, 64x64 pixels on x86-64-v3 (AVX2, which every supported
    host runs): 4096 columns in four column blocks."""
    c, f, hw = 32, 16, 64
    params = _params(f, hw * hw, c, "x86-64-v3")
    assert hw * hw // params.tile_n >= 4
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, c, hw, hw), dtype=np.float32)
    w = rng.standard_normal((f, c, 1, 1), dtype=np.float32)
    path = tmp_path / "pw.mlir"
    path.write_text(_POINTWISE.format(c=c, f=f, hw=hw))
    expected = np.einsum("fc,nchw->nfhw", w[:, :, 0, 0], x)
    np.savez(tmp_path / "pw.npz", in0=x, in1=w, out0=expected)
    report = sg.run("x86", str(path), threads=1, target="x86-64-v3")
    assert report.verified is True, report
