"""The generic (non-matmul) x86 schedule: params, op selection and end-to-end results."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from stagegraph.mlir.diagnostics import parse_payload
from stagegraph.stages.analysis import analyze
from stagegraph.stages.target import Target
from stagegraph.stages.x86.generic.params import (
    GenericParams,
    heuristic_generic_params,
    largest_divisor_at_most,
    reduction_tile_sizes,
    tile_sizes_for,
)
from tests.conftest import KERNELBENCH

CHAIN = """
#id = affine_map<(d0, d1) -> (d0, d1)>
func.func @main(%a: tensor<24x40xf32>, %b: tensor<24x40xf32>) -> tensor<24x40xf32> {
  %e = tensor.empty() : tensor<24x40xf32>
  %s = linalg.generic {indexing_maps = [#id, #id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%a, %b : tensor<24x40xf32>, tensor<24x40xf32>) outs(%e : tensor<24x40xf32>) {
  ^bb0(%x: f32, %y: f32, %o: f32):
    %r = arith.addf %x, %y : f32
    linalg.yield %r : f32
  } -> tensor<24x40xf32>
  %t = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%s : tensor<24x40xf32>) outs(%e : tensor<24x40xf32>) {
  ^bb0(%x: f32, %o: f32):
    %r = math.exp %x : f32
    linalg.yield %r : f32
  } -> tensor<24x40xf32>
  %u = linalg.generic {indexing_maps = [#id, #id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%t, %a : tensor<24x40xf32>, tensor<24x40xf32>) outs(%e : tensor<24x40xf32>) {
  ^bb0(%x: f32, %y: f32, %o: f32):
    %r = arith.mulf %x, %y : f32
    linalg.yield %r : f32
  } -> tensor<24x40xf32>
  return %u : tensor<24x40xf32>
}
"""

ROW_SUM = """
func.func @main(%a: tensor<32x100xf32>) -> tensor<32xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<32xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<32xf32>) -> tensor<32xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i)>],
                       iterator_types = ["parallel", "reduction"]}
      ins(%a : tensor<32x100xf32>) outs(%acc : tensor<32xf32>) {
  ^bb0(%x: f32, %o: f32):
    %s = arith.addf %x, %o : f32
    linalg.yield %s : f32
  } -> tensor<32xf32>
  return %r : tensor<32xf32>
}
"""

# A matmul with a bias epilogue (the matmul schedule's), a wrapper function, and a ReLU.
MIXED = """
#id = affine_map<(d0, d1) -> (d0, d1)>
func.func @main(%a: tensor<16x8xf32>, %b: tensor<8x32xf32>) -> tensor<16x32xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<16x32xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<16x32xf32>) -> tensor<16x32xf32>
  %m = linalg.matmul ins(%a, %b : tensor<16x8xf32>, tensor<8x32xf32>)
                     outs(%acc : tensor<16x32xf32>) -> tensor<16x32xf32>
  %r = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%m : tensor<16x32xf32>) outs(%e : tensor<16x32xf32>) {
  ^bb0(%x: f32, %o: f32):
    %y = arith.maximumf %x, %zero : f32
    linalg.yield %y : f32
  } -> tensor<16x32xf32>
  return %r : tensor<16x32xf32>
}
func.func @bench(%x: tensor<64xf32>) -> tensor<64xf32> attributes {stagegraph.wrapper} {
  %e = tensor.empty() : tensor<64xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>],
                       iterator_types = ["parallel"]}
      ins(%x : tensor<64xf32>) outs(%e : tensor<64xf32>) {
  ^bb0(%v: f32, %o: f32):
    %y = arith.negf %v : f32
    linalg.yield %y : f32
  } -> tensor<64xf32>
  return %r : tensor<64xf32>
}
"""

AVX512 = Target(isa=frozenset({"avx512f"}), vector_bits=512, l1d_bytes=48 * 1024)


def _jit(text: str, params: GenericParams | None = None):
    from stagegraph.runtime.jit import JitBinary
    from stagegraph.stages.x86.generic.schedule import lower_generic

    module = parse_payload(text)
    lower_generic(module, params)
    return JitBinary(module, opt_level=2)


def _op_names(module) -> list[str]:
    from stagegraph.mlir.bindings import ir

    names: list[str] = []

    def visit(op):
        names.append(op.name)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return names


# ----------------------------------------------------------------------------- params


def _scheduled_op_names(text: str) -> list[str]:
    """The op names after the generic schedule (heuristic params for ``AVX512``) on ``text``."""
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
    return _op_names(module)


def test_params_follow_the_target():
    facts = analyze(parse_payload(CHAIN))
    wide = heuristic_generic_params(facts, AVX512)
    narrow = heuristic_generic_params(facts, Target(vector_bits=128))
    assert (wide.lanes, narrow.lanes) == (16, 4)
    assert wide.inner_tile == 4 * wide.lanes and narrow.inner_tile == 4 * narrow.lanes


def test_tile_sizes_are_static_divisors():
    facts = analyze(parse_payload(CHAIN))
    params = GenericParams(inner_tile=16)
    assert tile_sizes_for(facts.ops[0], params) == [1, 10]  # 40: largest divisor <= 16
    assert largest_divisor_at_most(255, 16) == 15
    row = analyze(parse_payload(ROW_SUM)).ops[1]
    outer, inner = reduction_tile_sizes(row, GenericParams(reduction_chunk=64))
    assert outer == [1, 0] and inner == [0, 50]
    outer, inner = reduction_tile_sizes(row, GenericParams(reduction_chunk=1024))
    assert outer == [1, 0] and inner == [0, 0]  # the whole row in one tile


# ----------------------------------------------------------------------------- selection


def test_schedule_leaves_matmul_epilogue_and_wrapper_alone():
    from stagegraph.mlir.bindings import ir
    from stagegraph.stages.x86.generic.schedule import (
        apply_generic_schedule,
        build_generic_schedule,
    )

    module = parse_payload(MIXED)
    facts = analyze(module)
    with module.context, ir.Location.unknown():
        schedule = build_generic_schedule(facts, heuristic_generic_params(facts, AVX512))
        apply_generic_schedule(module, schedule, facts)
    names = _op_names(module)
    # fill (feeds the matmul), matmul and its epilogue stay; so does the wrapper's generic.
    assert names.count("linalg.matmul") == 1 and names.count("linalg.fill") == 1
    assert names.count("linalg.generic") == 2
    assert not any(n.startswith(("vector.", "scf.")) for n in names)
    assert "stagegraph.generic_op" not in str(module)  # labels are removed


def test_chain_is_fused_and_vectorized():
    names = _scheduled_op_names(CHAIN)
    assert names.count("scf.forall") == 1  # one loop nest for the three ops
    assert "linalg.generic" not in names and "vector.transfer_read" in names


# ----------------------------------------------------------------------------- end to end


@pytest.mark.parametrize("fuse", [True, False])
def test_elementwise_chain_runs(fuse):
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((24, 40), dtype=np.float32) for _ in range(2))
    params = GenericParams(lanes=8, inner_tile=16, fuse_elementwise=fuse)
    (out,) = _jit(CHAIN, params).call("main", [a, b])
    np.testing.assert_allclose(out, np.exp(a + b) * a, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("chunk", [1024, 25])
def test_row_reduction_runs(chunk):
    a = np.random.default_rng(1).standard_normal((32, 100), dtype=np.float32)
    (out,) = _jit(ROW_SUM, GenericParams(reduction_chunk=chunk)).call("main", [a])
    np.testing.assert_allclose(out, a.sum(axis=1), rtol=1e-4, atol=1e-4)


KB_CASES = [
    "l1_019_ReLU",  # elementwise
    "l1_027_SELU",  # elementwise chain (fusion)
    "l1_023_Softmax",  # reductions + elementwise
    "l1_047_Sum_reduction_over_a_dimension",  # reduction over an outer dim
    "l1_051_Argmax_over_a_dimension",  # not vectorizable: left to the fallback
    "l1_039_L2Norm",  # a norm
    "l1_041_Max_Pooling_1D",  # pooling (decomposed)
    "l1_045_Average_Pooling_2D",  # pooling
    "l1_067_conv_standard_1D",  # 1-D convolution
    "l1_063_conv_standard_2D_square_input_square_kernel",  # 2-D convolution (decomposed)
]


@pytest.mark.parametrize("stem", KB_CASES)
def test_kernelbench_payload_verifies(stem):
    if not KERNELBENCH.is_dir():
        pytest.skip(f"shared KernelBench payloads not found at {KERNELBENCH}")
    from stagegraph.core.ports import Module
    from stagegraph.mlir.bindings import ir
    from stagegraph.runtime.jit import JitBinary
    from stagegraph.stages.x86.generic.schedule import lower_generic
    from stagegraph.workload import parse_workload

    path = next(KERNELBENCH.glob(f"{stem}*.mlir"), None)
    if path is None:
        pytest.skip(f"{stem} not in {KERNELBENCH}")
    workload = parse_workload(str(path))
    module = Module["tensor"](workload.payload())
    lower_generic(module)
    with module.ir.context, ir.Location.unknown():
        binary = JitBinary(module.ir, opt_level=2)
    verdict = workload.verify(binary.call(workload.entry, workload.inputs()))
    assert verdict.ok, verdict.message


# ----------------------------------------------------------------------------- prepare

# A max reduction that also computes an argmax nobody uses, then the max is subtracted.
MAX_WITH_DEAD_ARGMAX = """
#in = affine_map<(d0, d1) -> (d0, d1)>
#row = affine_map<(d0, d1) -> (d0)>
func.func @main(%a: tensor<16x32xf32>) -> tensor<16xf32> {
  %ninf = arith.constant 0xFF800000 : f32
  %c0 = arith.constant 0 : i64
  %ei = tensor.empty() : tensor<16xi64>
  %fi = linalg.fill ins(%c0 : i64) outs(%ei : tensor<16xi64>) -> tensor<16xi64>
  %ef = tensor.empty() : tensor<16xf32>
  %ff = linalg.fill ins(%ninf : f32) outs(%ef : tensor<16xf32>) -> tensor<16xf32>
  %r:2 = linalg.generic {indexing_maps = [#in, #row, #row],
                         iterator_types = ["parallel", "reduction"]}
      ins(%a : tensor<16x32xf32>) outs(%ff, %fi : tensor<16xf32>, tensor<16xi64>) {
  ^bb0(%x: f32, %m: f32, %i: i64):
    %j = linalg.index 1 : index
    %jj = arith.index_cast %j : index to i64
    %mx = arith.maximumf %x, %m : f32
    %gt = arith.cmpf ogt, %x, %m : f32
    %sel = arith.select %gt, %jj, %i : i64
    linalg.yield %mx, %sel : f32, i64
  } -> (tensor<16xf32>, tensor<16xi64>)
  return %r#0 : tensor<16xf32>
}
"""

# An i1 mask (a cmp), an all-of reduction over it and a select by the reduced mask.
BOOL_MASK = """
#id = affine_map<(d0, d1) -> (d0, d1)>
#row = affine_map<(d0, d1) -> (d0, 0)>
func.func @main(%a: tensor<16x32xf32>, %b: tensor<16x32xf32>) -> tensor<16x32xf32> {
  %true = arith.constant true
  %zero = arith.constant 0.0 : f32
  %e1 = tensor.empty() : tensor<16x32xi1>
  %cmp = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%a : tensor<16x32xf32>) outs(%e1 : tensor<16x32xi1>) {
  ^bb0(%x: f32, %o: i1):
    %c = arith.cmpf ogt, %x, %zero : f32
    linalg.yield %c : i1
  } -> tensor<16x32xi1>
  %e2 = tensor.empty() : tensor<16x1xi1>
  %init = linalg.fill ins(%true : i1) outs(%e2 : tensor<16x1xi1>) -> tensor<16x1xi1>
  %all = linalg.generic {indexing_maps = [#id, #row], iterator_types = ["parallel", "reduction"]}
      ins(%cmp : tensor<16x32xi1>) outs(%init : tensor<16x1xi1>) {
  ^bb0(%x: i1, %o: i1):
    %r = arith.andi %x, %o : i1
    linalg.yield %r : i1
  } -> tensor<16x1xi1>
  %e3 = tensor.empty() : tensor<16x32xf32>
  %out = linalg.generic {indexing_maps = [#row, #id, #id, #id],
                         iterator_types = ["parallel", "parallel"]}
      ins(%all, %a, %b : tensor<16x1xi1>, tensor<16x32xf32>, tensor<16x32xf32>)
      outs(%e3 : tensor<16x32xf32>) {
  ^bb0(%m: i1, %x: f32, %y: f32, %o: f32):
    %s = arith.select %m, %x, %y : f32
    linalg.yield %s : f32
  } -> tensor<16x32xf32>
  return %out : tensor<16x32xf32>
}
"""

# A transpose that only moves a unit dim (a reshape), then an elementwise op.
UNIT_TRANSPOSE = """
func.func @main(%a: tensor<4x1x24xf32>) -> tensor<4x24x1xf32> {
  %e = tensor.empty() : tensor<4x24x1xf32>
  %t = linalg.transpose ins(%a : tensor<4x1x24xf32>) outs(%e : tensor<4x24x1xf32>)
       permutation = [0, 2, 1]
  %r = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d1, d2)>,
                                        affine_map<(d0, d1, d2) -> (d0, d1, d2)>],
                       iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%t : tensor<4x24x1xf32>) outs(%e : tensor<4x24x1xf32>) {
  ^bb0(%x: f32, %o: f32):
    %y = arith.negf %x : f32
    linalg.yield %y : f32
  } -> tensor<4x24x1xf32>
  return %r : tensor<4x24x1xf32>
}
"""


def _prepared(text: str):
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.functions import entry_function as _entry_function
    from stagegraph.stages.x86.generic.prepare import prepare

    module = parse_payload(text)
    with module.context, ir.Location.unknown():
        assert prepare(module, _entry_function(module, "main"))
        assert module.operation.verify()
    return module


def test_dead_argmax_result_is_dropped_and_reduction_vectorizes():
    module = _prepared(MAX_WITH_DEAD_ARGMAX)
    facts = analyze(module)
    (reduction,) = facts.ops_of("reduction")
    assert len(reduction.outputs) == 1 and "linalg.index" not in reduction.body_ops
    # The argmax's init (an i64 fill of an empty tensor) went with it: nothing computes it.
    assert [op.outputs[0].dtype for op in facts.ops] == ["f32", "f32"]
    a = np.random.default_rng(2).standard_normal((16, 32), dtype=np.float32)
    binary = _jit(MAX_WITH_DEAD_ARGMAX, GenericParams())
    (out,) = binary.call("main", [a])
    np.testing.assert_array_equal(out, a.max(axis=1))


def test_bool_tensors_are_widened_and_vectorized():
    from stagegraph.mlir.bindings import ir
    from stagegraph.stages.x86.generic.schedule import (
        apply_generic_schedule,
        build_generic_schedule,
    )

    module = _prepared(BOOL_MASK)
    facts = analyze(module)
    assert "i1" not in {v.dtype for op in facts.ops for v in op.inputs + op.outputs}
    (reduction,) = facts.ops_of("reduction")
    # The comparison merged into the reduction (computed in its registers), then a single
    # i8 combiner.
    assert reduction.body_ops == ("arith.cmpf", "arith.extui", "arith.andi")
    module = parse_payload(BOOL_MASK)
    facts = analyze(module)
    with module.context, ir.Location.unknown():
        schedule = build_generic_schedule(facts, heuristic_generic_params(facts, AVX512))
        apply_generic_schedule(module, schedule, facts)  # prepares, rebuilds the schedule
    assert "linalg.generic" not in _op_names(module)
    rng = np.random.default_rng(3)
    a, b = (rng.standard_normal((16, 32), dtype=np.float32) for _ in range(2))
    a[::3] = np.abs(a[::3]) + 0.5  # some rows are all positive
    (out,) = _jit(BOOL_MASK, GenericParams()).call("main", [a, b])
    np.testing.assert_array_equal(out, np.where((a > 0).all(axis=1, keepdims=True), a, b))


def test_unit_transpose_becomes_a_reshape():
    module = _prepared(UNIT_TRANSPOSE)
    assert "linalg.transpose" not in _op_names(module)
    a = np.random.default_rng(4).standard_normal((4, 1, 24), dtype=np.float32)
    (out,) = _jit(UNIT_TRANSPOSE, GenericParams()).call("main", [a])
    np.testing.assert_array_equal(out, -a.transpose(0, 2, 1))


def test_bool_tensor_returned_is_not_widened():
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.functions import entry_function as _entry_function
    from stagegraph.stages.x86.generic.prepare import prepare

    text = """
    func.func @main(%a: tensor<8xf32>) -> tensor<8xi1> {
      %zero = arith.constant 0.0 : f32
      %e = tensor.empty() : tensor<8xi1>
      %c = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>],
                           iterator_types = ["parallel"]}
          ins(%a : tensor<8xf32>) outs(%e : tensor<8xi1>) {
      ^bb0(%x: f32, %o: i1):
        %r = arith.cmpf olt, %x, %zero : f32
        linalg.yield %r : i1
      } -> tensor<8xi1>
      return %c : tensor<8xi1>
    }
    """
    module = parse_payload(text)
    with module.context, ir.Location.unknown():
        assert not prepare(module, _entry_function(module, "main"))


def test_float_reductions_may_reassociate_and_integer_ones_are_untouched():
    from stagegraph.mlir.bindings import ir, new_context
    from stagegraph.stages.common.rewrites import reassociate_reductions

    text = """
func.func @f(%x: vector<64xf32>, %i: vector<64xi32>) -> (f32, f32, i32) {
  %s = vector.reduction <add>, %x : vector<64xf32> into f32
  %m = vector.reduction <maximumf>, %x : vector<64xf32> into f32
  %n = vector.reduction <add>, %i : vector<64xi32> into i32
  return %s, %m, %n : f32, f32, i32
}
"""
    with new_context():
        module = ir.Module.parse(text)
        assert reassociate_reductions(module) == 2
        ops = list(module.body.operations[0].regions[0].blocks[0].operations)[:3]
        reassoc = ir.Attribute.parse("#arith.fastmath<reassoc>")
        flags = ["fastmath" in op.attributes and op.attributes["fastmath"] == reassoc for op in ops]
        assert flags == [True, True, False]


def _conv3d_reference(x, w, strides, dilations):
    """NCDHW x FCDHW -> NFDHW, valid padding, by summing over the filter taps."""
    n, _, d, h, wd = x.shape
    f, _, kd, kh, kw = w.shape
    (sd, sh, sw), (dd, dh, dw) = strides, dilations
    out_shape = [(s - (k - 1) * dl - 1) // st + 1 for s, k, st, dl in
                 zip((d, h, wd), (kd, kh, kw), strides, dilations, strict=True)]  # fmt: skip
    od, oh, ow = out_shape
    out = np.zeros((n, f, od, oh, ow), np.float64)
    for a, b, c in itertools.product(range(kd), range(kh), range(kw)):
        window = x[:, :, a * dd : a * dd + sd * od : sd, b * dh : b * dh + sh * oh : sh,
                   c * dw : c * dw + sw * ow : sw]  # fmt: skip
        out += np.einsum("ncdhw,fc->nfdhw", window, w[:, :, a, b, c])
    return out.astype(np.float32)


@pytest.mark.parametrize(
    ("strides", "dilations", "filters"),
    [((1, 1, 1), (1, 1, 1), 4), ((2, 1, 2), (1, 2, 1), 4), ((2, 1, 2), (1, 2, 1), 8)],
    ids=["unit", "strided", "strided-channels-last"],
)
def test_conv3d_runs_as_loops_of_vectorized_conv2d(strides, dilations, filters):
    """A 3-D convolution is rewritten into depth loops around 2-D convolutions, which the
    convolution path decomposes and vectorizes (channels-last first when its 8 output
    channels fill vectors: transposed once, then NDHWC depth loops); the result matches
    the definition."""
    x_shape, w_shape = (2, 3, 7, 6, 20), (filters, 3, 2, 3, 3)
    ref = _conv3d_reference(np.zeros(x_shape), np.zeros(w_shape), strides, dilations)
    o_shape = ref.shape
    tx, tw, to = (f"tensor<{'x'.join(map(str, s))}xf32>" for s in (x_shape, w_shape, o_shape))
    text = f"""
func.func @main(%x: {tx}, %w: {tw}) -> {to} {{
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : {to}
  %f = linalg.fill ins(%z : f32) outs(%e : {to}) -> {to}
  %r = linalg.conv_3d_ncdhw_fcdhw {{dilations = dense<{list(dilations)}> : vector<3xi64>,
      strides = dense<{list(strides)}> : vector<3xi64>}}
      ins(%x, %w : {tx}, {tw}) outs(%f : {to}) -> {to}
  return %r : {to}
}}
"""
    if filters % 8 == 0:
        prepared = _op_names(_prepared(text))
        # input, filter and result transposed; the zero init is filled channels-last
        assert "linalg.conv_2d_nhwc_hwcf" in prepared and prepared.count("linalg.transpose") == 3
    names = _scheduled_op_names(text)
    assert "linalg.conv_3d_ncdhw_fcdhw" not in names and "scf.for" in names
    assert "linalg.conv_2d_nchw_fchw" not in names and "vector.fma" in names
    rng = np.random.default_rng(0)
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    (out,) = _jit(text).call("main", [x, w])
    expected = _conv3d_reference(x, w, strides, dilations)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("kernel", "strides"), [((3, 3), (1, 1)), ((3, 5), (2, 1))])
def test_depthwise_nchw_runs_vectorized(kernel, strides):
    """NCHW depthwise convolutions run vectorized (as direct kernels along the width,
    stagegraph.stages.x86.conv.depthwise; tests/test_conv_depthwise.py); the result
    matches the definition."""
    n, c, h, w = 2, 16, 9, 21
    kh, kw = kernel
    oh, ow = (h - kh) // strides[0] + 1, (w - kw) // strides[1] + 1
    tx, tk, to = (f"tensor<{'x'.join(map(str, s))}xf32>" for s in
                  ((n, c, h, w), (c, kh, kw), (n, c, oh, ow)))  # fmt: skip
    text = f"""
func.func @main(%x: {tx}, %k: {tk}) -> {to} {{
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : {to}
  %f = linalg.fill ins(%z : f32) outs(%e : {to}) -> {to}
  %r = linalg.depthwise_conv_2d_nchw_chw {{dilations = dense<1> : vector<2xi64>,
      strides = dense<{list(strides)}> : vector<2xi64>}}
      ins(%x, %k : {tx}, {tk}) outs(%f : {to}) -> {to}
  return %r : {to}
}}
"""
    names = _scheduled_op_names(text)
    assert "linalg.depthwise_conv_2d_nchw_chw" not in names and "vector.fma" in names
    rng = np.random.default_rng(1)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    k = rng.standard_normal((c, kh, kw)).astype(np.float32)
    (out,) = _jit(text).call("main", [x, k])
    expected = np.zeros((n, c, oh, ow), np.float64)
    for a, b in itertools.product(range(kh), range(kw)):
        window = x[:, :, a : a + strides[0] * oh : strides[0], b : b + strides[1] * ow : strides[1]]
        expected += window * k[None, :, a, b, None, None]
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


def _conv2d_nchw(
    n: int,
    c: int,
    f: int,
    hw: tuple[int, int],
    kernel: tuple[int, int],
    strides: tuple[int, int],
    dilations: tuple[int, int],
) -> tuple[str, tuple]:
    """A ``conv_2d_nchw_fchw`` payload and its (input, filter, output) shapes."""  # fmt: skip
    x_shape, w_shape = (n, c, *hw), (f, c, *kernel)
    ref = _conv3d_reference(np.zeros((n, c, 1, *hw)), np.zeros((f, c, 1, *kernel)),
                            (1, *strides), (1, *dilations))  # fmt: skip
    o_shape = (n, f, *ref.shape[3:])
    tx, tw, to = (f"tensor<{'x'.join(map(str, s))}xf32>" for s in (x_shape, w_shape, o_shape))
    text = f"""
func.func @main(%x: {tx}, %w: {tw}) -> {to} {{
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : {to}
  %f = linalg.fill ins(%z : f32) outs(%e : {to}) -> {to}
  %r = linalg.conv_2d_nchw_fchw {{dilations = dense<{list(dilations)}> : vector<2xi64>,
      strides = dense<{list(strides)}> : vector<2xi64>}}
      ins(%x, %w : {tx}, {tw}) outs(%f : {to}) -> {to}
  return %r : {to}
}}
"""
    return text, (x_shape, w_shape, o_shape)


@pytest.mark.parametrize(
    ("f", "kernel", "strides", "dilations"),
    [(8, (3, 5), (1, 1), (1, 1)), (16, (2, 3), (2, 1), (1, 2)), (6, (3, 3), (1, 1), (1, 1))],
    ids=["asymmetric", "strided-dilated", "partial-vectors"],
)
def test_conv2d_nchw_runs_channels_last_when_the_channels_fill_vectors(
    f: int, kernel: tuple[int, int], strides: tuple[int, int], dilations: tuple[int, int]
) -> None:
    """An NCHW convolution whose output channels fill whole vectors becomes transposes
    around an NHWC one (its channels contiguous: no per-element gathers of accumulators
    and filter taps); others stay NCHW. Either way the result matches the definition, and
    ``conv_channels_last=False`` keeps the NCHW form."""
    text, (x_shape, w_shape, _) = _conv2d_nchw(2, 5, f, (9, 21), kernel, strides, dilations)
    names = _op_names(_prepared(text)) if f % 8 == 0 else []
    if f % 8 == 0:
        assert "linalg.conv_2d_nhwc_hwcf" in names and "linalg.conv_2d_nchw_fchw" not in names
        assert names.count("linalg.transpose") == 3  # the zero init filled channels-last
    assert "vector.fma" in _scheduled_op_names(text)
    rng = np.random.default_rng(2)
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    expected = _conv3d_reference(x[:, :, None], w[:, :, None], (1, *strides), (1, *dilations))
    for params in (None, GenericParams(conv_channels_last=False)):
        (out,) = _jit(text, params).call("main", [x, w])
        np.testing.assert_allclose(out, expected[:, :, 0], rtol=1e-4, atol=1e-4)


def test_conv2d_channels_last_is_skipped_for_partial_vectors_and_when_disabled() -> None:
    """Six output channels would be partial vectors: no rewrite; and the param turns the
    rewrite off."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.functions import entry_function
    from stagegraph.stages.x86.generic.prepare import prepare

    for f, enabled in ((6, True), (8, False)):
        text, _ = _conv2d_nchw(1, 3, f, (6, 12), (3, 3), (1, 1), (1, 1))
        module = parse_payload(text)
        with module.context, ir.Location.unknown():
            prepare(module, entry_function(module, "main"), conv_channels_last=enabled)
        names = _op_names(module)
        assert "linalg.conv_2d_nchw_fchw" in names and "linalg.conv_2d_nhwc_hwcf" not in names


POWERS = """
#id = affine_map<(d0, d1) -> (d0, d1)>
func.func @main(%a: tensor<8x40xf32>) -> tensor<8x40xf32> {
  %two = arith.constant 2.0 : f32
  %three = arith.constant 3.0 : f32
  %e = tensor.empty() : tensor<8x40xf32>
  %r = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%a : tensor<8x40xf32>) outs(%e : tensor<8x40xf32>) {
  ^bb0(%x: f32, %o: f32):
    %s = math.powf %x, %two : f32
    %c = math.powf %x, %three : f32
    %t = arith.addf %s, %c : f32
    linalg.yield %t : f32
  } -> tensor<8x40xf32>
  return %r : tensor<8x40xf32>
}
"""


def test_square_becomes_a_multiply_and_other_powers_stay():
    names = _op_names(_prepared(POWERS))
    assert names.count("math.powf") == 1 and "arith.mulf" in names
    a = np.random.default_rng(5).uniform(0.5, 2.0, (8, 40)).astype(np.float32)
    (out,) = _jit(POWERS).call("main", [a])
    np.testing.assert_allclose(out, a * a + a**3, rtol=1e-6)


def test_grouped_conv_runs_vectorized():
    """NGCHW x GFCHW with a strided, dilated width: vectorized (the width kernel) and
    equal to the definition."""
    n, g, c, f, h, w, kh, kw = 2, 3, 4, 5, 8, 19, 3, 2
    oh, ow = h - kh + 1, (w - (kw - 1) * 2 - 1) // 2 + 1  # width: stride 2, dilation 2
    tx, tk, to = (f"tensor<{'x'.join(map(str, s))}xf32>" for s in
                  ((n, g, c, h, w), (g, f, c, kh, kw), (n, g, f, oh, ow)))  # fmt: skip
    text = f"""
func.func @main(%x: {tx}, %k: {tk}) -> {to} {{
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : {to}
  %f = linalg.fill ins(%z : f32) outs(%e : {to}) -> {to}
  %r = linalg.conv_2d_ngchw_gfchw {{dilations = dense<[1, 2]> : vector<2xi64>,
      strides = dense<[1, 2]> : vector<2xi64>}}
      ins(%x, %k : {tx}, {tk}) outs(%f : {to}) -> {to}
  return %r : {to}
}}
"""
    names = _scheduled_op_names(text)
    assert "linalg.conv_2d_ngchw_gfchw" not in names and "vector.fma" in names
    rng = np.random.default_rng(2)
    x = rng.standard_normal((n, g, c, h, w)).astype(np.float32)
    k = rng.standard_normal((g, f, c, kh, kw)).astype(np.float32)
    (out,) = _jit(text).call("main", [x, k])
    expected = np.zeros((n, g, f, oh, ow), np.float64)
    for a, b in itertools.product(range(kh), range(kw)):
        window = x[:, :, :, a : a + oh, 2 * b : 2 * b + 2 * ow : 2]
        expected += np.einsum("ngchw,gfc->ngfhw", window, k[:, :, :, a, b])
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


def test_tile_size_prefers_a_divisor_but_not_a_tiny_one():
    from stagegraph.stages.x86.generic.params import tile_size

    assert tile_size(512, 64) == 64 and tile_size(96, 64) == 48  # divisors
    assert tile_size(4001, 64) == 64  # prime: a full tile, the last one partial
    assert tile_size(40, 64) == 40


@pytest.mark.parametrize("cols", [1009, 4001])
def test_prime_extents_vectorize_with_masks(cols):
    """A prime row length gets full-width vectors with a masked last tile (a divisor would
    be 1); the elementwise chain and the row reduction stay correct."""
    chain = CHAIN.replace("24x40", f"3x{cols}")
    names = _scheduled_op_names(chain)
    assert "linalg.generic" not in names and "vector.create_mask" in names
    rng = np.random.default_rng(cols)
    a, b = (rng.standard_normal((3, cols), dtype=np.float32) for _ in range(2))
    (out,) = _jit(chain).call("main", [a, b])
    np.testing.assert_allclose(out, np.exp(a + b) * a, rtol=1e-5, atol=1e-6)
    row_sum = ROW_SUM.replace("32x100", f"32x{cols}")
    names = _scheduled_op_names(row_sum)
    assert "linalg.generic" not in names and "vector.reduction" in names
    assert "vector.create_mask" in names or cols <= GenericParams().reduction_chunk
    x = rng.standard_normal((32, cols), dtype=np.float32)
    (total,) = _jit(row_sum).call("main", [x])
    np.testing.assert_allclose(total, x.sum(axis=1), rtol=1e-4, atol=1e-4)


def _pooling(window: tuple[int, int], dilation: int = 1) -> str:
    kh, kw = window
    oh, ow = 9 - (kh - 1) * dilation, 40 - (kw - 1) * dilation
    return f"""
func.func @main(%x: tensor<2x16x9x40xf32>) -> tensor<2x16x{oh}x{ow}xf32> {{
  %z = arith.constant 0.0 : f32
  %w = tensor.empty() : tensor<{kh}x{kw}xf32>
  %e = tensor.empty() : tensor<2x16x{oh}x{ow}xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<2x16x{oh}x{ow}xf32>) -> tensor<2x16x{oh}x{ow}xf32>
  %r = linalg.pooling_nchw_sum {{dilations = dense<{dilation}> : vector<2xi64>,
      strides = dense<1> : vector<2xi64>}}
      ins(%x, %w : tensor<2x16x9x40xf32>, tensor<{kh}x{kw}xf32>)
      outs(%f : tensor<2x16x{oh}x{ow}xf32>) -> tensor<2x16x{oh}x{ow}xf32>
  return %r : tensor<2x16x{oh}x{ow}xf32>
}}
"""


@pytest.mark.parametrize(
    ("window", "dilation", "vectorized"),
    [((3, 3), 1, True), ((1, 8), 1, False), ((3, 3), 2, False)],
    ids=["2d", "one-row", "dilated"],
)
def test_pooling_vectorizes_only_where_it_pays(window, dilation, vectorized):
    """2-D windows are decomposed and vectorized; one-row and dilated windows stay loops
    (their vectorized forms are shuffles slower than the loops); all stay correct."""
    from stagegraph.stages.x86.generic.schedule import convolution_plan

    text = _pooling(window, dilation)
    facts = analyze(parse_payload(text))
    (pool,) = [op for op in facts.ops if op.op_class == "pooling"]
    params = heuristic_generic_params(facts, AVX512)
    assert (convolution_plan(pool, params) is not None) == vectorized
    x = np.random.default_rng(6).standard_normal((2, 16, 9, 40)).astype(np.float32)
    (out,) = _jit(text).call("main", [x])
    kh, kw = window
    expected = sum(
        x[
            :,
            :,
            a * dilation : a * dilation + out.shape[2],
            b * dilation : b * dilation + out.shape[3],
        ]
        for a, b in itertools.product(range(kh), range(kw))
    )
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_failure_propagation_is_a_schedule_option_not_a_global():
    """Debugging a generic sub-sequence: the schedule (and the x86.schedule stage config)
    asks for propagated failures; the default leaves a failing op to the loop fallback."""
    from stagegraph.mlir.bindings import ir, new_context
    from stagegraph.stages.x86.generic.schedule import PROPAGATE_ATTR, build_generic_schedule
    from stagegraph.stages.x86.ir_stages import ScheduleConfig

    with new_context(), ir.Location.unknown():
        facts = analyze(ir.Module.parse(CHAIN))
        params = heuristic_generic_params(facts, AVX512)
        quiet = build_generic_schedule(facts, params)
        loud = build_generic_schedule(facts, params, propagate_failures=True)
        assert PROPAGATE_ATTR not in quiet.operation.attributes
        assert PROPAGATE_ATTR in loud.operation.attributes
    assert ScheduleConfig().propagate_failures is False


def _window_sums(x: np.ndarray, shape: tuple[int, ...], window: int) -> np.ndarray:
    """The sum pooling of NCHW ``x`` over ``window x window`` windows (stride 1)."""
    return sum(
        x[:, :, a : a + shape[2], b : b + shape[3]]
        for a, b in itertools.product(range(window), range(window))
    )


@pytest.mark.parametrize(("batch_tile", "channels"), [(1, 1), (4, 4), (3, 2)])
def test_pooling_channels_tile_by_pool_batch_tile(batch_tile, channels):
    """``pool_batch_tile`` tiles the innermost batch dim of a pooling (NCHW: its channels)
    to its largest divisor at most the knob, so each decomposed 1-D tile holds that many
    channels (the heuristic takes :data:`POOL_BATCH_TILE`); a convolution's batch tile
    (``conv_batch_tile``) does not apply to it; the result stays correct. (Vectorized
    along its width instead, see :func:`test_unit_stride_pooling_vectorizes_along_width`,
    a pooling takes one channel per tile.)"""
    import re

    from stagegraph.mlir.bindings import ir
    from stagegraph.stages.x86.generic.schedule import (
        apply_generic_schedule,
        build_generic_schedule,
        convolution_plan,
    )

    text = _pooling((3, 3))
    module = parse_payload(text)
    facts = analyze(module)
    (pool,) = [op for op in facts.ops if op.op_class == "pooling"]
    heuristic = heuristic_generic_params(facts, AVX512)
    assert heuristic.conv_batch_tile == 1 and heuristic.pool_batch_tile == 4
    params = heuristic.model_copy(
        update={"pool_batch_tile": batch_tile, "conv_batch_tile": 8, "pool_width_vectors": False}
    )
    sizes, decompose = convolution_plan(pool, params)
    assert decompose and sizes[pool.convolution.batch[-1]] == channels
    assert sizes[pool.convolution.batch[0]] == 1
    with module.context, ir.Location.unknown():
        apply_generic_schedule(module, build_generic_schedule(facts, params), facts)
    width = sizes[pool.convolution.output_image[-1]]
    tiles = set(re.findall(rf"tensor<1x(\d+)x1x{width}xf32>", str(module)))  # output tiles
    assert tiles == {str(channels)}
    x = np.random.default_rng(7).standard_normal((2, 16, 9, 40)).astype(np.float32)
    (out,) = _jit(text, params).call("main", [x])
    np.testing.assert_allclose(out, _window_sums(x, out.shape, 3), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("drop", [False, True])
def test_pooling_vectors_drop_unit_dims_by_conv_drop_unit_dims(drop):
    """A one-channel pooling tile vectorizes to ``vector<Wx1>`` values (window slices
    shuffled element by element); ``conv_drop_unit_dims`` turns them into ``vector<W>``
    before lowering (off by default); the result stays correct."""
    import re

    from stagegraph.mlir.bindings import ir
    from stagegraph.stages.x86.generic.schedule import (
        apply_generic_schedule,
        build_generic_schedule,
    )

    text = _pooling((3, 3))
    module = parse_payload(text)
    facts = analyze(module)
    heuristic = heuristic_generic_params(facts, AVX512)
    assert not heuristic.conv_drop_unit_dims
    params = heuristic.model_copy(
        update={"conv_drop_unit_dims": drop, "pool_batch_tile": 1, "pool_width_vectors": False}
    )
    with module.context, ir.Location.unknown():
        apply_generic_schedule(module, build_generic_schedule(facts, params), facts)
    unit = re.findall(r"vector<\d+x1xf32>", str(module))
    assert bool(unit) != drop
    x = np.random.default_rng(8).standard_normal((2, 16, 9, 40)).astype(np.float32)
    (out,) = _jit(text, params).call("main", [x])
    np.testing.assert_allclose(out, _window_sums(x, out.shape, 3), rtol=1e-5, atol=1e-5)


def _strided_pooling(stride: int) -> str:
    """A 3x3 max pooling of a 2x16x9x40 NCHW image with ``stride``."""
    oh, ow = (9 - 3) // stride + 1, (40 - 3) // stride + 1
    out = f"tensor<2x16x{oh}x{ow}xf32>"
    return f"""
func.func @main(%x: tensor<2x16x9x40xf32>) -> {out} {{
  %z = arith.constant 0xFF800000 : f32
  %w = tensor.empty() : tensor<3x3xf32>
  %e = tensor.empty() : {out}
  %f = linalg.fill ins(%z : f32) outs(%e : {out}) -> {out}
  %r = linalg.pooling_nchw_max {{dilations = dense<1> : vector<2xi64>,
      strides = dense<{stride}> : vector<2xi64>}}
      ins(%x, %w : tensor<2x16x9x40xf32>, tensor<3x3xf32>) outs(%f : {out}) -> {out}
  return %r : {out}
}}
"""


@pytest.mark.parametrize(("stride", "lanes", "along_width"), [(1, 16, True), (2, 16, False),
                                                             (1, 64, True), (1, 128, False)],
                         ids=["unit-stride", "strided", "half-a-vector",
                              "narrower-than-half-a-vector"])  # fmt: skip
def test_unit_stride_pooling_vectorizes_along_width(stride, lanes, along_width):
    """A unit-stride NCHW pooling at least half a vector wide (38 of 64 lanes, not of 128)
    takes one channel and a row of its
    output width per tile (``WIDTH_VECTORS`` vectors at most), unit dims dropped: every
    window offset is a contiguous ``vector<W>``. Strided or narrow ones keep their channel
    tiles (``pool_batch_tile``). All stay correct."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import collect
    from stagegraph.stages.x86.generic.plan import convolution_plan, pools_along_width
    from stagegraph.stages.x86.generic.schedule import (
        apply_generic_schedule,
        build_generic_schedule,
    )

    text = _strided_pooling(stride)
    module = parse_payload(text)
    facts = analyze(module)
    (pool,) = [op for op in facts.ops if op.op_class == "pooling"]
    params = heuristic_generic_params(facts, AVX512).model_copy(update={"lanes": lanes})
    assert pools_along_width(pool, params) == along_width
    sizes, _ = convolution_plan(pool, params)
    conv = pool.convolution
    width = pool.loop_ranges[conv.output_image[-1]]
    if along_width:
        assert sizes[conv.batch[-1]] == 1 and sizes[conv.output_image[-1]] == width == 38
    else:
        assert sizes[conv.batch[-1]] == params.pool_batch_tile
    with module.context, ir.Location.unknown():
        apply_generic_schedule(module, build_generic_schedule(facts, params), facts)
    maxima = collect(module.operation, "arith.maximumf")
    rows = [op for op in maxima if ir.VectorType(op.results[0].type).shape == [width]]
    assert maxima and bool(rows) == along_width  # whole rows, not channels, in each vector
    x = np.random.default_rng(9).standard_normal((2, 16, 9, 40)).astype(np.float32)
    (out,) = _jit(text, params).call("main", [x])
    oh, ow = out.shape[2:]
    expected = np.max(
        [
            x[:, :, a : a + stride * (oh - 1) + 1 : stride, b : b + stride * (ow - 1) + 1 : stride]
            for a, b in itertools.product(range(3), range(3))
        ],
        axis=0,
    )
    np.testing.assert_array_equal(out, expected)


def test_per_op_params_reach_only_their_op():
    """``per_op`` params (by op signature) change that op's tiling and nothing else's."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import collect
    from stagegraph.stages.x86.generic.schedule import build_generic_schedule

    module = parse_payload(ROW_SUM)
    facts = analyze(module)
    base = GenericParams(reduction_chunk=1024)
    reduction = facts.ops[1]

    def tile_sizes(per_op: dict) -> list[tuple[int, ...]]:
        with module.context, ir.Location.unknown():
            schedule = build_generic_schedule(facts, base, per_op=per_op)
        tiles = collect(
            schedule.operation, lambda op: op.name == "transform.structured.tile_using_for"
        )
        return [tuple(ir.DenseI64ArrayAttr(t.attributes["static_sizes"])) for t in tiles]

    assert tile_sizes({}) != tile_sizes({reduction.signature(): GenericParams(reduction_chunk=64)})
    other = {facts.ops[0].signature(): GenericParams(reduction_chunk=64)}  # the fill's entry
    assert tile_sizes(other) == tile_sizes({})


# x / sqrt(mean(x^2 over axis 1) + eps): the sqrt chain is read broadcast over axis 1.
NORMALIZE = """
#x = affine_map<(d0, d1, d2) -> (d0, d1, d2)>
#r = affine_map<(d0, d1, d2) -> (d0, 0, d2)>
func.func @main(%a: tensor<3x8x16xf32>) -> tensor<3x8x16xf32> {
  %zero = arith.constant 0.0 : f32
  %n = arith.constant 8.0 : f32
  %eps = arith.constant 1.0e-5 : f32
  %e = tensor.empty() : tensor<3x8x16xf32>
  %er = tensor.empty() : tensor<3x1x16xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%er : tensor<3x1x16xf32>) -> tensor<3x1x16xf32>
  %sum = linalg.generic {indexing_maps = [#x, #r],
                        iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%a : tensor<3x8x16xf32>) outs(%acc : tensor<3x1x16xf32>) {
  ^bb0(%v: f32, %o: f32):
    %sq = arith.mulf %v, %v : f32
    %s = arith.addf %sq, %o : f32
    linalg.yield %s : f32
  } -> tensor<3x1x16xf32>
  %rms = linalg.generic {indexing_maps = [#x, #x],
                        iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%sum : tensor<3x1x16xf32>) outs(%er : tensor<3x1x16xf32>) {
  ^bb0(%v: f32, %o: f32):
    %m = arith.divf %v, %n : f32
    %p = arith.addf %m, %eps : f32
    %r = math.sqrt %p : f32
    linalg.yield %r : f32
  } -> tensor<3x1x16xf32>
  %out = linalg.generic {indexing_maps = [#x, #r, #x],
                        iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%a, %rms : tensor<3x8x16xf32>, tensor<3x1x16xf32>) outs(%e : tensor<3x8x16xf32>) {
  ^bb0(%v: f32, %d: f32, %o: f32):
    %q = arith.divf %v, %d : f32
    linalg.yield %q : f32
  } -> tensor<3x8x16xf32>
  return %out : tensor<3x8x16xf32>
}
"""


def test_producer_read_broadcast_is_not_fused_into_its_consumer():
    """Fused, the sqrt chain would run once per element of the normalized axis (8x here);
    it gets its own loop nest instead, and the result is unchanged."""
    from stagegraph.stages.x86.generic.labels import annotate_generic_ops

    module = parse_payload(NORMALIZE)
    facts = analyze(module)
    with module.context:
        fused = annotate_generic_ops(module, facts)
    kinds = [f.op_class for f in facts.ops]
    rms = kinds.index("reduction") + 1
    assert rms not in fused
    a = np.random.default_rng(0).standard_normal((3, 8, 16), dtype=np.float32)
    (out,) = _jit(NORMALIZE).call("main", [a])
    want = a / np.sqrt((a.astype(np.float64) ** 2).mean(axis=1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(out, want, rtol=2e-6, atol=1e-7)


def test_static_tile_size_prefers_a_divisor_near_the_cap():
    from stagegraph.stages.x86.generic.params import static_tile_size

    assert static_tile_size(30, 8) == 6  # at least half the cap: kept
    assert static_tile_size(22, 8) == 11  # 2 would be the largest divisor <= 8
    assert static_tile_size(13, 8) == 13
    assert static_tile_size(17, 8) == 17  # a prime up to three times the cap: whole
    assert static_tile_size(62, 8) == 2  # nothing near the cap: the small divisor
    assert static_tile_size(5, 8) == 5


def test_convolution_width_tile_is_a_divisor_near_the_lanes():
    """An output width of 22 is tiled by 11 (independent accumulators), not by 2; the
    convolution stays vectorized and correct."""
    from stagegraph.stages.x86.generic.plan import convolution_plan

    x_shape, w_shape, o_shape = (2, 3, 6, 24), (8, 3, 3, 3), (2, 8, 4, 22)
    tx, tw, to = (f"tensor<{'x'.join(map(str, s))}xf32>" for s in (x_shape, w_shape, o_shape))
    text = f"""
func.func @main(%x: {tx}, %w: {tw}) -> {to} {{
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : {to}
  %f = linalg.fill ins(%z : f32) outs(%e : {to}) -> {to}
  %r = linalg.conv_2d_nchw_fchw {{dilations = dense<1> : vector<2xi64>,
      strides = dense<1> : vector<2xi64>}} ins(%x, %w : {tx}, {tw}) outs(%f : {to}) -> {to}
  return %r : {to}
}}
"""
    facts = analyze(parse_payload(text))
    (conv,) = [op for op in facts.ops if op.op_class == "convolution"]
    params = heuristic_generic_params(facts, Target(vector_bits=256))
    sizes, _ = convolution_plan(conv, params)
    assert sizes[conv.convolution.output_image[-1]] == 11
    names = _scheduled_op_names(text)
    assert "linalg.conv_2d_nchw_fchw" not in names and "vector.fma" in names
    rng = np.random.default_rng(4)
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    (out,) = _jit(text, params).call("main", [x, w])
    windows = np.lib.stride_tricks.sliding_window_view(x, (3, 3), axis=(2, 3))
    expected = np.einsum("nchwij,fcij->nfhw", windows, w)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


def test_convolution_tiles_take_the_lanes_of_their_own_element_type():
    """An f64 op elsewhere (PyTorch's normalizations compute in f64) halves the lanes of
    the elementwise tiles, not those of an f32 convolution."""
    text = """
func.func @main(%x: tensor<1x4x6x10xf32>, %w: tensor<8x4x3x3xf32>) -> tensor<1x8x4x8xf64> {
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<1x8x4x8xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<1x8x4x8xf32>) -> tensor<1x8x4x8xf32>
  %c = linalg.conv_2d_nchw_fchw {dilations = dense<1> : vector<2xi64>,
      strides = dense<1> : vector<2xi64>} ins(%x, %w : tensor<1x4x6x10xf32>, tensor<8x4x3x3xf32>)
      outs(%f : tensor<1x8x4x8xf32>) -> tensor<1x8x4x8xf32>
  %e64 = tensor.empty() : tensor<1x8x4x8xf64>
  %r = linalg.generic {indexing_maps = [affine_map<(a, b, c, d) -> (a, b, c, d)>,
      affine_map<(a, b, c, d) -> (a, b, c, d)>],
      iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%c : tensor<1x8x4x8xf32>) outs(%e64 : tensor<1x8x4x8xf64>) {
  ^bb0(%v: f32, %o: f64):
    %d = arith.extf %v : f32 to f64
    linalg.yield %d : f64
  } -> tensor<1x8x4x8xf64>
  return %r : tensor<1x8x4x8xf64>
}
"""
    params = heuristic_generic_params(analyze(parse_payload(text)), Target(vector_bits=256))
    assert params.lanes == 4
    assert (params.conv_width_tile, params.conv_channel_tile, params.conv_reduction_tile) == (
        8,
        4,
        4,
    )


def test_a_short_innermost_dim_grows_the_tile_outwards():
    """``[batch, groups, channels, 1]`` (a GroupNorm view): the unit innermost dim is taken
    whole and the tile grows outwards by static divisors, not one element per tile; the
    result is unchanged."""
    shape = (6, 12, 4, 1)
    t32, t64 = (f"tensor<{'x'.join(map(str, shape))}x{t}>" for t in ("f32", "f64"))
    text = f"""
#id = affine_map<(a, b, c, d) -> (a, b, c, d)>
func.func @main(%x: {t32}) -> {t64} {{
  %e = tensor.empty() : {t64}
  %r = linalg.generic {{indexing_maps = [#id, #id],
      iterator_types = ["parallel", "parallel", "parallel", "parallel"]}}
      ins(%x : {t32}) outs(%e : {t64}) {{
  ^bb0(%v: f32, %o: f64):
    %d = arith.extf %v : f32 to f64
    %s = arith.mulf %d, %d : f64
    linalg.yield %s : f64
  }} -> {t64}
  return %r : {t64}
}}
"""
    (op,) = analyze(parse_payload(text)).ops
    assert tile_sizes_for(op, GenericParams(inner_tile=16)) == [1, 4, 4, 1]
    assert tile_sizes_for(op, GenericParams(inner_tile=64)) == [1, 12, 4, 1]
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    (out,) = _jit(text, GenericParams(inner_tile=16)).call("main", [x])
    np.testing.assert_allclose(out, x.astype(np.float64) ** 2, rtol=1e-12)


@pytest.mark.parametrize(
    ("filters", "width", "vector_bits", "expected"),
    [
        (16, 20, 256, (16, 4)),
        (8, 24, 256, (8, 8)),
        (16, 22, 256, (8, 11)),
        (16, 17, 256, (8, 17)),
        (16, 24, 512, (16, 12)),
        (16, 10, 256, (16, 5)),
        (32, 10, 512, (32, 5)),
        (32, 17, 512, (16, 17)),
    ],
    ids=[
        "two-vectors",
        "one-vector-wider",
        "22-wide",
        "prime-width",
        "avx512-one-vector",
        "10-wide-above-cap",
        "avx512-10-wide-above-cap",
        "avx512-prime-width-fits-the-registers",
    ],
)
def test_channels_last_convolution_is_register_blocked(
    filters: int, width: int, vector_bits: int, expected: tuple[int, int]
) -> None:
    """A channels-last convolution tiles two vectors of output channels times a width whose
    accumulators fill half the register file (16 f32 channels x 4 on AVX2's 16 registers,
    32 x 8 on AVX-512's 32); fewer channels (or wider vectors) give the freed accumulators
    to the width, a static divisor near it (AVX-512, one vector of 16: 16 columns, 12 of 24).
    The result matches the definition."""
    from stagegraph.stages.x86.generic.plan import convolution_plan

    x_shape = (2, 5, width + 2, 4)  # N H W C
    w_shape = (3, 3, 4, filters)  # KH KW C F
    o_shape = (2, 3, width, filters)
    tx, tw, to = (f"tensor<{'x'.join(map(str, s))}xf32>" for s in (x_shape, w_shape, o_shape))
    text = f"""
func.func @main(%x: {tx}, %w: {tw}) -> {to} {{
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : {to}
  %f = linalg.fill ins(%z : f32) outs(%e : {to}) -> {to}
  %r = linalg.conv_2d_nhwc_hwcf {{dilations = dense<1> : vector<2xi64>,
      strides = dense<1> : vector<2xi64>}} ins(%x, %w : {tx}, {tw}) outs(%f : {to}) -> {to}
  return %r : {to}
}}
"""
    facts = analyze(parse_payload(text))
    (conv,) = facts.ops_of("convolution")
    params = heuristic_generic_params(facts, Target(vector_bits=vector_bits))
    sizes, decompose = convolution_plan(conv, params)
    roles = conv.convolution
    assert decompose
    assert (sizes[roles.output_channel[-1]], sizes[roles.output_image[-1]]) == expected
    if vector_bits == 256:  # runs on the host's AVX2 (the test machines have it)
        rng = np.random.default_rng(6)
        x = rng.standard_normal(x_shape).astype(np.float32)
        w = rng.standard_normal(w_shape).astype(np.float32)
        (out,) = _jit(text, params).call("main", [x, w])
        windows = np.lib.stride_tricks.sliding_window_view(x, (3, 3), axis=(1, 2))
        expected_out = np.einsum("nhwcij,ijcf->nhwf", windows, w)
        np.testing.assert_allclose(out, expected_out, rtol=1e-4, atol=1e-4)


# A batched matmul between elementwise ops: scale -> bmm -> exp. The matmul schedule runs
# one matmul per batch element and fuses neither, so both are this schedule's.
BATCHED = """
func.func @main(%a: tensor<2x8x16xf32>, %b: tensor<2x16x24xf32>) -> tensor<2x8x24xf32> {
  %zero = arith.constant 0.0 : f32
  %half = arith.constant 0.5 : f32
  %ea = tensor.empty() : tensor<2x8x16xf32>
  %scaled = linalg.generic {indexing_maps = [affine_map<(i, j, k) -> (i, j, k)>,
      affine_map<(i, j, k) -> (i, j, k)>],
      iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%a : tensor<2x8x16xf32>) outs(%ea : tensor<2x8x16xf32>) {
    ^bb0(%x: f32, %o: f32):
      %y = arith.mulf %x, %half : f32
      linalg.yield %y : f32
  } -> tensor<2x8x16xf32>
  %e = tensor.empty() : tensor<2x8x24xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<2x8x24xf32>) -> tensor<2x8x24xf32>
  %mm = linalg.batch_matmul ins(%scaled, %b : tensor<2x8x16xf32>, tensor<2x16x24xf32>)
      outs(%f : tensor<2x8x24xf32>) -> tensor<2x8x24xf32>
  %exp = linalg.generic {indexing_maps = [affine_map<(i, j, k) -> (i, j, k)>,
      affine_map<(i, j, k) -> (i, j, k)>],
      iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%mm : tensor<2x8x24xf32>) outs(%e : tensor<2x8x24xf32>) {
    ^bb0(%x: f32, %o: f32):
      %y = math.exp %x : f32
      linalg.yield %y : f32
  } -> tensor<2x8x24xf32>
  return %exp : tensor<2x8x24xf32>
}
"""


def test_batched_matmul_neighbours_are_vectorized_and_its_fill_is_left_to_it():
    names = _scheduled_op_names(BATCHED)
    assert names.count("linalg.generic") == 0  # the scale and the exp are tiled + vectorized
    assert names.count("linalg.batch_matmul") == 1 and names.count("linalg.fill") == 1
    assert names.count("scf.forall") == 2 and "vector.transfer_read" in names


def test_batched_matmul_between_elementwise_ops_matches_numpy(tmp_path):
    import stagegraph as sg

    rng = np.random.default_rng(3)
    a = rng.standard_normal((2, 8, 16), dtype=np.float32)
    b = rng.standard_normal((2, 16, 24), dtype=np.float32)
    (tmp_path / "bmm.mlir").write_text(BATCHED)
    np.savez(tmp_path / "bmm.npz", in0=a, in1=b, out0=np.exp(np.matmul(a * 0.5, b)))
    assert sg.run("x86", str(tmp_path / "bmm.mlir"), threads=1).verified is True


def _loop_ancestors(op) -> list[str]:
    """Names of the loops enclosing ``op``, innermost first."""
    names = []
    parent = op.parent
    while parent is not None and parent.name != "func.func":
        if parent.name in ("scf.for", "scf.forall"):
            names.append(parent.name)
        parent = parent.parent
    return names


@pytest.mark.parametrize("channels", [6, 16], ids=["nchw", "channels-last"])
def test_convolution_output_tiles_are_one_parallel_loop(channels: int) -> None:
    """A convolution's output tiles (batch, channels, rows, width tiles) form one outermost
    ``scf.forall``, which threads split; its input channels and window are serial loops
    inside it, around the FMAs. (As a nest of ``scf.for`` loops it ran on one thread.)"""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.functions import entry_function
    from stagegraph.mlir.walk import collect
    from stagegraph.stages.x86.generic.prepare import prepare
    from stagegraph.stages.x86.generic.schedule import (
        apply_generic_schedule,
        build_generic_schedule,
    )

    text, _ = _conv2d_nchw(2, 5, channels, (9, 21), (3, 3), (1, 1), (1, 1))
    module = parse_payload(text)
    with module.context, ir.Location.unknown():
        prepare(module, entry_function(module, "main"))  # channels-last when they fill vectors
    facts = analyze(module)
    with module.context, ir.Location.unknown():
        schedule = build_generic_schedule(facts, heuristic_generic_params(facts, AVX512))
        apply_generic_schedule(module, schedule, facts)
    fmas = collect(module, "vector.fma")
    assert fmas
    for fma in fmas:
        loops = _loop_ancestors(fma)
        assert loops[-1] == "scf.forall" and loops.count("scf.forall") == 1
        assert "scf.for" in loops[:-1]  # the reduction over channels and window rows
