"""The implicit-GEMM choice for convolutions, as the ``x86.normalize`` stage's config: pure
data, no MLIR, so a graph file, a tuner or a benchmark can set it
(``graph.with_config("normalize", conv_gemm=False)``)."""

from __future__ import annotations

from pydantic import Field

from stagegraph.core.ports import Config


class ConvGemmConfig(Config):
    """Which channels-first convolutions run as the implicit GEMM of their patches
    (:mod:`stagegraph.stages.x86.conv_gemm`) instead of the direct path.

    ``conv_gemm``: off, every convolution takes the direct path. ``min_filters``: fewer
    filters than this keep the direct path (the patch copy costs one move per ``2 *
    filters`` flops). ``max_patch_elements``: a larger patch matrix streams through memory
    instead of cache; such convolutions keep the direct path."""

    conv_gemm: bool = True
    min_filters: int = Field(4, ge=1)
    max_patch_elements: int = Field(1 << 26, ge=1)
