"""The benchmark wrapper: IR structure, timings at the tensor and buffer levels, errors."""

from __future__ import annotations

import numpy as np
import pytest

from stagegraph.mlir.bindings import interpreter, ir, new_context, passmanager
from stagegraph.mlir.functions import find_function
from stagegraph.runtime.jit import JitBinary
from stagegraph.runtime.memref import read_signature, record_signature
from stagegraph.runtime.shared import emit_shared_library
from stagegraph.stages.common import lowering
from stagegraph.stages.common.bench_harness import (
    WRAPPER_ATTR,
    WrapperError,
    insert_bench_wrapper,
    is_wrapper,
    run_benchmark,
)


def matmul(m: int, k: int, n: int) -> str:
    a, b, c = f"tensor<{m}x{k}xf32>", f"tensor<{k}x{n}xf32>", f"tensor<{m}x{n}xf32>"
    return f"""
func.func @mm(%a: {a}, %b: {b}) -> {c} {{
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : {c}
  %f = linalg.fill ins(%zero : f32) outs(%e : {c}) -> {c}
  %r = linalg.matmul ins(%a, %b : {a}, {b}) outs(%f : {c}) -> {c}
  return %r : {c}
}}
"""


# Touches linalg ops only. (Tiling would too, but its subviews currently fail in
# lowering.LOWER_TO_LLVM, which runs lower-affine before expand-strided-metadata.)
LINALG_SCHEDULE = """
module attributes {transform.with_named_sequence} {
  transform.named_sequence @__transform_main(%root: !transform.any_op {transform.readonly}) {
    %mm = transform.structured.match ops{["linalg.matmul"]} in %root
        : (!transform.any_op) -> !transform.any_op
    %generic = transform.structured.generalize %mm : (!transform.any_op) -> !transform.any_op
    %swapped = transform.structured.interchange %generic iterator_interchange = [1, 0, 2]
        : (!transform.any_op) -> !transform.any_op
    transform.yield
  }
}
"""


def run(module: ir.Module, *pipelines: str) -> None:
    passmanager.PassManager.parse(f"builtin.module({','.join(pipelines)})").run(module.operation)


def lower(module: ir.Module) -> None:
    run(module, lowering.LINALG_TO_LOOPS, lowering.LOWER_TO_LLVM)


@pytest.fixture
def ctx():
    with new_context() as context, ir.Location.unknown():
        yield context


def inputs(m: int, k: int, n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    return [rng.random((m, k), dtype=np.float32), rng.random((k, n), dtype=np.float32)]


def ops_named(op: ir.Operation, name: str) -> list[ir.Operation]:
    found = []

    def visit(inner: ir.Operation) -> ir.WalkResult:
        if inner.name == name:
            found.append(inner)
        return ir.WalkResult.ADVANCE

    op.walk(visit)
    return found


def callees(op: ir.Operation) -> list[str]:
    return [c.attributes["callee"].value for c in ops_named(op, "func.call")]


def test_tensor_level_wrapper_structure(ctx):
    module = ir.Module.parse(matmul(8, 4, 6))
    name = insert_bench_wrapper(module, "mm")
    assert name == "mm_bench"
    wrapper = find_function(module, name)
    assert is_wrapper(wrapper) and WRAPPER_ATTR in find_function(module, "clock_gettime").attributes
    assert not is_wrapper(find_function(module, "mm"))
    ftype = wrapper.attributes["function_type"].value
    assert [str(t) for t in ftype.inputs] == [
        "tensor<8x4xf32>",
        "tensor<4x6xf32>",
        "memref<8x6xf32>",
        "i64",
        "i64",
        "memref<?xi64>",
    ]
    warm, timed = ops_named(wrapper.operation, "scf.for")
    assert callees(warm) == ["mm"]
    assert callees(timed) == ["clock_gettime", "mm", "clock_gettime"]
    assert len(ops_named(timed, "bufferization.materialize_in_destination")) == 1
    # No stack allocation inside the loops.
    assert not ops_named(timed, "llvm.alloca") and len(ops_named(wrapper.operation, "llvm.alloca"))
    sig = read_signature(module, name)
    assert [a.output for a in sig.args] == [False, False, True, False, False, True]


def test_tensor_level_timings_and_outputs(ctx):
    module = ir.Module.parse(matmul(8, 4, 6))
    name = insert_bench_wrapper(module, "mm")
    run(module, lowering.BUFFERIZE)
    lower(module)
    binary = JitBinary(module)
    a, b = inputs(8, 4, 6)
    out = np.zeros((8, 6), np.float32)
    times = run_benchmark(binary, name, [a, b], warmup=2, repeat=7, outputs=[out])
    assert times.shape == (7,) and np.all(times > 0) and np.all(times < 0.1)
    np.testing.assert_allclose(out, a @ b, rtol=1e-5)


def test_tensor_level_survives_linalg_schedule(ctx, tmp_path):
    module = ir.Module.parse(matmul(8, 4, 16))
    name = insert_bench_wrapper(module, "mm")
    schedule = ir.Module.parse(LINALG_SCHEDULE)
    interpreter.apply_named_sequence(module, schedule.body.operations[0], schedule)
    payload = find_function(module, "mm").operation
    assert ops_named(payload, "linalg.generic") and not ops_named(payload, "linalg.matmul")
    assert callees(find_function(module, name).operation).count("mm") == 2
    run(module, lowering.BUFFERIZE)
    lower(module)
    binary = emit_shared_library(module, tmp_path / "libmm.so")
    a, b = inputs(8, 4, 16)
    out = np.zeros((8, 16), np.float32)
    times = run_benchmark(binary, name, [a, b], warmup=1, repeat=5, outputs=[out])
    assert np.all(times > 0)
    np.testing.assert_allclose(out, a @ b, rtol=1e-5)


def test_buffer_level_timings_and_outputs(ctx):
    module = ir.Module.parse(matmul(8, 4, 6))
    record_signature(module, "mm")
    run(module, lowering.BUFFERIZE)
    name = insert_bench_wrapper(module, "mm")
    wrapper = find_function(module, name)
    assert [str(t) for t in wrapper.attributes["function_type"].value.inputs][:3] == [
        "memref<8x4xf32>",
        "memref<4x6xf32>",
        "memref<8x6xf32>",
    ]
    (timed,) = ops_named(wrapper.operation, "scf.for")[1:]
    assert not ops_named(timed, "bufferization.materialize_in_destination")
    lower(module)
    binary = JitBinary(module)
    a, b = inputs(8, 4, 6)
    out = np.zeros((8, 6), np.float32)
    times = run_benchmark(binary, name, [a, b], warmup=0, repeat=4, outputs=[out])
    assert times.shape == (4,) and np.all(times > 0)
    np.testing.assert_allclose(out, a @ b, rtol=1e-5)
    # Outputs come from the payload's recorded signature when not given.
    assert run_benchmark(binary, name, [a, b], warmup=1, repeat=2).shape == (2,)


def test_buffer_level_without_recorded_outputs_takes_all_args(ctx):
    module = ir.Module.parse(matmul(8, 4, 6))
    run(module, lowering.BUFFERIZE)
    name = insert_bench_wrapper(module, "mm")
    lower(module)
    a, b = inputs(8, 4, 6)
    out = np.zeros((8, 6), np.float32)
    times = run_benchmark(JitBinary(module), name, [a, b, out], warmup=1, repeat=3)
    assert np.all(times > 0)
    np.testing.assert_allclose(out, a @ b, rtol=1e-5)


@pytest.mark.parametrize("level", ["tensor", "buffer"])
def test_timings_scale_with_work(ctx, level):
    """The payload is not hoisted or deleted: 216x the flops takes much longer."""
    medians = []
    for size in (16, 96):
        module = ir.Module.parse(matmul(size, size, size))
        record_signature(module, "mm")
        if level == "buffer":
            run(module, lowering.BUFFERIZE)
        name = insert_bench_wrapper(module, "mm")
        if level == "tensor":
            run(module, lowering.BUFFERIZE)
        lower(module)
        times = run_benchmark(JitBinary(module), name, inputs(size, size, size), 2, 9)
        medians.append(np.median(times))
    assert medians[1] > 20 * medians[0], medians


def test_error_missing_entry(ctx):
    module = ir.Module.parse(matmul(8, 4, 6))
    with pytest.raises(WrapperError, match="cannot wrap 'main': no function of that name"):
        insert_bench_wrapper(module, "main")


def test_error_llvm_level(ctx):
    module = ir.Module.parse(matmul(8, 4, 6))
    run(module, lowering.BUFFERIZE)
    lower(module)
    with pytest.raises(WrapperError, match="cannot wrap 'mm': it is already lowered to the LLVM"):
        insert_bench_wrapper(module, "mm")
    assert issubclass(WrapperError, ValueError)


def test_error_memref_result(ctx):
    module = ir.Module.parse(matmul(8, 4, 6))
    run(module, "one-shot-bufferize{bufferize-function-boundaries}")
    with pytest.raises(WrapperError, match=r"'mm': result #0 is a memref .*buffer-results-to-out"):
        insert_bench_wrapper(module, "mm")


def test_error_scalar_result_and_name_clash(ctx):
    module = ir.Module.parse(
        "func.func @f(%x: f32) -> f32 { return %x : f32 }\nfunc.func @f_bench() { return }"
    )
    with pytest.raises(WrapperError, match="a function named 'f_bench' already exists"):
        insert_bench_wrapper(module, "f")
    with pytest.raises(WrapperError, match="result #0 of type f32 would be unobservable"):
        insert_bench_wrapper(module, "f", name="f_timed")


def test_run_benchmark_checks_entry_and_inputs(ctx):
    module = ir.Module.parse(matmul(8, 4, 6))
    name = insert_bench_wrapper(module, "mm")
    record_signature(module, "mm")
    run(module, lowering.BUFFERIZE)
    lower(module)
    binary = JitBinary(module)
    a, b = inputs(8, 4, 6)
    with pytest.raises(WrapperError, match="'mm' is not a benchmark wrapper"):
        run_benchmark(binary, "mm", [a, b], 1, 1)
    with pytest.raises(ValueError, match=r"mm_bench: argument #1 has dtype float64"):
        run_benchmark(binary, name, [a, b.astype(np.float64)], 1, 1)
    with pytest.raises(ValueError, match="expected 1 outputs, got 0"):
        run_benchmark(binary, name, [a, b], 1, 1, outputs=[])
