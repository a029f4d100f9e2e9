"""Where Winograd may run and what it costs: the estimate the convolution path model
(:mod:`stagegraph.stages.x86.conv.choice`) weighs against the direct kernel and the
implicit GEMM; the rewrite itself is :mod:`stagegraph.stages.x86.conv.winograd`."""

from __future__ import annotations

import math

from stagegraph.stages.target import Target
from stagegraph.stages.x86.conv.config import ConvGemmConfig
from stagegraph.stages.x86.conv.conv_shape import ConvShape
from stagegraph.stages.x86.conv.rates import element_bits, peak_per_cycle
from stagegraph.stages.x86.conv.winograd_math import alpha


def winograd_worth(shape: ConvShape, config: ConvGemmConfig, element: str = "f32") -> bool:
    """Whether ``shape`` may run as Winograd: on in ``config``, a 2-D 3x3 window at unit
    strides and dilations, f32 (the type whose rounding the tile choice was checked for)."""
    return (
        config.winograd
        and element == "f32"
        and shape.taps == (3, 3)
        and shape.strides == (1, 1)
        and shape.dilations == (1, 1)
    )


def tiles(shape: ConvShape, m: int) -> tuple[int, int]:
    """The output tiles along the height and the width (the last ones partial)."""
    return math.ceil(shape.out[0] / m), math.ceil(shape.out[1] / m)


def winograd_cycles(
    shape: ConvShape, target: Target, config: ConvGemmConfig, element: str = "f32"
) -> float:
    """Estimated cycles of one core: the ``alpha^2`` matmuls (``P`` tile positions by ``C``
    by ``F``) at the matmul kernel's fraction of the peak, lowered by few filters, channels
    (``winograd_columns_half``) or tile positions (``winograd_rows_half``: a short matmul
    has short register blocks); the transformed filters (``alpha^2 C F``, ``alpha^2 / 9``
    times the weights) read once per call, at ``winograd_weight_bytes_per_cycle`` past L2;
    plus the transforms and transposes, per element moved: ``alpha^2 P C`` transformed
    inputs and ``alpha^2 P F`` products at ``winograd_transform_cycles``, the image and the
    output transposed at ``patch_cycles``."""
    m = config.winograd_tile
    side = alpha(m)
    th, tw = tiles(shape, m)
    positions = shape.n * th * tw
    half = config.winograd_columns_half
    fraction = config.gemm_peak_fraction * shape.f / (shape.f + half) * shape.c / (shape.c + half)
    fraction *= positions / (positions + config.winograd_rows_half)
    gemm = (
        2.0
        * side
        * side
        * positions
        * shape.c
        * shape.f
        / (peak_per_cycle(target, element) * fraction)
    )
    weight_bytes = side * side * shape.c * shape.f * element_bits(element) // 8
    if weight_bytes > target.l2_bytes:
        gemm += weight_bytes / config.winograd_weight_bytes_per_cycle
    moved = side * side * positions * (shape.c + shape.f)
    image = shape.n * shape.c * (shape.out[0] + 2) * (shape.out[1] + 2)
    transposed = image + shape.n * shape.f * math.prod(shape.out)
    return gemm + moved * config.winograd_transform_cycles + transposed * config.patch_cycles
