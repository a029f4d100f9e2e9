"""Tiles of elementwise ops that transpose: whole cache lines of the transposed input.

An elementwise op may read an input through a permutation (the transpose of a
channels-last convolution's result back to NCHW, :mod:`.transpose_fusion`, or one folded
into its epilogue). :func:`~.params.tile_sizes_for` tiles the output's innermost loop and
gives every other loop a tile of 1; the transposed input's own contiguous dim then moves
by one element per tile, and the loops over it are the forall's outermost: between two
tiles that read neighbouring elements of one cache line, the whole tensor passes through
the cache. Past L2 each line is fetched from memory once per element it holds (16x the
traffic of f32): the transpose after a 64-channel convolution on a 224x224 image
(12.8 MB) read 205 MB and took as long as the convolution's own kernel
(docs/measurements.md, "Transposes that read whole cache lines").

The rule: that loop's tile holds one cache line of the input (:data:`LINE_BYTES` over its
element size), so every line a tile reads is consumed whole (:func:`line_tiles`). Where
that line is one vector of f32 (AVX-512), the output's innermost tile takes a line too and
the 16x16 transpose is lowered as shuffles instead of element by element
(:func:`square_tiles`: 1.11x on that convolution; 16x16 tiles lowered element by
element were 5% slower than the 16x56 ones).
"""

from __future__ import annotations

from stagegraph.dtypes import byte_size
from stagegraph.stages.analysis import OpFacts, ValueFacts
from stagegraph.stages.x86.generic.params import tile_size

#: Bytes of an x86 cache line.
LINE_BYTES = 64


def transposed_inputs(op: OpFacts) -> list[tuple[int, ValueFacts]]:
    """(loop, input) per input of ``op`` whose innermost dim is indexed by a parallel loop
    other than the innermost one (a transposed read), longer than 1."""
    if not op.loop_ranges or not op.operand_dims:
        return []
    innermost = len(op.loop_ranges) - 1
    found = []
    for value, dims in zip(op.inputs, op.operand_dims, strict=False):
        if not dims or len(value.shape) != len(dims):
            continue
        loop = dims[-1]
        if loop < 0 or loop == innermost or op.loop_ranges[loop] == 1:
            continue
        if op.iterator_types[loop] == "parallel":
            found.append((loop, value))
    return found


def line_tiles(op: OpFacts, sizes: list[int]) -> list[int]:
    """``sizes`` (an elementwise op's tiles) with each transposed input's contiguous loop
    tiled by a cache line of it (see the module); unchanged where no input transposes or
    that loop's tile is already larger."""
    sizes = list(sizes)
    for loop, value in transposed_inputs(op):
        line = max(1, LINE_BYTES // (byte_size(value.dtype, default=4) or 4))
        if sizes[loop] >= line:
            continue
        sizes[loop] = tile_size(op.loop_ranges[loop], line, partial=False)
    return sizes


#: The transposes MLIR lowers as shuffles (``VectorTransposeLowering.Shuffle16x16``).
SHUFFLE_SIDE, SHUFFLE_DTYPE = 16, "f32"


def square_tiles(op: OpFacts, sizes: list[int], lanes: int) -> tuple[list[int], bool]:
    """(tiles, lower as shuffles): ``sizes`` (after :func:`line_tiles`) with the output's
    innermost tile at :data:`SHUFFLE_SIDE` where the op's one transposed input is f32,
    its line is that many elements and one vector (``lanes``), and both tiled loops divide
    by it: each tile is then one 16x16 transpose, which the schedule lowers as shuffles.
    Elsewhere ``sizes`` unchanged and False."""
    found = transposed_inputs(op)
    innermost = len(sizes) - 1
    if len(found) != 1 or lanes != SHUFFLE_SIDE or innermost < 1:
        return sizes, False
    ((loop, value),) = found
    if value.dtype != SHUFFLE_DTYPE or sizes[loop] != SHUFFLE_SIDE:
        return sizes, False
    if op.loop_ranges[innermost] % SHUFFLE_SIDE:
        return sizes, False
    squared = list(sizes)
    squared[innermost] = SHUFFLE_SIDE
    return squared, True
