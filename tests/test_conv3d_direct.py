"""Channels-last 3-D convolutions as one register-blocked direct kernel
(stagegraph.stages.x86.conv.direct3d, blocking in conv/direct3d_plan.py): the taps a block
of a zero-padded input reads, the blocking against the target's registers, the IR the
rewrite makes, and values against PyTorch eager through the x86 graph on pinned targets
(padding, strides, a dilated width, a transposed convolution, filters that end in a partial
vector, few input channels)."""

from __future__ import annotations

import json
import textwrap

import pytest

from stagegraph.stages.x86.conv.direct3d_plan import (
    SPARE_REGISTERS,
    Conv3dShape,
    Window,
    plan_blocks,
    tap_range,
)


def test_tap_range_keeps_the_taps_that_read_real_input():
    """A stride-1 transposed convolution of an 8-wide input by 5 taps: 12 outputs over an
    input padded by 4; output 0 reads real input only at its last tap, output 11 only at
    its first, a block of every output at all five."""
    window = Window(out=12, taps=5, stride=1, dilation=1, size=8, pad=4)
    assert tap_range(window, 0, 1) == (4, 5)
    assert tap_range(window, 11, 1) == (0, 1)
    assert tap_range(window, 5, 1) == (0, 5)
    assert tap_range(window, 0, 12) == (0, 5)
    assert tap_range(window, 0, 3) == (2, 5)
    # stride 2, dilation 2, pad 1 on 7 elements: output 0 reads -1, 1, 3 -> taps 1 and 2
    strided = Window(out=4, taps=3, stride=2, dilation=2, size=7, pad=1)
    assert tap_range(strided, 0, 1) == (1, 3)
    assert tap_range(strided, 3, 1) == (0, 1)  # reads 5, then 7 and 9 past the end
    # no padding: every output reads every tap
    plain = Window(out=6, taps=3, stride=1, dilation=1, size=8)
    assert all(tap_range(plain, o, 1) == (0, 3) for o in range(6))


_SHAPE = Conv3dShape(8, 16, 16, (Window(12, 5, 1, 1, 16),) * 3)
_PADDED = Conv3dShape(8, 16, 16, (Window(12, 5, 1, 1, 8, 4),) * 3)


@pytest.mark.parametrize(("registers", "lanes"), [(32, 16), (16, 8)], ids=["avx512", "avx2"])
@pytest.mark.parametrize("shape", [_SHAPE, _PADDED], ids=["plain", "padded"])
def test_blocks_fit_the_registers(registers, lanes, shape):
    """Accumulators, filter vectors and a spare fit the register file; the blocks tile the
    output exactly (images and rows by divisors, columns with a tail)."""
    plan = plan_blocks(shape, lanes, registers, 2)
    assert plan is not None
    assert plan.accumulators + plan.vectors + SPARE_REGISTERS <= registers
    assert plan.filter_vectors == 16 // lanes
    assert plan.filter_vectors % plan.vectors == 0
    assert shape.n % plan.images == 0 and 12 % plan.rows == 0
    assert plan.columns * (12 // plan.columns) + plan.tail == 12
    assert plan.accumulators >= 8  # enough chains to hide the FMA latency on two units


def test_a_padded_input_takes_blocks_that_skip_its_border():
    """Unpadded, a block takes the whole 12-column row (fewest loads per FMA); on the
    zero-padded input of a transposed convolution, narrow blocks of several images skip
    the taps that read only the border: the estimate falls below the unpadded one, near
    the useful flops at the peak (64 flops a cycle: 16 lanes, 2 FMA units)."""
    plain = plan_blocks(_SHAPE, 16, 32, 2)
    padded = plan_blocks(_PADDED, 16, 32, 2)
    assert plain is not None and padded is not None
    assert plain.columns == 12 and plain.images == 1
    assert padded.columns < 12 and padded.images > 1
    useful = 2 * 8 * 16 * 16 * (8 * 5) ** 3  # each real input element meets every tap
    assert padded.cycles < 0.5 * plain.cycles
    assert useful / padded.cycles > 0.7 * 64


def test_an_accumulator_budget_caps_the_block():
    plan = plan_blocks(_SHAPE, 16, 32, 2, budget=8)
    assert plan is not None and plan.accumulators <= 8


def test_partial_filter_vectors():
    """12 filters on 16 lanes: one vector, padded (written masked); 200 filters end in a
    partial 13th vector, more than one block may hold: not taken."""
    shape = Conv3dShape(2, 3, 12, (Window(4, 2, 1, 1, 5),) * 3)
    plan = plan_blocks(shape, 16, 32, 2)
    assert plan is not None and (plan.vectors, plan.filter_vectors) == (1, 1)
    wide = Conv3dShape(2, 3, 200, (Window(4, 2, 1, 1, 5),) * 3)
    assert plan_blocks(wide, 16, 32, 2) is None


# ----------------------------------------------------------------------------- IR

_CONV_MLIR = """
func.func @main(%x: tensor<2x6x7x8x3xf32>, %w: tensor<2x3x4x3x16xf32>)
    -> tensor<2x5x5x5x16xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<2x5x5x5x16xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<2x5x5x5x16xf32>)
      -> tensor<2x5x5x5x16xf32>
  %r = linalg.conv_3d_ndhwc_dhwcf {dilations = dense<1> : vector<3xi64>,
      strides = dense<1> : vector<3xi64>}
      ins(%x, %w : tensor<2x6x7x8x3xf32>, tensor<2x3x4x3x16xf32>)
      outs(%f : tensor<2x5x5x5x16xf32>) -> tensor<2x5x5x5x16xf32>
  return %r : tensor<2x5x5x5x16xf32>
}
"""

_PADDED_MLIR = """
func.func @main(%x: tensor<1x4x4x4x8xf32>, %w: tensor<3x3x3x8x16xf32>)
    -> tensor<1x6x6x6x16xf32> {
  %zero = arith.constant 0.0 : f32
  %e0 = tensor.empty() : tensor<1x8x8x8x8xf32>
  %z = linalg.fill ins(%zero : f32) outs(%e0 : tensor<1x8x8x8x8xf32>)
      -> tensor<1x8x8x8x8xf32>
  %p = tensor.insert_slice %x into %z[0, 2, 2, 2, 0] [1, 4, 4, 4, 8] [1, 1, 1, 1, 1]
      : tensor<1x4x4x4x8xf32> into tensor<1x8x8x8x8xf32>
  %e = tensor.empty() : tensor<1x6x6x6x16xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<1x6x6x6x16xf32>)
      -> tensor<1x6x6x6x16xf32>
  %r = linalg.conv_3d_ndhwc_dhwcf {dilations = dense<1> : vector<3xi64>,
      strides = dense<1> : vector<3xi64>}
      ins(%p, %w : tensor<1x8x8x8x8xf32>, tensor<3x3x3x8x16xf32>)
      outs(%f : tensor<1x6x6x6x16xf32>) -> tensor<1x6x6x6x16xf32>
  return %r : tensor<1x6x6x6x16xf32>
}
"""


def _rewritten(text: str, target):
    from stagegraph.mlir.bindings import ir, new_context
    from stagegraph.mlir.walk import collect
    from stagegraph.stages.x86.conv.direct3d import conv3d_to_direct_kernels

    with new_context(), ir.Location.unknown():
        module = ir.Module.parse(text)
        (fn,) = collect(module, "func.func")
        assert conv3d_to_direct_kernels(fn, target) == 1
        module.operation.verify()
        ops = collect(module)
        loops = [len(op.results) for op in ops if op.name == "scf.for" and len(op.results) > 1]
        return [op.name for op in ops], loops


def test_the_kernel_keeps_its_accumulators_through_the_reduction():
    """AVX2 (16 registers of 8 lanes): 16 filters are two vectors; 3 channels, 5-column
    rows. The fill becomes the accumulators' start; no convolution, fill or transpose is
    left; every reduction loop (depth taps, rows of taps, taps x channels) carries the
    whole block; each step issues one FMA per accumulator."""
    from stagegraph.stages.x86.conv.direct3d_plan import Target3d

    names, loops = _rewritten(_CONV_MLIR, Target3d(32, 16, 2))
    shape = Conv3dShape(2, 3, 16, (Window(5, 2, 1, 1, 6), Window(5, 3, 1, 1, 7),
                                   Window(5, 4, 1, 1, 8)))  # fmt: skip
    plan = plan_blocks(shape, 8, 16, 2)
    assert plan is not None
    # two filter vectors x a whole 5-column row: 10 accumulators, 2 filter vectors, spares
    assert (plan.vectors, plan.images, plan.rows, plan.columns, plan.tail) == (2, 1, 1, 5, 0)
    assert not [n for n in names if n.startswith("linalg.")]
    assert names.count("scf.forall") == 1
    assert loops == [10, 10, 10]  # depth taps, rows of taps, taps x channels
    assert names.count("vector.fma") == 10
    assert names.count("vector.broadcast") == 5 + 10  # a broadcast per column; the fill
    assert "arith.maxsi" not in names  # no padding: constant tap bounds


def test_a_padded_input_bounds_the_tap_loops_by_the_block():
    """The convolution of a zero-padded input: the tap loops take bounds computed from the
    block's position (max/min of the border), the padded input is still read (a block's
    other positions may need the border)."""
    from stagegraph.stages.x86.conv.direct3d_plan import Target3d

    names, _ = _rewritten(_PADDED_MLIR, Target3d(64, 32, 2))
    assert "tensor.insert_slice" in names
    # one lower and one upper bound per padded dim a block does not cover whole: the
    # depth (one output a block) and at least the rows or the columns
    assert names.count("arith.maxsi") == names.count("arith.minsi") >= 2
    assert not [n for n in names if n.startswith("linalg.conv")]


# ----------------------------------------------------------------------------- values

_PROBLEM = """
import torch
import torch.nn as nn
n, cin, cout, d, h, w = 2, 3, 16, 6, 7, 9
kd, kh, kw, stride, pad, dh, dw, transposed, bias = 2, 3, 4, 1, 0, 1, 1, 0, 1
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        conv = nn.ConvTranspose3d if transposed else nn.Conv3d
        extra = {} if transposed else {"dilation": (1, dh, dw)}
        self.conv = conv(cin, cout, (kd, kh, kw), stride=stride, padding=pad, bias=bool(bias),
                         **extra)
    def forward(self, x):
        return torch.relu(self.conv(x))
def get_inputs():
    return [torch.rand(n, cin, d, h, w)]
def get_init_inputs():
    return []
"""


def _run(capsys, tmp_path, overrides: str, *extra: str) -> tuple[dict, list[str]]:
    """Run the problem through x86 (verifying it): the report and the op names of the
    scheduled IR, with ``"accumulator loop"`` for each ``scf.for`` that carries vectors
    only (the kernel's reduction loops)."""
    pytest.importorskip("torch")
    from stagegraph.cli.main import main
    from stagegraph.mlir.bindings import ir, new_context
    from stagegraph.mlir.walk import collect

    path = tmp_path / "problem.py"
    path.write_text(textwrap.dedent(_PROBLEM))
    dump = tmp_path / "dump"
    spec = f"{path}:{overrides}" if overrides else str(path)
    code = main(["run", "x86", spec, "--threads", "1", "--dump-ir", str(dump), *extra, "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err[-2000:] + captured.out[-2000:]
    report = json.loads(captured.out)
    index = json.loads((dump / "index.json").read_text())
    (scheduled,) = [s["file"] for s in index if s["stage"] == "schedule"]
    with new_context():
        module = ir.Module.parse((dump / scheduled).read_text())
        names = [op.name for op in collect(module)]
        names += [
            "accumulator loop"
            for op in collect(module, "scf.for")
            if len(op.results) > 1 and all(isinstance(r.type, ir.VectorType) for r in op.results)
        ]
        return report, names


@pytest.mark.parametrize(
    "overrides",
    [
        "",  # 3 channels, a 2x3x4 window, a bias
        "cin=8,cout=32,kd=3,kh=3,kw=3,pad=1,stride=2,bias=0",  # two filter vectors on v3
        "cin=4,kd=3,kh=3,kw=3,dh=2,dw=2,h=9,w=11",  # a dilated width: taps around channels
        "cin=8,kd=3,kh=3,kw=3,transposed=1,d=4,h=4,w=5",  # stride 1 transposed: padded input
        "cin=5,cout=12,kd=2,kh=2,kw=2,n=3,h=5,w=13",  # 12 filters: a partial vector, masked
    ],
    ids=["few-channels", "padded-strided", "dilated", "transposed", "partial-filters"],
)
@pytest.mark.parametrize("target", ["x86-64-v3", "x86-64-v4"])
def test_direct3d_verifies_against_eager(capsys, tmp_path, overrides, target):
    report, names = _run(capsys, tmp_path, overrides, "--target", target)
    assert report["verified"] is True, report.get("message")
    assert not [n for n in names if "conv" in n]  # the kernel took it
    assert names.count("accumulator loop") >= 3


def test_the_kernel_is_a_tunable_choice(capsys, tmp_path):
    """Off, the convolution takes the depth loops of 2-D ones and still verifies."""
    overrides = "cin=8,kd=3,kh=3,kw=3,transposed=1,d=4,h=4,w=5"
    target = ("--target", "x86-64-v4")
    report, names = _run(capsys, tmp_path, overrides, "--param", "conv3d_direct=0", *target)
    assert report["verified"] is True
    assert "accumulator loop" not in names and "vector.fma" in names
    report, names = _run(capsys, tmp_path, overrides, *target)
    assert report["verified"] is True and names.count("accumulator loop") >= 3


# ----------------------------------------------------------------------------- cost model


def _v(level: str):
    from stagegraph.stages.target import resolve_target

    return resolve_target(level)


@pytest.mark.parametrize("level", ["x86-64-v3", "x86-64-v4"])
def test_3d_convolutions_take_the_kernel_where_the_gemm_ran_slower(level):
    """3 -> 24 channels, 3^3 on 12x8x8 (KernelBench's l2_023) and a 2x2x2 phase of an
    8 -> 64 transposed convolution (l2_003's): the 2-D model sent both to the GEMM, the
    kernel measured 1.1x faster than it (benchmarks/conv3d_rounds.py, AVX-512, under
    load); the 2-D estimate stays with ``direct3d`` off."""
    from stagegraph.stages.x86.conv.choice import choose_path
    from stagegraph.stages.x86.conv.config import ConvGemmConfig
    from stagegraph.stages.x86.conv.conv_shape import ConvShape

    shapes = [
        ConvShape(16, 3, 24, (3, 3, 3), (10, 6, 6), (1, 1, 1), (1, 1, 1)),
        ConvShape(2, 8, 64, (2, 2, 2), (4, 4, 32), (1, 1, 1), (1, 1, 1)),
    ]
    for shape in shapes:
        choice = choose_path(shape, _v(level), ConvGemmConfig())
        assert (choice.path, choice.decided_by) == ("direct", "cost model"), choice
        off = choose_path(shape, _v(level), ConvGemmConfig(direct3d=False))
        assert off.direct_cycles > choice.direct_cycles


def test_the_kernel_estimate_counts_only_what_a_padded_input_makes_it_read():
    """The same convolution costs less on a zero-padded input than on a real one, and a
    wider FMA (AVX-512) makes it cheaper."""
    from stagegraph.stages.x86.conv.choice import direct3d_cycles
    from stagegraph.stages.x86.conv.config import ConvGemmConfig
    from stagegraph.stages.x86.conv.conv_shape import ConvShape

    shape = ConvShape(8, 16, 16, (5, 5, 5), (12, 12, 12), (1, 1, 1), (1, 1, 1))
    config = ConvGemmConfig()
    plain = direct3d_cycles(shape, _v("x86-64-v4"), config)
    padded = direct3d_cycles(shape, _v("x86-64-v4"), config, "f32", [(8, 4)] * 3)
    avx2 = direct3d_cycles(shape, _v("x86-64-v3"), config, "f32", [(8, 4)] * 3)
    assert plain is not None and padded is not None and avx2 is not None
    assert padded < 0.5 * plain
    assert padded < avx2


_TRANSPOSED_MLIR = """
func.func @main(%x: tensor<{n}x{c}x8x8x8xf32>, %w: tensor<{f}x{c}x{k0}x{k1}x{k2}xf32>)
    -> tensor<{n}x{f}x{o0}x{o1}x{o2}xf32> {{
  %zero = arith.constant 0.0 : f32
  %e0 = tensor.empty() : tensor<{n}x{c}x{p0}x{p1}x{p2}xf32>
  %z = linalg.fill ins(%zero : f32) outs(%e0 : tensor<{n}x{c}x{p0}x{p1}x{p2}xf32>)
      -> tensor<{n}x{c}x{p0}x{p1}x{p2}xf32>
  %p = tensor.insert_slice %x into %z[0, 0, {q0}, {q1}, {q2}] [{n}, {c}, 8, 8, 8] [1, 1, 1, 1, 1]
      : tensor<{n}x{c}x8x8x8xf32> into tensor<{n}x{c}x{p0}x{p1}x{p2}xf32>
  %e = tensor.empty() : tensor<{n}x{f}x{o0}x{o1}x{o2}xf32>
  %i = linalg.fill ins(%zero : f32) outs(%e : tensor<{n}x{f}x{o0}x{o1}x{o2}xf32>)
      -> tensor<{n}x{f}x{o0}x{o1}x{o2}xf32>
  %r = linalg.conv_3d_ncdhw_fcdhw {{dilations = dense<1> : vector<3xi64>,
      strides = dense<1> : vector<3xi64>}}
      ins(%p, %w : tensor<{n}x{c}x{p0}x{p1}x{p2}xf32>, tensor<{f}x{c}x{k0}x{k1}x{k2}xf32>)
      outs(%i : tensor<{n}x{f}x{o0}x{o1}x{o2}xf32>) -> tensor<{n}x{f}x{o0}x{o1}x{o2}xf32>
  return %r : tensor<{n}x{f}x{o0}x{o1}x{o2}xf32>
}}
"""


@pytest.mark.parametrize(
    ("n", "c", "f", "kernel", "col2im"),
    [
        # KernelBench's l1_058: 8 filters fill half a 16-lane vector: col2im measured 1.15x
        (4, 16, 8, (3, 5, 7), True),
        # l2_077: 16 -> 16 channels, 5^3: the kernel measured 2.5x faster than col2im
        (8, 16, 16, (5, 5, 5), False),
    ],
    ids=["l1_058", "l2_077"],
)
def test_col2im_against_the_kernel_estimate(n, c, f, kernel, col2im):
    """A stride-1 transposed convolution (a zero-padded input): on a known target, col2im
    is taken only where its GEMM and adds beat the 3-D kernel's estimate on the padded
    input (AVX-512); without a target the earlier rule decides."""
    from stagegraph.mlir.bindings import ir, new_context
    from stagegraph.stages.x86.conv.col2im import stride1_transposed_to_col2im
    from stagegraph.stages.x86.conv.config import ConvGemmConfig

    pads = [k - 1 for k in kernel]
    sizes = {f"k{d}": kernel[d] for d in range(3)}
    sizes |= {f"p{d}": 8 + 2 * pads[d] for d in range(3)}
    sizes |= {f"q{d}": pads[d] for d in range(3)}
    sizes |= {f"o{d}": 8 + pads[d] for d in range(3)}
    text = _TRANSPOSED_MLIR.format(n=n, c=c, f=f, **sizes)
    config = ConvGemmConfig(col2im_max_elements=1 << 30)
    with new_context(), ir.Location.unknown():
        module = ir.Module.parse(text)
        assert stride1_transposed_to_col2im(module, config, _v("x86-64-v4")) == int(col2im)
        module.operation.verify()
