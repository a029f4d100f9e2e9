"""Register blocking of the channels-last 3-D direct kernel (:mod:`.direct3d`): pure data,
no MLIR, so the cost model and the tests read it without building IR.

The kernel keeps a block of ``images x rows x columns`` output positions times
``vectors`` vectors of filters in registers while it runs the whole reduction (every
channel of every tap the block reads). Each reduction step loads ``vectors`` filter
vectors and broadcasts one input element per position, then issues one FMA per
accumulator. The step's time is the largest of three bounds, all read from the target:
the FMAs over the FMA units, the loads (filters and broadcasts) over the load ports, and
the FMA latency (each accumulator's chain waits on its previous FMA). A convolution of a
zero-padded input (a stride-1 transposed convolution, a padded convolution) skips, per
block, the taps that read only the zero border of every position of the block
(:func:`tap_range`): the blocking that wins is the one with the fewest estimated cycles
over the whole convolution, border and tail blocks counted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

#: Cycles from an FMA's issue to its result (every x86 core since Haswell: 4 or 5).
FMA_LATENCY = 4
#: Loads per cycle from L1 (two ports on every AVX2/AVX-512 core the project targets).
LOAD_PORTS = 2
#: Filter vectors per block at most (each broadcast then feeds that many FMAs; more
#: leave too few registers for positions).
MAX_VECTORS = 6
#: Vector registers the block leaves free besides its filter vectors: one broadcast and
#: one for the compiler (address arithmetic never needs one; a spill of an accumulator in
#: the reduction loop costs more than the block it widens).
SPARE_REGISTERS = 2


@dataclass(frozen=True)
class Target3d:
    """What the blocking reads of the target: bytes of a vector register, how many there
    are, vector FMAs per cycle; ``accumulators`` caps a block (0: no cap)."""

    vector_bytes: int
    registers: int
    fma_units: int
    accumulators: int = 0


def direct3d_target(params: Any) -> Target3d | None:
    """The kernel's :class:`Target3d` from the generic schedule's params (its
    ``GenericParams``), or ``None`` when they turn the kernel off."""
    if not params.conv3d_direct:
        return None
    return Target3d(
        params.vector_bytes, params.vector_registers, params.vector_fmas_per_cycle,
        params.conv3d_accumulators,
    )  # fmt: skip


@dataclass(frozen=True)
class Window:
    """One spatial dim of a convolution: ``out`` outputs, ``taps`` taps, its stride and
    dilation, and the input it reads: ``size`` real elements after ``pad`` zeros (a
    convolution of an unpadded input: ``pad`` 0 and ``size`` the whole input)."""

    out: int
    taps: int
    stride: int
    dilation: int
    size: int
    pad: int = 0


@dataclass(frozen=True)
class Conv3dShape:
    """A channels-last 3-D convolution: ``n`` images, ``c`` channels, ``f`` filters and
    its three windows (depth, height, width)."""

    n: int
    c: int
    f: int
    windows: tuple[Window, Window, Window]

    @property
    def flops(self) -> int:
        outputs = self.n * math.prod(w.out for w in self.windows)
        return 2 * outputs * self.f * self.c * math.prod(w.taps for w in self.windows)


@dataclass(frozen=True)
class BlockPlan:
    """The kernel's blocking: ``vectors`` of ``lanes`` filters (of ``filter_vectors`` in
    all, the filters padded to whole vectors) times ``images x rows x columns`` output
    positions; along a row, whole blocks of ``columns``, then one of ``tail`` columns;
    ``cycles`` its estimate for the whole convolution."""

    lanes: int
    vectors: int
    filter_vectors: int
    images: int
    rows: int
    columns: int
    tail: int
    cycles: float

    @property
    def accumulators(self) -> int:
        return self.vectors * self.images * self.rows * self.columns


def tap_range(window: Window, first: int, count: int) -> tuple[int, int]:
    """The taps ``[lo, hi)`` that read real input for at least one of the outputs
    ``first .. first + count - 1``: output ``o`` reads ``o * stride + t * dilation - pad``,
    real when in ``[0, size)``."""
    last = first + count - 1
    lo = max(0, -((last * window.stride - window.pad) // window.dilation))
    hi = min(
        window.taps, (window.size - 1 + window.pad - first * window.stride) // window.dilation + 1
    )
    return lo, max(lo, hi)


def _taps_over_blocks(window: Window, block: int) -> tuple[int, int]:
    """Sum of the tap counts of the whole blocks of ``block`` outputs, and of the tail
    block's (the last ``out % block`` outputs)."""
    whole = sum(
        hi - lo
        for start in range(0, window.out - window.out % block, block)
        for lo, hi in [tap_range(window, start, block)]
    )
    tail = window.out % block
    if not tail:
        return whole, 0
    lo, hi = tap_range(window, window.out - tail, tail)
    return whole, hi - lo


def step_cycles(vectors: int, positions: int, fma_units: int) -> float:
    """Cycles of one reduction step of a block: FMAs, loads or the FMA latency."""
    fmas = vectors * positions / fma_units
    loads = (vectors + positions) / LOAD_PORTS
    return max(fmas, loads, float(FMA_LATENCY))


def _divisors(n: int, cap: int) -> list[int]:
    return [d for d in range(1, min(n, cap) + 1) if n % d == 0]


def _estimate(
    shape: Conv3dShape, blocks: int, vectors: int, block: tuple[int, int, int], fma_units: int
) -> float:
    """Cycles of the convolution blocked so: ``blocks`` blocks of ``vectors`` filter
    vectors, ``block`` (images, rows, columns) positions each (see the module)."""
    images, rows, columns = block
    depth, height, width = shape.windows
    depth_taps = sum(hi - lo for o in range(depth.out) for lo, hi in [tap_range(depth, o, 1)])
    row_taps, row_tail = _taps_over_blocks(height, rows)
    column_taps, column_tail = _taps_over_blocks(width, columns)
    outer = shape.n // images * depth_taps * (row_taps + row_tail) * shape.c * blocks
    whole = column_taps * step_cycles(vectors, images * rows * columns, fma_units)
    tail = width.out % columns
    rest = column_tail * step_cycles(vectors, images * rows * tail, fma_units) if tail else 0.0
    return outer * (whole + rest)


def plan_blocks(
    shape: Conv3dShape, lanes: int, registers: int, fma_units: int, budget: int = 0
) -> BlockPlan | None:
    """The blocking with the fewest estimated cycles; ``budget`` caps its accumulators
    (0: what the registers leave, see :data:`SPARE_REGISTERS`). ``None`` when the filters
    end in a partial vector and take more than :data:`MAX_VECTORS` vectors (a block then
    covers only some of the filters, and the last block's output would be partial)."""
    filter_vectors = math.ceil(shape.f / lanes)
    partial = shape.f % lanes != 0
    if partial and filter_vectors > MAX_VECTORS:
        return None
    choices = [filter_vectors] if partial else _divisors(filter_vectors, MAX_VECTORS)
    best: BlockPlan | None = None
    _, height, width = shape.windows
    for vectors in choices:
        room = (registers - vectors - SPARE_REGISTERS) // vectors
        if budget:
            room = min(room, budget // vectors)
        for images in _divisors(shape.n, room):
            for rows in _divisors(height.out, room // images):
                columns = min(width.out, room // (images * rows))
                block = (images, rows, columns)
                cycles = _estimate(shape, filter_vectors // vectors, vectors, block, fma_units)
                if best is None or cycles < best.cycles:
                    best = BlockPlan(
                        lanes, vectors, filter_vectors, images, rows, columns,
                        width.out % columns, cycles,
                    )  # fmt: skip
    return best
