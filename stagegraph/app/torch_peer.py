"""PyTorch as a peer for ``bench --vs torch`` (eager) and ``--vs torch-compile`` (inductor).

The workload's own PyTorch model (a fresh copy in its state before any call) runs on the
workload's inputs, with PyTorch's intra-op threads pinned to ``--threads`` (all usable cores
by default, like the x86 side) for the whole measurement and restored after. Its first
call is verified against the workload's reference (eager PyTorch on the same inputs, so
``--vs torch`` checks the harness and ``--vs torch-compile`` checks inductor). Samples are
taken around the Python call, as a PyTorch user calls a model; under ``torch.no_grad()``.
A ``.mlir`` workload has no PyTorch model to run: it is refused.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from stagegraph.app.bench import BenchReport, timing_fields
from stagegraph.errors import ConfigError, StagegraphError
from stagegraph.stages.target import effective_threads
from stagegraph.workload.torch_eager import to_numpy
from stagegraph.workload.torch_model import TorchWorkload
from stagegraph.workload.torch_source import require_torch

#: ``--vs`` names -> how the model runs.
PEERS = {"torch": "eager", "torch-compile": "inductor"}


class TorchMeasurement:
    """The model run by PyTorch (interface of :class:`~stagegraph.app.bench.NumpyMeasurement`:
    ``measure``, ``report``, ``verdict``).

    Raises:
        ConfigError: the workload has no PyTorch module (a ``.mlir`` file, a built-in).
        TorchUnavailableError: the ``torch`` extra is missing.
        StagegraphError: the model fails to run (or inductor fails to compile it).
    """

    def __init__(self, workload: Any, threads: int | None = None, peer: str = "torch") -> None:
        if not isinstance(workload, TorchWorkload):
            raise ConfigError(
                f"--vs {peer}: the workload {workload.spec} has no PyTorch module to run; "
                f"give a PyTorch workload (FILE.py or package.module:factory)"
            )
        self.torch = require_torch(f"--vs {peer}")
        self.workload, self.peer = workload, peer
        self.threads = effective_threads(threads)
        model = workload.torch_model()
        self.inputs = [
            x.clone() if isinstance(x, self.torch.Tensor) else x for x in workload.torch_inputs()
        ]
        begin = time.perf_counter()
        with self.pinned():
            self.fn = model if PEERS[peer] == "eager" else self.torch.compile(model)
            try:
                outputs = self._call()  # inductor compiles here
            except Exception as exc:
                raise StagegraphError(
                    f"--vs {peer}: PyTorch failed to run {workload.spec}: "
                    f"{type(exc).__name__}: {str(exc).strip().splitlines()[0:1]}"
                ) from None
        self.compile_seconds = time.perf_counter() - begin
        from torch.utils._pytree import tree_leaves

        self.verdict = workload.verify_outputs([to_numpy(t) for t in tree_leaves(outputs)])

    def _call(self) -> Any:
        with self.torch.no_grad():
            return self.fn(*self.inputs)

    @contextlib.contextmanager
    def pinned(self) -> Iterator[None]:
        """PyTorch's intra-op pool at ``self.threads`` (the previous count restored)."""
        before = self.torch.get_num_threads()
        self.torch.set_num_threads(self.threads)
        try:
            yield
        finally:
            self.torch.set_num_threads(before)

    def measure(self, count: int, warmup: int = 0) -> np.ndarray:
        out = np.empty(count)
        fn, inputs, no_grad = self.fn, self.inputs, self.torch.no_grad
        with self.pinned(), no_grad():
            for _ in range(warmup):
                fn(*inputs)
            for i in range(count):
                start = time.perf_counter()
                fn(*inputs)
                out[i] = time.perf_counter() - start
        return out

    def report(self, samples: np.ndarray | None, threads: int | None = None) -> BenchReport:
        """The report; ``threads`` is ignored: the thread count is fixed at creation."""
        from stagegraph.app.host import host_info

        base = {
            "graph": self.peer,
            "workload": self.workload.spec,
            "splice_at": "-",
            "verified": self.verdict.ok,
            "message": f"PyTorch {self.torch.__version__} ({PEERS[self.peer]}): "
            f"{self.verdict.message}",
            "compile_seconds": self.compile_seconds,
            "threads": self.threads,
            "host": host_info(),
        }
        if samples is None or not self.verdict.ok:
            return BenchReport(**base)
        return BenchReport(**base, **timing_fields(samples, self.workload.complexity))


def eager_measurement(session: Any) -> TorchMeasurement:
    """``--vs torch``: the workload's PyTorch model, eager, on the session's threads."""
    return TorchMeasurement(session.workload, session.request.threads, "torch")


def inductor_measurement(session: Any) -> TorchMeasurement:
    """``--vs torch-compile``: the model through ``torch.compile`` (inductor, default mode)."""
    return TorchMeasurement(session.workload, session.request.threads, "torch-compile")


def check_torch() -> None:
    """A missing ``torch`` extra fails before anything compiles."""
    require_torch("--vs torch")
