"""The engine's persistent stage cache (``Engine(cache_dir=...)``, ``--cache DIR``).

An entry is a folder named by the engine's memo key (stage spec + code versions + input
content hashes) holding ``entry.json`` and one file per output: modules as MLIR bytecode,
Params/Facts as JSON next to their class path. Nothing is pickled. Only stages whose
outputs are all modules, Params or Facts are stored (emit stages give Binary outputs).

Loading checks everything it reads: the format, the key and versions recorded in the entry,
each file's sha256, that the module parses and that the class is an importable Schema that
validates the JSON. A bad entry is reported through ``warn`` and ignored (then rewritten).
"""

from __future__ import annotations

import hashlib
import importlib
import io
import json
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stagegraph.core.ports import LEVELS, Module, Schema

FORMAT = 1
ENTRY = "entry.json"


class CacheEntryError(Exception):
    """Why an entry cannot be used (reported as a warning, never raised to the user)."""


def storable(outputs: dict[str, Any]) -> bool:
    """True when every output can be written without pickling (modules, Params, Facts)."""
    return bool(outputs) and all(isinstance(v, Module | Schema) for v in outputs.values())


class DiskCache:
    """Stage results on disk under ``root``, for one engine's ``versions``."""

    def __init__(self, root: str | Path, versions: str, warn: Callable[[str], None]) -> None:
        self.root = Path(root)
        self.versions = versions
        self.warn = warn

    def folder(self, key: str) -> Path:
        return self.root / key[:2] / key

    def load(self, key: str, context: Any, stage: str) -> tuple[dict, dict] | None:
        """The outputs and their hashes stored under ``key``, or None (missing or bad)."""
        folder = self.folder(key)
        if not (folder / ENTRY).exists():
            return None
        try:
            return self._read(folder, key, context)
        except Exception as exc:  # anything in a bad entry: ignore it, loudly
            reason = str(exc) if isinstance(exc, CacheEntryError) else f"{type(exc).__name__}"
            self.warn(
                f"ignoring cache entry {folder} for stage {stage!r}: {reason}; "
                "computing the stage again"
            )
            return None

    def _read(self, folder: Path, key: str, context: Any) -> tuple[dict, dict]:
        try:
            entry = json.loads((folder / ENTRY).read_text())
        except (OSError, ValueError) as exc:
            raise CacheEntryError(f"unreadable {ENTRY} ({exc})") from None
        if not isinstance(entry, dict) or entry.get("format") != FORMAT:
            raise CacheEntryError(f"not a format-{FORMAT} entry")
        if entry.get("key") != key or entry.get("versions") != self.versions:
            raise CacheEntryError(
                f"written by another version ({entry.get('versions')}, not {self.versions})"
            )
        outputs: dict[str, Any] = {}
        hashes = dict(entry["hashes"])
        for port, info in entry["outputs"].items():
            data = (folder / info["file"]).read_bytes()
            if hashlib.sha256(data).hexdigest() != info["sha256"]:
                raise CacheEntryError(f"{info['file']} does not match its checksum")
            if info["kind"] == "module":
                outputs[port] = _read_module(data, info["level"], context)
            else:
                outputs[port] = _read_schema(data, info["class"])
        if set(hashes) != set(outputs):
            raise CacheEntryError("outputs and hashes disagree")
        return outputs, hashes

    def store(self, key: str, stage: str, outputs: dict[str, Any], hashes: dict[str, str]) -> None:
        """Write an entry atomically (a temporary folder renamed into place)."""
        if not storable(outputs):
            return
        final = self.folder(key)
        tmp = self.root / f".tmp-{uuid.uuid4().hex}"
        try:
            tmp.mkdir(parents=True)
            described = {}
            for port, value in outputs.items():
                if isinstance(value, Module):
                    buffer = io.BytesIO()
                    value.ir.operation.write_bytecode(buffer)
                    data, name = buffer.getvalue(), f"{port}.mlirbc"
                    info = {"kind": "module", "level": value.level}
                else:
                    data, name = value.model_dump_json().encode(), f"{port}.json"
                    cls = type(value)
                    info = {"kind": "schema", "class": f"{cls.__module__}:{cls.__qualname__}"}
                (tmp / name).write_bytes(data)
                described[port] = {**info, "file": name, "sha256": hashlib.sha256(data).hexdigest()}
            entry = {
                "format": FORMAT,
                "key": key,
                "versions": self.versions,
                "stage": stage,
                "outputs": described,
                "hashes": hashes,
            }
            (tmp / ENTRY).write_text(json.dumps(entry, indent=1))
            final.parent.mkdir(parents=True, exist_ok=True)
            if final.exists():
                shutil.rmtree(final, ignore_errors=True)  # a bad entry being replaced
            os.rename(tmp, final)
        except OSError as exc:
            self.warn(f"cannot write cache entry {final} for stage {stage!r}: {exc}")
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)


def _read_module(data: bytes, level: str, context: Any) -> Module:
    from stagegraph.mlir.bindings import ir

    if level not in LEVELS:
        raise CacheEntryError(f"unknown IR level {level!r}")
    try:
        module = ir.Module.parse(data, context)
    except Exception as exc:
        raise CacheEntryError(f"the module does not parse ({str(exc).splitlines()[0]})") from None
    return Module[level](module)


def _read_schema(data: bytes, class_path: str) -> Schema:
    module_name, _, qualname = class_path.partition(":")
    try:
        cls: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            cls = getattr(cls, part)
    except (ImportError, AttributeError, ValueError):
        raise CacheEntryError(f"class {class_path} is not importable") from None
    if not (isinstance(cls, type) and issubclass(cls, Schema)):
        raise CacheEntryError(f"{class_path} is not a stagegraph schema")
    try:
        return cls.model_validate_json(data)
    except ValueError as exc:
        raise CacheEntryError(
            f"{class_path} does not validate ({exc.__class__.__name__})"
        ) from None
