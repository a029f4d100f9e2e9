"""Crash isolation: crashes, hangs and memory blow-ups in a child become IsolatedFailure."""

from __future__ import annotations

import ctypes
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from stagegraph.app.child_process import Limits, run_isolated
from stagegraph.errors import IsolatedFailure, StageFailed, StagegraphError

MB = 2**20


class TunerBoom(StagegraphError, ValueError):
    """A project error the child raises."""


def _add(a: int, b: int) -> int:
    return a + b


def _segfault() -> None:
    ctypes.string_at(0)


def _abort() -> None:
    os.abort()


def _bad_alloc() -> None:
    os.write(2, b"terminate called after throwing an instance of 'std::bad_alloc'\n")
    os.abort()


def _spin_with_grandchild(pid_file: str) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    Path(pid_file).write_text(str(child.pid))
    while True:
        pass


def _allocate_forever() -> None:
    chunks = []
    while True:
        chunks.append(bytearray(16 * MB))


def _raise_project_error() -> None:
    raise TunerBoom("tile size 7 does not divide 64")


def _raise_stage_failed() -> None:
    raise StageFailed("x86", "tile", "boom", diagnostics=["error: bad op"])


def _raise_plain_error() -> None:
    os.write(2, b"note from the C++ side\n")
    raise ValueError("no such tile")


def _exit_without_result() -> None:
    os._exit(3)


def _array(n: int) -> np.ndarray:
    return np.arange(n, dtype=np.float32).reshape(2, -1)


def _jit_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Parse, lower and JIT a matmul with the bindings, all inside the child."""
    from stagegraph.mlir.bindings import ir, new_context, passmanager
    from stagegraph.runtime.jit import JitBinary
    from stagegraph.runtime.memref import record_signature
    from stagegraph.stages.common import lowering

    text = """
    func.func @mm(%a: tensor<4x3xf32>, %b: tensor<3x5xf32>) -> tensor<4x5xf32> {
      %zero = arith.constant 0.0 : f32
      %e = tensor.empty() : tensor<4x5xf32>
      %f = linalg.fill ins(%zero : f32) outs(%e : tensor<4x5xf32>) -> tensor<4x5xf32>
      %r = linalg.matmul ins(%a, %b : tensor<4x3xf32>, tensor<3x5xf32>)
                         outs(%f : tensor<4x5xf32>) -> tensor<4x5xf32>
      return %r : tensor<4x5xf32>
    }
    """
    with new_context(), ir.Location.unknown():
        module = ir.Module.parse(text)
        record_signature(module, "mm")
        pipeline = ",".join((lowering.BUFFERIZE, lowering.LINALG_TO_LOOPS, lowering.LOWER_TO_LLVM))
        passmanager.PassManager.parse(f"builtin.module({pipeline})").run(module.operation)
        return JitBinary(module).call("mm", [a, b])[0]


def isolated(fn, *args, timeout_s: float = 8.0, memory_bytes: int | None = None):
    return run_isolated(fn, *args, timeout_s=timeout_s, memory_bytes=memory_bytes, label="t")


@pytest.fixture(autouse=True)
def parent_survives():
    """After every test the parent still runs isolated calls (and itself) normally."""
    pid = os.getpid()
    yield
    assert os.getpid() == pid
    assert isolated(_add, 2, 3) == 5


def test_returns_the_result():
    assert isolated(_add, 40, 2) == 42


def test_segfault_is_a_signal():
    with pytest.raises(IsolatedFailure) as info:
        isolated(_segfault)
    e = info.value
    assert (e.reason, e.signal, e.label) == ("signal", "SIGSEGV", "t")
    assert "killed by SIGSEGV (Segmentation fault)" in str(e)
    assert "Fatal Python error: Segmentation fault" in e.stderr_tail  # faulthandler, fd 2
    assert "_segfault" in e.stderr_tail


def test_abort_is_a_signal():
    with pytest.raises(IsolatedFailure, match="killed by SIGABRT") as info:
        isolated(_abort)
    assert (info.value.reason, info.value.signal) == ("signal", "SIGABRT")


def test_bad_alloc_abort_counts_as_memory():
    with pytest.raises(IsolatedFailure, match=r"ran out of memory \(SIGABRT") as info:
        isolated(_bad_alloc, memory_bytes=2**30)
    e = info.value
    assert (e.reason, e.signal, e.memory_bytes) == ("memory", "SIGABRT", 2**30)
    assert "std::bad_alloc" in e.stderr_tail


def test_timeout_kills_the_process_group(tmp_path):
    pid_file = tmp_path / "grandchild"
    start = time.perf_counter()
    with pytest.raises(IsolatedFailure, match=r"timed out after 2 s") as info:
        isolated(_spin_with_grandchild, str(pid_file), timeout_s=2.0)
    assert time.perf_counter() - start < 4
    assert (info.value.reason, info.value.timeout_s) == ("timeout", 2.0)
    grandchild = int(pid_file.read_text())
    assert _gone(grandchild), "the grandchild outlived the timeout"


def _gone(pid: int, wait_s: float = 3.0) -> bool:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):  # killed, waiting to be reaped by init
            return True
        time.sleep(0.05)
    return False


def test_unbounded_allocation_is_memory():
    with pytest.raises(IsolatedFailure, match=r"ran out of memory \(MemoryError") as info:
        isolated(_allocate_forever, memory_bytes=512 * MB)
    e = info.value
    assert (e.reason, e.exc_type, e.memory_bytes) == ("memory", "MemoryError", 512 * MB)
    assert "_allocate_forever" in e.child_traceback


def test_project_error_is_reraised_as_its_class():
    with pytest.raises(TunerBoom, match="^tile size 7 does not divide 64$") as info:
        isolated(_raise_project_error)
    cause = info.value.__cause__
    assert isinstance(cause, IsolatedFailure) and cause.reason == "exception"
    assert cause.exc_type == "tests.test_isolate.TunerBoom"
    assert "_raise_project_error" in cause.child_traceback


def test_error_with_custom_init_keeps_class_message_and_fields():
    with pytest.raises(StageFailed) as info:
        isolated(_raise_stage_failed)
    e = info.value
    assert (e.graph, e.stage, e.diagnostics) == ("x86", "tile", ["error: bad op"])
    assert str(e).startswith("stage 'tile' of graph 'x86' failed: boom")


def test_other_exceptions_carry_type_message_traceback_and_stderr():
    with pytest.raises(IsolatedFailure, match="ValueError: no such tile") as info:
        isolated(_raise_plain_error)
    e = info.value
    assert (e.reason, e.exc_type, e.exc_message) == ("exception", "ValueError", "no such tile")
    assert 'raise ValueError("no such tile")' in e.child_traceback
    assert "note from the C++ side" in e.stderr_tail


def test_exit_without_result():
    with pytest.raises(IsolatedFailure, match="exited with code 3") as info:
        isolated(_exit_without_result)
    assert (info.value.reason, info.value.exitcode) == ("exit", 3)


def test_returns_numpy_arrays():
    out = isolated(_array, 6)
    np.testing.assert_array_equal(out, np.arange(6, dtype=np.float32).reshape(2, 3))


def test_mlir_jit_in_the_child():
    rng = np.random.default_rng(0)
    a, b = rng.random((4, 3), dtype=np.float32), rng.random((3, 5), dtype=np.float32)
    out = isolated(_jit_matmul, a, b, memory_bytes=4 * 2**30)
    np.testing.assert_allclose(out, a @ b, rtol=1e-5)


def test_failure_pickles_and_limits_have_defaults():
    e = IsolatedFailure("timeout", "timed out after 2 s", label="x", timeout_s=2.0)
    back = pickle.loads(pickle.dumps(e))
    assert (type(back), str(back), back.timeout_s) == (IsolatedFailure, str(e), 2.0)
    assert Limits() == Limits(timeout_s=300.0, memory_bytes=8 * 2**30)
    assert Limits(timeout_s=5).run(_add, 1, 2, label="lim") == 3
