"""Ahead-of-time binaries: an object file and a shared library linked by the system ``cc``.

The object comes from the JIT (``ExecutionEngine.dump_to_object_file``, position
independent), so it is exactly the code the JIT would run. The library exports
``_mlir_ciface_<entry>(descriptor*..., scalars...)`` for every entry with a C interface;
signatures are written next to it as ``<lib>.signature.json`` so :meth:`load` can allocate
outputs without the IR. Loading and calling a library does not import the MLIR bindings.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from stagegraph.errors import ToolchainError
from stagegraph.runtime.heap import keep_heap_pages
from stagegraph.runtime.memref import (
    CIFACE_PREFIX,
    CallableBinary,
    Marshalled,
    Signature,
    SignatureError,
)


def emit_object(
    module: Any, path: str | Path, *, opt_level: int = 3, shared_libs: Sequence[str] = ()
) -> Path:
    """Compile an LLVM-dialect module to a position-independent object file at ``path``.

    ``shared_libs`` resolve external symbols (e.g. the OpenMP runtime) while compiling.
    """
    from stagegraph.mlir.bindings import execution_engine
    from stagegraph.runtime.jit import check_llvm_level

    check_llvm_level(module)
    path = Path(path)
    with module.context:
        engine = execution_engine.ExecutionEngine(
            module,
            opt_level=opt_level,
            shared_libs=list(shared_libs),
            enable_object_dump=True,
            enable_pic=True,
        )
        engine.dump_to_object_file(str(path))
    if not path.exists() or path.stat().st_size == 0:
        raise ToolchainError(f"the execution engine wrote no object code to {path}")
    return path


def link_shared(objects: Sequence[str | Path], path: str | Path, *, cc: str | None = None) -> Path:
    """Link objects into a shared library with the system C compiler (``$CC`` or ``cc``)."""
    compiler = cc or os.environ.get("CC", "cc")
    if shutil.which(compiler) is None:
        raise ToolchainError(f"no C compiler {compiler!r} on PATH to link {path}")
    rpaths = [f"-Wl,-rpath,{Path(o).resolve().parent}" for o in objects if ".so" in Path(o).name]
    cmd = [compiler, "-shared", "-o", str(path), *map(str, objects), *rpaths, "-lm"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode:
        raise ToolchainError(f"{' '.join(cmd)} failed:\n{proc.stderr.strip()}")
    return Path(path)


def emit_shared_library(
    module: Any,
    path: str | Path,
    *,
    opt_level: int = 3,
    signatures: Mapping[str, Signature] | None = None,
    shared_libs: Sequence[str] = (),
) -> SharedLibraryBinary:
    """Compile and link ``module`` into ``path`` (a ``.so``) and load it.

    Signatures recorded in the module (see ``record_signature``) are saved alongside.
    """
    from stagegraph.runtime.memref import read_signatures

    path = Path(path)
    with module.context:
        sigs = {**read_signatures(module), **(signatures or {})}
    with tempfile.TemporaryDirectory(prefix="stagegraph-") as tmp:
        obj = emit_object(module, Path(tmp) / "module.o", opt_level=opt_level,
                          shared_libs=shared_libs)  # fmt: skip
        link_shared([obj, *shared_libs], path)
    write_signatures(path, sigs)
    return SharedLibraryBinary(path, sigs)


def write_signatures(library: str | Path, signatures: Mapping[str, Signature]) -> Path:
    """Save ``signatures`` beside ``library`` for :meth:`SharedLibraryBinary.load`."""
    path = signature_path(library)
    path.write_text(
        json.dumps(
            {name: sig.model_dump(mode="json") for name, sig in signatures.items()}, indent=1
        )
    )
    return path


def signature_path(library: str | Path) -> Path:
    """Where the signatures of a library are stored."""
    library = Path(library)
    return library.with_name(library.name + ".signature.json")


class SharedLibraryBinary(CallableBinary):
    """A shared library loaded with ctypes; called like :class:`~stagegraph.runtime.jit.JitBinary`.

    ``key`` is the SHA-256 of the library file.
    """

    def __init__(
        self,
        path: str | Path,
        signatures: Mapping[str, Signature] | None = None,
        symbols: Mapping[str, str] | None = None,
    ):
        self.path = Path(path)
        super().__init__(hashlib.sha256(self.path.read_bytes()).hexdigest())
        keep_heap_pages()
        self.library = ctypes.CDLL(str(self.path.resolve()))
        self.signatures = dict(signatures or {})
        #: entry -> the exported C-interface symbol, where the library renamed it.
        self.symbols = dict(symbols or {})

    @classmethod
    def load(cls, path: str | Path) -> SharedLibraryBinary:
        """Load a library emitted by :func:`emit_shared_library`, with its signatures."""
        sidecar = signature_path(path)
        sigs = {}
        if sidecar.exists():
            data = json.loads(sidecar.read_text())
            sigs = {name: Signature.model_validate(sig) for name, sig in data.items()}
        return cls(path, sigs)

    def function(self, entry: str) -> Any:
        """The ``_mlir_ciface_<entry>`` symbol of the library (or the one it was renamed)."""
        name = self.symbols.get(entry, CIFACE_PREFIX + entry)
        try:
            return getattr(self.library, name)
        except AttributeError:
            raise SignatureError(
                f"{self.path} exports no {name}; set llvm.emit_c_interface "
                "(record_signature) on the entry before lowering"
            ) from None

    def _invoker(self, entry: str, marshalled: Marshalled) -> Callable[[], None]:
        fn = ctypes.CFUNCTYPE(None, *marshalled.argtypes)(
            ctypes.cast(self.function(entry), ctypes.c_void_p).value
        )
        values = marshalled.values

        def run() -> None:
            fn(*values)

        run.marshalled = marshalled  # type: ignore[attr-defined]  # keeps buffers alive
        return run
