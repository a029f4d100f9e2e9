"""Named NVIDIA GPUs: the documented facts a GPU cost model plans with.

Each name stands for one product of its architecture (the one this project measures or
the most common data-center part); with a GPU present, ``--target cuda`` reads the same
facts from the driver instead (:func:`stagegraph.stages.gpu.target.driver_target`).

Sources: NVIDIA's architecture whitepapers and product datasheets (A100 SXM4 80GB, RTX
3090, L40S, H100 SXM5 80GB, H200 SXM 141GB) and the CUDA C++ Programming Guide's table of
compute-capability limits. Peak rates are dense (no sparsity), in TFLOP/s at boost clock;
``fma`` is the CUDA cores' rate (2 flops per FMA), ``tensor`` the tensor cores' rate by
input dtype (f32 runs as tf32).
"""

from __future__ import annotations

from dataclasses import dataclass, field

KIB, MIB = 1024, 1024 * 1024


@dataclass(frozen=True)
class NamedGpu:
    """What a GPU name implies (per-SM and per-block limits are the architecture's)."""

    product: str
    arch: str  # the PTX target: sm_80, sm_90a, ...
    sm_count: int
    shared_bytes_per_sm: int
    shared_bytes_per_block_optin: int
    l2_bytes: int
    memory_bandwidth_gbs: float
    max_threads_per_sm: int
    fma_tflops: dict[str, float] = field(default_factory=dict)
    tensor_tflops: dict[str, float] = field(default_factory=dict)


_A100 = NamedGpu(
    "NVIDIA A100-SXM4-80GB", "sm_80", 108, 164 * KIB, 163 * KIB, 40 * MIB, 2039.0, 2048,
    {"f64": 9.7, "f32": 19.5, "f16": 78.0, "bf16": 39.0},
    {"f64": 19.5, "f32": 156.0, "f16": 312.0, "bf16": 312.0, "i8": 624.0},
)  # fmt: skip
_RTX3090 = NamedGpu(
    "NVIDIA GeForce RTX 3090", "sm_86", 82, 100 * KIB, 99 * KIB, 6 * MIB, 936.0, 1536,
    {"f64": 0.56, "f32": 35.6, "f16": 35.6, "bf16": 35.6},
    {"f32": 35.6, "f16": 71.0, "bf16": 71.0, "i8": 284.0},
)  # fmt: skip
_L40S = NamedGpu(
    "NVIDIA L40S", "sm_89", 142, 100 * KIB, 99 * KIB, 96 * MIB, 864.0, 1536,
    {"f64": 1.4, "f32": 91.6, "f16": 91.6, "bf16": 91.6},
    {"f32": 183.0, "f16": 362.0, "bf16": 362.0, "f8": 733.0, "i8": 733.0},
)  # fmt: skip
_H100 = NamedGpu(
    "NVIDIA H100 80GB HBM3", "sm_90a", 132, 228 * KIB, 227 * KIB, 50 * MIB, 3350.0, 2048,
    {"f64": 33.5, "f32": 66.9, "f16": 133.8, "bf16": 133.8},
    {"f64": 66.9, "f32": 494.7, "f16": 989.4, "bf16": 989.4, "f8": 1978.9, "i8": 1978.9},
)  # fmt: skip
_H200 = NamedGpu(
    "NVIDIA H200", "sm_90a", 132, 228 * KIB, 227 * KIB, 60 * MIB, 4800.0, 2048,
    dict(_H100.fma_tflops), dict(_H100.tensor_tflops),
)  # fmt: skip

#: ``--target`` names: an architecture stands for its most common data-center part.
GPUS: dict[str, NamedGpu] = {
    "sm_80": _A100,
    "sm_86": _RTX3090,
    "sm_89": _L40S,
    "sm_90a": _H100,
    "h100": _H100,
    "h200": _H200,
}

#: By compute capability: the defaults for facts a driver cannot report (peak rates).
BY_CAPABILITY: dict[tuple[int, int], NamedGpu] = {
    (8, 0): _A100,
    (8, 6): _RTX3090,
    (8, 9): _L40S,
    (9, 0): _H100,
}
