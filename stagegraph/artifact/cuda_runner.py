"""Running a ``cuda`` artifact folder for ``stagegraph exec``: validate, then need a GPU.

:class:`CudaArtifact` has the interface ``exec`` uses for a CPU artifact
(:class:`~stagegraph.artifact.runner.CpuArtifact`: ``manifest``, ``check_inputs``, ``call``,
``bind``), so checking, saving and timing the results is shared. It validates the manifest
against :class:`~stagegraph.artifact.manifest.CudaManifest` first, so a broken folder is
named as such on any machine; only then does it ask for a GPU, and without one refuses
(:class:`~stagegraph.errors.GpuUnavailableError`, exit 2). The GPU work itself is
:class:`stagegraph.runtime.cuda.CudaProgram` on the folder's plain dicts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from stagegraph.artifact.cuda_folder import load_cuda_folder
from stagegraph.artifact.manifest import CudaManifest, load_manifest
from stagegraph.artifact.runner import CheckedInputs
from stagegraph.errors import GpuUnavailableError


class CudaArtifact(CheckedInputs):
    """A loaded ``cuda`` artifact folder, on the first GPU of this machine.

    Raises:
        ArtifactError: no or another version of manifest, a manifest the schema refuses,
            or a PTX or constant file missing from the folder.
        GpuUnavailableError: the folder is valid but this machine has no usable GPU.
    """

    def __init__(self, directory: str | Path) -> None:
        from stagegraph.runtime.cuda import driver

        self.directory = Path(directory)
        manifest = load_manifest(self.directory, kind="cuda")
        assert isinstance(manifest, CudaManifest)
        self.manifest = manifest
        self.folder = load_cuda_folder(self.directory)
        try:
            driver()
        except GpuUnavailableError as error:
            raise GpuUnavailableError(
                f"{self.directory}: a cuda artifact (PTX for {manifest.target.name}) needs an "
                f"NVIDIA GPU to run, and this machine has none usable ({error}). Copy the "
                "folder to a GPU machine and run `stagegraph exec` or "
                "`benchmarks/gpu_check.py --run` there"
            ) from None
        self._programs: list[Any] = []

    def _program(self) -> Any:
        from stagegraph.runtime.cuda import CudaProgram

        folder = self.folder
        program = CudaProgram(folder.manifest, folder.ptx, folder.constants)
        self._programs.append(program)
        return program

    def call(self, inputs: Sequence[Any]) -> list[np.ndarray]:
        """Upload ``inputs`` (checked), run the plan, return the results."""
        program = self._program()
        try:
            return program.run([np.asarray(x) for x in inputs])
        finally:
            program.close()
            self._programs.remove(program)

    def bind(self, inputs: Sequence[Any]) -> tuple[Callable[[], None], list[np.ndarray]]:
        """A zero-argument call on uploaded inputs (the launches, then a synchronize), for
        timing; its buffers stay on the GPU until :meth:`close`."""
        program = self._program()
        program.upload([np.asarray(x) for x in inputs])

        def run() -> None:
            program.launch_all()
            program.synchronize()

        return run, []

    def close(self) -> None:
        """Free what :meth:`bind` left on the GPU."""
        while self._programs:
            self._programs.pop().close()
