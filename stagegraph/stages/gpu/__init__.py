"""The NVIDIA GPU graph's stages: GPU target facts, a GPU cost model, a transform-dialect
schedule that maps ops to blocks and threads, the lowering of kernels to NVVM, and the
emission of PTX per kernel with a host-side launch plan.

:data:`TARGET_NAMES` and :func:`is_gpu_target` are the small hook through which the
``--target`` option learns these names (one registry of targets can absorb them later).
"""

from __future__ import annotations

from stagegraph.stages.gpu.target_names import GPUS

#: The names ``--target`` accepts for GPU graphs (``cuda``: the first GPU present).
TARGET_NAMES: tuple[str, ...] = (*sorted(GPUS), "cuda")


def is_gpu_target(name: str | None) -> bool:
    """Whether ``name`` names a GPU target (a GPU graph's target stage resolves it)."""
    return name is not None and name.strip().lower() in TARGET_NAMES
