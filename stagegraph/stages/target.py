"""What parameter selection knows of the machine: ISA features, cores, caches.

:func:`detect_target` reads the host once (``/proc/cpuinfo``, the CPU's sysfs cache
directories, the scheduler affinity and the cgroup CPU quota) and caches the result;
:func:`read_target` does the same from given paths, so a test or a cross-compiling user can
describe another machine. Every file is optional: what cannot be read keeps the
:class:`Target` default.
"""

from __future__ import annotations

import contextlib
import os
import platform
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import Field, field_serializer

from stagegraph.core.ports import Config, Facts
from stagegraph.core.registry import Registry
from stagegraph.core.stage import stage
from stagegraph.errors import UnknownTargetError
from stagegraph.runtime.cores import CGROUP_CPU_MAX, usable_cores

CPUINFO = Path("/proc/cpuinfo")
CPU_SYSFS = Path("/sys/devices/system/cpu/cpu0")

# FMA units per core on every x86 core with FMA this project targets (Haswell on, Zen on).
FMA_UNITS = 2

# Flag families that matter to code generation; the rest of /proc/cpuinfo (``hypervisor``,
# ``constant_tsc``, ...) would only make the Target noisy and its hash host-specific.
_SIMD_PREFIXES = ("sse", "ssse3", "avx", "fma", "f16c", "amx", "asimd", "sve", "sme", "bf16")
_SIMD_FLAGS = {"i8mm", "fphp", "neon", "vnni"}
_NOT_SIMD = {"smep"}  # x86 supervisor-mode protection, not arm64 SME


class Target(Facts):
    """The host (or a described machine) as seen by cost models.

    ``name`` is what the target was asked as (``host``, ``x86-64-v3``, ``znver4``, ...);
    ``cpu`` is the LLVM CPU the code is built for, None for the host the JIT runs on.
    """

    name: str = "host"
    cpu: str | None = None
    arch: str = "x86_64"
    isa: frozenset[str] = frozenset()  # e.g. {"avx2", "fma", "avx512f", "avx512bf16", "amx_bf16"}
    cores: int = 1
    vector_bits: int = 128  # widest usable SIMD register: 512 with AVX-512, 256 with AVX2
    l1d_bytes: int = 32 * 1024
    l2_bytes: int = 1024 * 1024
    l3_bytes: int = 8 * 1024 * 1024
    frequency_ghz: float | None = None
    # Width of the FMA units when narrower than ``vector_bits`` (Zen 1: 128-bit units run a
    # 256-bit FMA as two halves); None: as wide as the vectors.
    fma_bits: int | None = None

    @field_serializer("isa")
    def _sorted_isa(self, isa: frozenset[str]) -> list[str]:
        """Sorted, so the content hash is the same in every process."""
        return sorted(isa)

    def has(self, feature: str) -> bool:
        return feature in self.isa

    @property
    def vector_registers(self) -> int:
        """Architectural SIMD registers: 32 with AVX-512 (EVEX), else 16."""
        return 32 if self.has("avx512f") or self.vector_bits >= 512 else 16

    @property
    def tier(self) -> str:
        """The x86-64 psABI level the ISA reaches (``x86-64-v3`` for AVX2 + FMA)."""
        from stagegraph.stages.target_names import level_of

        return level_of(self.isa)

    def fma_lanes_per_cycle(self, lanes: int | None = None) -> int:
        """f32 FMA lanes one core completes per cycle on vectors of ``lanes`` f32 lanes
        (default: the widest): two FMA units, each as wide as the vector or its own width
        (``fma_bits``), whichever is narrower. Zen 1 on AVX2: 8, not 16."""
        lanes = lanes or max(1, self.vector_bits // 32)
        unit_lanes = max(1, (self.fma_bits or self.vector_bits) // 32)
        return FMA_UNITS * min(lanes, unit_lanes)

    @property
    def narrow_fma(self) -> bool:
        """Whether the FMA units are narrower than the widest vectors (a vector FMA issues
        in parts, so fewer independent chains keep the units busy)."""
        return self.fma_bits is not None and self.fma_bits < self.vector_bits

    def missing_on(self, host: Target) -> list[str]:
        """ISA features this target's code may use that ``host`` lacks (sorted)."""
        return sorted(self.isa - host.isa)


def normalize_flag(flag: str) -> str:
    """Map a kernel cpuinfo flag to the spelling LLVM uses for the feature.

    The kernel writes ``avx512_bf16`` / ``avx_vnni`` where LLVM (and ``-mattr``) write
    ``avx512bf16`` / ``avxvnni``; AMX flags keep their underscore (``amx_bf16``).
    """
    flag = flag.strip().lower()
    if flag == "pni":  # "Prescott New Instructions": the kernel's name for SSE3
        return "sse3"
    if flag.startswith("avx512_"):
        return "avx512" + flag.removeprefix("avx512_")
    if flag.startswith("avx_"):
        return "avx" + flag.removeprefix("avx_").replace("_", "")
    return flag


def _is_simd(flag: str) -> bool:
    return (flag.startswith(_SIMD_PREFIXES) or flag in _SIMD_FLAGS) and flag not in _NOT_SIMD


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def cpuinfo_text(path: Path = CPUINFO) -> str:
    """The text of /proc/cpuinfo, read once per process, or of ``path`` ("" if unreadable)."""
    return _host_cpuinfo() if path == CPUINFO else _read(path) or ""


@cache
def _host_cpuinfo() -> str:
    return _read(CPUINFO) or ""


def cpuinfo_fields(text: str) -> dict[str, str]:
    """The first CPU's fields in /proc/cpuinfo's text, keys lowercased, empty values skipped:
    the one parse every reader of cpuinfo (ISA, frequency, CPU model and name) starts from."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and value.strip():
            fields.setdefault(key.strip().lower(), value.strip())
    return fields


def parse_cpuinfo(text: str) -> tuple[frozenset[str], float | None]:
    """SIMD features and the first ``cpu MHz`` (in GHz) from the text of /proc/cpuinfo."""
    fields = cpuinfo_fields(text)
    # x86 "flags", arm64 "Features" (whichever comes first in the text)
    listed = next((v for k, v in fields.items() if k in ("flags", "features")), "")
    flags = {normalize_flag(f) for f in listed.split()}
    mhz: float | None = None
    with contextlib.suppress(ValueError):
        mhz = float(fields.get("cpu mhz", ""))
    ghz = round(mhz / 1000, 3) if mhz else None
    return frozenset(f for f in flags if _is_simd(f)), ghz


def parse_cpu_model(text: str) -> tuple[str, int, int] | None:
    """``vendor_id``, ``cpu family`` and ``model`` of the first CPU in /proc/cpuinfo's text."""
    fields = cpuinfo_fields(text)
    try:
        return fields["vendor_id"], int(fields["cpu family"]), int(fields["model"])
    except (KeyError, ValueError):
        return None


def parse_size(text: str) -> int | None:
    """Bytes of a sysfs cache size such as ``48K``, ``32768K`` or ``2M``."""
    text = text.strip().upper().removesuffix("B")
    scale = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(text[-1:], 1)
    digits = text[:-1] if text[-1:] in "KMG" else text
    try:
        return int(float(digits) * scale)
    except ValueError:
        return None


def read_caches(cpu_dir: Path) -> dict[str, int]:
    """Cache sizes by Target field name, from ``<cpu_dir>/cache/index*/{level,type,size}``."""
    found: dict[str, int] = {}
    for index in sorted((cpu_dir / "cache").glob("index*")):
        level, kind, size = (_read(index / name) for name in ("level", "type", "size"))
        if level is None or kind is None or size is None:
            continue
        kind = kind.strip()
        nbytes = parse_size(size)
        if kind == "Instruction" or nbytes is None:
            continue
        field = {"1": "l1d_bytes", "2": "l2_bytes", "3": "l3_bytes"}.get(level.strip())
        if field is not None:
            found[field] = max(found.get(field, 0), nbytes)
    return found


def read_frequency_ghz(cpu_dir: Path) -> float | None:
    """Maximum frequency from cpufreq (kHz), when the kernel exposes it."""
    text = _read(cpu_dir / "cpufreq" / "cpuinfo_max_freq")
    try:
        return round(int(text) / 1e6, 3) if text else None
    except ValueError:
        return None


def effective_threads(threads: int | None) -> int:
    """What ``--threads`` means when not given: all usable cores (as the cost models assume)."""
    if threads is not None:
        return threads
    return usable_cores()


def payload_threads(params: Any) -> int | None:
    """The threads a compiled payload's parallel loops run on, as its params chose them
    (``payload_threads()`` of a params model, else its ``threads`` field); None for a graph
    without params that say (the granted count is :func:`effective_threads`)."""
    count = getattr(params, "payload_threads", None)
    if callable(count):
        return count()
    value = getattr(params, "threads", None)
    return value if isinstance(value, int) else None


def vector_bits_for(isa: frozenset[str]) -> int:
    """Widest SIMD register the feature set allows."""
    if "avx512f" in isa:
        return 512
    if "avx2" in isa or "avx" in isa:
        return 256
    return 128


def read_target(
    cpuinfo: Path = CPUINFO,
    cpu_dir: Path = CPU_SYSFS,
    cgroup_cpu_max: Path = CGROUP_CPU_MAX,
) -> Target:
    """Describe the machine from these files; anything unreadable keeps the default."""
    from stagegraph.stages.target_names import CPUS, host_cpu_name

    text = cpuinfo_text(cpuinfo)
    isa, cpuinfo_ghz = parse_cpuinfo(text)
    model = parse_cpu_model(text)
    cpu = host_cpu_name(*model) if model else None
    fields: dict[str, Any] = {
        "arch": platform.machine() or Target.model_fields["arch"].default,
        "isa": isa,
        "cores": usable_cores(cgroup_cpu_max),
        "vector_bits": vector_bits_for(isa),
        "frequency_ghz": read_frequency_ghz(cpu_dir) or cpuinfo_ghz,
        "fma_bits": CPUS[cpu].fma_bits if cpu else None,
        **read_caches(cpu_dir),
    }
    return Target(**fields)


@cache
def detect_target() -> Target:
    """The host machine, read once per process."""
    return read_target()


def target_from_override(**fields: Any) -> Target:
    """The host with some fields replaced (validated), e.g. ``target_from_override(cores=1)``."""
    return Target(**{**detect_target().model_dump(), **fields})


ENV_VAR = "STAGEGRAPH_TARGET"


def resolve_target(name: str | None = None) -> Target:
    """The facts of a named target: ``host`` (read from this machine), an x86-64 level
    (``x86-64-v3``), an LLVM CPU name (``znver3``) or any name in :data:`TARGETS`. ``None``
    means ``$STAGEGRAPH_TARGET``, else ``host`` (so a whole test run can be pinned to a tier).

    Raises:
        UnknownTargetError: the name is none of these (with a "did you mean").
    """
    name = (name or os.environ.get(ENV_VAR) or "host").strip().lower()
    return TARGETS.get(name)(name)


def named_x86_target(name: str) -> Target:
    """A named x86 machine (:mod:`stagegraph.stages.target_names`) with this host's cores."""
    from stagegraph.stages.target_names import NAMED

    machine = NAMED[name]
    host = detect_target()
    return Target(
        name=name,
        cpu=name,
        arch="x86_64",
        isa=machine.isa,
        cores=host.cores,
        vector_bits=vector_bits_for(machine.isa),
        l1d_bytes=machine.l1d_bytes,
        l2_bytes=machine.l2_bytes,
        l3_bytes=machine.l3_bytes,
        frequency_ghz=None,
        fma_bits=machine.fma_bits,
    )


def _discover_named() -> None:
    from stagegraph.stages.target_names import NAMED

    for name in NAMED:
        TARGETS.add_shipped(name, named_x86_target, "stagegraph.stages.target_names")


#: Target names, each to a function ``(name) -> Target``: ``host`` and the named x86
#: machines; a target package (or plugin) registers more with ``TARGETS.register``.
TARGETS: Registry[Callable[[str], Target]] = Registry(
    "target", error=UnknownTargetError, discover=_discover_named
)
TARGETS.register("host", lambda _name: detect_target(), origin="the host machine")


class TargetConfig(Config):
    """``name``: ``host``, an x86-64 level or an LLVM CPU name (default: ``$STAGEGRAPH_TARGET``
    or ``host``); ``overrides``: fields to replace on it (to describe another machine)."""

    name: str | None = None
    overrides: dict[str, Any] = Field(default_factory=dict)


@stage("analysis", name="target")
def target(config: TargetConfig) -> Target:
    """The machine parameter selection plans for: the named target, with any overrides."""
    resolved = resolve_target(config.name)
    if config.overrides:
        return Target(**{**resolved.model_dump(), **config.overrides})
    return resolved
