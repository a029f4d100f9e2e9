"""Per-core rates the convolution cost models share (:mod:`.choice`, :mod:`.col2im`,
:mod:`.winograd_cost`): the FMA peak per cycle of an element type, read from the target."""

from __future__ import annotations

from stagegraph.dtypes import byte_size
from stagegraph.stages.target import Target


def element_bits(element: str) -> int:
    """Bits of an element type (unknown names count as f32)."""
    return 8 * byte_size(element, 4)


def peak_per_cycle(target: Target, element: str) -> float:
    """Flops per cycle of one core at the FMA peak for ``element`` (f32 lanes scaled)."""
    bits = element_bits(element)
    return 2.0 * target.fma_lanes_per_cycle() * 32 / bits
