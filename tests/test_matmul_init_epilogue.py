"""A matmul's initial C added in its epilogue (:mod:`stagegraph.stages.x86.matmul.init_epilogue`):
the rewrite's IR, the sites it makes, and a biased implicit-GEMM convolution that verifies
on pinned x86-64 levels with C written in place (no block copied in or out)."""

from __future__ import annotations

import numpy as np
import pytest

import stagegraph as sg
from stagegraph.core.catalog import load_graph
from stagegraph.mlir.bindings import ir, new_context
from stagegraph.mlir.walk import collect, defining_op
from stagegraph.stages.x86.matmul.canonical import find_matmuls
from stagegraph.stages.x86.matmul.init_epilogue import init_as_epilogue

_MATMULS = """
func.func @main(%a: tensor<37x29xf32>, %b: tensor<29x53xf32>, %bias: tensor<53xf32>)
    -> (tensor<37x53xf32>, tensor<37x53xf32>, tensor<37x53xf32>) {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<37x53xf32>
  %c = linalg.broadcast ins(%bias : tensor<53xf32>) outs(%e : tensor<37x53xf32>) dimensions = [0]
  %z = linalg.fill ins(%zero : f32) outs(%e : tensor<37x53xf32>) -> tensor<37x53xf32>
  %biased = linalg.matmul {stagegraph.matmul_source = 0 : i64}
    ins(%a, %b : tensor<37x29xf32>, tensor<29x53xf32>) outs(%c : tensor<37x53xf32>)
    -> tensor<37x53xf32>
  %plain = linalg.matmul {stagegraph.matmul_source = 1 : i64}
    ins(%a, %b : tensor<37x29xf32>, tensor<29x53xf32>) outs(%z : tensor<37x53xf32>)
    -> tensor<37x53xf32>
  %other = linalg.matmul {stagegraph.matmul_source = 2 : i64}
    ins(%a, %b : tensor<37x29xf32>, tensor<29x53xf32>) outs(%c : tensor<37x53xf32>)
    -> tensor<37x53xf32>
  return %biased, %plain, %other : tensor<37x53xf32>, tensor<37x53xf32>, tensor<37x53xf32>
}
"""


def test_a_valued_init_becomes_a_zero_fill_and_an_add_into_it():
    """Only the scheduled matmul (source 0, not 2) that does not start from zero (not 1)
    is rewritten: it accumulates from a zero fill, and one all-parallel generic adds its
    result into the old init (that generic's ``outs``), which the site counts as its
    first elementwise consumer."""
    with new_context(), ir.Location.unknown():
        module = ir.Module.parse(_MATMULS)
        assert init_as_epilogue(module, {0, 1}) == 1
        assert module.operation.verify()
        biased, plain, other = collect(module.operation, "linalg.matmul")
        fill = defining_op(biased.operands[2])
        assert fill.name == "linalg.fill"
        assert ir.FloatAttr(defining_op(fill.operands[0]).attributes["value"]).value == 0.0
        (use,) = list(biased.results[0].uses)
        adder = use.owner.operation
        assert adder.name == "linalg.generic" and use.operand_number == 0
        assert defining_op(adder.operands[1]).name == "linalg.broadcast"  # C's old init
        assert [op.name for op in adder.regions[0].blocks[0].operations] == [
            "arith.addf",
            "linalg.yield",
        ]
        for untouched in (plain, other):
            assert defining_op(untouched.operands[2]).name in {"linalg.fill", "linalg.broadcast"}
            assert not any(
                u.owner.operation.name == "linalg.generic" for u in untouched.results[0].uses
            )
        assert defining_op(other.operands[2]).name == "linalg.broadcast"
        sites = find_matmuls(module)
        assert [(s.has_fill, s.consumers) for s in sites] == [(True, 1), (True, 0), (False, 0)]


def _conv(c: int, f: int, size: int, stride: int) -> str:
    out = (size - 3) // stride + 1
    x, w, y = f"2x{c}x{size}x{size}", f"{f}x{c}x3x3", f"2x{f}x{out}x{out}"
    return f"""
func.func @main(%x: tensor<{x}xf32>, %w: tensor<{w}xf32>, %b: tensor<{f}xf32>)
    -> tensor<{y}xf32> {{
  %e = tensor.empty() : tensor<{y}xf32>
  %i = linalg.broadcast ins(%b : tensor<{f}xf32>) outs(%e : tensor<{y}xf32>)
    dimensions = [0, 2, 3]
  %r = linalg.conv_2d_nchw_fchw
    {{dilations = dense<1> : vector<2xi64>, strides = dense<{stride}> : vector<2xi64>}}
    ins(%x, %w : tensor<{x}xf32>, tensor<{w}xf32>) outs(%i : tensor<{y}xf32>)
    -> tensor<{y}xf32>
  return %r : tensor<{y}xf32>
}}
"""


@pytest.mark.parametrize("level", ["x86-64-v4", "x86-64-v3"])
@pytest.mark.parametrize(("c", "f", "size", "stride"), [(3, 24, 29, 2), (5, 16, 19, 1)])
def test_biased_gemm_convolutions_verify_with_c_in_place(tmp_path, level, c, f, size, stride):
    """Odd sizes (14 or 17 outputs a row, 196 or 289 GEMM columns: partial register
    panels), strided or not, in blocks of output rows: the result equals numpy's, and the
    bufferized code copies no part of C (before, each block of C was copied out of the bias
    broadcast into a buffer and back)."""
    out = (size - 3) // stride + 1
    rng = np.random.default_rng(size)
    x = rng.standard_normal((2, c, size, size), dtype=np.float32)
    w = rng.standard_normal((f, c, 3, 3), dtype=np.float32)
    b = rng.standard_normal(f, dtype=np.float32)
    expected = np.broadcast_to(b.reshape(1, f, 1, 1).astype(np.float64), (2, f, out, out)).copy()
    for i in range(3):
        for j in range(3):
            span = stride * (out - 1) + 1
            window = x[:, :, i : i + span : stride, j : j + span : stride].astype(np.float64)
            expected += np.einsum("nchw,fc->nfhw", window, w[:, :, i, j].astype(np.float64))
    payload = tmp_path / "conv.mlir"
    payload.write_text(_conv(c, f, size, stride))
    np.savez(tmp_path / "conv.npz", in0=x, in1=w, in2=b, out0=expected.astype(np.float32))
    graph = load_graph("x86").with_config("normalize", path="gemm", patch_block_l2_fraction=0.001)
    dumped = tmp_path / "ir"
    report = sg.run(graph, str(payload), threads=1, target=level, dump_ir=str(dumped))
    assert report.verified is True, report
    [normalized] = [p for p in dumped.iterdir() if "normalize" in p.name]
    [bufferized] = [p for p in dumped.iterdir() if "bufferize" in p.name]
    with new_context():
        blocks = collect(ir.Module.parse(normalized.read_text()).operation, "scf.for")
        assert blocks  # the GEMM runs in blocks of output rows
        module = ir.Module.parse(bufferized.read_text())
        copied = [
            ir.MemRefType(op.operands[1].type).shape
            for op in collect(module.operation, "memref.copy")
        ]
        assert not [shape for shape in copied if f in shape], copied  # (x's rows may be)
