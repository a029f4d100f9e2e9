"""Convolutions whose images share one implicit GEMM run in groups of images whose patch
matrix fits L2 (:mod:`stagegraph.stages.x86.conv.image_groups`): the group size from the
target, the IR (one ``scf.for`` over groups around one matmul), values against numpy with a
fill init and with a bias init, on a pinned x86-64 level."""

from __future__ import annotations

import numpy as np
import pytest

import stagegraph as sg
from stagegraph.core.catalog import load_graph
from stagegraph.mlir.bindings import ir, new_context
from stagegraph.mlir.walk import collect
from stagegraph.stages.target import resolve_target, target_from_override
from stagegraph.stages.x86.conv.config import ConvGemmConfig
from stagegraph.stages.x86.conv.gemm import ConvShape, convolutions_to_gemm
from stagegraph.stages.x86.conv.image_groups import images_per_group

_V4 = resolve_target("x86-64-v4")
_V3 = resolve_target("x86-64-v3")


def _with_l2(target, size: int):
    return target_from_override(**{**target.model_dump(), "l2_bytes": size})


def test_group_size_fits_half_of_l2_in_wide_matmuls():
    """KernelBench's l1_067 at 16x its batch (512 images, 64 channels, 3 taps, 30 outputs:
    23 KB of patches an image): 32 images (960 columns) fit half of a 2 MB L2; at the
    shipped 32 images the whole matrix fits and stays one GEMM."""
    config = ConvGemmConfig()
    shape = ConvShape(512, 64, 64, (3,), (30,), (1,), (1,))
    assert images_per_group(shape, _with_l2(_V4, 2 << 20), config, "f32") == 32
    # half of 1 MB holds 22 images, but no divisor of 512 from 18 (512 columns) to 22: the
    # narrowest wide group, 32
    assert images_per_group(shape, _with_l2(_V4, 1 << 20), config, "f32") == 32
    shipped = ConvShape(32, 64, 64, (3,), (30,), (1,), (1,))
    assert images_per_group(shipped, _with_l2(_V4, 2 << 20), config, "f32") == 32
    off = ConvGemmConfig(patch_block_l2_fraction=0)
    assert images_per_group(shape, _with_l2(_V4, 2 << 20), off, "f32") == 512


def test_group_columns_fill_wide_matmuls_even_past_the_budget():
    """A budget of one image still gets groups of at least ``partial_block_min_panels``
    panels (16 x 32 columns on AVX-512, 16 x 16 on AVX2): 18 images of 30 outputs on
    AVX-512 (the narrowest divisor of 36 with 512 columns), 9 on AVX2; a batch with no
    such divisor stays whole."""
    config = ConvGemmConfig(patch_block_l2_fraction=1e-6)
    shape = ConvShape(36, 64, 64, (3,), (30,), (1,), (1,))
    assert images_per_group(shape, _V4, config, "f32") == 18
    assert images_per_group(shape, _V3, config, "f32") == 9
    prime = ConvShape(37, 64, 64, (3,), (30,), (1,), (1,))
    assert images_per_group(prime, _V4, config, "f32") == 37


def _payload(n: int, c: int, f: int, length: int, bias: bool) -> str:
    out = length - 2
    x, w, y = f"{n}x{c}x{length}", f"{f}x{c}x3", f"{n}x{f}x{out}"
    if bias:
        init = (f"%i = linalg.broadcast ins(%b : tensor<{f}xf32>) outs(%e : tensor<{y}xf32>)"
                " dimensions = [0, 2]")  # fmt: skip
    else:
        init = f"%i = linalg.fill ins(%z : f32) outs(%e : tensor<{y}xf32>) -> tensor<{y}xf32>"
    return f"""
func.func @main(%x: tensor<{x}xf32>, %w: tensor<{w}xf32>, %b: tensor<{f}xf32>)
    -> tensor<{y}xf32> {{
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<{y}xf32>
  {init}
  %r = linalg.conv_1d_ncw_fcw
    {{dilations = dense<1> : vector<1xi64>, strides = dense<1> : vector<1xi64>}}
    ins(%x, %w : tensor<{x}xf32>, tensor<{w}xf32>) outs(%i : tensor<{y}xf32>)
    -> tensor<{y}xf32>
  return %r : tensor<{y}xf32>
}}
"""


# 8 channels x 3 taps x 30 outputs x 4 B = 2.9 KB of patches an image; 1% of a 1 MB L2 (10 KB)
# holds 3, but 3 x 30 columns are too few panels: the knob at one panel takes 3 of 12.
_SMALL_GROUPS = ConvGemmConfig(
    path="gemm", patch_block_l2_fraction=0.01, partial_block_min_panels=1
)


def test_the_groups_are_one_loop_around_one_matmul():
    with new_context(), ir.Location.unknown():
        module = ir.Module.parse(_payload(12, 8, 16, 32, bias=False))
        count = convolutions_to_gemm(module, _SMALL_GROUPS, _with_l2(_V4, 1 << 20))
        assert count == 1 and module.operation.verify()
        [loop] = collect(module.operation, lambda op: op.name == "scf.for")
        [matmul] = collect(module.operation, lambda op: op.name == "linalg.matmul")
        assert matmul.parent.name == "scf.for"
        shapes = [list(ir.RankedTensorType(v.type).shape) for v in matmul.operands]
        assert shapes == [[16, 24], [24, 3 * 30], [16, 3 * 30]]
        bounds = [
            ir.IntegerAttr(loop.operands[i].owner.attributes["value"]).value for i in range(3)
        ]
        assert bounds == [0, 12, 3]  # 12 images, 3 a group
        fills = collect(module.operation, lambda op: op.name == "linalg.fill")
        # each group's accumulator is a fresh fill; the payload's whole-output fill is dead
        assert [op.parent.name for op in fills if list(op.results[0].uses)] == ["scf.for"]
        assert loop.operands[3].owner.name == "tensor.empty"  # the output starts empty


@pytest.mark.parametrize("bias", [False, True])
def test_grouped_gemm_matches_numpy_on_avx2(tmp_path, bias):
    n, c, f, length = 12, 8, 16, 32
    rng = np.random.default_rng(5)
    x = rng.standard_normal((n, c, length), dtype=np.float32)
    w = rng.standard_normal((f, c, 3), dtype=np.float32)
    b = rng.standard_normal(f, dtype=np.float32) if bias else np.zeros(f, np.float32)
    out = np.broadcast_to(b.reshape(1, f, 1).astype(np.float64), (n, f, length - 2)).copy()
    for t in range(3):
        window = x[:, :, t : t + length - 2].astype(np.float64)
        out += np.einsum("ncl,fc->nfl", window, w[:, :, t].astype(np.float64))
    payload = tmp_path / "conv.mlir"
    payload.write_text(_payload(n, c, f, length, bias))
    np.savez(tmp_path / "conv.npz", in0=x, in1=w, in2=b, out0=out.astype(np.float32))
    knobs = {"path": "gemm", "patch_block_l2_fraction": 0.0001, "partial_block_min_panels": 1}
    graph = load_graph("x86").with_config("normalize", **knobs)
    dumped = tmp_path / "ir"
    report = sg.run(graph, str(payload), threads=1, target="x86-64-v3", dump_ir=str(dumped))
    assert report.verified is True, report
    [normalized] = [p for p in dumped.iterdir() if "normalize" in p.name]
    with new_context():
        module = ir.Module.parse(normalized.read_text())
        [matmul] = collect(module.operation, lambda op: op.name == "linalg.matmul")
        # one image a group: its 30 columns are one panel of AVX2's 16 lanes x 2 (30 < 32)
        assert ir.RankedTensorType(matmul.operands[1].type).shape == [24, 30]
