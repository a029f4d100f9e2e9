"""Implicit-GEMM convolutions whose patch matrix is gathered straight into the packed
panels of B (:mod:`stagegraph.stages.x86.conv.patch_gather`,
:mod:`stagegraph.stages.x86.matmul.patch_operands`): the IR after ``normalize`` (one
gather feeding the matmul, no window copy, no reshape), after ``schedule`` (the gather
fused into the packing steps as vector gathers, no patch matrix of its own) and after
``bufferize`` (no patch-matrix buffer), and values against numpy for 1-D, 2-D and 3-D
strided and dilated windows, padded inputs, row blocks, K blocks and partial panels, on
pinned x86-64 levels."""

from __future__ import annotations

import math

import numpy as np
import pytest

import stagegraph as sg
from stagegraph.core.catalog import load_graph
from stagegraph.mlir.bindings import ir, new_context
from stagegraph.mlir.walk import collect
from stagegraph.stages.target import resolve_target
from stagegraph.stages.x86.conv.config import ConvGemmConfig
from stagegraph.stages.x86.conv.conv_shape import ConvShape
from stagegraph.stages.x86.conv.gemm import convolutions_to_gemm
from stagegraph.stages.x86.conv.patch_gather import gather_worth
from stagegraph.stages.x86.matmul.canonical import PATCH_ATTR
from stagegraph.stages.x86.matmul.params import MatmulParams
from stagegraph.stages.x86.matmul.patch_operands import fusable

_V4 = resolve_target("x86-64-v4")
_OPS = {1: "conv_1d_ncw_fcw", 2: "conv_2d_nchw_fchw", 3: "conv_3d_ncdhw_fcdhw"}


def _payload(n, c, f, size, taps, stride, dilation, pad=0):
    """A channels-first convolution of ``len(size)`` spatial dims; with ``pad`` the input
    is zero-padded first (``tensor.pad``), as imported PyTorch convolutions are."""
    rank = len(size)
    padded = [s + 2 * pad for s in size]
    out = [(p - dilation[i] * (taps[i] - 1) - 1) // stride[i] + 1 for i, p in enumerate(padded)]
    x, xp = f"{n}x{c}x" + "x".join(map(str, size)), f"{n}x{c}x" + "x".join(map(str, padded))
    w, y = f"{f}x{c}x" + "x".join(map(str, taps)), f"{n}x{f}x" + "x".join(map(str, out))
    vec = f"vector<{rank}xi64>"
    strides = f"dense<[{', '.join(map(str, stride))}]> : {vec}"
    dilations = f"dense<[{', '.join(map(str, dilation))}]> : {vec}"
    image = "%x"
    padding = ""
    if pad:
        low = ", ".join(["0", "0"] + [str(pad)] * rank)
        padding = f"""
  %z = arith.constant 0.0 : f32
  %xp = tensor.pad %x low[{low}] high[{low}] {{
  ^bb0({", ".join(f"%i{d}: index" for d in range(rank + 2))}):
    tensor.yield %z : f32
  }} : tensor<{x}xf32> to tensor<{xp}xf32>"""
        image = "%xp"
    return f"""
func.func @main(%x: tensor<{x}xf32>, %w: tensor<{w}xf32>) -> tensor<{y}xf32> {{{padding}
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<{y}xf32>
  %i = linalg.fill ins(%zero : f32) outs(%e : tensor<{y}xf32>) -> tensor<{y}xf32>
  %r = linalg.{_OPS[rank]} {{dilations = {dilations}, strides = {strides}}}
    ins({image}, %w : tensor<{xp}xf32>, tensor<{w}xf32>) outs(%i : tensor<{y}xf32>)
    -> tensor<{y}xf32>
  return %r : tensor<{y}xf32>
}}
"""


def _reference(x, w, stride, dilation, pad):
    """The convolution in float64 with numpy, one tap at a time."""
    rank = x.ndim - 2
    x = np.pad(x.astype(np.float64), [(0, 0), (0, 0)] + [(pad, pad)] * rank)
    taps = w.shape[2:]
    out = [(x.shape[2 + i] - dilation[i] * (taps[i] - 1) - 1) // stride[i] + 1 for i in range(rank)]
    result = np.zeros((x.shape[0], w.shape[0], *out))
    for tap in np.ndindex(*taps):
        window = tuple(
            slice(t * d, t * d + (o - 1) * s + 1, s)
            for t, d, o, s in zip(tap, dilation, out, stride, strict=True)
        )
        patch = x[(slice(None), slice(None), *window)]
        result += np.einsum("nc...,fc->nf...", patch, w[(slice(None), slice(None), *tap)])
    return result


def _ops(path, name, attribute=None):
    with new_context():
        module = ir.Module.parse(path.read_text())
        return [
            op.name
            for op in collect(module.operation, lambda op: op.name == name)
            if attribute is None or attribute in op.attributes
        ]


def _stage_ir(folder, stage):
    [path] = [p for p in folder.iterdir() if p.name.endswith(f"-{stage}.mlir")]
    return path


def test_a_strided_convolution_reads_one_gather_and_a_unit_stride_one_a_window_copy():
    """After the rewrite: a stride-2 window's matmul reads B straight from one
    ``linalg.generic`` marked as the patch gather (no window map, no reshape between);
    a unit-stride window keeps the window copy (rows of vector moves) and its reshape."""
    with new_context(), ir.Location.unknown():
        module = ir.Module.parse(_payload(1, 3, 16, (17, 17), (3, 3), (2, 2), (1, 1)))
        assert convolutions_to_gemm(module, ConvGemmConfig(path="gemm"), _V4) == 1
        assert module.operation.verify()
        [matmul] = collect(module.operation, lambda op: op.name == "linalg.matmul")
        gather = matmul.operands[1].owner.operation
        assert gather.name == "linalg.generic" and PATCH_ATTR in gather.attributes
        assert ir.RankedTensorType(gather.results[0].type).shape == [3 * 9, 8 * 8]
        assert not list(gather.operands)[:-1]  # no inputs: the body reads the image
        assert not collect(module.operation, lambda op: op.name == "tensor.collapse_shape"
                           and op.results[0] == matmul.operands[1])  # fmt: skip
        unit = ir.Module.parse(_payload(1, 3, 16, (17, 17), (3, 3), (1, 1), (1, 1)))
        assert convolutions_to_gemm(unit, ConvGemmConfig(path="gemm"), _V4) == 1
        [matmul] = collect(unit.operation, lambda op: op.name == "linalg.matmul")
        assert matmul.operands[1].owner.operation.name == "tensor.collapse_shape"
        assert not collect(unit.operation, lambda op: PATCH_ATTR in op.attributes)
        # the knobs: the gather off, or for unit strides too
        off = ir.Module.parse(_payload(1, 3, 16, (17, 17), (3, 3), (2, 2), (1, 1)))
        convolutions_to_gemm(off, ConvGemmConfig(path="gemm", gather_patches=False), _V4)
        assert not collect(off.operation, lambda op: PATCH_ATTR in op.attributes)
        every = ConvGemmConfig(path="gemm", gather_min_stride=1)
        convolutions_to_gemm(unit := ir.Module.parse(_payload(1, 3, 16, (17, 17), (3, 3),
                             (1, 1), (1, 1))), every, _V4)  # fmt: skip
        assert len(collect(unit.operation, lambda op: PATCH_ATTR in op.attributes)) == 1


def test_a_sliced_image_is_copied_before_the_gather():
    """A vectorized gather reads its input as one contiguous buffer: an image that is a
    slice of another (a group's channels) is copied into a tensor of its own first."""
    text = (
        _payload(1, 3, 16, (17, 17), (3, 3), (2, 2), (1, 1))
        .replace(
            "func.func @main(%x: tensor<1x3x17x17xf32>,",
            "func.func @main(%big: tensor<1x16x17x17xf32>,",
        )
        .replace(
            "  %zero = arith.constant 0.0 : f32\n",
            "  %zero = arith.constant 0.0 : f32\n  %x = tensor.extract_slice %big[0, 4, 0, 0]"
            " [1, 3, 17, 17] [1, 1, 1, 1] : tensor<1x16x17x17xf32> to tensor<1x3x17x17xf32>\n",
            1,
        )
    )
    with new_context(), ir.Location.unknown():
        module = ir.Module.parse(text)
        assert convolutions_to_gemm(module, ConvGemmConfig(path="gemm"), _V4) == 1
        [copy] = collect(module.operation, lambda op: op.name == "linalg.copy")
        assert copy.operands[0].owner.operation.name == "tensor.extract_slice"
        [flat] = collect(module.operation, lambda op: op.name == "tensor.collapse_shape"
                         and op.operands[0] == copy.results[0])  # fmt: skip
        assert ir.RankedTensorType(flat.results[0].type).shape == [3 * 17 * 17]


def test_the_gather_where_it_measured_faster():
    """Strided windows over few channels or many taps gather; 3x3/2 over many channels,
    unit strides and the knob off keep the window copy (ConvGemmConfig's measurements)."""
    config = ConvGemmConfig()

    def shape(c, k, stride, rank=2):
        return ConvShape(1, c, 64, (k,) * rank, (28,) * rank, (stride,) * rank, (1,) * rank)

    assert gather_worth(ConvShape(2, 3, 96, (11, 11), (55, 55), (4, 4), (1, 1)), config)
    assert gather_worth(shape(3, 7, 2), config) and gather_worth(shape(3, 3, 2), config)
    assert gather_worth(shape(32, 5, 2), config) and gather_worth(shape(64, 7, 2), config)
    assert not gather_worth(shape(64, 3, 2), config)
    assert not gather_worth(ConvShape(32, 32, 64, (3,), (19,), (3,), (4,)), config)  # l1_076
    assert not gather_worth(shape(3, 7, 1), config)  # unit stride: row copies
    assert not gather_worth(shape(3, 7, 2), ConvGemmConfig(gather_patches=False))


def test_the_gather_is_fused_only_into_static_packing_steps():
    """A masked gather does not verify: the packing of B must run in static steps, whole
    panels (and a partial last one split off when one block spans the columns)."""
    params = MatmulParams(tile_n=256, reg_n=32)
    assert fusable(512, params)  # whole panels, whole blocks
    assert fusable(200, params)  # one block: 6 panels and a split-off 8
    assert not fusable(600, params)  # blocks of 256 and a last partial one
    assert not fusable(40, params)  # one whole panel only: no split
    assert not fusable(512, MatmulParams(tile_n=256, reg_n=32, pack=False))


# (batch, channels, filters, size, taps, stride, dilation, pad, normalize config)
_CASES = {
    # l1_050's form at a small size: 11x11/4 on a padded input, blocks of rows with a
    # partial panel (5 rows of 20: 100 columns), the whole image read from each block's origin
    "2d-11x11/4-blocks": (2, 3, 16, (83, 83), (11, 11), (4, 4), (1, 1), 2,
                          {"patch_block_l2_fraction": 0.0005, "max_patch_blocks": 4,
                           "partial_block_min_panels": 1}),
    # 64 channels x 3x3: K = 576 in K blocks; 10x10 outputs: 3 panels and a partial one
    # (these two the measured rule leaves on the window copy: gathered by the knob)
    "2d-3x3/2-kblocks": (1, 64, 32, (20, 20), (3, 3), (2, 2), (1, 1), 1, {"gather_min_taps": 1}),
    "1d-dilated": (4, 32, 32, (50,), (3,), (3,), (2,), 0, {"gather_min_taps": 1}),
    "3d-strided": (1, 16, 32, (9, 9, 9), (3, 3, 3), (2, 2, 2), (1, 1, 1), 0, {}),
}  # fmt: skip


@pytest.mark.parametrize("target", ["x86-64-v4", "x86-64-v3"])
@pytest.mark.parametrize("case", list(_CASES))
def test_gathered_patches_match_numpy(tmp_path, case, target):
    n, c, f, size, taps, stride, dilation, pad, knobs = _CASES[case]
    rng = np.random.default_rng(sum(map(ord, case)))
    x = rng.standard_normal((n, c, *size), dtype=np.float32)
    w = rng.standard_normal((f, c, *taps), dtype=np.float32)
    payload = tmp_path / "conv.mlir"
    payload.write_text(_payload(n, c, f, size, taps, stride, dilation, pad))
    expected = _reference(x, w, stride, dilation, pad).astype(np.float32)
    np.savez(tmp_path / "conv.npz", in0=x, in1=w, out0=expected)
    graph = load_graph("x86").with_config("normalize", path="gemm", **knobs)
    dumped = tmp_path / "ir"
    report = sg.run(graph, str(payload), threads=1, target=target, dump_ir=str(dumped))
    assert report.verified is True, report
    # normalize: one gather; schedule: fused into the packing steps as vector gathers (no
    # gather op left of its own); bufferize: no buffer of the patch matrix's shape
    assert len(_ops(_stage_ir(dumped, "normalize"), "linalg.generic", PATCH_ATTR)) == 1
    scheduled = _stage_ir(dumped, "schedule")
    assert not _ops(scheduled, "linalg.generic", PATCH_ATTR)
    assert _ops(scheduled, "vector.gather")
    depth = c * math.prod(taps)
    with new_context():
        module = ir.Module.parse(_stage_ir(dumped, "bufferize").read_text())
        allocs = collect(module.operation, lambda op: op.name == "memref.alloc")
        shapes = [list(ir.MemRefType(op.results[0].type).shape) for op in allocs]
    assert not [s for s in shapes if len(s) == 2 and s[0] == depth], shapes


@pytest.mark.slow
def test_the_benchmark_times_both_variants(tmp_path):
    """benchmarks/conv_patch_gather.py: both variants verify and a row gives both medians
    and their ratio."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "conv_patch_gather.py"
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 3, 40, 40), dtype=np.float32)
    w = rng.standard_normal((32, 3, 7, 7), dtype=np.float32)
    payload = tmp_path / "conv.mlir"
    payload.write_text(_payload(1, 3, 32, (40, 40), (7, 7), (2, 2), (1, 1)))
    expected = _reference(x, w, (2, 2), (1, 1), 0).astype(np.float32)
    np.savez(tmp_path / "conv.npz", in0=x, in1=w, out0=expected)
    out = subprocess.run(
        [sys.executable, str(script), str(payload), "--rounds", "2", "--calls", "1",
         "--conv", "path=gemm", "--target", "x86-64-v3"],
        capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    [row] = [line for line in out.stdout.splitlines() if line.startswith("| conv |")]
    gather, copy, ratio = (float(cell.split()[0]) for cell in row.split("|")[2:5])
    assert gather > 0 and copy > 0
    assert ratio == pytest.approx(copy / gather, rel=0.5)
