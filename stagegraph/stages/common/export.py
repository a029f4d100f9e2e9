"""Exporting an LLVM-level module with a C ABI: the object file, the shared library, the
header, and the facts a manifest records about them.

One function, :func:`export_module`, serves the ``object`` and ``shared`` emit stages and
the ``artifact`` emit stage (every file at once): the entry is exported under a chosen C
symbol and nothing else is global, so ``--emit object|shared`` is an artifact with fewer
files. The OpenMP runtime is copied next to a shared library that needs it (found through
``$ORIGIN``); glibc's ``libm``/``libmvec`` come from the system.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stagegraph.artifact.cabi import (
    ciface_symbol,
    header_source,
    manifest_values,
    wrapper_source,
)
from stagegraph.artifact.manifest import C_IDENTIFIER, CpuTarget, RuntimeLibrary, Value
from stagegraph.artifact.toolchain import export_object, link_library
from stagegraph.errors import ArtifactError, ConfigError
from stagegraph.runtime.memref import Signature

#: Prefixes an exported symbol may not take: MLIR's generated names live there.
_RESERVED = ("_mlir_",)


@dataclass
class Exported:
    """What :func:`export_module` wrote and what a manifest says about it."""

    entry: str
    symbol: str
    ciface: str
    signature: Signature
    arguments: tuple[Value, ...]
    results: tuple[Value, ...]
    target: CpuTarget
    runtime: tuple[RuntimeLibrary, ...]
    files: dict[str, Path] = field(default_factory=dict)


def check_symbol(symbol: str) -> str:
    """Refuse an entry symbol that is no C identifier or would shadow a program's names.

    Raises:
        ConfigError: names the symbol and why.
    """
    if not C_IDENTIFIER.fullmatch(symbol):
        raise ConfigError(
            f"--entry-symbol {symbol!r} is not a C identifier ([A-Za-z_][A-Za-z0-9_]*)"
        )
    if symbol == "main" or symbol.startswith(_RESERVED):
        raise ConfigError(
            f"--entry-symbol {symbol!r} would collide with a C program's main or MLIR's "
            "generated _mlir_* names; pick another"
        )
    return symbol


def pick_entry(signatures: dict[str, Signature], entry: str | None) -> Signature:
    """The signature of the entry to export: ``entry``, else the only recorded one (or
    ``main`` among several).

    Raises:
        ArtifactError: no such entry, or several and none named.
    """
    if entry is not None:
        if entry not in signatures:
            known = ", ".join(sorted(signatures)) or "none"
            raise ArtifactError(f"the module records no entry {entry!r} (recorded: {known})")
        return signatures[entry]
    if len(signatures) == 1:
        return next(iter(signatures.values()))
    if "main" in signatures:
        return signatures["main"]
    raise ArtifactError(
        f"the module records {len(signatures)} entries ({', '.join(sorted(signatures))}); "
        "name the one to export"
    )


def module_target(module: Any) -> CpuTarget:
    """The CPU the module is built for: the pinned target, else this host (the JIT builds
    for the host CPU)."""
    from stagegraph.stages.common.lowering import required_isa
    from stagegraph.stages.target import detect_target

    recorded = required_isa(module)
    if recorded is None:
        host = detect_target()
        return CpuTarget(name=host.name, isa=tuple(sorted(host.isa)))
    name, isa = recorded
    return CpuTarget(name=name, isa=tuple(sorted(isa)))


def runtime_needs(module: Any, omp: bool) -> list[tuple[str | None, RuntimeLibrary]]:
    """The libraries the code calls (their paths; None: ``libm``, which the link names
    itself), each with how a manifest names it: the OpenMP runtime travels with the
    artifact (``file``); glibc's libraries come from the system."""
    from stagegraph.stages.common.runtime_libs import runtime_libraries

    needs: list[tuple[str | None, RuntimeLibrary]] = [
        (None, RuntimeLibrary(name="libm.so.6", purpose="libm"))
    ]
    for path in runtime_libraries(module, omp):
        name = Path(path).name
        if "mvec" in name:
            needs.append((path, RuntimeLibrary(name=name, purpose="libmvec")))
        else:
            needs.append((path, RuntimeLibrary(name=name, purpose="openmp", file=name)))
    return needs


def export_module(
    module: Any,
    *,
    symbol: str,
    entry: str | None = None,
    object_path: Path | None = None,
    library_path: Path | None = None,
    header_path: Path | None = None,
    opt_level: int = 3,
    preamble: tuple[str, ...] = (),
) -> Exported:
    """Compile ``module`` (LLVM level) and write the files asked for, exporting ``entry``
    as ``symbol`` (plain pointers) and ``_mlir_ciface_<symbol>`` (descriptors) only.

    Raises:
        LoweringIncompleteError: the module is not at the LLVM level.
        ConfigError: an unusable symbol. ArtifactError: no such entry.
        ToolchainError: the C compiler or binutils are missing or fail.
    """
    from stagegraph.runtime.memref import read_signatures
    from stagegraph.runtime.shared import emit_object
    from stagegraph.stages.common.flat_globals import flat_globals_while
    from stagegraph.stages.common.lowering import raise_not_lowered, survey_llvm_level

    check_symbol(symbol)
    left, omp = survey_llvm_level(module)
    raise_not_lowered(left, "the stage that produced emit's input")
    with module.context:
        signature = pick_entry(read_signatures(module), entry)
    arguments, results = manifest_values(signature)
    ciface = ciface_symbol(symbol)
    needs = runtime_needs(module, omp)
    paths = [path for path, _ in needs if path]
    header_name = header_path.name if header_path else f"{symbol}.h"
    header = header_source(symbol, ciface, arguments, results, preamble)
    exported = Exported(signature.entry, symbol, ciface, signature, arguments, results,
                        module_target(module), tuple(lib for _, lib in needs))  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="stagegraph-export-") as scratch:
        work = Path(scratch)
        with flat_globals_while(module):  # weights: one LLVM constant each, not per row
            raw = emit_object(module, work / "raw.o", opt_level=opt_level, shared_libs=paths)
        (work / header_name).write_text(header)
        wrapper = wrapper_source(header_name, symbol, ciface, arguments, results)
        obj = export_object(raw, object_path or work / "export.o", entry=signature.entry,
                            symbol=symbol, ciface=ciface, wrapper=wrapper, work=work)  # fmt: skip
        if object_path:
            exported.files["object"] = object_path
        if library_path:
            linked = [bundle(path, library_path.parent) if lib.file else path
                      for path, lib in needs if path]  # fmt: skip
            exported.files["library"] = link_library(obj, library_path, exported=[symbol, ciface],
                                                     libraries=linked, work=work)  # fmt: skip
    if header_path:
        header_path.write_text(header)
        exported.files["header"] = header_path
    return exported


def bundle(library: str, directory: Path) -> Path:
    """``library`` copied into ``directory`` (once), where ``$ORIGIN`` finds it."""
    target = directory / Path(library).name
    if not target.exists() or target.stat().st_size != Path(library).stat().st_size:
        shutil.copy2(library, target)
    return target
