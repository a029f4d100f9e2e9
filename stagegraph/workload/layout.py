"""How a sharded workload's arrays are split over a grid of devices (MPI ranks), and which
block of a global array each rank holds: what the MPI launcher needs to scatter inputs and
assemble outputs, for any workload that declares a ``layout()``."""

from __future__ import annotations

import numpy as np

from stagegraph.core.ports import Schema

Split = tuple[tuple[int, ...], ...]
"""Per tensor dimension, the grid axes it is split over (``()`` = not split)."""


class Layout(Schema):
    """Grid shape and the split of every argument and result of ``main``."""

    grid: tuple[int, ...]
    inputs: tuple[Split, ...]
    outputs: tuple[Split, ...]

    @property
    def ranks(self) -> int:
        return int(np.prod(self.grid))

    def coords(self, rank: int) -> tuple[int, ...]:
        """Grid coordinates of a linear rank (row-major, as ``shard`` numbers processes)."""
        return tuple(int(c) for c in np.unravel_index(rank, self.grid))


def local_slices(split: Split, shape: tuple[int, ...], layout: Layout, rank: int) -> tuple:
    """The block of a global array that ``rank`` holds under ``split`` (even splits only)."""
    coords = layout.coords(rank)
    index = []
    for dim, axes in zip(shape, split, strict=False):
        parts, position = 1, 0
        for axis in axes:  # the first axis is the major one
            position = position * layout.grid[axis] + coords[axis]
            parts *= layout.grid[axis]
        size = dim // parts
        index.append(slice(position * size, (position + 1) * size))
    return tuple(index) + (slice(None),) * (len(shape) - len(index))


def owns_block(split: Split, layout: Layout, rank: int) -> bool:
    """True for the one rank per block that reports it (coordinate 0 on unused axes)."""
    used = {a for axes in split for a in axes}
    coords = layout.coords(rank)
    return all(coords[a] == 0 for a in range(len(layout.grid)) if a not in used)
