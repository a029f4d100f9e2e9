"""Workloads by name: ``NAME[:key=value,...]`` specs (lists written with ``-``, e.g.
``mlp:batch=64,widths=256-512-256``), the path of a ``.mlir`` file, or a PyTorch model: a
problem file ``FILE.py[:name=value,...]`` or ``package.module:factory``
(:mod:`.torch_model`).

Workload classes live in the ``stagegraph.workloads`` package; each module there registers
its classes with :func:`register`, and the package is imported only when a name is first
looked up. ``.mlir`` files shipped in that package are registered under their stem.
"""

from __future__ import annotations

import importlib
import pkgutil
import typing
from pathlib import Path
from typing import Any

from stagegraph.core.registry import Registry
from stagegraph.errors import UnknownWorkloadError, WorkloadParamError, did_you_mean
from stagegraph.workload.base import Workload, WorkloadParams
from stagegraph.workload.torch_source import is_factory_spec

PACKAGE = "stagegraph.workloads"


# ---------------------------------------------------------------- registry

_discovered = False


def _discover() -> None:
    """Import every module of the workloads package and index its ``.mlir`` files (once)."""
    global _discovered
    if _discovered:
        return
    _discovered = True
    package = importlib.import_module(PACKAGE)
    for info in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{PACKAGE}.{info.name}")
    for folder in package.__path__:
        for path in sorted(Path(folder).glob("*.mlir")):
            WORKLOADS.add_shipped(path.stem, path, f"the payload {path.name}")


#: Workload names: the classes of the ``stagegraph.workloads`` package and of plugins
#: (:func:`register`), and the package's ``.mlir`` payloads under their stem.
WORKLOADS: Registry[type[Workload] | Path] = Registry(
    "workload", error=UnknownWorkloadError, discover=_discover
)


def register(cls: type[Workload]) -> type[Workload]:
    """Class decorator: make ``cls`` available under ``cls.name`` in specs.

    Raises:
        TypeError: ``cls`` is no :class:`Workload` subclass or has no ``name``.
        DuplicateNameError: another class (or a shipped ``.mlir`` payload) has the name; the
            same class again (a re-import of its module) is no clash.
    """
    if not (isinstance(cls, type) and issubclass(cls, Workload)):
        raise TypeError(f"register_workload needs a Workload subclass, got {cls!r}")
    if not cls.name:
        raise TypeError(f"{cls.__qualname__} has no 'name'")
    if cls.__module__ != PACKAGE and not cls.__module__.startswith(PACKAGE + "."):
        _discover()  # a user class must not shadow a shipped one registered later
    return WORKLOADS.register(cls.name, cls)


def list_workloads() -> list[str]:
    """Names usable in specs (Python workloads and the package's .mlir files)."""
    return WORKLOADS.names()


def workload_class(name: str) -> type[Workload]:
    """The class registered under ``name``."""
    entry = WORKLOADS.entry(name)
    if isinstance(entry, Path):
        raise WORKLOADS.unknown(name)
    return entry


# ---------------------------------------------------------------- spec parsing


def parse_workload(text: str) -> Workload:
    """Build a workload from ``NAME[:key=value,...]``, a ``.mlir`` path, a PyTorch problem
    file ``FILE.py[:name=value,...]`` or ``package.module:factory``.

    Raises:
        UnknownWorkloadError: no workload of that name and no such ``.mlir`` file.
        WorkloadParamError: an unknown key, a repeated key or an invalid value.
        PayloadError: the ``.mlir`` file cannot be parsed or has dynamic shapes.
    """
    text = text.strip()
    head, _, rest = text.partition(":")
    if head.endswith(".py"):
        from stagegraph.workload.torch_model import parse_problem_spec

        return parse_problem_spec(text)
    if text.endswith(".mlir") or head.endswith(".mlir"):
        from stagegraph.workload.mlir_file import MlirFileWorkload

        path = Path(text if text.endswith(".mlir") else head)
        if not path.is_file():
            raise UnknownWorkloadError(f"mlir file workload: no such file {str(path)!r}")
        values = _split(path.stem, MlirFileWorkload.Params, rest if head != text else "")
        return MlirFileWorkload(path, **values)
    if head not in WORKLOADS.names() and is_factory_spec(text):
        from stagegraph.workload.torch_model import parse_factory_spec

        return parse_factory_spec(text)
    found = WORKLOADS.entry(head)
    if isinstance(found, Path):
        from stagegraph.workload.mlir_file import MlirFileWorkload

        return MlirFileWorkload(found, **_split(head, MlirFileWorkload.Params, rest))
    return found(**_split(head, found.Params, rest))


def _split(name: str, params: type[WorkloadParams], text: str) -> dict[str, Any]:
    """``key=value,...`` -> raw values (lists split on '-'); pydantic validates them."""
    values: dict[str, Any] = {}
    if not text:
        return values
    fields = params.model_fields
    names = [*(f for f in fields if f != "seed"), "seed"]
    for item in text.split(","):
        key, eq, value = (part.strip() for part in item.partition("="))
        if not eq or not key:
            raise WorkloadParamError(
                f"workload {name!r}: expected key=value, got {item!r} in {text!r}"
            )
        if key not in fields:
            raise WorkloadParamError(
                f"workload {name!r} has no parameter {key!r}{did_you_mean(key, fields)}; "
                f"parameters: {', '.join(names)}"
            )
        if key in values:
            raise WorkloadParamError(f"workload {name!r}: parameter {key!r} given twice")
        is_list = typing.get_origin(fields[key].annotation) in (list, tuple)
        values[key] = value.split("-") if is_list and value else value
    return values
