"""Every registry of names, for ``stagegraph list KIND``: each kind is one
:class:`~stagegraph.core.registry.Registry`, defined beside what it names; this module only
imports those modules so that the index (:func:`~stagegraph.core.registry.registries`) is
complete. A new kind (artifact kinds, ...) adds its module here."""

from __future__ import annotations

import importlib
from typing import Any

from stagegraph.core.registry import Registry, registries
from stagegraph.errors import UnknownNameError, unknown_name_message

#: The modules that define a registry.
MODULES = (
    "stagegraph.core.stage",  # stages, stage-modules
    "stagegraph.core.catalog",  # graphs
    "stagegraph.workload.registry",  # workloads
    "stagegraph.stages.common.costmodel",  # cost-models
    "stagegraph.stages.common.runtime_libs",  # runtime-libraries
    "stagegraph.stages.target",  # targets
    "stagegraph.app.versus",  # peers
    "stagegraph.stages.gpu",  # gpu-targets
)


def all_registries() -> dict[str, Registry[Any]]:
    """Every registry by its plural name (``graphs``, ``cost-models``, ``peers``, ...)."""
    for module in MODULES:
        importlib.import_module(module)
    return registries()


def registry(kind: str) -> Registry[Any]:
    """The registry listed as ``kind``.

    Raises:
        UnknownNameError: no registry of that kind (with a "did you mean").
    """
    found = all_registries()
    if kind not in found:
        raise UnknownNameError(unknown_name_message("registry", kind, found))
    return found[kind]
