"""Named targets: x86-64 micro-architecture levels and LLVM CPU names as machine facts.

``--target`` accepts ``host`` (read from the machine, see :mod:`stagegraph.stages.target`),
the psABI levels ``x86-64``, ``x86-64-v2``, ``x86-64-v3`` (AVX2 + FMA) and ``x86-64-v4``
(AVX-512 F/BW/CD/DQ/VL), or an LLVM CPU name (``znver3``, ``skylake-avx512``,
``sapphirerapids``, ...). A name gives what the host would give: ISA features (spelled as
the kernel's cpuinfo flags, normalized as :func:`~stagegraph.stages.target.normalize_flag`
does), the vector width and register count they imply, and cache sizes.

Cache sizes are per core and taken from the vendors' documentation of each family; the
levels name no machine, so they get the defaults below (``LEVEL_CACHES``), sized like a
common server core of that level. ``cores`` is never implied by a name: it stays the host's
(the code runs, or is measured, here).
"""

from __future__ import annotations

from dataclasses import dataclass

# SIMD features, cumulative by level (cpuinfo spelling; its "pni" is read as sse3).
_V1 = frozenset({"sse", "sse2"})
_V2 = _V1 | {"sse3", "ssse3", "sse4_1", "sse4_2"}
_V3 = _V2 | {"avx", "avx2", "fma", "f16c"}
_V4 = _V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
_ICELAKE = _V4 | {
    "avx512vnni",
    "avx512vbmi",
    "avx512vbmi2",
    "avx512bitalg",
    "avx512vpopcntdq",
    "avx512ifma",
}
_SAPPHIRE = _ICELAKE | {
    "avx512bf16",
    "avx512fp16",
    "avxvnni",
    "amx_bf16",
    "amx_tile",
    "amx_int8",
}
_ZEN4 = _V4 | {
    "avx512vnni",
    "avx512vbmi",
    "avx512vbmi2",
    "avx512bitalg",
    "avx512vpopcntdq",
    "avx512ifma",
    "avx512bf16",
}

KIB, MIB = 1024, 1024 * 1024


@dataclass(frozen=True)
class NamedMachine:
    """What a target name implies: SIMD features, per-core cache sizes in bytes and, where
    the FMA units are narrower than the widest vectors, their width in bits."""

    isa: frozenset[str]
    l1d_bytes: int
    l2_bytes: int
    l3_bytes: int
    fma_bits: int | None = None


def _m(isa: frozenset[str], l1: int, l2: int, l3: int, fma_bits: int | None = None) -> NamedMachine:
    return NamedMachine(frozenset(isa), l1, l2, l3, fma_bits)


#: The psABI levels: no machine, so caches of a typical server core of the level.
LEVELS: dict[str, NamedMachine] = {
    "x86-64": _m(_V1, 32 * KIB, 256 * KIB, 8 * MIB),
    "x86-64-v2": _m(_V2, 32 * KIB, 256 * KIB, 8 * MIB),
    "x86-64-v3": _m(_V3, 32 * KIB, 512 * KIB, 16 * MIB),
    "x86-64-v4": _m(_V4, 32 * KIB, 1 * MIB, 16 * MIB),
}

#: LLVM x86 CPU names (``-mcpu``), grouped by family; caches per core.
CPUS: dict[str, NamedMachine] = {
    # Intel client and server cores.
    "nehalem": _m(_V2, 32 * KIB, 256 * KIB, 8 * MIB),
    "westmere": _m(_V2, 32 * KIB, 256 * KIB, 12 * MIB),
    "sandybridge": _m(_V2 | {"avx"}, 32 * KIB, 256 * KIB, 8 * MIB),
    "ivybridge": _m(_V2 | {"avx", "f16c"}, 32 * KIB, 256 * KIB, 8 * MIB),
    "haswell": _m(_V3, 32 * KIB, 256 * KIB, 8 * MIB),
    "broadwell": _m(_V3, 32 * KIB, 256 * KIB, 8 * MIB),
    "skylake": _m(_V3, 32 * KIB, 256 * KIB, 8 * MIB),
    "alderlake": _m(_V3 | {"avxvnni"}, 48 * KIB, 1280 * KIB, 30 * MIB),
    "raptorlake": _m(_V3 | {"avxvnni"}, 48 * KIB, 2 * MIB, 36 * MIB),
    "meteorlake": _m(_V3 | {"avxvnni"}, 48 * KIB, 2 * MIB, 24 * MIB),
    "arrowlake": _m(_V3 | {"avxvnni"}, 48 * KIB, 3 * MIB, 36 * MIB),
    "skylake-avx512": _m(_V4, 32 * KIB, 1 * MIB, 32 * MIB),
    "skx": _m(_V4, 32 * KIB, 1 * MIB, 32 * MIB),
    "cascadelake": _m(_V4 | {"avx512vnni"}, 32 * KIB, 1 * MIB, 32 * MIB),
    "cooperlake": _m(_V4 | {"avx512vnni", "avx512bf16"}, 32 * KIB, 1 * MIB, 32 * MIB),
    "cannonlake": _m(_V4 | {"avx512vbmi", "avx512ifma"}, 32 * KIB, 256 * KIB, 8 * MIB),
    "icelake-client": _m(_ICELAKE, 48 * KIB, 512 * KIB, 8 * MIB),
    "icelake-server": _m(_ICELAKE, 48 * KIB, 1280 * KIB, 48 * MIB),
    "tigerlake": _m(_ICELAKE, 48 * KIB, 1280 * KIB, 12 * MIB),
    "rocketlake": _m(_ICELAKE, 48 * KIB, 512 * KIB, 16 * MIB),
    "sapphirerapids": _m(_SAPPHIRE, 48 * KIB, 2 * MIB, 60 * MIB),
    "emeraldrapids": _m(_SAPPHIRE, 48 * KIB, 2 * MIB, 320 * MIB),
    "graniterapids": _m(_SAPPHIRE | {"amx_fp16"}, 48 * KIB, 2 * MIB, 480 * MIB),
    # AMD Zen cores (L3 per CCX/CCD). Zen 1 has 128-bit FMA units: a 256-bit FMA issues as
    # two halves, one per cycle per core instead of two.
    "znver1": _m(_V3, 32 * KIB, 512 * KIB, 8 * MIB, fma_bits=128),
    "znver2": _m(_V3, 32 * KIB, 512 * KIB, 16 * MIB),
    "znver3": _m(_V3, 32 * KIB, 512 * KIB, 32 * MIB),
    # Zen 4 runs a 512-bit FMA on its two 256-bit units: AVX-512 doubles the registers'
    # width, not the FMA lanes per cycle (measured on an EPYC 9004 core: an FMA loop of zmm
    # chains and one of ymm chains both sustain 117 GFLOP/s).
    "znver4": _m(_ZEN4, 32 * KIB, 1 * MIB, 32 * MIB, fma_bits=256),
    "znver5": _m(_ZEN4 | {"avxvnni"}, 48 * KIB, 1 * MIB, 32 * MIB),
}

NAMED: dict[str, NamedMachine] = {**LEVELS, **CPUS}

# LLVM's spelling of the features a target enables or disables (per-function
# "target-features"): every feature named here is listed, + when the target has it and -
# when not, so a host's wider ISA never leaks into code built for a narrower target.
_LLVM_FEATURES = {
    "sse3": "sse3",
    "ssse3": "ssse3",
    "sse4_1": "sse4.1",
    "sse4_2": "sse4.2",
    "avx": "avx",
    "avx2": "avx2",
    "fma": "fma",
    "f16c": "f16c",
    "avx512f": "avx512f",
    "avx512bw": "avx512bw",
    "avx512cd": "avx512cd",
    "avx512dq": "avx512dq",
    "avx512vl": "avx512vl",
    "avx512vnni": "avx512vnni",
    "avx512vbmi": "avx512vbmi",
    "avx512vbmi2": "avx512vbmi2",
    "avx512bitalg": "avx512bitalg",
    "avx512vpopcntdq": "avx512vpopcntdq",
    "avx512ifma": "avx512ifma",
    "avx512bf16": "avx512bf16",
    "avx512fp16": "avx512fp16",
    "avxvnni": "avxvnni",
    "amx_tile": "amx-tile",
    "amx_bf16": "amx-bf16",
    "amx_int8": "amx-int8",
    "amx_fp16": "amx-fp16",
}


def level_of(isa: frozenset[str]) -> str:
    """The highest psABI level (``LEVELS``) whose features ``isa`` has (``x86-64`` at least):
    what ``Target.tier`` reports and benchmark reports name."""
    reached = [name for name, level in LEVELS.items() if level.isa <= isa]
    return reached[-1] if reached else "x86-64"


def llvm_features(isa: frozenset[str]) -> list[str]:
    """``+f``/``-f`` for every SIMD feature LLVM knows, from a cpuinfo-spelled ISA set."""
    return [f"{'+' if ours in isa else '-'}{theirs}" for ours, theirs in _LLVM_FEATURES.items()]


#: AMD family 19h models of Zen 4 cores (EPYC 9004 and 8004, Ryzen 7000 and 8000); the
#: others in the family are Zen 3.
ZEN4_MODELS = (range(0x10, 0x20), range(0x60, 0x80), range(0xA0, 0xB0))


def host_cpu_name(vendor: str, family: int, model: int) -> str | None:
    """The LLVM CPU name of a host, from cpuinfo's ``vendor_id``, ``cpu family`` and ``model``,
    for the cores whose facts differ from what their ISA implies (so far FMA units narrower
    than the vectors: Zen 1, AMD family 17h models below 30h, and Hygon's Dhyana, family
    18h; Zen 4, family 19h in ``ZEN4_MODELS``); else None."""
    if (vendor == "AuthenticAMD" and family == 0x17 and model < 0x30) or (
        vendor == "HygonGenuine" and family == 0x18
    ):
        return "znver1"
    if vendor == "AuthenticAMD" and family == 0x19 and any(model in r for r in ZEN4_MODELS):
        return "znver4"
    return None


def known_names() -> list[str]:
    """Every name ``--target`` accepts besides ``host``."""
    return sorted(NAMED)
