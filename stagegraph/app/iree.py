"""IREE as a peer for ``bench --vs iree``: the same payload compiled by IREE for llvm-cpu.

The workload's MLIR (the ``.mlir`` file's text, or the printed payload of a Python workload)
is compiled with IREE's Python compiler API for the same CPU as the x86 side (``host``, an
x86-64 level or an LLVM CPU name, with the level's exact feature list), with data tiling and
all micro-kernels on. It runs in this process on IREE's ``local-sync`` driver for one
thread (the call runs on the calling thread, like the x86 code) and on ``local-task`` with
exactly ``threads`` workers otherwise (``--task_topology_group_count``: the worker count
itself, not ``--task_topology_max_group_count``, which only caps a per-physical-core
heuristic and gives fewer workers on a machine with fewer physical cores).

Comparability: the x86 samples are taken inside the compiled code (``clock_gettime`` around
the call), so they contain no Python. An IREE call from Python pays ~10-15 us of invocation
overhead (argument lists, buffer views, fence waits, the result's Python wrappers). It is
measured on a no-op module with the same signature (same argument types; each result a
``tensor.empty`` of the result's type, so the output allocation stays in the measured call)
and its median is subtracted from every sample.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from stagegraph.app.bench import BenchReport, timing_fields
from stagegraph.errors import ConfigError, PeerUnavailableError, StagegraphError
from stagegraph.stages.target import effective_threads

INSTALL_HINT = "pip install 'stagegraph[peers]'"
DATA_TILING = ("--iree-opt-data-tiling", "--iree-llvmcpu-enable-ukernels=all")
#: Calls of the no-op module whose median is the invocation overhead.
OVERHEAD_CALLS = 300

# IREE's task executor is created once per process, with the flags parsed before it.
_task_workers: int | None = None


def import_iree() -> tuple[Any, Any]:
    """``(iree.compiler, iree.runtime)``.

    Raises:
        PeerUnavailableError: the ``peers`` extra is not installed.
    """
    try:
        import iree.compiler as compiler
        import iree.runtime as runtime
    except ImportError as exc:
        raise PeerUnavailableError(
            f"--vs iree needs IREE's compiler and runtime (iree-base-compiler and "
            f"iree-base-runtime 3.13.0), which cannot be imported ({exc}); install them "
            f"with: {INSTALL_HINT}"
        ) from None
    return compiler, runtime


def target_flags(target: str | None) -> list[str]:
    """IREE llvm-cpu flags for a stagegraph target name (``None``: $STAGEGRAPH_TARGET/host).

    ``host`` is ``--iree-llvmcpu-target-cpu=host``. A level or CPU name is passed as the
    CPU (LLVM knows ``x86-64-v3`` as well as ``znver4``) with stagegraph's explicit feature
    list for it, so the SIMD features are exactly those the x86 side builds for.

    Raises:
        UnknownTargetError: the name is none of these.
    """
    from stagegraph.stages.target import ENV_VAR, resolve_target
    from stagegraph.stages.target_names import NAMED, llvm_features

    name = (target or os.environ.get(ENV_VAR) or "host").strip().lower()
    if name == "host":
        return ["--iree-llvmcpu-target-cpu=host"]
    resolve_target(name)  # unknown names fail here, as for the x86 side
    features = ",".join(llvm_features(NAMED[name].isa))
    return [
        "--iree-llvmcpu-target-triple=x86_64-unknown-linux-gnu",
        f"--iree-llvmcpu-target-cpu={name}",
        f"--iree-llvmcpu-target-cpu-features={features}",
    ]


def payload_text(workload: Any) -> str:
    """The workload's MLIR: the file's own text, or the printed payload (also for a file
    with ops these bindings rewrite on parsing, such as ``tm_tensor.scan``)."""
    from stagegraph.mlir.bindings import new_context
    from stagegraph.mlir.diagnostics import unregistered_ops
    from stagegraph.mlir.scan import stepping_scans
    from stagegraph.workload.mlir_file import MlirFileWorkload

    if isinstance(workload, MlirFileWorkload) and not unregistered_ops(workload.text):
        return workload.text
    with stepping_scans():  # IREE gets upstream ops only, not the x86 graph's vector scans
        return str(workload.payload(new_context()))


def noop_text(workload: Any) -> str:
    """A module with the entry's signature whose results are uninitialized tensors."""
    from stagegraph.mlir.bindings import func, ir, new_context

    context = new_context()
    module = workload.payload(context)
    with context:
        entry = next(
            op
            for op in module.body.operations
            if isinstance(op, func.FuncOp) and op.name.value == workload.entry
        )
        inputs = [str(t) for t in entry.type.inputs]
        results = list(entry.type.results)
        body = []
        for i, kind in enumerate(results):
            if isinstance(kind, ir.RankedTensorType):
                body.append(f"    %r{i} = tensor.empty() : {kind}")
            elif isinstance(kind, ir.IntegerType | ir.IndexType):
                body.append(f"    %r{i} = arith.constant 0 : {kind}")
            else:
                body.append(f"    %r{i} = arith.constant 0.0 : {kind}")
    arguments = ", ".join(f"%a{i}: {t}" for i, t in enumerate(inputs))
    returned = ", ".join(f"%r{i}" for i in range(len(results)))
    types = ", ".join(str(t) for t in results)
    return "\n".join(
        [
            "module {",
            f"  func.func @{workload.entry}({arguments}) -> ({types}) {{",
            *body,
            f"    return {returned} : {types}" if results else "    return",
            "  }",
            "}",
        ]
    )


def compile_vmfb(text: str, target: str | None, source: str = "payload") -> bytes:
    """The llvm-cpu VM flatbuffer for ``text``.

    Raises:
        PeerCompileError: IREE rejected the payload (its first diagnostics quoted).
    """
    from stagegraph.errors import PeerCompileError

    compiler, _ = import_iree()
    flags = [*target_flags(target), *DATA_TILING]
    try:
        return compiler.compile_str(text, target_backends=["llvm-cpu"], extra_args=flags)
    except compiler.CompilerToolError as exc:
        lines = [ln for ln in str(exc).splitlines() if "error" in ln.lower()]
        detail = "; ".join(lines[:3]) or str(exc).splitlines()[0]
        raise PeerCompileError(f"IREE cannot compile {source}: {detail}") from None


def device_config(threads: int) -> Any:
    """An iree.runtime Config on ``threads`` threads (see the module docstring).

    Raises:
        ConfigError: this process already created IREE's task executor for another count.
    """
    global _task_workers
    _, runtime = import_iree()
    if threads == 1:
        return runtime.Config("local-sync")
    if _task_workers is None:
        runtime.flags.parse_flags(f"--task_topology_group_count={threads}")
        _task_workers = threads
    elif _task_workers != threads:
        raise ConfigError(
            f"IREE's task executor of this process runs {_task_workers} workers; it is "
            f"created once per process, so --threads {threads} needs a new process"
        )
    return runtime.Config("local-task")


def as_list(results: Any) -> list[Any]:
    if results is None:
        return []
    return list(results) if isinstance(results, tuple | list) else [results]


def to_iree(array: np.ndarray, dtype: str) -> np.ndarray:
    """stagegraph's storage of ``dtype`` as IREE wants it (bf16: uint16 bits -> bfloat16)."""
    if dtype == "bf16":
        import ml_dtypes  # a dependency of iree-base-runtime

        return np.ascontiguousarray(array).view(ml_dtypes.bfloat16)
    return np.ascontiguousarray(array)


def to_numpy(value: Any) -> np.ndarray:
    """An IREE result in stagegraph's storage (bfloat16 -> uint16 bits)."""
    array = np.asarray(value.to_host() if hasattr(value, "to_host") else value)
    return array.view(np.uint16) if array.dtype.name == "bfloat16" else array


class OverheadTimer:
    """Per-call timing with the median time of a no-op call subtracted.

    ``call`` and ``noop`` are invoked the same way (same argument objects, same Python
    path), so what the no-op costs is what the call costs besides its work. The clock is
    injectable so that the subtraction can be tested exactly.
    """

    def __init__(
        self,
        call: Callable[[], Any],
        noop: Callable[[], Any],
        clock: Callable[[], float] = time.perf_counter,
        calls: int = OVERHEAD_CALLS,
    ) -> None:
        self.call, self.noop, self.clock = call, noop, clock
        for _ in range(min(calls, 20)):
            noop()
        self.overhead_s = float(np.median(self._time(noop, calls)))

    def _time(self, fn: Callable[[], Any], count: int) -> np.ndarray:
        clock, out = self.clock, np.empty(count)
        for i in range(count):
            start = clock()
            fn()
            out[i] = clock() - start
        return out

    def measure(self, count: int, warmup: int = 0) -> np.ndarray:
        for _ in range(warmup):
            self.call()
        # Never zero or negative: a call is at least as slow as the clock's resolution.
        return np.maximum(self._time(self.call, count) - self.overhead_s, 1e-9)


class IreeMeasurement:
    """The payload compiled and run by IREE, for ``--vs iree`` (interface of
    :class:`~stagegraph.app.bench.NumpyMeasurement`: ``measure``, ``report``, ``verdict``).

    Raises:
        PeerUnavailableError: the ``peers`` extra is missing.
        PeerCompileError: IREE rejected the payload.
        ConfigError: a second thread count in one process.
    """

    def __init__(self, workload: Any, threads: int | None = None, target: str | None = None):
        _, runtime = import_iree()
        self.workload, self.target = workload, target
        self.threads = effective_threads(threads)
        begin = time.perf_counter()
        vmfb = compile_vmfb(payload_text(workload), target, source=workload.spec)
        noop_vmfb = compile_vmfb(noop_text(workload), target, source="the no-op module")
        self.compile_seconds = time.perf_counter() - begin
        self.config = device_config(self.threads)
        self.call_fn = self._load(runtime, vmfb)
        noop_fn = self._load(runtime, noop_vmfb)
        specs = workload.input_specs()
        inputs = [to_iree(x, s.dtype) for x, s in zip(workload.inputs(), specs, strict=True)]
        try:
            outputs = as_list(self.call_fn(*inputs))
            self.verdict = workload.verify([to_numpy(o) for o in outputs])
        except (RuntimeError, ValueError) as exc:
            raise StagegraphError(f"IREE failed to run {workload.spec}: {exc}") from None
        # Inputs uploaded once: the x86 side's timed calls do not copy their inputs either.
        self.device_inputs = [runtime.asdevicearray(self.config.device, x) for x in inputs]
        args: Sequence[Any] = self.device_inputs
        self.timer = OverheadTimer(lambda: self.call_fn(*args), lambda: noop_fn(*args))

    def _load(self, runtime: Any, vmfb: bytes) -> Any:
        context = runtime.SystemContext(config=self.config)
        context.add_vm_module(runtime.VmModule.copy_buffer(context.instance, vmfb))
        return context.modules.module[self.workload.entry]

    @property
    def overhead_s(self) -> float:
        return self.timer.overhead_s

    def measure(self, count: int, warmup: int = 0) -> np.ndarray:
        return self.timer.measure(count, warmup)

    def report(self, samples: np.ndarray | None, threads: int | None = None) -> BenchReport:
        """The report; ``threads`` is ignored: IREE's worker count is fixed at creation."""
        from stagegraph.app.host import host_info

        base = {
            "graph": "iree",
            "workload": self.workload.spec,
            "splice_at": "-",
            "verified": self.verdict.ok,
            "reference": self.workload.reference_source,
            "message": (
                f"{self.verdict.message}; IREE invocation overhead "
                f"{self.overhead_s * 1e6:.1f} us subtracted from each sample"
            ),
            "compile_seconds": self.compile_seconds,
            "threads": self.threads,
            "payload_threads": self.threads,
            "host": host_info(),
        }
        if samples is None or not self.verdict.ok:
            return BenchReport(**base)
        return BenchReport(**base, **timing_fields(samples, self.workload.complexity))
