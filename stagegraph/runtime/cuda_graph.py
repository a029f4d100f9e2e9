"""Replaying an artifact's launches as one CUDA graph.

A ``cuda`` artifact's host plan is static: the same kernels, grids and buffers every run.
Issued one by one from Python, each launch costs microseconds of host time that a plan of
many small kernels pays in full while the GPU idles between them. Captured once into a
CUDA graph (``cuStreamBeginCapture`` on a stream of its own, the launches and device
copies, ``cuStreamEndCapture``, ``cuGraphInstantiate``), a run is one ``cuGraphLaunch``:
what compiled runtimes do with a fixed command sequence (IREE's CUDA HAL records its
command buffers as graphs). Used for timing only where asked (``gpu_check --graph``): the
launches issued one by one stay the reported default.

Like :mod:`stagegraph.runtime.cuda`, this imports neither MLIR nor pydantic.
"""

from __future__ import annotations

from stagegraph.runtime.cuda import CudaProgram


class GraphReplay:
    """The launches of ``program`` (after its :meth:`~CudaProgram.upload`) captured as a
    graph on a stream of their own; :meth:`time_ms` times replays, :meth:`close` frees."""

    def __init__(self, program: CudaProgram) -> None:
        self.program = program
        call = program._call
        cu = program.cu
        self.stream = call("cuStreamCreate", 1)  # CU_STREAM_NON_BLOCKING
        mode = cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL
        call("cuStreamBeginCapture", self.stream, mode)
        try:
            program.launch_all(self.stream)
        finally:
            self.graph = call("cuStreamEndCapture", self.stream)
        self.instance = call("cuGraphInstantiate", self.graph, 0)

    def launch(self) -> None:
        """One replay of every launch (asynchronous, on the graph's stream)."""
        self.program._call("cuGraphLaunch", self.instance, self.stream)

    def time_ms(self, repeats: int = 20, warmup: int = 3) -> list[float]:
        """Milliseconds per replay, by CUDA events on the graph's stream."""
        call = self.program._call
        start, stop = call("cuEventCreate", 0), call("cuEventCreate", 0)
        times = []
        try:
            for i in range(warmup + repeats):
                call("cuEventRecord", start, self.stream)
                self.launch()
                call("cuEventRecord", stop, self.stream)
                call("cuEventSynchronize", stop)
                if i >= warmup:
                    times.append(float(call("cuEventElapsedTime", start, stop)))
        finally:
            call("cuEventDestroy", start)
            call("cuEventDestroy", stop)
        return times

    def close(self) -> None:
        """Destroy the instance, the graph and the stream."""
        call = self.program._call
        call("cuGraphExecDestroy", self.instance)
        call("cuGraphDestroy", self.graph)
        call("cuStreamDestroy", self.stream)
