"""Refuse a workload whose buffers cannot fit in memory, before anything compiles.

Why: the sizes of a workload's arguments and results are known from its signature alone,
so ``matmul:m=100000,n=100000,k=100000`` (112 GiB of inputs) can be refused in
milliseconds, instead of compiling for a minute and dying in numpy's allocator (or, with
``--isolate``, being blamed on the ``emit`` stage with a useless reproducer). The check is
a lower bound: the inputs, the outputs and the reference are all held at once while a run
is verified, and compiled code may need scratch space on top.

What "available" means: the least of what the kernel would hand out (``MemAvailable`` of
``/proc/meminfo``), what this process's cgroup still allows (``memory.max`` minus
``memory.current``, cgroup v2) and what its address-space limit leaves (``RLIMIT_AS``
minus the current ``VmSize``: ``--memory`` under ``--isolate``, or ``ulimit -v``).
A source that cannot be read (another OS) is skipped; with none, nothing is refused.
"""

from __future__ import annotations

import resource
from pathlib import Path
from typing import Any

from stagegraph.errors import InsufficientMemoryError

MEMINFO = Path("/proc/meminfo")
CGROUP = Path("/sys/fs/cgroup")
STATUS = Path("/proc/self/status")


def needed_bytes(workload: Any) -> int:
    """Bytes of the workload's arguments and results plus a reference copy of each result
    (a lower bound of what a verified run holds at once)."""
    inputs = sum(spec.nbytes for spec in workload.input_specs())
    outputs = sum(spec.nbytes for spec in workload.output_specs())
    return inputs + 2 * outputs


def available_bytes() -> tuple[int, str] | None:
    """The smallest memory budget this process has, and where it comes from (None: no
    source could be read)."""
    budgets = [b for b in (_meminfo(), _cgroup(), _address_space()) if b is not None]
    return min(budgets) if budgets else None


def check_fits(workload: Any) -> None:
    """Raise when the workload's buffers exceed the memory available.

    Anything without a signature (a bare module given to the engine) is not checked.

    Raises:
        InsufficientMemoryError: the bytes needed and available, and where the limit is.
    """
    if not hasattr(workload, "input_specs"):
        return
    needed = needed_bytes(workload)
    budget = available_bytes()
    if budget is None or needed <= budget[0]:
        return
    available, source = budget
    raise InsufficientMemoryError(
        f"workload {workload.spec!r} needs at least {_gib(needed)} for its inputs, outputs "
        f"and reference, but only {_gib(available)} is available ({source}); refused before "
        "compiling: choose smaller sizes"
    )


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB ({n:,} bytes)"


def _meminfo() -> tuple[int, str] | None:
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024, "MemAvailable in /proc/meminfo"
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup() -> tuple[int, str] | None:
    """What this process's cgroup limit leaves (v2 ``memory.max``, else v1
    ``memory.limit_in_bytes``; the group as mounted in this namespace)."""
    for limit_file, usage_file in (
        (CGROUP / "memory.max", CGROUP / "memory.current"),
        (CGROUP / "memory" / "memory.limit_in_bytes", CGROUP / "memory" / "memory.usage_in_bytes"),
    ):
        try:
            limit = limit_file.read_text().strip()
            usage = int(usage_file.read_text().strip())
        except (OSError, ValueError):
            continue
        if limit == "max" or int(limit) >= 2**60:  # v1 writes "no limit" as a huge number
            return None
        return max(0, int(limit) - usage), f"cgroup limit {limit_file}"
    return None


def _address_space() -> tuple[int, str] | None:
    """What ``RLIMIT_AS`` leaves beyond the address space already mapped."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    mapped = 0
    try:
        for line in STATUS.read_text().splitlines():
            if line.startswith("VmSize:"):
                mapped = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        mapped = 0
    return (
        max(0, soft - mapped),
        f"address-space limit {_gib(soft)} (--memory with --isolate, or ulimit -v), "
        f"{_gib(mapped)} of it mapped already",
    )
