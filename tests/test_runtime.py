"""Calling compiled code: signatures, marshalling, the JIT and shared libraries."""

from __future__ import annotations

import ctypes
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from stagegraph.mlir.bindings import ir, new_context, passmanager
from stagegraph.runtime import memref
from stagegraph.runtime.jit import EmitError, JitBinary
from stagegraph.runtime.memref import Arg, SignatureError, read_signature, record_signature
from stagegraph.runtime.shared import SharedLibraryBinary, emit_shared_library
from stagegraph.stages.common import lowering

MATMUL = """
func.func @mm(%a: tensor<8x4xf32>, %b: tensor<4x6xf32>) -> tensor<8x6xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<8x6xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<8x6xf32>) -> tensor<8x6xf32>
  %r = linalg.matmul ins(%a, %b : tensor<8x4xf32>, tensor<4x6xf32>)
                     outs(%f : tensor<8x6xf32>) -> tensor<8x6xf32>
  return %r : tensor<8x6xf32>
}
"""

# Scalars by value, several element types, a 0-d result and bf16 storage in one module.
MIXED = """
#id = affine_map<(i) -> (i)>
#red = affine_map<(i) -> ()>
func.func @scale(%x: f64, %a: tensor<5xf64>) -> tensor<5xf64> {
  %e = tensor.empty() : tensor<5xf64>
  %r = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel"]}
      ins(%a : tensor<5xf64>) outs(%e : tensor<5xf64>) {
  ^bb0(%v: f64, %o: f64):
    %m = arith.mulf %v, %x : f64
    linalg.yield %m : f64
  } -> tensor<5xf64>
  return %r : tensor<5xf64>
}
func.func @addi(%a: tensor<3xi32>, %b: tensor<3xi64>) -> (tensor<3xi64>, tensor<3xi1>) {
  %e = tensor.empty() : tensor<3xi64>
  %p = tensor.empty() : tensor<3xi1>
  %r:2 = linalg.generic {indexing_maps = [#id, #id, #id, #id], iterator_types = ["parallel"]}
      ins(%a, %b : tensor<3xi32>, tensor<3xi64>) outs(%e, %p : tensor<3xi64>, tensor<3xi1>) {
  ^bb0(%x: i32, %y: i64, %o: i64, %q: i1):
    %w = arith.extsi %x : i32 to i64
    %s = arith.addi %w, %y : i64
    %z = arith.constant 0 : i64
    %c = arith.cmpi sgt, %s, %z : i64
    linalg.yield %s, %c : i64, i1
  } -> (tensor<3xi64>, tensor<3xi1>)
  return %r#0, %r#1 : tensor<3xi64>, tensor<3xi1>
}
func.func @sum_bf16(%a: tensor<4xbf16>) -> tensor<f32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<f32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<f32>) -> tensor<f32>
  %r = linalg.generic {indexing_maps = [#id, #red], iterator_types = ["reduction"]}
      ins(%a : tensor<4xbf16>) outs(%f : tensor<f32>) {
  ^bb0(%v: bf16, %acc: f32):
    %w = arith.extf %v : bf16 to f32
    %s = arith.addf %w, %acc : f32
    linalg.yield %s : f32
  } -> tensor<f32>
  return %r : tensor<f32>
}
"""


def run(module: ir.Module, *pipelines: str) -> None:
    passmanager.PassManager.parse(f"builtin.module({','.join(pipelines)})").run(module.operation)


def compile_llvm(text: str, entries: list[str]) -> ir.Module:
    """Parse, record signatures, bufferize, lower linalg to loops, lower to LLVM."""
    module = ir.Module.parse(text)
    for entry in entries:
        record_signature(module, entry)
    run(module, lowering.BUFFERIZE, lowering.LINALG_TO_LOOPS, lowering.LOWER_TO_LLVM)
    return module


@pytest.fixture
def ctx():
    with new_context() as context, ir.Location.unknown():
        yield context


@pytest.fixture
def mm_inputs():
    rng = np.random.default_rng(0)
    return [rng.random((8, 4), dtype=np.float32), rng.random((4, 6), dtype=np.float32)]


def test_signature_from_tensor_types_survives_lowering(ctx):
    module = ir.Module.parse(MATMUL)
    sig = record_signature(module, "mm")
    assert sig.args == (
        Arg(dtype="f32", shape=(8, 4)),
        Arg(dtype="f32", shape=(4, 6)),
        Arg(dtype="f32", shape=(8, 6), output=True),
    )
    run(module, lowering.BUFFERIZE)
    assert read_signature(module, "mm") == sig
    run(module, lowering.LINALG_TO_LOOPS, lowering.LOWER_TO_LLVM)
    assert module.body.operations[0].operation.name == "llvm.func"
    assert read_signature(module, "mm") == sig


def test_signature_at_buffer_level_needs_output_flags(ctx):
    module = ir.Module.parse(MATMUL)
    run(module, lowering.BUFFERIZE)
    with pytest.raises(SignatureError, match="records no outputs"):
        read_signature(module, "mm")
    sig = record_signature(module, "mm", outputs=[False, False, True])
    assert [a.output for a in sig.args] == [False, False, True]
    assert read_signature(module, "mm") == sig


def test_signature_errors_name_the_function(ctx):
    module = ir.Module.parse(MATMUL)
    with pytest.raises(SignatureError, match="no function named 'nope'"):
        record_signature(module, "nope")
    run(module, lowering.BUFFERIZE, lowering.LINALG_TO_LOOPS, lowering.LOWER_TO_LLVM)
    with pytest.raises(SignatureError, match="'mm' is already lowered"):
        record_signature(module, "mm")


def test_descriptor_round_trip():
    a = np.arange(12, dtype=np.float64).reshape(3, 4)
    desc = memref.to_descriptor(a)
    assert list(desc.sizes) == [3, 4] and list(desc.strides) == [4, 1]
    view = memref.from_descriptor(desc, a.dtype)
    view[1, 2] = -1.0
    assert a[1, 2] == -1.0
    assert memref.from_descriptor(memref.to_descriptor(a[:, 1:]), a.dtype).shape == (3, 3)
    scalar = np.array(5, dtype=np.int32)
    assert memref.from_descriptor(memref.to_descriptor(scalar), np.int32)[()] == 5


def test_jit_call_matmul(ctx, mm_inputs):
    binary = JitBinary(compile_llvm(MATMUL, ["mm"]))
    (c,) = binary.call("mm", mm_inputs)
    np.testing.assert_allclose(c, mm_inputs[0] @ mm_inputs[1], rtol=1e-5)
    assert binary.entries == frozenset({"mm"})
    assert len(binary.key) == 64


def test_jit_preallocated_and_bound(ctx, mm_inputs):
    binary = JitBinary(compile_llvm(MATMUL, ["mm"]))
    out = np.full((8, 6), np.nan, dtype=np.float32)
    binary.call_into("mm", [*mm_inputs, out])
    np.testing.assert_allclose(out, mm_inputs[0] @ mm_inputs[1], rtol=1e-5)
    out[:] = 0
    again = binary.bind("mm", [*mm_inputs, out])
    for _ in range(3):
        again()
    np.testing.assert_allclose(out, mm_inputs[0] @ mm_inputs[1], rtol=1e-5)


def test_jit_checks_arguments(ctx, mm_inputs):
    binary = JitBinary(compile_llvm(MATMUL, ["mm"]))
    with pytest.raises(SignatureError, match=r"mm: argument #0 has dtype float64"):
        binary.call("mm", [mm_inputs[0].astype(np.float64), mm_inputs[1]])
    with pytest.raises(SignatureError, match=r"argument #1 has shape \(6, 4\)"):
        binary.call("mm", [mm_inputs[0], mm_inputs[1].T.copy()])
    with pytest.raises(SignatureError, match="expected 2 inputs, got 1"):
        binary.call("mm", mm_inputs[:1])
    with pytest.raises(SignatureError, match="no recorded signature for entry 'other'"):
        binary.call("other", mm_inputs)


def test_jit_refuses_unlowered_module(ctx):
    with pytest.raises(EmitError, match="'mm' is not lowered to the LLVM dialect"):
        JitBinary(ir.Module.parse(MATMUL))


def test_jit_without_c_interface(ctx, mm_inputs):
    module = ir.Module.parse(MATMUL)
    run(module, lowering.BUFFERIZE, lowering.LINALG_TO_LOOPS, lowering.LOWER_TO_LLVM)
    binary = JitBinary(module)
    with pytest.raises(SignatureError, match="entry 'mm' has no C interface"):
        binary.call_into("mm", [*mm_inputs, np.zeros((8, 6), np.float32)])


def check_mixed(binary) -> None:
    a = np.arange(5, dtype=np.float64)
    (scaled,) = binary.call("scale", [2.5, a])
    np.testing.assert_array_equal(scaled, 2.5 * a)

    x, y = np.array([1, -5, 3], np.int32), np.array([10, 2, -9], np.int64)
    total, positive = binary.call("addi", [x, y])
    np.testing.assert_array_equal(total, [11, -3, -6])
    assert positive.dtype == np.bool_
    np.testing.assert_array_equal(positive, [True, False, False])

    values = np.array([1.5, -2.0, 0.25, 8.0], dtype=np.float32)
    bits = (values.view(np.uint32) >> 16).astype(np.uint16)  # exact in bf16
    (s,) = binary.call("sum_bf16", [bits.view(memref.DTYPES["bf16"])])
    assert s.shape == () and s[()] == pytest.approx(values.sum())


def test_jit_dtypes_scalars_and_0d(ctx):
    check_mixed(JitBinary(compile_llvm(MIXED, ["scale", "addi", "sum_bf16"])))


def test_shared_library_called_like_jit(ctx, tmp_path, mm_inputs):
    module = compile_llvm(MATMUL, ["mm"])
    binary = emit_shared_library(module, tmp_path / "libmm.so")
    (c,) = binary.call("mm", mm_inputs)
    np.testing.assert_allclose(c, mm_inputs[0] @ mm_inputs[1], rtol=1e-5)
    loaded = SharedLibraryBinary.load(tmp_path / "libmm.so")
    assert loaded.signatures == binary.signatures and loaded.key == binary.key
    np.testing.assert_allclose(loaded.call("mm", mm_inputs)[0], c)


def test_shared_library_dtypes(ctx, tmp_path):
    module = compile_llvm(MIXED, ["scale", "addi", "sum_bf16"])
    check_mixed(emit_shared_library(module, tmp_path / "libmixed.so"))


PLAIN_CTYPES = """
import ctypes, sys
import numpy as np

class MemRef2D(ctypes.Structure):
    _fields_ = [("allocated", ctypes.c_void_p), ("aligned", ctypes.c_void_p),
                ("offset", ctypes.c_int64), ("sizes", ctypes.c_int64 * 2),
                ("strides", ctypes.c_int64 * 2)]

def desc(a):
    return MemRef2D(a.ctypes.data, a.ctypes.data, 0, (ctypes.c_int64 * 2)(*a.shape),
                    (ctypes.c_int64 * 2)(*(s // a.itemsize for s in a.strides)))

lib = ctypes.CDLL(sys.argv[1])
a = np.arange(32, dtype=np.float32).reshape(8, 4) / 7
b = np.arange(24, dtype=np.float32).reshape(4, 6) / 5
c = np.zeros((8, 6), dtype=np.float32)
da, db, dc = desc(a), desc(b), desc(c)
lib._mlir_ciface_mm(ctypes.byref(da), ctypes.byref(db), ctypes.byref(dc))
assert np.allclose(c, a @ b, rtol=1e-5), c
print("ok", float(c.sum()))
"""


def test_shared_library_with_plain_ctypes(ctx, tmp_path):
    """The .so is self-contained: a separate process calls it without stagegraph."""
    emit_shared_library(compile_llvm(MATMUL, ["mm"]), tmp_path / "libmm.so")
    script = tmp_path / "call.py"
    script.write_text(PLAIN_CTYPES)
    proc = subprocess.run(
        [sys.executable, "-I", str(script), str(tmp_path / "libmm.so")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    expected = (np.arange(32, dtype=np.float32).reshape(8, 4) / 7) @ (
        np.arange(24, dtype=np.float32).reshape(4, 6) / 5
    )
    assert proc.stdout.split()[0] == "ok"
    assert float(proc.stdout.split()[1]) == pytest.approx(float(expected.sum()), rel=1e-5)


def test_shared_library_exports_c_interface(ctx, tmp_path):
    emit_shared_library(compile_llvm(MATMUL, ["mm"]), tmp_path / "libmm.so")
    lib = ctypes.CDLL(str(tmp_path / "libmm.so"))
    assert hasattr(lib, "_mlir_ciface_mm")
    assert Path(str(tmp_path / "libmm.so") + ".signature.json").exists()


def test_openmp_binary_leaves_the_callers_cpu_affinity_alone():
    """The runtime must not pin the calling thread: numpy's threads, later target detection
    (``usable_cores``) and other runtimes in the process keep every core."""
    import os

    from stagegraph.app.bench import prepare
    from stagegraph.app.graph_options import with_params
    from stagegraph.core.catalog import load_graph
    from stagegraph.core.engine import Engine
    from stagegraph.workload import parse_workload

    pytest.importorskip("stagegraph.runtime.openmp").library_path()
    before = os.sched_getaffinity(0)
    if len(before) < 2:
        pytest.skip("needs two usable cores")
    work = parse_workload("matmul:m=64,n=64,k=64")
    measurement = prepare(Engine(), with_params(load_graph("x86"), {"threads": 2}, 2), work, None)
    assert measurement.verdict.ok
    measurement.measure(3)
    assert os.sched_getaffinity(0) == before


def test_openmp_workers_sleep_when_idle_on_a_busy_machine_unless_the_user_says_otherwise():
    """Idle workers must not spin between calls where other processes already fill the cores
    (they would take the cores a parallel loop's threads need), and may where the machine is
    quiet; a KMP_BLOCKTIME the user set is kept. Checked in children: the runtime reads the
    variable once, when it starts."""
    import os
    import subprocess
    import sys

    from stagegraph.runtime.openmp import default_blocktime

    assert default_blocktime(3.0, 2) == "0" and default_blocktime(1.2, 2) is None
    code = (
        "import os\n"
        "from stagegraph.runtime import openmp\n"
        "os.getloadavg = lambda: (float(os.environ['FAKE_LOAD']), 0.0, 0.0)\n"
        "try:\n"
        "    openmp.library_path()\n"
        "except Exception:\n"
        "    pass\n"
        "print(os.environ.get('KMP_BLOCKTIME'))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "KMP_BLOCKTIME"}

    def blocktime(**extra: str) -> str:
        run = [sys.executable, "-c", code]
        done = subprocess.run(run, env={**env, **extra}, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert blocktime(FAKE_LOAD="1000") == "0"
    assert blocktime(FAKE_LOAD="0") == "None"
    assert blocktime(FAKE_LOAD="1000", KMP_BLOCKTIME="50") == "50"


def test_one_walk_tells_what_is_not_lowered_and_whether_openmp_is_needed():
    """The emit stage's checks of the largest module of a compile share one walk: the ops
    LLVM translation cannot take (casts last) and whether any ``omp`` op is left."""
    from stagegraph.mlir.bindings import ir, new_context
    from stagegraph.stages.common.lowering import survey_llvm_level
    from stagegraph.stages.common.rewrites import uses_bf16

    context = new_context()
    with context:
        lowered = ir.Module.parse(
            "llvm.func @f(%a: i32) -> i32 {\n  %b = llvm.add %a, %a : i32\n"
            "  llvm.return %b : i32\n}"
        )
        assert survey_llvm_level(lowered) == ([], False)
        partial = ir.Module.parse(
            "llvm.func @f(%a: i32) -> i32 {\n"
            "  %c = builtin.unrealized_conversion_cast %a : i32 to index\n"
            "  %b = arith.addi %a, %a : i32\n  omp.barrier\n  llvm.return %b : i32\n}"
        )
        left, omp = survey_llvm_level(partial)
        assert [op.name for op in left] == ["arith.addi", "builtin.unrealized_conversion_cast"]
        assert omp
        # bf16 seen as a function argument or as a result, not only as an operand.
        assert uses_bf16(ir.Module.parse("func.func @g(%a: bf16) {\n  return\n}"))
        assert uses_bf16(ir.Module.parse(
            "func.func @g(%a: f32) -> f32 {\n  %b = arith.truncf %a : f32 to bf16\n"
            "  %c = arith.extf %b : bf16 to f32\n  return %c : f32\n}"
        ))  # fmt: skip
        assert not uses_bf16(lowered)
