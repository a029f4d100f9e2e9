"""Running the GPU graph's artifacts through the CUDA driver (``cuda-bindings``).

Loads each kernel's PTX (``cuModuleLoadData``: the driver JIT-compiles it for the GPU
present), then runs the host-side plan of a ``cuda`` manifest step by step: allocations,
host-to-device copies, constants, launches with their grid, block and shared memory,
device-to-device and device-to-host copies, frees. Every driver call's return code is
checked (:class:`~stagegraph.errors.CudaError` names the call and the error).

This module imports neither MLIR nor pydantic: it runs on a GPU machine that has only
numpy and ``cuda-bindings`` (plus this package's plain modules).
"""

from __future__ import annotations

import ctypes
from functools import cache
from typing import Any

import numpy as np

from stagegraph.errors import CudaError, GpuUnavailableError

#: Manifest dtype -> numpy storage dtype (bf16 as raw 16-bit patterns).
NUMPY_DTYPES: dict[str, Any] = {
    "f64": np.float64, "f32": np.float32, "f16": np.float16, "bf16": np.uint16,
    "i64": np.int64, "i32": np.int32, "i16": np.int16, "i8": np.int8, "i1": np.bool_,
    "ui8": np.uint8, "index": np.int64,
}  # fmt: skip
#: Manifest dtype -> the ctypes type a scalar kernel argument is passed as.
SCALAR_CTYPES: dict[str, Any] = {
    "f64": ctypes.c_double, "f32": ctypes.c_float, "f16": ctypes.c_uint16,
    "bf16": ctypes.c_uint16, "i64": ctypes.c_int64, "index": ctypes.c_int64,
    "i32": ctypes.c_int32, "i16": ctypes.c_int16, "i8": ctypes.c_int8, "i1": ctypes.c_bool,
}  # fmt: skip


@cache
def driver() -> Any:
    """``cuda.bindings.driver``, initialised, with device 0's primary context current.

    Raises:
        GpuUnavailableError: cuda-bindings missing, no driver (libcuda) or no device.
    """
    try:
        from cuda.bindings import driver as cu
    except ImportError:
        raise GpuUnavailableError(
            "running GPU code needs cuda-bindings (pip install 'stagegraph[gpu]') and an "
            "NVIDIA GPU; none is usable here, so compile or --emit instead"
        ) from None
    try:
        check(cu, cu.cuInit(0), "cuInit")
        count = check(cu, cu.cuDeviceGetCount(), "cuDeviceGetCount")
    except (RuntimeError, CudaError) as error:
        raise GpuUnavailableError(
            f"no NVIDIA GPU is present on this machine ({error}); compile or --emit the "
            "GPU graph's artifact here and run it on a machine with a GPU"
        ) from None
    if not count:
        raise GpuUnavailableError("no NVIDIA GPU is present on this machine (0 devices)")
    device = check(cu, cu.cuDeviceGet(0), "cuDeviceGet")
    context = check(cu, cu.cuDevicePrimaryCtxRetain(device), "cuDevicePrimaryCtxRetain")
    check(cu, cu.cuCtxSetCurrent(context), "cuCtxSetCurrent")
    return cu


def check(cu: Any, result: Any, call: str) -> Any:
    """The values a driver call returned after its status; raise on any error status."""
    status, *values = result if isinstance(result, tuple) else (result,)
    if status != cu.CUresult.CUDA_SUCCESS:
        _, name = cu.cuGetErrorName(status)
        raise CudaError(f"CUDA call {call} failed: {name.decode() if name else status}")
    return values[0] if len(values) == 1 else tuple(values) or None


_ATTRIBUTES = {
    "sm_count": "MULTIPROCESSOR_COUNT",
    "warp_size": "WARP_SIZE",
    "max_threads_per_block": "MAX_THREADS_PER_BLOCK",
    "max_threads_per_sm": "MAX_THREADS_PER_MULTIPROCESSOR",
    "registers_per_block": "MAX_REGISTERS_PER_BLOCK",
    "registers_per_sm": "MAX_REGISTERS_PER_MULTIPROCESSOR",
    "shared_bytes_per_block": "MAX_SHARED_MEMORY_PER_BLOCK",
    "shared_bytes_per_block_optin": "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN",
    "shared_bytes_per_sm": "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR",
    "l2_bytes": "L2_CACHE_SIZE",
    "memory_clock_khz": "MEMORY_CLOCK_RATE",
    "memory_bus_bits": "GLOBAL_MEMORY_BUS_WIDTH",
    "major": "COMPUTE_CAPABILITY_MAJOR",
    "minor": "COMPUTE_CAPABILITY_MINOR",
}


def device_properties(ordinal: int = 0) -> dict[str, Any]:
    """The limits of GPU ``ordinal`` as the driver reports them (plain dict)."""
    cu = driver()
    device = check(cu, cu.cuDeviceGet(ordinal), "cuDeviceGet")
    props: dict[str, Any] = {}
    for key, name in _ATTRIBUTES.items():
        attribute = getattr(cu.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}")
        props[key] = int(check(cu, cu.cuDeviceGetAttribute(attribute, device), name))
    raw = check(cu, cu.cuDeviceGetName(64, device), "cuDeviceGetName")
    props["name"] = raw.split(b"\0", 1)[0].decode()
    props["capability"] = (props.pop("major"), props.pop("minor"))
    return props


def _itemsize(dtype: str) -> int:
    return np.dtype(NUMPY_DTYPES[dtype]).itemsize


class CudaProgram:
    """One artifact loaded on the GPU: its modules and kernels, ready to run the plan.

    ``manifest`` is the plain-dict ``cuda`` manifest, ``ptx`` the PTX text by module name
    (the kernel's ``ptx`` file stem), ``constants`` the constant buffers' values.
    """

    def __init__(self, manifest: dict[str, Any], ptx: dict[str, str],
                 constants: dict[str, np.ndarray]) -> None:  # fmt: skip
        self.cu = driver()
        self.manifest, self.constants = manifest, constants
        self.modules: dict[str, Any] = {}
        self.functions: dict[str, Any] = {}
        for kernel in manifest["kernels"]:
            stem = kernel["ptx"].removesuffix(".ptx")
            if stem not in self.modules:
                image = ptx[stem].encode() + b"\0"
                self.modules[stem] = self._call("cuModuleLoadData", image)
            self.functions[kernel["name"]] = self._call(
                "cuModuleGetFunction", self.modules[stem], kernel["entry"].encode()
            )
        self.launches = {k["name"]: k["launch"] for k in manifest["kernels"]}
        attribute = "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES"
        # Any dynamic shared memory: without the opt-in a launch gets 48 KiB less the
        # kernel's static shared memory (a wgmma block's 48 KiB of stages and its 1 KiB of
        # mbarriers failed with CUDA_ERROR_INVALID_VALUE on an H200).
        for kernel in manifest["kernels"]:
            if kernel["launch"]["shared_mem_bytes"] > 0:
                self._call("cuFuncSetAttribute", self.functions[kernel["name"]],
                           getattr(self.cu.CUfunction_attribute, attribute),
                           kernel["launch"]["shared_mem_bytes"])  # fmt: skip
        self.buffers: dict[str, int] = {}
        self.scalars: dict[str, Any] = {}
        self._prepared: list[tuple[str, Any]] | None = None
        self._holders: list[Any] = []

    def _call(self, name: str, *args: Any) -> Any:
        return check(self.cu, getattr(self.cu, name)(*args), name)

    # -- the plan ------------------------------------------------------------------------

    def upload(self, inputs: list[np.ndarray], poison: bool = False) -> None:
        """Allocate every buffer and copy the inputs and constants (the plan's steps up to
        the first launch, and every later alloc, are replayed by :meth:`launch_all`).

        ``poison`` fills each result buffer that no copy fills with 0xFF bytes (NaN for
        floats, -1 for integers) first, so an element no kernel writes fails verification
        instead of passing on whatever the allocator left there."""
        by_name = {}
        arguments = self.manifest["arguments"]
        if len(inputs) != len(arguments):
            raise CudaError(f"the artifact takes {len(arguments)} inputs, got {len(inputs)}")
        for spec, value in zip(arguments, inputs, strict=True):
            if spec["shape"] is None:
                self.scalars[spec["name"]] = np.asarray(value).item()
                continue
            by_name[spec["name"]] = np.ascontiguousarray(value, dtype=NUMPY_DTYPES[spec["dtype"]])
        self._prepared, self._holders = None, []  # new buffers: marshal the parameters again
        for step in self.manifest["plan"]:
            op = step["op"]
            if op == "alloc":
                self.buffers[step["buffer"]] = int(self._call("cuMemAlloc", max(step["bytes"], 1)))
            elif op == "copy_h2d":
                data = by_name[step["src"]]
                self._call("cuMemcpyHtoD", self.buffers[step["dst"]], data.ctypes.data, data.nbytes)
            elif op == "constant":
                data = np.ascontiguousarray(self.constants[step["data"]])
                self._call("cuMemcpyHtoD", self.buffers[step["buffer"]], data.ctypes.data,
                           data.nbytes)  # fmt: skip
            elif op == "tensor_map":
                self._tensor_map(step)
        if poison:
            self._poison_results()

    def _poison_results(self) -> None:
        filled = {s.get("dst") or s.get("buffer") for s in self.manifest["plan"]
                  if s["op"] in ("copy_h2d", "constant")}  # fmt: skip
        for spec in self.manifest["results"]:
            if spec["name"] in self.buffers and spec["name"] not in filled:
                nbytes = int(np.prod(spec["shape"])) * _itemsize(spec["dtype"])
                self._call("cuMemsetD8", self.buffers[spec["name"]], 0xFF, nbytes)

    def launch_all(self, stream: Any = None) -> None:
        """Every launch and device copy of the plan, in order, on ``stream`` (the default
        stream unless given: :mod:`stagegraph.runtime.cuda_graph` captures a graph on its
        own).

        The kernel parameters are marshalled once, on the first call after
        :meth:`upload` (the buffers do not move between runs), so a timed run issues only
        the driver calls: a plan of 14 small kernels spent most of its time building
        ctypes arrays otherwise."""
        if self._prepared is None:
            self._prepared = [self._prepare(step) for step in self.manifest["plan"]
                              if step["op"] in ("launch", "copy_d2d")]  # fmt: skip
        launch, success = self.cu.cuLaunchKernel, self.cu.CUresult.CUDA_SUCCESS
        for kind, call in self._prepared:
            if kind == "copy":
                self._copy(*call, stream=stream)
                continue
            if stream is not None:
                call = (*call[:8], stream, *call[9:])  # hStream follows the shared bytes
            status = launch(*call)
            status = status[0] if isinstance(status, tuple) else status
            if status != success:
                check(self.cu, (status,), "cuLaunchKernel")

    def _prepare(self, step: dict[str, Any]) -> tuple[str, Any]:
        if step["op"] == "copy_d2d":
            return "copy", (step["src"], step["dst"])
        return "launch", self._launch_arguments(step)

    def _tensor_map(self, step: dict[str, Any]) -> None:
        """Encode the step's TMA tensor map on the host and copy it to its buffer."""
        from stagegraph.runtime.tensor_map import TENSOR_MAP_BYTES, encode

        encoded = encode(self.cu, step, self._pointer(step["source"]), check)
        self._call("cuMemcpyHtoD", self.buffers[step["buffer"]], encoded.getPtr(),
                   TENSOR_MAP_BYTES)  # fmt: skip

    def _pointer(self, view: dict[str, Any]) -> int:
        return self.buffers[view["buffer"]] + view["offset"] * _itemsize(view["dtype"])

    def _launch_arguments(self, step: dict[str, Any]) -> tuple[Any, ...]:
        """``cuLaunchKernel``'s arguments for one launch step; the parameter values live in
        ``self._holders`` as long as the program (the driver reads them at each launch)."""
        holders: list[Any] = []
        for arg in step["args"]:
            if "buffer" in arg:
                base = ctypes.c_uint64(self.buffers[arg["buffer"]])
                holders += [base, ctypes.c_uint64(base.value), ctypes.c_int64(arg["offset"])]
                holders += [ctypes.c_int64(n) for n in (*arg["sizes"], *arg["strides"])]
            elif "tensor_map" in arg:  # a TMA descriptor's device address
                holders.append(ctypes.c_uint64(self.buffers[arg["tensor_map"]]))
            elif "argument" in arg:  # a scalar input of the entry
                holders.append(SCALAR_CTYPES[arg["dtype"]](self.scalars[arg["argument"]]))
            else:
                holders.append(SCALAR_CTYPES[arg["dtype"]](arg["scalar"]))
        pointers = np.array([ctypes.addressof(h) for h in holders], dtype=np.uint64)
        self._holders.append((holders, pointers))
        config = self.launches[step["kernel"]]
        return (self.functions[step["kernel"]], *config["grid"], *config["block"],
                config["shared_mem_bytes"], 0, pointers.ctypes.data, 0)  # fmt: skip

    def _copy(self, src: dict[str, Any], dst: dict[str, Any], stream: Any = None) -> None:
        """A device copy between two dense row-major views of the same shape."""
        from math import prod

        def dense(view: dict[str, Any]) -> bool:
            step, want = 1, []
            for size in reversed(view["sizes"]):
                want.append(step)
                step *= size
            return list(reversed(want)) == list(view["strides"]) or prod(view["sizes"]) <= 1

        if not (dense(src) and dense(dst)) or list(src["sizes"]) != list(dst["sizes"]):
            raise CudaError(f"the plan copies between strided views {src} -> {dst}")
        nbytes = prod(src["sizes"]) * _itemsize(src["dtype"])
        if stream is not None:  # capturable: the synchronous copy is not
            self._call("cuMemcpyDtoDAsync", self._pointer(dst), self._pointer(src), nbytes,
                       stream)  # fmt: skip
            return
        self._call("cuMemcpyDtoD", self._pointer(dst), self._pointer(src), nbytes)

    def download(self) -> list[np.ndarray]:
        """The results, copied back to the host."""
        outputs = []
        for spec in self.manifest["results"]:
            out = np.empty(spec["shape"], dtype=NUMPY_DTYPES[spec["dtype"]])
            self._call("cuMemcpyDtoH", out.ctypes.data, self.buffers[spec["name"]], out.nbytes)
            outputs.append(out)
        return outputs

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """Upload (result buffers poisoned), launch everything, synchronize and return the
        results."""
        self.upload(inputs, poison=True)
        self.launch_all()
        self.synchronize()
        return self.download()

    def synchronize(self) -> None:
        """Wait until the launches issued so far have finished."""
        self._call("cuCtxSynchronize")

    def time_ms(self, repeats: int = 20, warmup: int = 3) -> list[float]:
        """Milliseconds per run of the launches (after :meth:`upload`), by CUDA events."""
        start = self._call("cuEventCreate", 0)
        stop = self._call("cuEventCreate", 0)
        times = []
        try:
            for i in range(warmup + repeats):
                self._call("cuEventRecord", start, 0)
                self.launch_all()
                self._call("cuEventRecord", stop, 0)
                self._call("cuEventSynchronize", stop)
                if i >= warmup:
                    times.append(float(self._call("cuEventElapsedTime", start, stop)))
        finally:
            self._call("cuEventDestroy", start)
            self._call("cuEventDestroy", stop)
        return times

    def close(self) -> None:
        """Free every buffer and unload the modules."""
        for pointer in self.buffers.values():
            self._call("cuMemFree", pointer)
        self.buffers.clear()
        for module in self.modules.values():
            self._call("cuModuleUnload", module)
        self.modules.clear()
