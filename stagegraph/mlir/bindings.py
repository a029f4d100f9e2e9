"""The only module that imports the MLIR Python bindings.

Prefers the official top-level ``mlir`` package and falls back to the copy that the
``torch-mlir`` wheel ships as ``torch_mlir``. Importing :mod:`stagegraph` never imports
this module; stages import it when they run.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING


def _root() -> str:
    for candidate in ("mlir", "torch_mlir"):
        try:
            importlib.import_module(f"{candidate}.ir")
        except ImportError:
            continue
        return candidate
    raise ImportError(
        "stagegraph needs MLIR Python bindings: install 'torch-mlir==20261001' "
        "(it ships them as torch_mlir) or the official 'mlir' package"
    )


ROOT = _root()


def _load(name: str) -> ModuleType:
    return importlib.import_module(f"{ROOT}.{name}")


ir = _load("ir")
passmanager = _load("passmanager")


def _prefer_light_op_views() -> None:
    """Search :mod:`stagegraph.mlir.op_views` for a dialect's op classes before the
    bindings' own dialect modules (once per process; see that package)."""
    from importlib.util import find_spec

    light = "stagegraph.mlir.op_views"
    globals_ = _load("_mlir_libs._mlir").globals
    searched = list(globals_.dialect_search_modules)
    if light not in searched and find_spec(light) is not None:
        globals_.dialect_search_modules = [light, *searched]


_prefer_light_op_views()


def dialect(name: str) -> ModuleType:
    """``<root>.dialects.<name>``, e.g. ``dialect("transform.structured")``."""
    return _load(f"dialects.{name}")


#: Modules by attribute name, imported on first use (module ``__getattr__``): importing
#: all of them costs ~0.5 s, which a command that only parses and analyses a payload
#: (``tune --explain``) need not pay. ``linalg`` in particular builds hundreds of OpDSL op
#: definitions on import; ``linalg_native`` (the C++ queries: indexing maps, contraction and
#: convolution inference, ``fill_builtin_region``), ``linalg_enums`` (``IteratorType``) and
#: ``linalg_ops`` (the generated op classes: ``GenericOp``, ``YieldOp``) are what analysing
#: and building ops need, at a fraction of the cost. ``llvm_types`` likewise gives the LLVM
#: dialect's type classes without its op classes (0.06 s).
_LAZY = {
    "execution_engine": "execution_engine",
    "runtime": "runtime",
    "linalg_native": "_mlir_libs._mlirDialectsLinalg",
    "linalg_enums": "dialects._linalg_enum_gen",
    "linalg_ops": "dialects._linalg_ops_gen",
    "llvm_types": "_mlir_libs._mlirDialectsLLVM",  # ArrayType, StructType, ...: no op classes
}
_DIALECTS = {
    "affine": "affine",
    "arith": "arith",
    "bufferization": "bufferization",
    "func": "func",
    "gpu": "gpu",
    "linalg": "linalg",
    "llvm": "llvm",
    "memref": "memref",
    "nvgpu": "nvgpu",
    "nvvm": "nvvm",
    "scf": "scf",
    "tensor": "tensor",
    "vector": "vector",
    "transform": "transform",
    "structured": "transform.structured",
    "loop": "transform.loop",
    "interpreter": "transform.interpreter",
}


def __getattr__(name: str) -> ModuleType:
    if name in _LAZY:
        module = _load(_LAZY[name])
    elif name in _DIALECTS:
        module = dialect(_DIALECTS[name])
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = module
    return module


if TYPE_CHECKING:
    from torch_mlir import execution_engine, runtime  # noqa: F401
    from torch_mlir._mlir_libs import _mlirDialectsLinalg as linalg_native  # noqa: F401
    from torch_mlir._mlir_libs import _mlirDialectsLLVM as llvm_types  # noqa: F401
    from torch_mlir.dialects import _linalg_enum_gen as linalg_enums  # noqa: F401
    from torch_mlir.dialects import _linalg_ops_gen as linalg_ops  # noqa: F401
    from torch_mlir.dialects import (  # noqa: F401  (for type checkers; loaded lazily)
        affine,
        arith,
        bufferization,
        func,
        linalg,
        llvm,
        memref,
        nvgpu,
        nvvm,
        scf,
        tensor,
        transform,
        vector,
    )
    from torch_mlir.dialects.transform import interpreter, loop, structured  # noqa: F401


def new_context() -> ir.Context:
    """A context with every upstream dialect available and errors raised as MLIRError."""
    context = ir.Context()
    context.emit_error_diagnostics = True
    context.load_all_available_dialects()
    return context


def binding_version() -> str:
    """Version string of the bindings, part of every cache key."""
    from importlib import metadata

    for dist in ("mlir", "mlir-python-bindings", "torch-mlir"):
        try:
            return f"{dist}=={metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            continue
    return ROOT
