"""stagegraph: MLIR lowering flows as typed graphs of named stages.

``import stagegraph as sg`` gives the public API; every name is imported on first use (module
``__getattr__``), so ``import stagegraph`` stays fast and loads no MLIR::

    import stagegraph as sg

    report = sg.run("x86", "matmul:m=64,n=64,k=64", param={"tile_m": 32})
    comparison = sg.bench("x86", "matmul:m=64,n=64,k=64", budget=2, vs="numpy", threads=1)

Building graphs: :class:`Graph`, :class:`GraphInput`, :func:`stage`, the port types
:class:`Module`, :class:`Params`, :class:`Facts`, :class:`Config`, :class:`Binary`,
:class:`WorkloadRef`; tuning them: :func:`declare_space` (with :class:`Range`,
:class:`Choice`, :class:`TuningSite`); running them:
:class:`Engine`, :func:`run`, :func:`bench`, :func:`tune`; PyTorch in: :func:`from_torch`,
:func:`compile`, :func:`torch_backend`; names: :func:`load_graph`,
:func:`parse_workload`, :class:`Workload`; extending: :func:`register_graph`,
:func:`register_workload`, :func:`register_cost_model`, :func:`load_plugin`. Everything else
lives in the subpackages (``stagegraph.core``, ``stagegraph.app``, ...).
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

#: Public name -> the module that defines it.
_EXPORTS = {
    "Graph": "stagegraph.core.graph",
    "GraphInput": "stagegraph.core.graph",
    "stage": "stagegraph.core.stage",
    "Engine": "stagegraph.core.engine",
    "Module": "stagegraph.core.ports",
    "Params": "stagegraph.core.ports",
    "Facts": "stagegraph.core.ports",
    "Config": "stagegraph.core.ports",
    "Workload": "stagegraph.workload.base",
    "load_graph": "stagegraph.core.catalog",
    "parse_workload": "stagegraph.workload.registry",
    "run": "stagegraph.api",
    "bench": "stagegraph.api",
    "build_artifact": "stagegraph.api",
    "register_graph": "stagegraph.core.catalog",
    "register_workload": "stagegraph.workload.registry",
    "register_cost_model": "stagegraph.stages.common.costmodel",
    "load_plugin": "stagegraph.core.plugins",
    "StagegraphError": "stagegraph.errors",
    "Binary": "stagegraph.core.ports",
    "WorkloadRef": "stagegraph.core.ports",
    "declare_space": "stagegraph.core.tunable",
    "Range": "stagegraph.core.tunable",
    "Choice": "stagegraph.core.tunable",
    "TuningSite": "stagegraph.core.tunable",
    "from_torch": "stagegraph.api",
    "compile": "stagegraph.api",
    "torch_backend": "stagegraph.api",
}
_RENAMED = {"register_workload": "register"}

__all__ = [
    "Binary",
    "Choice",
    "Config",
    "Engine",
    "Facts",
    "Graph",
    "GraphInput",
    "Module",
    "Params",
    "Range",
    "StagegraphError",
    "TuningSite",
    "Workload",
    "WorkloadRef",
    "bench",
    "build_artifact",
    "compile",
    "declare_space",
    "from_torch",
    "load_graph",
    "load_plugin",
    "parse_workload",
    "register_cost_model",
    "register_graph",
    "register_workload",
    "run",
    "stage",
    "torch_backend",
    "tune",
]

if TYPE_CHECKING:
    from stagegraph.api import (
        bench,
        build_artifact,
        compile,
        from_torch,
        run,
        torch_backend,
        tune,
    )
    from stagegraph.core.catalog import load_graph, register_graph
    from stagegraph.core.engine import Engine
    from stagegraph.core.graph import Graph, GraphInput
    from stagegraph.core.plugins import load_plugin
    from stagegraph.core.ports import Binary, Config, Facts, Module, Params, WorkloadRef
    from stagegraph.core.stage import stage
    from stagegraph.core.tunable import Choice, Range, TuningSite, declare_space
    from stagegraph.errors import StagegraphError
    from stagegraph.stages.common.costmodel import register_cost_model
    from stagegraph.workload.base import Workload
    from stagegraph.workload.registry import parse_workload
    from stagegraph.workload.registry import register as register_workload


#: The packages whose import registers the built-in entries (the stage library's modules,
#: and each target package its cost models and hooks). Every registry imports them before it
#: first answers (:func:`stagegraph.core.registry.load_providers`), so core names no stage
#: package, and ``import stagegraph`` stays lazy.
PROVIDERS = ("stagegraph.stages",)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'stagegraph' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), _RENAMED.get(name, name))
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


class _Package(types.ModuleType):
    """``stagegraph.tune`` is both the function :func:`stagegraph.api.tune` and the tuner's
    subpackage. Importing the subpackage sets the package attribute ``tune`` to it, which
    would shadow the function after the first tuning run; the property keeps the function
    as the attribute (``sg.tune(...)``) while ``import stagegraph.tune.runner`` and
    ``from stagegraph.tune.runner import ...`` still reach the subpackage (they go through
    ``sys.modules``)."""

    @property
    def tune(self) -> Any:
        return importlib.import_module("stagegraph.api").tune

    @tune.setter
    def tune(self, module: types.ModuleType) -> None:
        self.__dict__["_tune_package"] = module  # what the import system sets


sys.modules[__name__].__class__ = _Package
