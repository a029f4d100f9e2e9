"""What a benchmark number depends on besides the code: the CPU, the ISA tier, OpenBLAS.

A speedup over numpy means little without the machine it was measured on, the vector tier
the code was compiled for, and the OpenBLAS kernels numpy ran: ``OPENBLAS_CORETYPE`` forces
a core type's kernels (often an older, slower one than the CPU supports), so a report
records it. OpenBLAS reads that variable only when it loads, so a benchmark script that wants
representative numpy numbers must start without it: :func:`reexec_without_openblas_overrides`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from stagegraph.core.ports import Schema
from stagegraph.stages.target import Target, cpuinfo_fields, cpuinfo_text

#: Environment variables that change which kernels OpenBLAS picks, read when it loads.
OPENBLAS_OVERRIDES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
#: Set in a re-exec'd benchmark to the overrides it removed, so it can say so.
REMOVED_MARKER = "STAGEGRAPH_REMOVED_OPENBLAS_ENV"

# Features beyond a tier that change what the code generator can emit; named when present.
_EXTRAS = ("avx512bf16", "avx512fp16", "avx512vnni", "avxvnni", "amx_bf16", "amx_tile")


class BlasInfo(Schema):
    """The BLAS numpy calls, as threadpoolctl sees it (``architecture`` is OpenBLAS's core
    type, e.g. ``Haswell`` or ``SkylakeX``: the kernels it runs)."""

    internal_api: str
    version: str | None = None
    architecture: str | None = None
    num_threads: int | None = None
    threading_layer: str | None = None


class HostInfo(Schema):
    """The machine a report was measured on, recorded in every benchmark report."""

    cpu_model: str
    target: str
    blas: BlasInfo | None = None
    openblas_coretype: str | None = None
    openblas_l2_size: str | None = None


def cpu_model(cpuinfo: str) -> str:
    """The first ``model name`` of /proc/cpuinfo's text (``unknown`` when there is none)."""
    return cpuinfo_fields(cpuinfo).get("model name", "unknown")


def isa_tier(isa: frozenset[str], arch: str = "x86_64") -> str:
    """Name the ISA tier of a feature set, e.g. ``x86-64-v3 (avx2, fma)``.

    The tier is the highest x86-64 level whose features the set has (the levels of
    ``target_names``, as ``Target.tier`` reads them); the features shown are the ones that
    level adds (just ``avx2, fma`` for v3) and any extras that matter to code generation,
    so two reports compare at a glance.
    """
    from stagegraph.stages.target_names import LEVELS, level_of

    if arch not in ("x86_64", "amd64", "AMD64"):
        return f"{arch} ({', '.join(sorted(isa))})" if isa else arch
    tier = level_of(isa)
    names = list(LEVELS)  # lowest first: each level contains the last
    below = LEVELS[names[names.index(tier) - 1]].isa if names.index(tier) else frozenset()
    added = sorted(LEVELS[tier].isa - below, key=lambda f: (f != "avx512f", f))
    shown: Sequence[str] = ("avx2", "fma") if tier == "x86-64-v3" else added
    if tier == "x86-64":
        shown = ()
    extras = [f for f in _EXTRAS if f in isa and f not in shown]
    return f"{tier} ({', '.join([*shown, *extras])})" if shown or extras else tier


def blas_info() -> BlasInfo | None:
    """numpy's OpenBLAS (or other BLAS) as loaded now, with its current thread count."""
    import numpy  # noqa: F401  (threadpoolctl only sees libraries already loaded)
    from threadpoolctl import threadpool_info

    for lib in threadpool_info():
        if lib.get("user_api") == "blas":
            return BlasInfo(
                internal_api=lib.get("internal_api", "unknown"),
                version=lib.get("version"),
                architecture=lib.get("architecture"),
                num_threads=lib.get("num_threads"),
                threading_layer=lib.get("threading_layer"),
            )
    return None


def _cpu_model() -> str:
    return cpu_model(cpuinfo_text())


def host_info(target: Target | None = None) -> HostInfo:
    """The host, the tier of ``target`` (default: the detected host) and numpy's BLAS now.

    Call it where the BLAS thread count of interest is in force (inside the thread limit
    of a numpy measurement) so ``blas.num_threads`` says what that measurement used.
    """
    from stagegraph.stages.target import detect_target

    target = target or detect_target()
    return HostInfo(
        cpu_model=_cpu_model(),
        target=isa_tier(target.isa, target.arch),
        blas=blas_info(),
        openblas_coretype=os.environ.get("OPENBLAS_CORETYPE"),
        openblas_l2_size=os.environ.get("OPENBLAS_L2_SIZE"),
    )


def describe(host: HostInfo) -> str:
    """One line for a table header or the text output of ``bench``."""
    blas = host.blas
    blas_text = "no BLAS found"
    if blas is not None:
        blas_text = f"{blas.internal_api} {blas.version or '?'} ({blas.architecture or '?'})"
    return f"host {host.cpu_model}; target {host.target}; numpy BLAS {blas_text}"


def openblas_overrides(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The OpenBLAS kernel overrides set in ``environ`` (default: this process)."""
    env = os.environ if environ is None else environ
    return {name: env[name] for name in OPENBLAS_OVERRIDES if name in env}


def without_openblas_overrides(environ: dict[str, str]) -> dict[str, str] | None:
    """``environ`` without the OpenBLAS kernel overrides, marked with what was removed;
    ``None`` when there is nothing to remove."""
    found = openblas_overrides(environ)
    if not found:
        return None
    env = {k: v for k, v in environ.items() if k not in OPENBLAS_OVERRIDES}
    env[REMOVED_MARKER] = ",".join(f"{k}={v}" for k, v in found.items())
    return env


def removed_note(environ: dict[str, str]) -> str | None:
    """What a restarted benchmark prints about the variables it was restarted without."""
    removed = environ.get(REMOVED_MARKER)
    if not removed:
        return None
    return (
        f"note: restarted without {removed.replace(',', ', ')} so that OpenBLAS picks the "
        "kernels for this CPU (forced kernels make numpy slower than it is)"
    )


def reexec_without_openblas_overrides(argv: Sequence[str] | None = None) -> str | None:
    """Restart this script without ``OPENBLAS_CORETYPE``/``OPENBLAS_L2_SIZE`` if either is set.

    Never returns in the first process (it is replaced); in the restarted one, returns a
    note naming what was removed, for the script to print with its results (``None`` when
    nothing was). For benchmark scripts only: the CLI reports the variables instead.
    """
    env = without_openblas_overrides(dict(os.environ))
    if env is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        args = [sys.executable, *(sys.argv if argv is None else argv)]
        os.execve(sys.executable, args, env)
    return removed_note(dict(os.environ))
