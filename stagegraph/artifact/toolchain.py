"""Turning the JIT's object code into something a C program links: chosen entry symbols,
nothing else global, a shared library that finds its run-time libraries next to itself.

The execution engine's object exports the payload's functions under their MLIR names
(``main``, ``_mlir_ciface_main``) plus packed wrappers (``_mlir_main``); linked into a C
program, ``main`` collides with the program's own. :func:`export_object` renames the entry's
descriptor form to the chosen symbol, adds the plain-pointer wrapper, and makes every other
symbol local (binutils ``objcopy``); :func:`link_library` links the result with a version
script exporting only those symbols and ``$ORIGIN`` as run path.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from stagegraph.errors import ToolchainError


def tool(name: str, env: str | None = None) -> str:
    """The program ``$env`` or ``name`` on PATH.

    Raises:
        ToolchainError: not installed (binutils and a C compiler build artifacts).
    """
    program = (os.environ.get(env) if env else None) or name
    if shutil.which(program) is None:
        raise ToolchainError(
            f"building an artifact needs {program!r} on PATH (a C compiler and binutils: "
            "apt-get install gcc binutils)"
        )
    return program


def run_tool(cmd: Sequence[str]) -> None:
    """Run one toolchain command; its stderr becomes the error."""
    proc = subprocess.run(list(cmd), capture_output=True, text=True, check=False)
    if proc.returncode:
        raise ToolchainError(f"{' '.join(cmd)} failed:\n{proc.stderr.strip()}")


def export_object(
    raw: Path, out: Path, *, entry: str, symbol: str, ciface: str, wrapper: str, work: Path
) -> Path:
    """Write ``out``: ``raw`` with ``entry``'s descriptor form renamed ``ciface``, the
    plain-pointer form ``symbol`` (C source ``wrapper``, compiled here) linked in, and every
    symbol but those two made local.

    Args:
        raw: the execution engine's object file.
        entry: the MLIR function exported (its ``_mlir_ciface_`` form is renamed).
        work: a scratch folder (the wrapper's header must already be in it).
    """
    from stagegraph.runtime.memref import CIFACE_PREFIX

    objcopy = tool("objcopy", "OBJCOPY")
    renamed, wrapped, combined = work / "renamed.o", work / "wrapper.o", work / "combined.o"
    run_tool([objcopy, f"--redefine-sym={CIFACE_PREFIX}{entry}={ciface}",
              f"--redefine-sym={entry}={ciface}_expanded", str(raw), str(renamed)])  # fmt: skip
    (work / "wrapper.c").write_text(wrapper)
    run_tool([tool("cc", "CC"), "-std=c11", "-O2", "-fPIC", "-c", str(work / "wrapper.c"),
              "-o", str(wrapped)])  # fmt: skip
    run_tool([tool("ld", "LD"), "-r", str(renamed), str(wrapped), "-o", str(combined)])
    run_tool([objcopy, f"--keep-global-symbol={symbol}", f"--keep-global-symbol={ciface}",
              str(combined), str(out)])  # fmt: skip
    return out


def link_library(
    obj: Path,
    out: Path,
    *,
    exported: Sequence[str],
    libraries: Sequence[str | Path],
    work: Path,
) -> Path:
    """Link ``obj`` into the shared library ``out`` exporting only ``exported``.

    ``libraries`` are linked by path (each is recorded by its soname); the library's run
    path is ``$ORIGIN``, so a runtime copied next to it is found wherever the folder goes.
    ``--no-undefined``: a symbol no library provides fails here, not in the user's program.
    """
    script = work / "exports.map"
    script.write_text(
        "{\n  global:\n" + "".join(f"    {s};\n" for s in exported) + "  local: *;\n};\n"
    )
    cmd = [
        tool("cc", "CC"),
        "-shared",
        "-o",
        str(out),
        str(obj),
        *map(str, libraries),
        "-lm",
        f"-Wl,--version-script={script}",
        "-Wl,--no-undefined",
        "-Wl,-rpath,$ORIGIN",
    ]
    run_tool(cmd)
    return out
