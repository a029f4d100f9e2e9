"""The ``.npz`` beside a ``.mlir`` payload: its inputs (``in0..``) and reference
(``mut0..`` then ``out0..``), read and checked against the entry's signature.

Why a module of its own: numpy reports a broken file in its own words ("pickled data",
"File is not a zip file", an ``EOFError`` that click would turn into a bare "aborted"), and
a reference of the wrong shape or dtype surfaces only after a full compile and run, as a
broadcast error deep in the verifier. Here every such file is refused up front, with a
message naming the file, the array and the entry's argument or result it should match.
Headers are read without loading the arrays (KernelBench references reach hundreds of MB).
"""

from __future__ import annotations

import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from stagegraph.errors import PayloadError
from stagegraph.workload.tensors import TensorSpec

INPUT_PREFIXES = ("in",)
#: Training-mode norms return updated running statistics (``mut0..``) before the outputs.
REFERENCE_PREFIXES = ("mut", "out")

Header = tuple[tuple[int, ...], np.dtype]


def read_headers(path: Path) -> dict[str, Header]:
    """Shape and dtype of every array of the npz at ``path``, without reading the data.

    Raises:
        PayloadError: the file is empty, not a zip archive, holds something other than
            ``.npy`` arrays, or an array needs pickle (object arrays are never loaded).
    """
    headers: dict[str, Header] = {}
    try:
        with zipfile.ZipFile(path) as archive:
            for member in archive.namelist():
                if not member.endswith(".npy"):
                    raise PayloadError(f"{path}: member {member!r} is not a .npy array")
                with archive.open(member) as handle:
                    version = np.lib.format.read_magic(handle)
                    shape, _, dtype = _read_header(handle, version)
                if dtype.hasobject:
                    raise PayloadError(
                        f"{path}: array {member[:-4]!r} holds Python objects (pickled data), "
                        "which stagegraph never loads; store numeric arrays"
                    )
                headers[member[:-4]] = (tuple(int(d) for d in shape), dtype)
    except PayloadError:
        raise
    except (OSError, EOFError, ValueError, zipfile.BadZipFile) as exc:
        size = path.stat().st_size if path.exists() else 0
        what = "is empty" if size == 0 else f"is not a readable .npz archive ({exc})"
        raise PayloadError(
            f"{path} {what}; the .npz beside a payload holds its inputs in0.. and its "
            "reference out0.. (numpy.savez); delete it to use another reference"
        ) from None
    return headers


def _read_header(handle: object, version: tuple[int, int]) -> tuple:
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(handle)
    return np.lib.format.read_array_header_2_0(handle)


def names(headers: dict[str, Header], prefixes: Sequence[str]) -> list[str]:
    """``prefix0, prefix1, ..`` for each prefix in order, as far as they are numbered."""
    found = []
    for prefix in prefixes:
        index = 0
        while f"{prefix}{index}" in headers:
            found.append(f"{prefix}{index}")
            index += 1
    return found


def check_arrays(
    path: Path,
    headers: dict[str, Header],
    prefixes: Sequence[str],
    specs: Sequence[TensorSpec],
    entry: str,
    what: str,
) -> list[str]:
    """The names of the arrays standing for ``specs`` (arguments or results of ``entry``),
    after checking their count, shapes and dtypes.

    Raises:
        PayloadError: a count, shape or dtype that differs from the signature.
    """
    found = names(headers, prefixes)
    pattern = "/".join(p + "N" for p in prefixes)
    if len(found) != len(specs):
        listing = ", ".join(found) or "(none)"
        raise PayloadError(
            f"{path}: has {len(found)} arrays {listing} named {pattern}, but @{entry} has "
            f"{len(specs)} {what}s"
        )
    for index, (name, spec) in enumerate(zip(found, specs, strict=True)):
        shape, dtype = headers[name]
        if shape != tuple(spec.shape) or dtype != spec.numpy_dtype:
            raise PayloadError(
                f"{path}: {name} is {dtype}{list(shape)} but {what} #{index} of @{entry} is "
                f"{spec.dtype}{list(spec.shape)} (stored as {spec.numpy_dtype}); shapes and "
                "dtypes must match exactly"
            )
    return found


def load_arrays(path: Path, names_: Sequence[str]) -> list[np.ndarray]:
    """The named arrays (never unpickling).

    Raises:
        PayloadError: the archive is damaged past its headers.
    """
    try:
        with np.load(path, allow_pickle=False) as data:
            return [data[n] for n in names_]
    except (OSError, EOFError, ValueError, zipfile.BadZipFile) as exc:
        raise PayloadError(f"{path}: cannot read its arrays: {exc}") from None
