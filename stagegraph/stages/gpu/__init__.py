"""The NVIDIA GPU target package: GPU target facts, a GPU cost model, a transform-dialect
schedule that maps ops to blocks and threads, the lowering of kernels to NVVM, and the
emission of PTX per kernel with a host-side launch plan.

Importing it registers what the generic layers need from it without naming it: its stage
modules (imported on the first stage lookup) and its target names (:data:`GPU_TARGETS`,
listed by ``stagegraph list gpu-targets``). Nothing here loads MLIR.
"""

from __future__ import annotations

from stagegraph.core.registry import Registry
from stagegraph.core.stage import register_stage_module
from stagegraph.errors import UnknownTargetError
from stagegraph.stages.gpu.target_names import GPUS

for _module in ("target", "normalize", "split_reduction", "params", "schedule", "lower", "emit"):
    register_stage_module(f"stagegraph.stages.gpu.{_module}")

#: GPU target names, each to the lazy resolver of its facts (``cuda``: the first GPU present,
#: read from the driver); a plugin registers more with ``GPU_TARGETS.register``.
GPU_TARGETS: Registry[str] = Registry(
    "GPU target", plural="gpu-targets", error=UnknownTargetError, resolve=lambda _n, e: e
)
for _name in sorted(GPUS):
    GPU_TARGETS.register(_name, _name, origin="stagegraph.stages.gpu.target_names")
GPU_TARGETS.register("cuda", "cuda", origin="the first NVIDIA GPU present")

#: The names ``--target`` accepts for GPU graphs.
TARGET_NAMES: tuple[str, ...] = (*sorted(GPUS), "cuda")


def is_gpu_target(name: str | None) -> bool:
    """Whether ``name`` names a GPU target (a GPU graph's target stage resolves it)."""
    return name is not None and name.strip().lower() in TARGET_NAMES
