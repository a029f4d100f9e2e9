"""How the packed kernel reads a constant weight that lies past L2: in one sequential
stream, prefetched ahead (:mod:`.stream_prefetch`).

A weight packed at compile time (:mod:`.constant_pack`) comes from memory (or L3) on
every call once it outgrows L2. With few rows (a Linear layer at batch 1-64) each of its
elements serves few FMAs, so the kernel waits on the weight unless the loads are in
flight long before the register tiles need them. Two choices make that so:

- One K block (``tile_k = 0``) where A's packed rows (``m x k``) fit a quarter of L2
  (:data:`A_L2_SHARE`): the kernel then walks the packed constant
  ``[N / reg_n, K, reg_n]`` in its memory order, panel after panel, so "ahead" is just
  further along memory, and a fixed distance (:data:`STREAM_PREFETCH_BYTES`) keeps
  enough lines in flight. The register tiles of each panel keep their accumulators over
  all of K and write C once (no packed C).
- Else (K blocks, each pass over B reads one K block of every panel): the prefetch runs
  one panel ahead, ``k x reg_n`` elements further in memory, which is the micro-panel
  the next column of register tiles reads.

Measured on a Xeon (AVX-512, 2 MiB L2), 1 thread, a 4096x4096 constant weight (64 MiB),
thread CPU time, under load: batch 4 1.58x faster, batch 16 1.63x, batch 64 1.11x, batch
128 1.04x; IREE (llvm-cpu, data tiling) went from 0.66x to 1.06x of our time at batch 4
(docs/measurements.md, "Linear layers with weights past the caches").
"""

from __future__ import annotations

from stagegraph.stages.target import Target
from stagegraph.stages.x86.matmul.params import MatmulParams, whole_b_panels

#: Prefetch distance along a sequential weight stream: about the bytes the memory system
#: must have in flight to stream at full speed from one core (~100 ns of latency at
#: ~20 GB/s is 2 KiB), several times over, and a small part of any L2. Measured at batch
#: 16, 4096x4096: 8, 16 and 32 KiB within noise of each other (1.6-1.8x), 4 KiB 1.45x.
STREAM_PREFETCH_BYTES = 16 * 1024
#: A single K block is taken where A's packed rows take at most this share of L2: they are
#: read again for every panel of B, beside the stream passing through.
A_L2_SHARE = 4
#: K block of a B read as it lies (unpacked, ``[k, n]`` rows: a few rows of A against a
#: weight whose columns make no whole panels, 4096 -> 4100) once B lies past L2. The
#: register tiles sweep the columns of one K block at a time, so the block's rows are as
#: many concurrent streams through memory; the hardware prefetchers follow a few dozen
#: (Intel's L2 streamer 32, Zen's fewer). Measured (Xeon, 1 thread, 4096 -> 4100): batch 4
#: K blocks of 256 -> 16 1.88x faster, batch 8 2.5x, 8 and 32 rows slightly slower than 16;
#: AVX2 code (x86-64-v3) at batch 4 2.3x; a 4 MiB weight at batch 3 unchanged (0.97).
UNPACKED_STREAM_ROWS = 16


def streams_constant_b(n: int, k: int, elem: int, target: Target) -> bool:
    """Whether a constant ``k x n`` weight lies past L2 (read from L3 or memory per call)."""
    return k * n * elem > target.l2_bytes


def unpacked_b_streams(pack: bool, n: int, k: int, elem: int, target: Target) -> bool:
    """Whether the register tiles read a ``k x n`` B past L2 as it lies (not packed): its K
    block should then be :data:`UNPACKED_STREAM_ROWS` rows."""
    return not pack and k > UNPACKED_STREAM_ROWS and streams_constant_b(n, k, elem, target)


def stream_constant_b(
    params: MatmulParams, m: int, n: int, k: int, elem: int, target: Target
) -> MatmulParams:
    """``params`` for a constant B (packed at compile time) read as a prefetched stream
    when it lies past L2 (see the module doc); unchanged otherwise, or where B will not
    be packed at compile time (no whole panels, no packed kernel)."""
    if not (params.pack and whole_b_panels(n, params) and streams_constant_b(n, k, elem, target)):
        return params
    if m * k * elem * A_L2_SHARE <= target.l2_bytes:
        return params.model_copy(update={"tile_k": 0, "prefetch_b": STREAM_PREFETCH_BYTES})
    if not params.k_block(k):
        return params.model_copy(update={"prefetch_b": STREAM_PREFETCH_BYTES})
    return params.model_copy(update={"prefetch_b": k * params.reg_n * elem})
