"""Per-core rates the convolution cost models share (:mod:`.choice`, :mod:`.col2im`,
:mod:`.winograd_cost`): the FMA peak per cycle of an element type, read from the target."""

from __future__ import annotations

from stagegraph.stages.target import Target

#: Bits of each element type the cost models price (others count as f32).
ELEMENT_BITS = {"f16": 16, "bf16": 16, "f32": 32, "f64": 64}


def peak_per_cycle(target: Target, element: str) -> float:
    """Flops per cycle of one core at the FMA peak for ``element`` (f32 lanes scaled)."""
    bits = ELEMENT_BITS.get(element, 32)
    return 2.0 * target.fma_lanes_per_cycle() * 32 / bits
