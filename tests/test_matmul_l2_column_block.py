"""A B packed per call that one row block reads is cut into column blocks whose packed
slice stays in L2 (``matmul.heuristic.B_SLICE_L2_PARTS``): the NCHW 1x1 convolutions of
MobileNet (few filters and channels, many pixels). Choices on pinned targets; values of a
pointwise convolution that takes several column blocks, against numpy."""

from __future__ import annotations

import numpy as np
import pytest

import stagegraph as sg
from stagegraph.stages.target import resolve_target
from stagegraph.stages.x86.matmul.heuristic import (
    A_REPACK_L2_PARTS,
    B_SLICE_L2_PARTS,
    heuristic_matmul_params,
)


def _slice_bytes(params, k: int) -> int:
    return (params.tile_k or k) * params.tile_n * 4


@pytest.mark.parametrize("target_name", ["x86-64-v4", "x86-64-v3"])
@pytest.mark.parametrize(("m", "n", "k"), [(64, 12544, 32), (64, 4096, 64), (32, 12544, 27)])
def test_small_a_keeps_the_packed_b_slice_in_l2(target_name, m, n, k):
    """MobileNet's first 1x1 convolutions (filters x pixels x channels): the B slice of a
    column block takes at most a quarter of L2, in whole register panels, and the column
    blocks are balanced (the last is not a sliver)."""
    target = resolve_target(target_name)
    params = heuristic_matmul_params(m, n, k, "f32", target)
    assert params.pack and params.tile_m >= m  # one row block reads each B slice
    assert params.tile_n < n
    assert params.tile_n % params.reg_n == 0
    assert _slice_bytes(params, k) <= target.l2_bytes // B_SLICE_L2_PARTS
    blocks = -(-n // params.tile_n)
    assert n - (blocks - 1) * params.tile_n > params.tile_n // 2


def test_the_slice_budget_follows_the_targets_l2():
    """The pinned v3 target has half the L2 of v4: its column blocks are narrower."""
    v3, v4 = resolve_target("x86-64-v3"), resolve_target("x86-64-v4")
    assert v3.l2_bytes < v4.l2_bytes
    narrow = heuristic_matmul_params(64, 12544, 32, "f32", v3)
    wide = heuristic_matmul_params(64, 12544, 32, "f32", v4)
    assert narrow.tile_n < wide.tile_n


@pytest.mark.parametrize("target_name", ["x86-64-v4", "x86-64-v3"])
def test_large_a_or_several_row_blocks_keep_the_l3_column_block(target_name):
    """Where A's block would be packed again per column block at a real cost (m x kc past
    1/A_REPACK_L2_PARTS of L2), or where several row blocks re-read each B slice, the
    column block stays the L3 one: its slice is larger than the L2 budget."""
    target = resolve_target(target_name)
    for m, n, k in [(1024, 1024, 1024), (2048, 4096, 256)]:
        params = heuristic_matmul_params(m, n, k, "f32", target)
        kc = params.tile_k or k
        assert params.tile_m < m or m * kc * 4 * A_REPACK_L2_PARTS > target.l2_bytes
        assert _slice_bytes(params, k) > target.l2_bytes // B_SLICE_L2_PARTS


def test_a_constant_b_is_not_cut_for_l2():
    """A B packed at compile time is not packed per call: no slice to keep in L2 (the
    one-row Linear layers stream their weight, see stream_params)."""
    target = resolve_target("x86-64-v4")
    per_call = heuristic_matmul_params(64, 12544, 32, "f32", target)
    constant = heuristic_matmul_params(64, 12544, 32, "f32", target, constant_b=True)
    assert constant.tile_n > per_call.tile_n


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
    """32 channels, 16 filters, 70x70 pixels on x86-64-v3 (AVX2, which every supported
    host runs): 4900 columns in five column blocks, the last one partial."""
    c, f, hw = 32, 16, 70
    params = heuristic_matmul_params(f, hw * hw, c, "f32", resolve_target("x86-64-v3"))
    assert -(-(hw * hw) // params.tile_n) >= 3 and (hw * hw) % params.tile_n
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, c, hw, hw), dtype=np.float32)
    w = rng.standard_normal((f, c, 1, 1), dtype=np.float32)
    path = tmp_path / "pw.mlir"
    path.write_text(_POINTWISE.format(c=c, f=f, hw=hw))
    expected = np.einsum("fc,nchw->nfhw", w[:, :, 0, 0], x)
    np.savez(tmp_path / "pw.npz", in0=x, in1=w, out0=expected)
    report = sg.run("x86", str(path), threads=1, target="x86-64-v3")
    assert report.verified is True, report
