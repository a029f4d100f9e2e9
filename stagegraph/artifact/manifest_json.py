"""The manifest's JSON without pydantic: file name, schema version, kinds, and a reader.

A manifest is one JSON object (plain dicts, lists, strings and numbers). Every manifest has
``schema_version`` (an int, :data:`SCHEMA_VERSION`) and ``kind`` (``"cpu"`` or ``"cuda"``);
the remaining keys depend on the kind and are specified by the models of
:mod:`stagegraph.artifact.manifest` and in ``docs/guides/c-abi.md``. This module uses the
standard library only, so a runtime on a machine without pydantic (a GPU host) can read a
manifest with :func:`load_manifest_dict` and index the dict directly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from stagegraph.errors import ArtifactError

#: The manifest's file name inside an artifact folder.
MANIFEST_NAME = "manifest.json"
#: Bumped whenever a key changes meaning or a required key is added.
SCHEMA_VERSION = 1
#: The kinds of code a manifest describes.
KINDS = ("cpu", "cuda")


def manifest_path(location: str | Path) -> Path:
    """The manifest of an artifact folder (or the manifest file itself)."""
    path = Path(location)
    return path / MANIFEST_NAME if path.is_dir() else path


def load_manifest_dict(location: str | Path, kind: str | None = None) -> dict[str, Any]:
    """The manifest of the artifact folder (or file) ``location`` as a plain dict, after
    checking its schema version and kind (``kind``: the one the caller runs, if it cares).

    Raises:
        ArtifactError: no manifest, not JSON, another schema version or an unknown kind.
    """
    path = manifest_path(location)
    if not path.is_file():
        raise ArtifactError(f"{location}: no {MANIFEST_NAME} (is it an artifact folder?)")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ArtifactError(f"{path}: not a readable JSON manifest ({error})") from None
    if not isinstance(data, dict):
        raise ArtifactError(f"{path}: a manifest is a JSON object, got {type(data).__name__}")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ArtifactError(
            f"{path}: manifest schema version {version!r}, but this stagegraph reads version "
            f"{SCHEMA_VERSION}; rebuild the artifact with this stagegraph (stagegraph compile)"
        )
    found = data.get("kind")
    if found not in KINDS:
        raise ArtifactError(f"{path}: unknown artifact kind {found!r}; known: {', '.join(KINDS)}")
    if kind is not None and found != kind:
        raise ArtifactError(f"{path}: a {found!r} artifact, but this runner runs {kind!r} ones")
    return data
