"""Running a CPU artifact from its folder alone: no IR, no compiler, no MLIR bindings.

:class:`CpuArtifact` reads the manifest, refuses a host that lacks the target's ISA
features before anything is loaded, loads the library with ctypes, checks the caller's
arrays against the manifest and allocates the outputs. It is what ``stagegraph exec`` runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from stagegraph.artifact.manifest import CpuManifest, Value, load_manifest
from stagegraph.dtypes import numpy_dtype
from stagegraph.errors import ArtifactError, TargetNotRunnableError
from stagegraph.runtime.memref import Arg, Signature


def missing_isa(manifest: CpuManifest, host_isa: frozenset[str]) -> list[str]:
    """The target's ISA features this host lacks (sorted; empty: it can run the code)."""
    return sorted(set(manifest.target.isa) - host_isa)


def signature_of(manifest: CpuManifest) -> Signature:
    """The calling convention the runtime marshals, rebuilt from the manifest."""
    values = sorted((*manifest.arguments, *manifest.results), key=lambda v: v.position)
    outputs = {v.name for v in manifest.results}
    return Signature(
        entry=manifest.name,
        args=tuple(Arg(dtype=v.dtype, shape=v.shape, output=v.name in outputs) for v in values),
    )


class CheckedInputs:
    """What every artifact kind shares: ``directory``, ``manifest`` (its ``arguments``) and
    checking the caller's arrays against them before anything runs."""

    directory: Path
    manifest: Any

    def check_inputs(self, inputs: Sequence[Any], sources: Sequence[str] = ()) -> list[Any]:
        """The inputs as the call takes them, after checking each against the manifest.

        ``sources`` name where each input came from (its file), for the message.

        Raises:
            ArtifactError: a wrong count, dtype or shape (naming the argument and source).
        """
        specs = sorted(self.manifest.arguments, key=lambda v: v.position)
        if len(inputs) != len(specs):
            names = ", ".join(v.name for v in specs) or "none"
            raise ArtifactError(
                f"{self.directory}: the artifact takes {len(specs)} inputs ({names}), "
                f"got {len(inputs)}"
            )
        return [
            _checked(spec, value, sources[i] if i < len(sources) else f"input #{i}")
            for i, (spec, value) in enumerate(zip(specs, inputs, strict=True))
        ]


class CpuArtifact(CheckedInputs):
    """A loaded CPU artifact folder.

    Args:
        directory: the folder ``stagegraph compile -o`` wrote.
        host_isa: the ISA features of this host; a target feature missing from it refuses
            the artifact before its library is loaded (running it would die of SIGILL).

    Raises:
        ArtifactError: no or another version of manifest, or a missing/unloadable library.
        TargetNotRunnableError: the host lacks ISA features the code was built for.
    """

    def __init__(self, directory: str | Path, host_isa: frozenset[str]) -> None:
        from stagegraph.runtime.shared import SharedLibraryBinary

        self.directory = Path(directory)
        manifest = load_manifest(self.directory, kind="cpu")
        assert isinstance(manifest, CpuManifest)
        self.manifest = manifest
        missing = missing_isa(manifest, host_isa)
        if missing:
            raise TargetNotRunnableError(
                f"{self.directory}: the artifact was built for target {manifest.target.name!r}, "
                f"and this host lacks {', '.join(missing)}; rebuild it for a target this host "
                "runs (stagegraph compile --target host)"
            )
        library = self.directory / manifest.library
        absent = [
            name
            for name in (manifest.library, *(r.file for r in manifest.runtime if r.file))
            if not (self.directory / name).is_file()
        ]
        if absent:
            raise ArtifactError(
                f"{self.directory}: the manifest names {', '.join(absent)}, which the folder "
                "lacks; copy the whole folder the artifact was written to"
            )
        self.signature = signature_of(manifest)
        try:
            self.binary = SharedLibraryBinary(
                library,
                {manifest.name: self.signature},
                {manifest.name: manifest.entry.ciface_symbol},
            )
        except OSError as error:
            raise ArtifactError(f"{library}: cannot be loaded ({error})") from None
        self.binary.function(manifest.name)  # a library without the entry fails here

    def call(self, inputs: Sequence[Any]) -> list[np.ndarray]:
        """Run the entry on checked ``inputs``; returns freshly allocated outputs in order."""
        return self.binary.call(self.manifest.name, inputs)

    def bind(self, inputs: Sequence[Any]) -> tuple[Callable[[], None], list[np.ndarray]]:
        """A zero-argument call on fixed buffers (for timing), and the outputs it writes."""
        args, outputs = self.signature.assemble(inputs)
        return self.binary.bind(self.manifest.name, args), outputs


def _checked(spec: Value, value: Any, source: str) -> Any:
    array = np.asarray(value)
    expected = numpy_dtype(spec.dtype)
    if array.dtype != expected:
        raise ArtifactError(
            f"{source}: {spec.name} has dtype {array.dtype}, but the artifact takes "
            f"{spec.dtype} ({expected}{' bit patterns' if spec.dtype == 'bf16' else ''})"
        )
    shape = () if spec.shape is None else tuple(spec.shape)
    if array.shape != shape:
        raise ArtifactError(
            f"{source}: {spec.name} has shape {array.shape}, but the artifact takes {shape}"
        )
    return array
