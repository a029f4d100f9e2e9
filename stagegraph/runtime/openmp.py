"""Locate an OpenMP runtime (``__kmpc_*`` ABI) for JIT-compiled parallel loops.

MLIR's ``convert-openmp-to-llvm`` emits calls to the LLVM/Intel runtime ABI (``__kmpc_fork_call``
...), which GNU ``libgomp`` does not provide. The MLIR wheel ships no runtime, so one comes
from PyPI: ``intel-openmp`` (``libiomp5.so``) or ``cmeel-libomp`` (LLVM ``libomp.so``). Code
compiled with one thread needs no runtime at all.
"""

from __future__ import annotations

import ctypes
import functools
import os
from importlib import metadata
from pathlib import Path

from stagegraph.errors import OpenMPRuntimeNotFound
from stagegraph.runtime.cores import usable_cores
from stagegraph.runtime.heap import keep_heap_pages

ENV_VAR = "STAGEGRAPH_OPENMP_LIB"
# How long (ms) an idle OpenMP worker spins before it sleeps; the runtime reads it once, when
# it starts. Its default, 200 ms, spans back-to-back calls. On a quiet machine that is what
# short calls want (a 256^3 matmul at 2 threads: 1.18x OpenBLAS spinning, 0.64x sleeping, as
# every call wakes the workers). On a machine whose cores other processes already use, the
# spinning workers take the cores the threads of a parallel loop need and every join waits
# for a descheduled thread (Linear + BatchNorm at 2 threads beside two busy processes: 3x
# IREE's time spinning, 1 ms or 200 ms alike, 0.4x sleeping). So the workers sleep at once
# when the load average already fills the usable cores; the user's own setting always wins.
BLOCKTIME_VAR, BUSY_BLOCKTIME = "KMP_BLOCKTIME", "0"
_DISTRIBUTIONS = ("intel-openmp", "cmeel-libomp")
_NAMES = ("libiomp5.so", "libomp.so", "libomp.so.5")


@functools.cache
def library_path() -> str:
    """Absolute path of the runtime to pass to ``ExecutionEngine(shared_libs=[...])``.

    Raises:
        OpenMPRuntimeNotFound: neither ``$STAGEGRAPH_OPENMP_LIB`` nor a known package has one.
    """
    keep_heap_pages()
    blocktime = default_blocktime(os.getloadavg()[0], usable_cores())
    if blocktime is not None:
        os.environ.setdefault(BLOCKTIME_VAR, blocktime)
    override = os.environ.get(ENV_VAR)
    if override:
        if not Path(override).is_file():
            raise OpenMPRuntimeNotFound(f"{ENV_VAR}={override} is not a file")
        return str(Path(override).resolve())
    for dist in _DISTRIBUTIONS:
        try:
            files = metadata.distribution(dist).files or []
        except metadata.PackageNotFoundError:
            continue
        for file in files:
            if Path(file.name).name in _NAMES:
                path = Path(file.locate()).resolve()
                if path.is_file() and _has_kmpc(path):
                    return str(path)
    raise OpenMPRuntimeNotFound(
        "multi-threaded code needs an OpenMP runtime with the __kmpc_* ABI: "
        "pip install 'intel-openmp==2026.2.0' (or set $STAGEGRAPH_OPENMP_LIB)"
    )


def default_blocktime(load_average: float, cores: int) -> str | None:
    """``KMP_BLOCKTIME`` for a process starting now: 0 (sleep when idle) when other work
    already fills the ``cores`` (the one-minute ``load_average`` above them), else None
    (the runtime's own default)."""
    return BUSY_BLOCKTIME if load_average > cores else None


def _has_kmpc(path: Path) -> bool:
    try:
        return hasattr(ctypes.CDLL(str(path)), "__kmpc_fork_call")
    except OSError:
        return False
