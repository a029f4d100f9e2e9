"""What a GPU cost model knows of the device: SMs, per-block and per-SM limits, caches,
memory bandwidth and peak rates.

:class:`GpuTarget` stands beside the CPU :class:`~stagegraph.stages.target.Target` (a
different machine model, not more fields on it). A name (``sm_90a``, ``h100``, ...) gives
the documented facts of :mod:`stagegraph.stages.gpu.target_names`; ``cuda`` reads the first
GPU present through the driver (:mod:`stagegraph.runtime.cuda`), keeping the named defaults
only for what a driver does not report (peak rates).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from stagegraph.core.ports import Facts
from stagegraph.core.stage import stage
from stagegraph.stages.gpu.target_names import BY_CAPABILITY, GPUS, NamedGpu
from stagegraph.stages.target import TargetConfig

KIB = 1024


class GpuTarget(Facts):
    """An NVIDIA GPU as the GPU cost model and the PTX emitter see it.

    ``arch`` is the PTX target (``sm_90a``); ``source`` says where the facts came from
    (``named``: the documented defaults of ``name``; ``driver``: read from the device).
    """

    name: str = "sm_90a"
    arch: str = "sm_90a"
    product: str = ""
    source: str = "named"
    sm_count: int = 132
    warp_size: int = 32
    max_threads_per_block: int = 1024
    max_threads_per_sm: int = 2048
    registers_per_block: int = 65536
    registers_per_sm: int = 65536
    max_registers_per_thread: int = 255
    shared_bytes_per_block: int = 48 * KIB  # without opting in
    shared_bytes_per_block_optin: int = 227 * KIB
    shared_bytes_per_sm: int = 228 * KIB
    l2_bytes: int = 50 * 1024 * KIB
    memory_bandwidth_gbs: float = 3350.0
    fma_tflops: dict[str, float] = Field(default_factory=dict)
    tensor_tflops: dict[str, float] = Field(default_factory=dict)

    @property
    def sm(self) -> int:
        """The compute capability as one number (``sm_90a``: 90)."""
        return int(self.arch.removeprefix("sm_").rstrip("a"))

    def peak_tflops(self, dtype: str, tensor_cores: bool = False) -> float | None:
        """The dense peak rate for ``dtype`` (None where the table has none)."""
        return (self.tensor_tflops if tensor_cores else self.fma_tflops).get(dtype)


def named_target(name: str, machine: NamedGpu) -> GpuTarget:
    """The documented facts of a named GPU."""
    return GpuTarget(
        name=name,
        arch=machine.arch,
        product=machine.product,
        source="named",
        sm_count=machine.sm_count,
        max_threads_per_sm=machine.max_threads_per_sm,
        shared_bytes_per_block_optin=machine.shared_bytes_per_block_optin,
        shared_bytes_per_sm=machine.shared_bytes_per_sm,
        l2_bytes=machine.l2_bytes,
        memory_bandwidth_gbs=machine.memory_bandwidth_gbs,
        fma_tflops=dict(machine.fma_tflops),
        tensor_tflops=dict(machine.tensor_tflops),
    )


def target_from_properties(props: dict[str, Any]) -> GpuTarget:
    """A target from the driver's device properties (:func:`runtime.cuda.device_properties`):
    every limit as the device reports it, peak rates from the named part of the same
    compute capability (a driver reports no rates)."""
    major, minor = props["capability"]
    like = BY_CAPABILITY.get((major, minor)) or GPUS["sm_90a" if major >= 9 else "sm_80"]
    arch = f"sm_{major}{minor}" + ("a" if (major, minor) == (9, 0) else "")
    bandwidth = 2 * props["memory_clock_khz"] * 1e3 * props["memory_bus_bits"] / 8 / 1e9
    return GpuTarget(
        name="cuda",
        arch=arch,
        product=props["name"],
        source="driver",
        sm_count=props["sm_count"],
        warp_size=props["warp_size"],
        max_threads_per_block=props["max_threads_per_block"],
        max_threads_per_sm=props["max_threads_per_sm"],
        registers_per_block=props["registers_per_block"],
        registers_per_sm=props["registers_per_sm"],
        shared_bytes_per_block=props["shared_bytes_per_block"],
        shared_bytes_per_block_optin=props["shared_bytes_per_block_optin"],
        shared_bytes_per_sm=props["shared_bytes_per_sm"],
        l2_bytes=props["l2_bytes"],
        memory_bandwidth_gbs=round(bandwidth, 1) if bandwidth > 0 else like.memory_bandwidth_gbs,
        fma_tflops=dict(like.fma_tflops),
        tensor_tflops=dict(like.tensor_tflops),
    )


def driver_target() -> GpuTarget:
    """The first GPU present, read through the CUDA driver.

    Raises:
        GpuUnavailableError: no driver or no device on this machine.
    """
    from stagegraph.runtime.cuda import device_properties

    return target_from_properties(device_properties(0))


def resolve_gpu_target(name: str | None) -> GpuTarget:
    """The facts of a GPU target name (default ``sm_90a``).

    Raises:
        UnknownTargetError: not a GPU name (with a "did you mean").
        GpuUnavailableError: ``cuda`` on a machine without a GPU.
    """
    from stagegraph.errors import UnknownTargetError, unknown_name_message
    from stagegraph.stages.gpu import TARGET_NAMES

    key = (name or "sm_90a").strip().lower()
    if key == "cuda":
        return driver_target()
    machine = GPUS.get(key)
    if machine is None:
        raise UnknownTargetError(unknown_name_message("GPU target", key, TARGET_NAMES))
    return named_target(key, machine)


class GpuTargetConfig(TargetConfig):
    """``name``: a GPU name (``sm_80``, ``sm_86``, ``sm_89``, ``sm_90a``, ``h100``,
    ``h200``) or ``cuda`` (the first GPU present); ``overrides``: fields to replace."""


@stage("analysis", name="gpu.target")
def gpu_target(config: GpuTargetConfig) -> GpuTarget:
    """The GPU the cost model plans for: the named (or present) GPU, with any overrides."""
    resolved = resolve_gpu_target(config.name)
    if config.overrides:
        return GpuTarget(**{**resolved.model_dump(), **config.overrides})
    return resolved
