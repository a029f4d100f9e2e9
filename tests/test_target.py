"""Host target detection: real host plausibility, and fallbacks on fake /proc and sysfs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stagegraph.stages.target import (
    Target,
    detect_target,
    normalize_flag,
    parse_size,
    read_target,
    target_from_override,
)

CPUINFO_AVX512 = """\
processor\t: 0
model name\t: Fake CPU
cpu MHz\t\t: 2600.000
flags\t\t: fpu sse sse2 avx avx2 fma avx512f avx512bw avx512vl avx512_bf16 amx_bf16 amx_tile \
amx_int8 avx_vnni hypervisor smep constant_tsc

processor\t: 1
cpu MHz\t\t: 1200.000
flags\t\t: fpu sse
"""


def fake_cpu(root: Path, caches: list[tuple[str, str, str]], max_khz: str | None = None) -> Path:
    """A fake ``/sys/devices/system/cpu/cpu0`` with (level, type, size) cache entries."""
    cpu = root / "cpu0"
    for i, (level, kind, size) in enumerate(caches):
        index = cpu / "cache" / f"index{i}"
        index.mkdir(parents=True)
        (index / "level").write_text(level + "\n")
        (index / "type").write_text(kind + "\n")
        (index / "size").write_text(size + "\n")
    if max_khz is not None:
        (cpu / "cpufreq").mkdir(parents=True)
        (cpu / "cpufreq" / "cpuinfo_max_freq").write_text(max_khz + "\n")
    cpu.mkdir(parents=True, exist_ok=True)
    return cpu


def test_host_target_is_plausible() -> None:
    target = detect_target()
    assert target is detect_target()  # cached
    assert target.cores >= 1
    assert 8 * 1024 <= target.l1d_bytes <= 4 * 1024 * 1024
    assert target.l2_bytes >= target.l1d_bytes
    assert target.vector_bits in (128, 256, 512)
    if target.has("avx512f"):
        assert target.vector_bits == 512
    assert not any("_" in f for f in target.isa if f.startswith("avx512"))
    assert "hypervisor" not in target.isa


def test_features_caches_and_frequency_from_fake_files(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(CPUINFO_AVX512)
    cpu = fake_cpu(
        tmp_path,
        [
            ("1", "Data", "48K"),
            ("1", "Instruction", "32K"),
            ("2", "Unified", "2048K"),
            ("3", "Unified", "32M"),
        ],
        max_khz="3700000",
    )
    target = read_target(cpuinfo, cpu, tmp_path / "no-cgroup")
    assert {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512bf16"} <= target.isa
    assert {"amx_bf16", "amx_tile", "amx_int8", "avxvnni"} <= target.isa
    assert not {"hypervisor", "smep", "constant_tsc", "fpu"} & target.isa
    assert target.vector_bits == 512
    assert (target.l1d_bytes, target.l2_bytes, target.l3_bytes) == (48 << 10, 2 << 20, 32 << 20)
    assert target.frequency_ghz == 3.7


def test_missing_files_fall_back_to_defaults(tmp_path: Path) -> None:
    target = read_target(tmp_path / "none", tmp_path / "none", tmp_path / "none")
    defaults = Target()
    assert target.isa == frozenset()
    assert target.vector_bits == 128
    assert (target.l1d_bytes, target.l2_bytes, target.l3_bytes) == (
        defaults.l1d_bytes,
        defaults.l2_bytes,
        defaults.l3_bytes,
    )
    assert target.frequency_ghz is None
    assert target.cores >= 1


def test_avx2_only_and_cpuinfo_frequency(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("cpu MHz\t: 2400.0\nflags\t: sse2 avx avx2 fma\n")
    cpu = fake_cpu(tmp_path, [("1", "Data", "32K"), ("2", "Unified", "bogus")])
    target = read_target(cpuinfo, cpu, tmp_path / "none")
    assert target.vector_bits == 256
    assert target.frequency_ghz == 2.4
    assert target.l1d_bytes == 32 << 10
    assert target.l2_bytes == Target().l2_bytes  # unreadable size: default kept


@pytest.mark.parametrize(("cpu_max", "cores"), [("150000 100000", 2), ("max 100000", 8)])
def test_cores_from_affinity_capped_by_cgroup_quota(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cpu_max: str, cores: int
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(8)))
    quota = tmp_path / "cpu.max"
    quota.write_text(cpu_max + "\n")
    assert read_target(tmp_path / "none", tmp_path / "none", quota).cores == cores


@pytest.mark.parametrize(
    ("flag", "normal"),
    [
        ("avx512_bf16", "avx512bf16"),
        ("avx512_vnni", "avx512vnni"),
        ("amx_bf16", "amx_bf16"),
        ("avx_vnni", "avxvnni"),
        ("AVX2", "avx2"),
    ],
)
def test_normalize_flag(flag: str, normal: str) -> None:
    assert normalize_flag(flag) == normal


@pytest.mark.parametrize(
    ("text", "size"), [("48K", 48 << 10), ("32768K", 32 << 20), ("2M", 2 << 20), ("x", None)]
)
def test_parse_size(text: str, size: int | None) -> None:
    assert parse_size(text) == size


def test_override_validates() -> None:
    one_core = target_from_override(cores=1, isa=frozenset({"avx2"}))
    assert one_core.cores == 1
    assert one_core.has("avx2")
    assert one_core.l1d_bytes == detect_target().l1d_bytes
    with pytest.raises(ValueError):
        target_from_override(cache_lines=64)


AVX2_FLAGS = "sse2 avx avx2 fma"
AVX512_FLAGS = AVX2_FLAGS + " avx512f avx512bw avx512cd avx512dq avx512vl"


def cpuinfo_with_model(
    path: Path, vendor: str, family: int | None, model: int, flags: str = AVX2_FLAGS
) -> Path:
    """A fake /proc/cpuinfo naming the CPU's vendor, family (None: left out), model and
    flags (AVX2 by default)."""
    family_line = f"cpu family\t: {family}\n" if family is not None else ""
    path.write_text(f"vendor_id\t: {vendor}\n{family_line}model\t\t: {model}\nflags\t: {flags}\n")
    return path


@pytest.mark.parametrize(
    ("vendor", "family", "model", "flags", "fma_bits", "lanes_per_cycle"),
    [
        ("AuthenticAMD", 23, 1, AVX2_FLAGS, 128, 8),  # Zen 1 (EPYC 7001): 128-bit FMA units
        ("AuthenticAMD", 23, 8, AVX2_FLAGS, 128, 8),  # Zen+
        ("HygonGenuine", 24, 0, AVX2_FLAGS, 128, 8),  # Dhyana, a Zen 1 core
        ("AuthenticAMD", 23, 49, AVX2_FLAGS, None, 16),  # Zen 2 (EPYC 7002): 256-bit units
        ("AuthenticAMD", 25, 1, AVX2_FLAGS, None, 16),  # Zen 3 (EPYC 7003)
        ("AuthenticAMD", 25, 33, AVX2_FLAGS, None, 16),  # Zen 3 (Ryzen 5000)
        ("AuthenticAMD", 25, 17, AVX512_FLAGS, 256, 16),  # Zen 4 (EPYC 9004): 256-bit units
        ("AuthenticAMD", 25, 97, AVX512_FLAGS, 256, 16),  # Zen 4 (Ryzen 7000)
        ("AuthenticAMD", 25, 160, AVX512_FLAGS, 256, 16),  # Zen 4c (EPYC 9754)
        ("GenuineIntel", 6, 85, AVX512_FLAGS, None, 32),  # Skylake-SP: two 512-bit units
        ("GenuineIntel", 6, 85, AVX2_FLAGS, None, 16),
    ],
)
def test_fma_width_from_the_cpu_model(tmp_path: Path, vendor, family, model, flags, fma_bits,
                                      lanes_per_cycle) -> None:  # fmt: skip
    """Zen 1 runs a 256-bit FMA, and Zen 4 a 512-bit one, as two halves: half the FMA lanes
    per cycle of a core whose units are as wide as its vectors, read from cpuinfo's vendor,
    family and model."""
    cpuinfo = cpuinfo_with_model(tmp_path / "cpuinfo", vendor, family, model, flags)
    target = read_target(cpuinfo, tmp_path / "none", tmp_path / "none")
    assert target.fma_bits == fma_bits
    assert target.narrow_fma is (fma_bits is not None)
    assert target.fma_lanes_per_cycle() == lanes_per_cycle
    # Narrower vectors (SSE code on the same core) fit the units: full rate again.
    assert target.fma_lanes_per_cycle(lanes=4) == 8


def test_no_cpu_model_means_full_width_fma(tmp_path: Path) -> None:
    cpuinfo = cpuinfo_with_model(tmp_path / "cpuinfo", "AuthenticAMD", None, 1)
    assert read_target(cpuinfo, tmp_path / "none", tmp_path / "none").fma_bits is None
