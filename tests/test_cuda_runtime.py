"""The CUDA runtime's side of the plan, against a recording stand-in for the driver: which
calls it makes in which order, the bytes it copies, the kernel parameters it marshals (a
buffer view as base, base, offset, sizes, strides; scalars by value) and that a failing
call's status becomes an error naming the call. The real driver runs in
``benchmarks/gpu_check.py`` on a GPU."""

from __future__ import annotations

import ctypes
import enum

import numpy as np
import pytest

from stagegraph.errors import CudaError
from stagegraph.runtime import cuda


class Result(enum.Enum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1


class FakeDriver:
    """Records every call; device memory is a dict of bytearrays keyed by address."""

    CUresult = Result

    def __init__(self, fail: str | None = None) -> None:
        self.calls: list[tuple] = []
        self.memory: dict[int, bytearray] = {}
        self.next = 0x1000
        self.fail = fail

    def __getattr__(self, name: str):
        if not name.startswith("cu"):
            raise AttributeError(name)

        def call(*args):
            self.calls.append((name, *args))
            if name == self.fail:
                return (Result.CUDA_ERROR_INVALID_VALUE, None)
            return getattr(self, f"do_{name}", lambda *a: (Result.CUDA_SUCCESS, None))(*args)

        return call

    def do_cuGetErrorName(self, status):
        return (Result.CUDA_SUCCESS, status.name.encode())

    def do_cuMemAlloc(self, nbytes):
        address, self.next = self.next, self.next + ((nbytes + 255) // 256) * 256
        self.memory[address] = bytearray(nbytes)
        return (Result.CUDA_SUCCESS, address)

    def do_cuMemcpyHtoD(self, dst, src, nbytes):
        self.memory[dst][:nbytes] = ctypes.string_at(src, nbytes)
        return (Result.CUDA_SUCCESS,)

    def do_cuMemcpyDtoH(self, dst, src, nbytes):
        ctypes.memmove(dst, bytes(self.memory[src][:nbytes]), nbytes)
        return (Result.CUDA_SUCCESS,)

    def do_cuMemsetD8(self, dst, value, nbytes):
        self.memory[dst][:nbytes] = bytes([value]) * nbytes
        return (Result.CUDA_SUCCESS,)

    def do_cuEventElapsedTime(self, start, stop):
        return (Result.CUDA_SUCCESS, 0.25)

    def do_cuLaunchKernel(self, function, *rest):
        # The driver copies the parameters at the call: read them now (7 int64s, a float).
        pointers = ctypes.cast(rest[-2], ctypes.POINTER(ctypes.c_uint64))
        self.launched = [ctypes.c_int64.from_address(pointers[i]).value for i in range(7)]
        self.launched.append(ctypes.c_float.from_address(pointers[7]).value)
        return (Result.CUDA_SUCCESS,)


MANIFEST = {
    "kernels": [{"name": "m__k", "ptx": "m.ptx", "entry": "k",
                 "launch": {"grid": [2, 1, 1], "block": [64, 1, 1], "shared_mem_bytes": 0}}],
    "arguments": [{"name": "arg0", "position": 0, "dtype": "f32", "shape": [2, 4]},
                  {"name": "arg1", "position": 1, "dtype": "f32", "shape": None}],
    "results": [{"name": "out2", "position": 2, "dtype": "f32", "shape": [2, 4]}],
    "constants": {},
    "plan": [
        {"op": "alloc", "buffer": "arg0", "bytes": 32},
        {"op": "copy_h2d", "src": "arg0", "dst": "arg0"},
        {"op": "alloc", "buffer": "out2", "bytes": 32},
        {"op": "launch", "kernel": "m__k",
         "args": [{"buffer": "arg0", "offset": 4, "sizes": [1, 4], "strides": [4, 1],
                   "dtype": "f32"},
                  {"argument": "arg1", "dtype": "f32"}]},
        {"op": "copy_d2h", "src": "out2", "dst": "out2"},
        {"op": "free", "buffer": "arg0"},
        {"op": "free", "buffer": "out2"},
    ],
}  # fmt: skip


@pytest.fixture
def fake(monkeypatch):
    driver = FakeDriver()
    monkeypatch.setattr(cuda, "driver", lambda: driver)
    return driver


def test_runs_the_plan_in_order_with_marshalled_parameters(fake):
    program = cuda.CudaProgram(MANIFEST, {"m": ".version 8.0"}, {})
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    (out,) = program.run([x, np.float32(2.5)])
    names = [c[0] for c in fake.calls]
    assert names[:2] == ["cuModuleLoadData", "cuModuleGetFunction"]
    assert fake.calls[0][1].endswith(b"\0")  # PTX handed over NUL-terminated
    assert names[2:] == ["cuMemAlloc", "cuMemcpyHtoD", "cuMemAlloc", "cuMemsetD8",
                         "cuLaunchKernel", "cuCtxSynchronize", "cuMemcpyDtoH"]  # fmt: skip
    launch = next(c for c in fake.calls if c[0] == "cuLaunchKernel")
    assert launch[2:9] == (2, 1, 1, 64, 1, 1, 0)
    assert fake.launched == [0x1000, 0x1000, 4, 1, 4, 4, 1, 2.5]
    assert bytes(fake.memory[0x1000]) == x.tobytes()
    assert out.shape == (2, 4) and out.dtype == np.float32
    program.close()
    assert [c[0] for c in fake.calls[-3:]] == ["cuMemFree", "cuMemFree", "cuModuleUnload"]


def test_results_no_kernel_writes_come_back_as_nan(fake):
    """The fake launch writes nothing: verification must see NaN, not a stale zero."""
    program = cuda.CudaProgram(MANIFEST, {"m": ""}, {})
    (out,) = program.run([np.ones((2, 4), np.float32), np.float32(1.0)])
    assert np.isnan(out).all()
    memset = next(c for c in fake.calls if c[0] == "cuMemsetD8")
    assert memset[2:] == (0xFF, 32)  # the result buffer only, never an input


def test_a_failing_call_names_itself(monkeypatch):
    driver = FakeDriver(fail="cuLaunchKernel")
    monkeypatch.setattr(cuda, "driver", lambda: driver)
    program = cuda.CudaProgram(MANIFEST, {"m": ""}, {})
    with pytest.raises(CudaError, match="cuLaunchKernel failed: CUDA_ERROR_INVALID_VALUE"):
        program.run([np.zeros((2, 4), np.float32), 1.0])


def test_wrong_input_count_is_refused(fake):
    program = cuda.CudaProgram(MANIFEST, {"m": ""}, {})
    with pytest.raises(CudaError, match="takes 2 inputs, got 1"):
        program.run([np.zeros((2, 4), np.float32)])


def test_bench_samples_are_cuda_event_times(fake):
    from stagegraph.stages.gpu.emit import CudaBinary

    binary = CudaBinary("key", MANIFEST, {"m": ""}, {})
    samples = binary.benchmark("main", [np.ones((2, 4), np.float32), 1.0], 2, 3)
    np.testing.assert_allclose(samples, [0.25e-3] * 3)  # seconds, warm-up runs dropped
    names = [c[0] for c in fake.calls]
    assert names.count("cuLaunchKernel") == 5 and names.count("cuEventSynchronize") == 5
    assert names.count("cuMemcpyHtoD") == 1  # inputs uploaded once, not per sample
    assert names[-1] == "cuModuleUnload"


def test_parameters_are_marshalled_once_per_upload(fake):
    """Timed runs issue only driver calls: the same parameter block at every launch."""
    program = cuda.CudaProgram(MANIFEST, {"m": ""}, {})
    program.upload([np.ones((2, 4), np.float32), np.float32(3.0)])
    program.time_ms(repeats=3, warmup=1)
    launches = [c for c in fake.calls if c[0] == "cuLaunchKernel"]
    assert len(launches) == 4 and len({c[-2] for c in launches}) == 1
    assert len(program._holders) == 1 and fake.launched[-1] == 3.0
    program.upload([np.ones((2, 4), np.float32), np.float32(5.0)])  # new buffers and scalars
    program.launch_all()
    assert fake.launched[-1] == 5.0 and len(program._holders) == 1


def test_graph_replay_captures_the_launches_once_on_its_own_stream(fake):
    from stagegraph.runtime.cuda_graph import GraphReplay

    class Mode:
        CU_STREAM_CAPTURE_MODE_GLOBAL = "global"

    fake.CUstreamCaptureMode = Mode
    fake.do_cuStreamCreate = lambda flags: (Result.CUDA_SUCCESS, "stream")
    program = cuda.CudaProgram(MANIFEST, {"m": ""}, {})
    program.upload([np.ones((2, 4), np.float32), np.float32(1.0)])
    replay = GraphReplay(program)
    samples = replay.time_ms(repeats=4, warmup=1)
    replay.close()
    names = [c[0] for c in fake.calls]
    begin, end = names.index("cuStreamBeginCapture"), names.index("cuStreamEndCapture")
    captured = [c for c in fake.calls[begin:end] if c[0] == "cuLaunchKernel"]
    assert len(captured) == 1 and captured[0][9] == "stream"  # hStream: the capture stream
    assert names.count("cuLaunchKernel") == 1  # replays launch the graph, not the kernels
    assert names.count("cuGraphLaunch") == 5 and samples == [0.25] * 4
    assert names[-3:] == ["cuGraphExecDestroy", "cuGraphDestroy", "cuStreamDestroy"]
