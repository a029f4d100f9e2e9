"""Depthwise and grouped NCHW convolutions as direct kernels along the output width
(stagegraph.stages.x86.conv.depthwise): the blocking, the IR the rewrite makes, and values
against PyTorch eager through the x86 graph (stride 2, padding, a channel multiplier,
batch > 1, several channels per group, rows that do not fill whole vectors)."""

from __future__ import annotations

import json
import textwrap

import pytest

pytest.importorskip("torch")

from stagegraph.cli.main import main
from stagegraph.mlir.bindings import ir, new_context
from stagegraph.mlir.walk import collect
from stagegraph.stages.x86.conv.depthwise import (
    ACCUMULATORS,
    grouped_to_width_kernels,
    width_plan,
)

_PROBLEM = """
import torch
import torch.nn as nn
batch_size = 1
c = 8
hw = 10
stride = 1
k = 3
groups = 8
mult = 1
bias = 0
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(c, c * mult, k, stride=stride, padding=k // 2, groups=groups,
                              bias=bool(bias))
    def forward(self, x):
        return torch.relu(self.conv(x))
def get_inputs():
    return [torch.rand(batch_size, c, hw, hw)]
def get_init_inputs():
    return []
"""


@pytest.mark.parametrize(
    ("width", "filters", "lanes", "expected"),
    [
        (112, 1, 16, (16, 7, 1, 1, 0)),  # 7 vectors fill a row
        (56, 1, 8, (8, 7, 1, 1, 0)),  # AVX2
        (7, 1, 16, (8, 1, 1, 0, 7)),  # a short row: half vectors, one masked block
        (14, 2, 16, (16, 1, 2, 0, 14)),  # a channel multiplier of 2: both filters
        (28, 6, 16, (16, 2, 3, 0, 28)),  # 2 vectors x 3 of the 6 filters (4 do not divide)
        (200, 1, 16, (16, 8, 1, 1, 72)),
    ],
)
def test_width_plan_blocks_rows_within_the_accumulators(width, filters, lanes, expected):
    plan = width_plan(width, filters, lanes)
    got = (plan.lanes, plan.vectors, plan.filters, plan.blocks, plan.tail)
    assert got == expected
    assert plan.rows == 1
    assert plan.vectors * plan.filters <= ACCUMULATORS
    assert plan.blocks * plan.vectors * plan.lanes + plan.tail == width


@pytest.mark.parametrize(
    ("height", "width", "filters", "rows"),
    [
        (14, 14, 1, 7),
        (7, 7, 1, 7),
        (28, 28, 1, 4),
        (112, 112, 1, 1),
        (14, 14, 2, 2),  # both filters x 2 rows
        (13, 13, 1, 1),
    ],
)
def test_short_rows_take_several_rows_per_block(height, width, filters, rows):
    """Rows fill the accumulators the vectors and filters leave, by divisors of the
    height (13 rows: one at a time)."""
    plan = width_plan(width, filters, 16, height)
    assert plan.rows == rows
    assert height % plan.rows == 0
    assert plan.rows * plan.vectors * plan.filters <= ACCUMULATORS


_DEPTHWISE_MLIR = """
func.func @main(%x: tensor<2x16x12x12xf32>, %w: tensor<16x3x3xf32>) -> tensor<2x16x5x5xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<2x16x5x5xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<2x16x5x5xf32>) -> tensor<2x16x5x5xf32>
  %r = linalg.depthwise_conv_2d_nchw_chw {dilations = dense<1> : vector<2xi64>,
      strides = dense<2> : vector<2xi64>}
      ins(%x, %w : tensor<2x16x12x12xf32>, tensor<16x3x3xf32>)
      outs(%f : tensor<2x16x5x5xf32>) -> tensor<2x16x5x5xf32>
  return %r : tensor<2x16x5x5xf32>
}
"""


def test_depthwise_becomes_a_width_kernel_without_transposes():
    """Stride 2, 5 x 5 outputs: all 5 rows in one block of one masked 8-lane vector each,
    9 taps per row read as 16 lanes and shuffled to every other one; the weights broadcast
    once per channel; the fill becomes the accumulators' start (no fill op, no
    transpose, no convolution left)."""
    with new_context(), ir.Location.unknown():
        module = ir.Module.parse(_DEPTHWISE_MLIR)
        (fn,) = collect(module, "func.func")
        assert grouped_to_width_kernels(fn, 16) == 1
        module.operation.verify()
        names = [op.name for op in collect(module)]
        assert not [n for n in names if n.startswith("linalg.")]
        assert names.count("scf.forall") == 1
        assert names.count("vector.fma") == 9 * 5
        assert names.count("vector.broadcast") == 9 + 5  # weights, the fill per row
        shuffles = collect(module, "vector.shuffle")
        assert len(shuffles) == 9 * 5
        assert {tuple(ir.VectorType(s.result.type).shape) for s in shuffles} == {(8,)}
        reads = collect(module, "vector.transfer_read")
        assert {tuple(ir.VectorType(r.result.type).shape) for r in reads} == {(16,)}


_GROUPED_MLIR = """
func.func @main(%x: tensor<1x2x32x9x9xf32>, %w: tensor<2x4x32x3x{kw}xf32>,
                %o: tensor<1x2x4x{oh}x{ow}xf32>) -> tensor<1x2x4x{oh}x{ow}xf32> {{
  %r = linalg.conv_2d_ngchw_gfchw {{dilations = dense<1> : vector<2xi64>,
      strides = dense<{stride}> : vector<2xi64>}}
      ins(%x, %w : tensor<1x2x32x9x9xf32>, tensor<2x4x32x3x{kw}xf32>)
      outs(%o : tensor<1x2x4x{oh}x{ow}xf32>) -> tensor<1x2x4x{oh}x{ow}xf32>
  return %r : tensor<1x2x4x{oh}x{ow}xf32>
}}
"""


@pytest.mark.parametrize(
    ("kw", "stride", "taken"),
    [(3, 1, True), (3, 2, True), (3, 3, False), (1, 1, False)],
    ids=["stride-1", "stride-2", "stride-3", "one-column-window"],
)
def test_which_grouped_convolutions_take_the_width_kernel(kw, stride, taken):
    """32 channels per group (the group loops ran 16x PyTorch's time there) take it; a
    stride past two (one shuffle per tap no longer does) and a one-column window do not.
    The initial value is read (not a fill): 2 x 4 filters, 9 channels a loop each."""
    oh, ow = (9 - 3) // stride + 1, (9 - kw) // stride + 1
    text = _GROUPED_MLIR.format(kw=kw, stride=stride, oh=oh, ow=ow)
    with new_context(), ir.Location.unknown():
        module = ir.Module.parse(text)
        (fn,) = collect(module, "func.func")
        assert grouped_to_width_kernels(fn, 16) == int(taken)
        module.operation.verify()
        names = [op.name for op in collect(module)]
        assert ("linalg.conv_2d_ngchw_gfchw" in names) != taken
        if taken:
            assert names.count("scf.for") >= 2  # rows, channels of a group
            assert "vector.transfer_read" in names


def _run(capsys, tmp_path, overrides: str, *extra: str) -> tuple[dict, list[str], set]:
    """Run the problem through x86 (verifying it); the report, the op names of the
    scheduled IR and the shapes of its tensor and FMA results."""
    path = tmp_path / "problem.py"
    path.write_text(textwrap.dedent(_PROBLEM))
    dump = tmp_path / "dump"
    spec = f"{path}:{overrides}" if overrides else str(path)
    code = main(["run", "x86", spec, "--threads", "1", "--dump-ir", str(dump), *extra, "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report.get("message")
    index = json.loads((dump / "index.json").read_text())
    (scheduled,) = [s["file"] for s in index if s["stage"] == "schedule"]
    with new_context():
        module = ir.Module.parse((dump / scheduled).read_text())
        ops = collect(module)
        names = [op.name for op in ops]
        shapes = {
            tuple(ir.RankedTensorType(r.type).shape)
            for op in ops
            for r in op.results
            if isinstance(r.type, ir.RankedTensorType)
        }
        shapes |= {
            ("fma", *ir.VectorType(op.result.type).shape) for op in ops if op.name == "vector.fma"
        }
    return report, names, shapes


@pytest.mark.parametrize(
    "overrides",
    [
        "c=16,groups=16,hw=12",  # 3x3, padding 1, 12 columns: a masked 16-lane block (v4)
        "c=16,groups=16,hw=21,stride=2,k=5",  # stride 2, padding 2, 11 columns
        "c=8,hw=9,batch_size=3,bias=1",  # batch 3, a bias as the initial value
        "c=6,groups=6,hw=10,mult=3,stride=2,bias=1",  # channel multiplier 3: grouped, 1 channel
        "c=16,hw=20,groups=4",  # 4 channels per group: a loop over them
        "c=64,hw=9,groups=2,stride=2",  # 32 channels per group
        "c=16,groups=16,hw=40",  # several whole blocks and a tail
    ],
)
@pytest.mark.parametrize("target", ["x86-64-v3", "x86-64-v4"])
def test_width_kernels_verify_against_eager(capsys, tmp_path, overrides, target):
    report, names, _ = _run(capsys, tmp_path, overrides, "--target", target)
    assert report["verified"] is True, report.get("message")
    assert "vector.fma" in names
    convolutions = [n for n in names if "conv" in n]
    assert not convolutions  # the width kernel took it
    assert "linalg.transpose" not in names


def test_the_width_kernel_is_a_tunable_choice(capsys, tmp_path):
    """Off, a depthwise convolution takes the channels-last path (the padded input
    transposed to NHWC) and still verifies; on, it runs on NGCHW views of the NCHW
    tensors."""
    overrides, target = "c=16,groups=16,hw=12", ("--target", "x86-64-v4")
    report, _, shapes = _run(
        capsys, tmp_path, overrides, "--param", "conv_grouped_width=0", *target
    )
    assert report["verified"] is True
    assert (1, 14, 14, 16) in shapes and (1, 16, 1, 14, 14) not in shapes
    # channels-last tiles: 12 columns (a divisor of 12 up to 8: 6) x 16 channels (AVX-512
    # lanes), the channels innermost, never one channel per vector
    fmas = {shape[1:] for shape in shapes if shape[0] == "fma"}
    assert fmas and all(shape[-1] == 16 for shape in fmas), fmas
    report, _, shapes = _run(capsys, tmp_path, overrides, *target)
    assert report["verified"] is True
    assert (1, 14, 14, 16) not in shapes and (1, 16, 1, 14, 14) in shapes
