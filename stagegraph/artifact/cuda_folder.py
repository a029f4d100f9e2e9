"""Reading a ``cuda`` artifact folder without pydantic or MLIR: manifest, PTX, constants.

A GPU machine has numpy and ``cuda-bindings`` but no pydantic, so what runs there
(``benchmarks/gpu_check.py --run``, ``stagegraph exec`` on a GPU) reads the folder through
:func:`~stagegraph.artifact.manifest_json.load_manifest_dict` (which refuses another schema
version or kind) and hands the plain dicts to :class:`stagegraph.runtime.cuda.CudaProgram`.
The schema itself was checked when the folder was written (``gpu.emit`` builds the manifest
through :class:`~stagegraph.artifact.manifest.CudaManifest`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from stagegraph.artifact.manifest_json import load_manifest_dict
from stagegraph.errors import ArtifactError


@dataclass(frozen=True)
class CudaFolder:
    """A ``cuda`` artifact as the runtime takes it: the manifest (plain dicts), the PTX text
    by module (the kernels' ``ptx`` file stems) and the constant buffers' values by name."""

    directory: Path
    manifest: dict[str, Any]
    ptx: dict[str, str]
    constants: dict[str, np.ndarray]


def load_cuda_folder(directory: str | Path) -> CudaFolder:
    """The ``cuda`` artifact in ``directory``, every file its manifest names read.

    Raises:
        ArtifactError: no manifest, another schema version or kind, or a PTX or constant
            file the manifest names that the folder lacks or cannot be read.
    """
    folder = Path(directory)
    manifest = load_manifest_dict(folder, kind="cuda")
    try:
        files = sorted({k["ptx"] for k in manifest["kernels"]})
        constants = dict(manifest.get("constants", {}))
    except (KeyError, TypeError) as error:
        raise ArtifactError(f"{folder}: the cuda manifest lacks {error}") from None
    absent = [f for f in (*files, *constants.values()) if not (folder / f).is_file()]
    if absent:
        raise ArtifactError(
            f"{folder}: the manifest names {', '.join(absent)}, which the folder lacks; copy "
            "the whole folder the artifact was written to"
        )
    try:
        ptx = {Path(f).stem: (folder / f).read_text() for f in files}
        values = {name: np.load(folder / f, allow_pickle=False) for name, f in constants.items()}
    except (OSError, ValueError, UnicodeDecodeError) as error:
        raise ArtifactError(f"{folder}: cannot read the artifact's files ({error})") from None
    return CudaFolder(folder, manifest, ptx, values)
