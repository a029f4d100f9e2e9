"""How many cores this process may run on: the one count the cost models (``Target.cores``)
and the OpenMP runtime settings both read."""

from __future__ import annotations

import contextlib
import math
import os
from pathlib import Path

CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


def usable_cores(cgroup_cpu_max: Path = CGROUP_CPU_MAX) -> int:
    """Cores this process may run on: the affinity mask, capped by a cgroup v2 CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        quota = cgroup_cpu_max.read_text().split()
    except OSError:
        quota = ["max"]
    if len(quota) == 2 and quota[0] != "max":
        with contextlib.suppress(ValueError, ZeroDivisionError):
            cores = min(cores, max(1, math.ceil(int(quota[0]) / int(quota[1]))))
    return max(1, cores)
