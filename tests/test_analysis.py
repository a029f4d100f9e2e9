"""Payload analysis: classification, contraction sizes, layers, summaries and errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from stagegraph.errors import PayloadError, UnregisteredOpError, UnsupportedPayloadError
from stagegraph.stages.analysis import (
    PayloadFacts,
    analyze,
    parse_payload,
)
from tests.conftest import KERNELBENCH, MATMUL_MLIR


def facts_of(text: str, entry: str | None = None) -> PayloadFacts:
    return analyze(parse_payload(text), entry)


MATMUL = MATMUL_MLIR

# C[m, n] += A[m, k] * B[n, k], written as a generic (the matmul_transpose_b layout).
GENERIC_MATMUL_TRANSPOSED_B = """
#a = affine_map<(m, n, k) -> (m, k)>
#b = affine_map<(m, n, k) -> (n, k)>
#c = affine_map<(m, n, k) -> (m, n)>
func.func @main(%a: tensor<64x32xf32>, %b: tensor<128x32xf32>, %c: tensor<64x128xf32>)
    -> tensor<64x128xf32> {
  %0 = linalg.generic {indexing_maps = [#a, #b, #c],
                       iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%a, %b : tensor<64x32xf32>, tensor<128x32xf32>) outs(%c : tensor<64x128xf32>) {
  ^bb0(%x: f32, %y: f32, %z: f32):
    %m = arith.mulf %x, %y : f32
    %s = arith.addf %z, %m : f32
    linalg.yield %s : f32
  } -> tensor<64x128xf32>
  return %0 : tensor<64x128xf32>
}
"""

BATCH_MATMUL = """
func.func @main(%a: tensor<4x16x8xf32>, %b: tensor<4x8x32xf32>, %c: tensor<4x16x32xf32>)
    -> tensor<4x16x32xf32> {
  %r = linalg.batch_matmul ins(%a, %b : tensor<4x16x8xf32>, tensor<4x8x32xf32>)
                           outs(%c : tensor<4x16x32xf32>) -> tensor<4x16x32xf32>
  return %r : tensor<4x16x32xf32>
}
"""

CONV = """
func.func @main(%x: tensor<2x3x17x17xf32>, %w: tensor<8x3x3x3xf32>, %o: tensor<2x8x8x8xf32>)
    -> tensor<2x8x8x8xf32> {
  %r = linalg.conv_2d_nchw_fchw {dilations = dense<1> : vector<2xi64>,
                                 strides = dense<2> : vector<2xi64>}
      ins(%x, %w : tensor<2x3x17x17xf32>, tensor<8x3x3x3xf32>)
      outs(%o : tensor<2x8x8x8xf32>) -> tensor<2x8x8x8xf32>
  return %r : tensor<2x8x8x8xf32>
}
"""

POOLING = """
func.func @main(%x: tensor<1x4x8x8xf32>, %o: tensor<1x4x4x4xf32>) -> tensor<1x4x4x4xf32> {
  %window = tensor.empty() : tensor<2x2xf32>
  %r = linalg.pooling_nchw_max {dilations = dense<1> : vector<2xi64>,
                                strides = dense<2> : vector<2xi64>}
      ins(%x, %window : tensor<1x4x8x8xf32>, tensor<2x2xf32>)
      outs(%o : tensor<1x4x4x4xf32>) -> tensor<1x4x4x4xf32>
  return %r : tensor<1x4x4x4xf32>
}
"""

# Row softmax: max-reduce, exp(x - max), sum-reduce, divide.
SOFTMAX = """
#id = affine_map<(i, j) -> (i, j)>
#row = affine_map<(i, j) -> (i)>
func.func @main(%x: tensor<8x32xf32>) -> tensor<8x32xf32> {
  %ninf = arith.constant 0xFF800000 : f32
  %zero = arith.constant 0.0 : f32
  %e1 = tensor.empty() : tensor<8xf32>
  %minit = linalg.fill ins(%ninf : f32) outs(%e1 : tensor<8xf32>) -> tensor<8xf32>
  %max = linalg.generic {indexing_maps = [#id, #row], iterator_types = ["parallel", "reduction"]}
      ins(%x : tensor<8x32xf32>) outs(%minit : tensor<8xf32>) {
  ^bb0(%in: f32, %acc: f32):
    %m = arith.maximumf %in, %acc : f32
    linalg.yield %m : f32
  } -> tensor<8xf32>
  %e2 = tensor.empty() : tensor<8x32xf32>
  %exp = linalg.generic {indexing_maps = [#id, #row, #id],
                         iterator_types = ["parallel", "parallel"]}
      ins(%x, %max : tensor<8x32xf32>, tensor<8xf32>) outs(%e2 : tensor<8x32xf32>) {
  ^bb0(%in: f32, %mx: f32, %out: f32):
    %d = arith.subf %in, %mx : f32
    %e = math.exp %d : f32
    linalg.yield %e : f32
  } -> tensor<8x32xf32>
  %sinit = linalg.fill ins(%zero : f32) outs(%e1 : tensor<8xf32>) -> tensor<8xf32>
  %sum = linalg.generic {indexing_maps = [#id, #row], iterator_types = ["parallel", "reduction"]}
      ins(%exp : tensor<8x32xf32>) outs(%sinit : tensor<8xf32>) {
  ^bb0(%in: f32, %acc: f32):
    %s = arith.addf %in, %acc : f32
    linalg.yield %s : f32
  } -> tensor<8xf32>
  %r = linalg.generic {indexing_maps = [#id, #row, #id], iterator_types = ["parallel", "parallel"]}
      ins(%exp, %sum : tensor<8x32xf32>, tensor<8xf32>) outs(%e2 : tensor<8x32xf32>) {
  ^bb0(%in: f32, %s: f32, %out: f32):
    %q = arith.divf %in, %s : f32
    linalg.yield %q : f32
  } -> tensor<8x32xf32>
  return %r : tensor<8x32xf32>
}
"""

RELU = """
#id = affine_map<(i, j) -> (i, j)>
func.func @main(%x: tensor<8x32xbf16>) -> tensor<8x32xbf16> {
  %zero = arith.constant 0.0 : bf16
  %e = tensor.empty() : tensor<8x32xbf16>
  %r = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%x : tensor<8x32xbf16>) outs(%e : tensor<8x32xbf16>) {
  ^bb0(%in: bf16, %out: bf16):
    %m = arith.maximumf %in, %zero : bf16
    linalg.yield %m : bf16
  } -> tensor<8x32xbf16>
  return %r : tensor<8x32xbf16>
}
"""

# Two layers: relu(x @ w1 + b1) then (h @ w2 + b2); the second has no activation.
MLP = """
#id = affine_map<(i, j) -> (i, j)>
#col = affine_map<(i, j) -> (j)>
func.func @main(%x: tensor<4x16xf32>, %w1: tensor<16x32xf32>, %b1: tensor<32xf32>,
                %w2: tensor<32x8xf32>, %b2: tensor<8xf32>) -> tensor<4x8xf32> {
  %zero = arith.constant 0.0 : f32
  %e1 = tensor.empty() : tensor<4x32xf32>
  %acc1 = linalg.fill ins(%zero : f32) outs(%e1 : tensor<4x32xf32>) -> tensor<4x32xf32>
  %mm1 = linalg.matmul ins(%x, %w1 : tensor<4x16xf32>, tensor<16x32xf32>)
                       outs(%acc1 : tensor<4x32xf32>) -> tensor<4x32xf32>
  %bias1 = linalg.generic {indexing_maps = [#id, #col, #id],
                           iterator_types = ["parallel", "parallel"]}
      ins(%mm1, %b1 : tensor<4x32xf32>, tensor<32xf32>) outs(%e1 : tensor<4x32xf32>) {
  ^bb0(%v: f32, %b: f32, %o: f32):
    %s = arith.addf %v, %b : f32
    linalg.yield %s : f32
  } -> tensor<4x32xf32>
  %relu = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%bias1 : tensor<4x32xf32>) outs(%e1 : tensor<4x32xf32>) {
  ^bb0(%v: f32, %o: f32):
    %m = arith.maximumf %v, %zero : f32
    linalg.yield %m : f32
  } -> tensor<4x32xf32>
  %e2 = tensor.empty() : tensor<4x8xf32>
  %acc2 = linalg.fill ins(%zero : f32) outs(%e2 : tensor<4x8xf32>) -> tensor<4x8xf32>
  %mm2 = linalg.matmul ins(%relu, %w2 : tensor<4x32xf32>, tensor<32x8xf32>)
                       outs(%acc2 : tensor<4x8xf32>) -> tensor<4x8xf32>
  %bias2 = linalg.generic {indexing_maps = [#id, #col, #id],
                           iterator_types = ["parallel", "parallel"]}
      ins(%mm2, %b2 : tensor<4x8xf32>, tensor<8xf32>) outs(%e2 : tensor<4x8xf32>) {
  ^bb0(%v: f32, %b: f32, %o: f32):
    %s = arith.addf %v, %b : f32
    linalg.yield %s : f32
  } -> tensor<4x8xf32>
  return %bias2 : tensor<4x8xf32>
}
"""


# --------------------------------------------------------------------------- classes


def test_matmul() -> None:
    facts = facts_of(MATMUL)
    assert facts.entry == "main"
    assert [(op.name, op.op_class) for op in facts.ops] == [
        ("linalg.fill", "elementwise"),
        ("linalg.matmul", "matmul"),
    ]
    mm = facts.ops[1]
    assert mm.contraction is not None
    assert (mm.contraction.batch, mm.contraction.m, mm.contraction.n, mm.contraction.k) == (
        1,
        16,
        12,
        8,
    )
    assert (mm.contraction.transpose_a, mm.contraction.transpose_b) == (False, False)
    assert mm.iterator_types == ("parallel", "parallel", "reduction")
    assert mm.loop_ranges == (16, 12, 8)
    assert mm.producers == ("%arg0", "%arg1", "linalg.fill")
    assert mm.indexing_maps[0] == "(d0, d1, d2) -> (d0, d2)"
    assert [(v.shape, v.dtype) for v in mm.inputs] == [((16, 8), "f32"), ((8, 12), "f32")]
    assert mm.flops == 2 * 16 * 12 * 8
    assert facts.flops == 2 * 16 * 12 * 8  # the fill adds no flops
    assert facts.bytes == 4 * (16 * 8 + 8 * 12 + 16 * 12)
    assert facts.classes == {"matmul", "elementwise"}
    assert facts.primary_class == "matmul"
    fn = facts.entry_function
    assert [a.shape for a in fn.arguments] == [(16, 8), (8, 12)]
    assert fn.results[0].type == "tensor<16x12xf32>"


def test_generic_contraction_with_transposed_b() -> None:
    (op,) = facts_of(GENERIC_MATMUL_TRANSPOSED_B).ops
    assert (op.name, op.op_class) == ("linalg.generic", "matmul")
    c = op.contraction
    assert c is not None
    assert (c.m, c.n, c.k) == (64, 128, 32)
    assert (c.m_dims, c.n_dims, c.k_dims) == ((0,), (1,), (2,))
    assert (c.transpose_a, c.transpose_b) == (False, True)
    assert op.body_ops == ("arith.mulf", "arith.addf")


def test_batch_matmul() -> None:
    (op,) = facts_of(BATCH_MATMUL).ops
    c = op.contraction
    assert c is not None
    assert (c.batch, c.m, c.n, c.k) == (4, 16, 32, 8)
    assert op.flops == 2 * 4 * 16 * 32 * 8


def test_convolution() -> None:
    (op,) = facts_of(CONV).ops
    assert (op.name, op.op_class) == ("linalg.conv_2d_nchw_fchw", "convolution")
    assert op.loop_ranges == (2, 8, 8, 8, 3, 3, 3)  # n, f, oh, ow, c, kh, kw
    assert op.iterator_types == ("parallel",) * 4 + ("reduction",) * 3
    assert op.convolution is not None
    assert op.convolution.strides == (2, 2)
    assert op.convolution.filter_loop == (5, 6)
    assert op.flops == 2 * 2 * 8 * 8 * 8 * 3 * 3 * 3
    assert op.contraction is None


def test_pooling() -> None:
    (op,) = facts_of(POOLING).ops
    assert op.op_class == "pooling"
    assert op.loop_ranges == (1, 4, 4, 4, 2, 2)
    assert op.producers[1] == "tensor.empty"


def test_softmax_is_reductions_and_elementwise() -> None:
    facts = facts_of(SOFTMAX)
    assert [op.op_class for op in facts.ops] == [
        "elementwise",  # fill -inf
        "reduction",  # max
        "elementwise",  # exp(x - max)
        "elementwise",  # fill 0
        "reduction",  # sum
        "elementwise",  # divide
    ]
    assert facts.primary_class == "reduction"
    assert facts.ops[1].iterator_types == ("parallel", "reduction")
    assert facts.ops[2].flops == 2 * 8 * 32  # subf + exp per element
    assert facts.layers == ()


def test_elementwise_bf16() -> None:
    facts = facts_of(RELU)
    (op,) = facts.ops
    assert op.op_class == "elementwise"
    assert op.body_ops == ("arith.maximumf",)
    assert facts.dtypes == {"bf16"}
    assert facts.bytes == 2 * 2 * 8 * 32


def test_mlp_layers() -> None:
    facts = facts_of(MLP)
    names = [op.name for op in facts.ops]
    assert names.count("linalg.matmul") == 2
    first, second = facts.layers
    assert (first.m, first.n, first.k) == (4, 32, 16)
    assert first.epilogue_ops == ("arith.addf", "arith.maximumf")
    assert [facts.ops[i].name for i in first.epilogue] == ["linalg.generic"] * 2
    assert (second.m, second.n, second.k) == (4, 8, 32)
    assert second.epilogue_ops == ("arith.addf",)
    # The first layer's epilogue ends where the second matmul starts.
    assert facts.ops[second.contraction].producers[0] == "linalg.generic"


def test_mlp_workload_layers() -> None:
    """The project's own MLP workload builds the layer pattern analysis looks for."""
    mlp = pytest.importorskip("stagegraph.workloads.mlp")
    module = mlp.Mlp(batch=8, widths=[16, 32, 8]).payload()
    facts = analyze(module)
    assert [(layer.m, layer.n, layer.k) for layer in facts.layers] == [(8, 32, 16), (8, 8, 32)]
    assert all(layer.epilogue_ops == ("arith.addf", "arith.maximumf") for layer in facts.layers)


# --------------------------------------------------------------------------- errors


def test_dynamic_argument_is_rejected() -> None:
    text = MATMUL.replace("%a: tensor<16x8xf32>", "%a: tensor<?x8xf32>")
    text = text.replace("ins(%a, %b : tensor<16x8xf32>", "ins(%a, %b : tensor<?x8xf32>")
    with pytest.raises(UnsupportedPayloadError) as info:
        facts_of(text)
    assert str(info.value) == (
        "payload function @main argument 0 has dynamic shape tensor<?x8xf32>; "
        "stagegraph needs static shapes"
    )
    assert isinstance(info.value, PayloadError)
    assert isinstance(info.value, ValueError)


def test_dynamic_operand_is_rejected() -> None:
    text = """
    func.func @main(%a: tensor<4x8xf32>) -> tensor<4x8xf32> {
      %d = tensor.cast %a : tensor<4x8xf32> to tensor<?x8xf32>
      %c = arith.constant 1 : index
      %e = tensor.empty(%c) : tensor<?x8xf32>
      %r = linalg.copy ins(%d : tensor<?x8xf32>) outs(%e : tensor<?x8xf32>) -> tensor<?x8xf32>
      %s = tensor.cast %r : tensor<?x8xf32> to tensor<4x8xf32>
      return %s : tensor<4x8xf32>
    }
    """
    with pytest.raises(UnsupportedPayloadError, match=r"@main op linalg.copy \(#0\) input 0 has"):
        facts_of(text)


def test_unsupported_element_type_is_rejected() -> None:
    text = RELU.replace("xbf16", "xf8E4M3FN").replace("bf16", "f8E4M3FN")
    with pytest.raises(UnsupportedPayloadError, match="unsupported element type f8E4M3FN"):
        facts_of(text)


TWO_FUNCTIONS = """
func.func @first(%a: tensor<4xf32>) -> tensor<4xf32> { return %a : tensor<4xf32> }
func.func @second(%a: tensor<4xf32>) -> tensor<4xf32> { return %a : tensor<4xf32> }
func.func private @helper(%a: tensor<?xf32>) -> tensor<?xf32>
"""


def test_entry_selection() -> None:
    with pytest.raises(UnsupportedPayloadError, match=r"no entry function.*@first, @second"):
        facts_of(TWO_FUNCTIONS)
    with pytest.raises(UnsupportedPayloadError, match=r"no function @secnd \(did you mean @second"):
        facts_of(TWO_FUNCTIONS, entry="secnd")
    facts = facts_of(TWO_FUNCTIONS, entry="second")
    assert facts.entry == "second"
    helper = facts.functions[2]
    assert (helper.name, helper.visibility, helper.has_body) == ("helper", "private", False)
    assert helper.arguments[0].shape == (-1,)  # dynamic is fine outside the entry


def test_wrapper_functions_are_skipped() -> None:
    text = TWO_FUNCTIONS.replace("func.func @first(", "func.func @first(", 1).replace(
        "func.func @second(%a: tensor<4xf32>) -> tensor<4xf32> {",
        "func.func @second(%a: tensor<4xf32>) -> tensor<4xf32> attributes {stagegraph.wrapper} {",
    )
    facts = facts_of(text)
    assert facts.entry == "first"
    assert [f.name for f in facts.functions] == ["first", "helper"]


def test_unregistered_custom_op() -> None:
    text = """
    func.func @main(%a: tensor<8xf32>) -> tensor<8xf32> {
      %r = mystery.shuffle %a by(3) : tensor<8xf32>
      return %r : tensor<8xf32>
    }
    """
    with pytest.raises(UnregisteredOpError, match=r"op 'mystery\.shuffle'.*dialect 'mystery'") as e:
        parse_payload(text)
    assert (e.value.op_name, e.value.dialect) == ("mystery.shuffle", "mystery")


def test_unregistered_generic_op() -> None:
    text = """
    func.func @main(%a: tensor<8xf32>) -> tensor<8xf32> {
      %r = "mystery.op"(%a) : (tensor<8xf32>) -> tensor<8xf32>
      return %r : tensor<8xf32>
    }
    """
    with pytest.raises(UnregisteredOpError) as info:
        parse_payload(text)
    assert (info.value.op_name, info.value.dialect) == ("mystery.op", "mystery")


def test_other_parse_errors_keep_the_diagnostic() -> None:
    with pytest.raises(UnsupportedPayloadError, match=r"payload does not parse: .*:2:") as info:
        parse_payload("func.func @main() {\n  %x = arith.constant : f32\n}", source="bad.mlir")
    assert not isinstance(info.value, UnregisteredOpError)


# --------------------------------------------------------------------------- KernelBench


def kernelbench(stem: str) -> Path:
    if not KERNELBENCH.is_dir():
        pytest.skip(f"shared KernelBench payloads not found at {KERNELBENCH}")
    return KERNELBENCH / f"{stem}.mlir"


@pytest.mark.parametrize(
    ("stem", "primary", "ops"),
    [
        ("l1_001_Square_matrix_multiplication", "matmul", {"matmul": 1, "elementwise": 1}),
        ("l1_003_Batched_matrix_multiplication", "matmul", {"matmul": 1, "elementwise": 1}),
        ("l1_019_ReLU", "elementwise", {"elementwise": 1}),
        ("l1_023_Softmax", "reduction", {"reduction": 2, "elementwise": 6}),
        ("l1_041_Max_Pooling_1D", "pooling", {"pooling": 1, "elementwise": 1}),
        ("l1_043_Max_Pooling_3D", "pooling", {"pooling": 1, "elementwise": 1}),
        ("l1_055_conv_standard_2D_asymmetric_input_square_kernel", "convolution", None),
        ("l1_083_conv_depthwise_2D_square_input_asymmetric_kernel", "convolution", None),
        ("l1_097_ScaledDotProductAttention", "matmul", None),
    ],
)
def test_kernelbench_classes(stem: str, primary: str, ops: dict[str, int] | None) -> None:
    facts = analyze(parse_payload(kernelbench(stem).read_text()))
    assert facts.primary_class == primary
    if ops is not None:
        counts: dict[str, int] = {}
        for op in facts.ops:
            counts[op.op_class] = counts.get(op.op_class, 0) + 1
        assert counts == ops


def test_kernelbench_matmul_with_transposed_b() -> None:
    facts = analyze(parse_payload(kernelbench("l1_017_Matmul_with_transposed_B").read_text()))
    (mm,) = facts.ops_of("matmul")
    assert mm.contraction is not None
    assert (mm.contraction.m, mm.contraction.n, mm.contraction.k) == (256, 256, 128)
    assert mm.producers[1] == "linalg.transpose"  # B is transposed by a separate op
    assert facts.ops[0].op_class == "elementwise"  # the transpose itself
    assert mm.flops == 16777216  # manifest.json agrees


def test_kernelbench_attention_has_two_batch_matmuls() -> None:
    facts = analyze(parse_payload(kernelbench("l1_097_ScaledDotProductAttention").read_text()))
    sizes = [(c.batch, c.m, c.n, c.k) for op in facts.ops if (c := op.contraction) is not None]
    assert sizes == [(128, 16, 16, 8), (128, 16, 8, 16)]


def test_kernelbench_cumsum_parses_into_upstream_ops() -> None:
    module = parse_payload(kernelbench("l1_089_cumsum").read_text())  # tm_tensor.scan rewritten
    names = set()
    module.operation.walk(lambda op: names.add(op.name) or 0)
    assert "scf.for" in names and not any(n.startswith("tm_tensor.") for n in names)


def test_analyze_stage_runs_in_a_graph_node() -> None:
    from stagegraph.core.ports import Module
    from stagegraph.core.stage import get_factory

    node = get_factory("analyze")(entry="main")
    outputs = node.run({"module": Module["tensor"](parse_payload(MATMUL))})
    assert outputs["facts"].primary_class == "matmul"
    assert node.kind == "analysis"


# A generic whose declared loop kinds differ from what its maps imply (the output indexes
# both loops, yet the second is declared a reduction): the declaration wins.
DECLARED_REDUCTION = """
#id = affine_map<(i, j) -> (i, j)>
func.func @main(%a: tensor<4x8xf32>, %c: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %0 = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "reduction"]}
      ins(%a : tensor<4x8xf32>) outs(%c : tensor<4x8xf32>) {
  ^bb0(%x: f32, %z: f32):
    %s = arith.addf %z, %x : f32
    linalg.yield %s : f32
  } -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
"""


def test_declared_iterator_types_win_over_those_the_maps_imply() -> None:
    (op,) = facts_of(DECLARED_REDUCTION).ops
    assert op.iterator_types == ("parallel", "reduction")
    assert op.op_class == "reduction"


def test_analysis_and_explain_do_not_import_the_linalg_python_module() -> None:
    """The bindings' ``linalg`` module defines every named op through OpDSL when imported (a
    tenth of a second): analysing a payload, building the matmul workload and explaining a
    tuning space must not need it (how ``tune --explain`` answers in well under a second)."""
    import subprocess
    import sys

    softmax = KERNELBENCH / "l1_023_Softmax.mlir"
    payloads = ["matmul:m=64,n=32,k=16"] + ([str(softmax)] if softmax.exists() else [])
    script = (
        "import sys, io, contextlib\n"
        "from stagegraph.cli.main import main\n"
        "for payload in sys.argv[1:]:\n"
        "    with contextlib.redirect_stdout(io.StringIO()):\n"
        "        assert main(['tune', 'x86', payload, '--explain']) == 0\n"
        "print(sorted(m for m in sys.modules if m.endswith('dialects.linalg')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, *payloads], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_operands_of_one_type_share_their_facts() -> None:
    """Facts of a type are built once and shared by every operand of that type (an
    unrolled network has thousands of operands and a handful of types)."""
    facts = facts_of(MATMUL)
    fill, matmul = facts.ops
    assert matmul.outputs[0] is fill.outputs[0] and matmul.outputs[0].shape == (16, 12)
    assert facts_of(MATMUL).ops[1].inputs[0] is matmul.inputs[0]
    assert matmul.inputs[0].shape == (16, 8) and matmul.inputs[1].shape == (8, 12)


CONV_RELU = """
func.func @main(%x: tensor<1x8x10x10xf32>, %w: tensor<16x8x3x3xf32>) -> tensor<1x16x8x8xf32> {
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<1x16x8x8xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<1x16x8x8xf32>) -> tensor<1x16x8x8xf32>
  %c = linalg.conv_2d_nchw_fchw ins(%x, %w : tensor<1x8x10x10xf32>, tensor<16x8x3x3xf32>)
      outs(%f : tensor<1x16x8x8xf32>) -> tensor<1x16x8x8xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(n, c, h, w) -> (n, c, h, w)>,
      affine_map<(n, c, h, w) -> (n, c, h, w)>],
      iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%c : tensor<1x16x8x8xf32>) outs(%e : tensor<1x16x8x8xf32>) {
    ^bb0(%a: f32, %o: f32):
      %m = arith.maximumf %a, %z : f32
      linalg.yield %m : f32
  } -> tensor<1x16x8x8xf32>
  return %r : tensor<1x16x8x8xf32>
}
"""


def test_compiles_do_not_import_the_linalg_opdsl_module(tmp_path) -> None:
    """Compiling a matmul and a convolution with its epilogue (through the JIT) needs only
    the generated linalg op classes (``stagegraph.mlir.op_views``): the OpDSL module costs
    0.13-0.18 s, a tenth of a small model's compile. Nor does it import the llvm dialect's
    op classes (0.06 s): LLVM-level modules are read by walking, not by iterating blocks."""
    import os
    import subprocess
    import sys

    (tmp_path / "conv.mlir").write_text(CONV_RELU)
    script = (
        "import sys\n"
        "import stagegraph as sg\n"
        "for payload in sys.argv[1:]:\n"
        "    sg.run('x86', payload, threads=1)\n"
        "heavy = ('dialects.linalg', 'dialects.llvm')\n"
        "print(sorted(m for m in sys.modules if m.endswith(heavy)))\n"
    )
    payloads = ["matmul:m=64,n=64,k=64", str(tmp_path / "conv.mlir")]
    # The host's own target (a run pinned to another tier names its CPU through an
    # ``#llvm.target_features`` attribute, whose parsing loads the llvm dialect module).
    env = {k: v for k, v in os.environ.items() if k != "STAGEGRAPH_TARGET"}
    done = subprocess.run(
        [sys.executable, "-c", script, *payloads], capture_output=True, text=True, timeout=300,
        env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
