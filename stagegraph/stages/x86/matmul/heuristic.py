"""The heuristic that derives the x86 matmul schedule's knobs (:class:`MatmulParams`) from
the target: register tile from the vector width and register file, K block from L1, row and
column blocks from L2 and L3, parallel blocks from the thread count. No size table.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from stagegraph.dtypes import byte_size
from stagegraph.stages.target import Target
from stagegraph.stages.x86.matmul.params import MatmulParams, pack_k_step, whole_b_panels
from stagegraph.stages.x86.matmul.stream_params import (
    UNPACKED_STREAM_ROWS,
    stream_constant_b,
    unpacked_b_streams,
)

# Register-tile rows preferred on 16 registers when the FMA units are half as wide as the
# vectors (Zen 1 on AVX2: one 256-bit FMA per cycle, so 8 chains of latency 5 keep it busy),
# when they divide m (else rows that do, as on other cores: an LSTM's batch of 10 keeps 5).
# The measurements behind this and every choice below: docs/measurements.md, "Design
# decisions: the matmul heuristic".
NARROW_FMA_ROWS = 4
# K steps of a K block per C element of the register tile, which reloads and stores its C
# once per K block: kc >= C_TILE_K_STEPS x reg_m x reg_n. L1 alone sizes AVX-512's 8x32
# tile a K block of 128, where the C tile's reloads stall the FMAs. AVX2's tiles (6x16,
# 4x16) keep their L1 blocks, which are longer. Only where m spans two or more row blocks
# of the longer K block: with one, the B micro-panel would stream from L2 for nothing.
C_TILE_K_STEPS = 2
# Blocks per thread the parallel block loop aims for (see _split_for_threads).
BLOCKS_PER_THREAD = 2
# Packing cost of an A element relative to a B element: A's panels are a transposition
# (rows of A become reg_m-wide columns), B's a copy of row segments (see _halve).
A_PACK_COST = 2
# Shortest block edge (rows and columns), in register panels of reg_n columns.
MIN_BLOCK_PANELS = 4
# Packing an element (a load and a store, often missing cache) costs about as much as this
# many FMAs of the register tile (8 lanes per cycle on one core); see _halve.
PACK_ELEMENT_FMAS = 8
# Blocks beyond one per thread (for balance) are split only while the packing each split
# adds stays below this fraction of the matmul's FMAs.
BALANCE_PACKING = 0.01
# Threads sharing B's K blocks (MatmulParams.share_b) have at least this many rows each;
# with fewer, each packs its own copy (see heuristic_matmul_params).
SHARE_B_MIN_ROWS = 512
# A B packed per call that one row block reads (all of m in one tile_m) is read back once,
# per column block: kept to 1/B_SLICE_L2_PARTS of L2, its slice is still there when the
# register tiles read it (a 1x1 convolution's 32 x 12544 pixels, packed whole, were read
# back from L3: 1.1x slower), in blocks that divide n (a dynamic last block unfused the
# stem convolution's patch gather: 1.7x slower). Only while A's block (m x kc), packed
# again per column block, takes at most 1/A_REPACK_L2_PARTS of L2 (see _l2_column_block).
B_SLICE_L2_PARTS = 4
A_REPACK_L2_PARTS = 32


class _Problem(NamedTuple):
    """One matmul to choose params for: C (m x n) += A (m x k) B (k x n), elements of
    ``elem`` bytes, on ``target`` with ``threads`` threads."""

    m: int
    n: int
    k: int
    elem: int
    target: Target
    threads: int


class _RegisterTile(NamedTuple):
    """The register tile the heuristic picks: lanes per vector, the register file, rows,
    columns and k steps per kernel iteration."""

    lanes: int
    registers: int
    reg_m: int
    reg_n: int
    k_unroll: int


def heuristic_matmul_params(
    m: int,
    n: int,
    k: int,
    dtype: str,
    target: Target,
    threads: int = 1,
    constant_b: bool = False,
    l2_b_slice: bool = False,
) -> MatmulParams:
    """Derive tiles from the vector width, register count and cache sizes (no size table).

    The loop nest is BLIS's: per parallel block (``block_m x tile_n`` of C), per K block,
    B's ``kc x tile_n`` slice is packed once; per ``tile_m`` row block inside, A's
    ``tile_m x kc`` slice is packed; the register tile then sweeps the row block's panels
    for each B micro-panel.

    Register tile (:func:`_register_tile`): two vectors wide and as many rows as fit the
    register file, or fewer that divide m. K block (:func:`_k_block`): the B and A
    micro-panels stay in L1 while the register tile sweeps the m panels, unless the tile's
    C then reloads too often (``C_TILE_K_STEPS``: AVX-512's 8x32 tile). Row block
    (tile_m): its A slice (tile_m x kc) in half of L2. Column block (tile_n): its B slice
    (kc x tile_n) in half of this core's share of L3 (it is re-read from there once per row
    block). The parallel block takes all rows (block_m), so B is packed once per K block;
    with ``threads`` > 1 the block is halved until every thread has several blocks to
    take (the parallel loop is scheduled dynamically, :func:`_thread_blocks`). Blocks are
    balanced: equal parts of the extent, not a maximum size plus a sliver.

    ``constant_b``: B is a compile-time constant, packed when the payload is compiled
    (:mod:`.constant_pack`): packing then always pays, even for a few rows against a B
    that fits the cache (where packing it per call would not). Where it cannot be packed
    at compile time (no whole panels: N = 1000) and all of M is one register tile's rows,
    B is read as it lies: each of its elements then serves those rows once either way, so
    a per-call packing pass only doubles the traffic over B (1024 -> 1000 at batch 3, B
    constant ``[k, n]``: 1.2x PyTorch's time packed, 0.76x unpacked; Xeon, 1 thread).

    ``l2_b_slice``: B is packed per call from a tensor in memory (no producer fused into
    its packing): a small A then keeps B's packed slice in L2 (see B_SLICE_L2_PARTS).
    """
    # (A constant B packed at compile time leaves no packing of B for threads to share.)
    chosen = _heuristic_params(
        m, n, k, dtype, target, threads, share_b=not constant_b,
        l2_b_slice=l2_b_slice and not constant_b,
    )  # fmt: skip
    if constant_b and not chosen.pack and whole_b_panels(n, chosen) and dtype == "f32":
        # A constant B is packed at compile time (constant_pack): the run packs only A.
        chosen = chosen.model_copy(update={"pack": True})
    elif chosen.pack and m <= chosen.reg_m and not (constant_b and whole_b_panels(n, chosen)):
        chosen = chosen.model_copy(update={"pack": False})  # one pass over B, unpacked
    elem = byte_size(dtype, 4)
    if constant_b and dtype == "f32":  # a weight past L2: one prefetched stream
        chosen = stream_constant_b(chosen, m, n, k, elem, target)
    if unpacked_b_streams(chosen.pack, n, k, elem, target):  # B's rows: few streams at once
        kc = _nearest_divisor(k, UNPACKED_STREAM_ROWS, chosen.k_unroll)
        chosen = chosen.model_copy(update={"tile_k": kc if kc < k else 0})
    return chosen


def _heuristic_params(
    m: int,
    n: int,
    k: int,
    dtype: str,
    target: Target,
    threads: int,
    share_b: bool = True,
    l2_b_slice: bool = False,
) -> MatmulParams:
    """:func:`heuristic_matmul_params` for a B packed per call (``share_b``: the threads
    may share its packing; ``l2_b_slice``: see there)."""
    elem = byte_size(dtype, 4)
    tile = _register_tile(m, n, k, elem, target)
    problem = _Problem(m, n, k, elem, target, threads)
    kc, l1_kc = _k_block(m, k, elem, tile, target, threads)
    # Two K blocks become one when the register tiles then write C directly (whole tiles,
    # f32): no packed C, no pass zeroing it or reading it back, for a B micro-panel that
    # streams from L2 instead of L1. Not where C_TILE_K_STEPS already lengthened the blocks
    # past L1.
    if dtype == "f32" and k == 2 * kc and kc == l1_kc:
        single = _blocked(problem, k, tile, share_b, l2_b_slice)
        if single.whole_register_tiles(m, n):
            return single
    return _blocked(problem, kc, tile, share_b, l2_b_slice)


def _register_tile(m: int, n: int, k: int, elem: int, target: Target) -> _RegisterTile:
    """Two vectors wide (two independent FMA chains per broadcast) and as many rows as fit
    the register file after the B vectors and one broadcast, or fewer that divide m while
    enough FMA chains remain (``_row_tile``: 10 on full-width FMA units over long loops,
    else 8). K unroll: only as far as the unrolled steps' B vectors and broadcasts still
    fit beside the accumulators (with 16 registers a 6x16 tile leaves room for one step;
    unrolling further makes LLVM load ahead and spill accumulators)."""
    lanes = max(1, target.vector_bits // (8 * elem))
    registers = target.vector_registers
    reg_n = 2 * lanes
    reg_m = max(1, min(8, (registers - 2 - 1) // 2))
    if registers == 16:
        reg_m = 6
    preferred = min(NARROW_FMA_ROWS, m) if registers == 16 and target.narrow_fma else None
    # Do not pad a tiny problem up to a big register tile.
    if n <= lanes:
        reg_n = lanes
    full_width_long = min(n, k) >= LONG_LOOPS and not target.narrow_fma
    chains = FULL_WIDTH_FMA_ACCUMULATORS if full_width_long else MIN_ACCUMULATORS
    reg_m = _row_tile(
        m, min(reg_m, m), reg_n // lanes, lanes == 8, preferred, min_accumulators=chains
    )
    accumulators = reg_m * (reg_n // lanes)
    k_unroll = next(
        u
        for u in (4, 2, 1)
        if k % u == 0 and (u == 1 or accumulators + u * (reg_n // lanes + 1) <= registers)
    )
    return _RegisterTile(lanes, registers, reg_m, reg_n, k_unroll)


def _k_block(
    m: int, k: int, elem: int, tile: _RegisterTile, target: Target, threads: int
) -> tuple[int, int]:
    """The K block length and the one L1 alone would give (see heuristic_matmul_params).

    The B micro-panel (kc x reg_n) and the A micro-panel (reg_m x kc) of one register-tile
    sweep share three quarters of L1, so B stays in L1 across the m panels. Register tiles
    are static: kc is the divisor of k nearest it that is a multiple of k_unroll and of
    the vectorized packing step (else every packing step of a K block is masked in k: 1000
    = 4 x 250 with 8-wide steps)."""
    reg_m, reg_n, k_unroll = tile.reg_m, tile.reg_n, tile.k_unroll
    l1_target = max(k_unroll, target.l1d_bytes * 3 // 4 // ((reg_n + reg_m) * elem))
    step = max(k_unroll, pack_k_step(k))
    kc = l1_kc = _nearest_divisor(k, l1_target, step)
    # ... but long enough that the register tile's C, reloaded and stored once per K block,
    # is spread over enough K steps (C_TILE_K_STEPS), where m spans two or more row blocks
    # of that length (a row block's A slice takes half of L2, as in _blocked()).
    reuse_target = C_TILE_K_STEPS * reg_m * reg_n
    if reuse_target > l1_target:
        long_kc = _nearest_divisor(k, reuse_target, step)
        # Several threads keep several K blocks (whether they share B's or pack their own,
        # share_b below), in steps of at most 4 where the long block would be all of K.
        if threads > 1 and long_kc == k:
            long_kc = _nearest_divisor(k, reuse_target, max(k_unroll, min(step, 4)))
        long_row_block = target.l2_bytes // 2 // (long_kc * elem)
        if m >= 2 * long_row_block and (threads == 1 or long_kc < k):
            kc = long_kc
    return kc, l1_kc


def _blocked(
    problem: _Problem,
    kc: int,
    tile: _RegisterTile,
    may_share_b: bool = True,
    l2_b_slice: bool = False,
) -> MatmulParams:
    """The params with K blocks of ``kc``: cache blocks sized from L2 and L3, then split
    for the threads."""
    m, n, k, elem, target, threads = problem
    reg_m, reg_n = tile.reg_m, tile.reg_n
    # Row block: its A slice (tile_m x kc) takes half of L2, beside the B micro-panel
    # streaming through and the accumulators of the register tiles. The budget is
    # rounded up to whole register tiles: 256 rows of 6 are 258 in one block, not two
    # blocks of 132 that pack B's micro-panels twice.
    tile_m = _balanced(m, _round_up(target.l2_bytes // 2 // (kc * elem), reg_m), reg_m)
    # Column block: its B slice (kc x tile_n) in half of one core's share of L3.
    l3_share = target.l3_bytes // max(1, target.cores)
    tile_n = _balanced(n, l3_share // 2 // (kc * elem), reg_n)
    # The parallel block: all rows, in whole row blocks (B packed once per K block).
    block_m = _round_up(m, tile_m)
    pack = _worth_packing(m, n, k, elem, reg_m, reg_n, target)
    if pack and l2_b_slice and tile_m >= m:
        tile_n = _l2_column_block(problem, kc, tile_n, reg_n)
    share_b = False
    if threads > 1:
        tile_m, tile_n, block_m, share_b = _thread_blocks(
            problem, kc, tile, (tile_m, tile_n, block_m), pack and may_share_b
        )
    return MatmulParams(
        tile_m=tile_m,
        tile_n=tile_n,
        tile_k=kc if kc < k else 0,
        reg_m=reg_m,
        reg_n=reg_n,
        k_unroll=tile.k_unroll,
        vector_width=tile.lanes,
        vector_registers=tile.registers,
        block_m=block_m if block_m > tile_m else 0,
        pack=pack,
        share_b=share_b,
        threads=threads,
    )


def _l2_column_block(problem: _Problem, kc: int, tile_n: int, reg_n: int) -> int:
    """``tile_n``, or less: the widest column block of whole ``reg_n`` panels that divides
    n (static blocks: every block the same shape, and an implicit GEMM's patch gather stays
    fused into B's packing, see ``patch_operands.fusable``) whose packed B slice (kc x
    tile_n) takes at most 1/B_SLICE_L2_PARTS of L2, where A's block (m x kc, packed once
    per column block) is small beside L2. See B_SLICE_L2_PARTS."""
    m, n, _, elem, target, _ = problem
    if m * kc * elem * A_REPACK_L2_PARTS > target.l2_bytes or n % reg_n:
        return tile_n
    most = target.l2_bytes // B_SLICE_L2_PARTS // (kc * elem) // reg_n
    panels = n // reg_n
    fitting = [d for d in range(1, min(most, panels) + 1) if panels % d == 0]
    return min(tile_n, fitting[-1] * reg_n) if fitting else tile_n


def _thread_blocks(
    problem: _Problem, kc: int, tile: _RegisterTile, blocks: tuple[int, int, int], pack: bool
) -> tuple[int, int, int, bool]:
    """``(tile_m, tile_n, block_m)`` of one thread split into enough blocks for every
    thread (threads take blocks dynamically, see lowering), and whether they share B.

    A split into row blocks only would pack every K block of B once per block. Then the
    threads share B instead (MatmulParams.share_b) and take the row blocks of each K block:
    as many as fit L2, in a multiple of the threads (each K block ends in a join; an odd
    block out leaves a thread idle). Not when each thread does better packing its own copy
    of B's K block: when the copy fits its own L2, or when the threads have few rows each
    (under SHARE_B_MIN_ROWS). (The copies fit L3: the column block keeps a K block of B in
    half of a core's share of it.) A thread with its own copy needs no join per K block and
    reads no panel from another core's cache; with few rows each, those joins and remote
    reads cost more than the copy."""
    m, n, k, elem, target, threads = problem
    reg_m, reg_n = tile.reg_m, tile.reg_n
    tile_m, tile_n, block_m = blocks
    split_m, split_n = _split_for_threads(m, n, block_m, tile_n, reg_m, reg_n, threads)
    private_b = kc * n * elem <= target.l2_bytes or m < SHARE_B_MIN_ROWS * threads
    share_b = (
        pack and kc < k and split_n >= tile_n >= n and -(-m // split_m) >= threads and not private_b
    )
    if share_b:
        row_blocks = _round_up(-(-m // tile_m), threads)
        tile_m = _balanced(m, _round_up(-(-m // row_blocks), reg_m), reg_m)
        block_m = _round_up(m, tile_m)
    else:
        block_m, tile_n = split_m, split_n
        tile_m = _balanced(block_m, tile_m, reg_m)
    block_m = _round_up(block_m, tile_m)
    return tile_m, tile_n, block_m, share_b


def _worth_packing(
    m: int, n: int, k: int, elem: int, reg_m: int, reg_n: int, target: Target
) -> bool:
    """Whether packing A and B into panels pays: not for a few rows against a B that stays
    in cache and tiles evenly (an RNN step, a small attention head), where packing B costs
    about what the register tiles then save; not when B outgrows a quarter of L2 or its
    column tiles would be partial (masked)."""
    few_rows = m <= 2 * reg_m and m % reg_m == 0
    return not (few_rows and n % reg_n == 0 and k * n * elem <= target.l2_bytes // 4)


# Independent FMA chains a register tile needs to keep the FMA units busy: latency (4-5
# cycles) x vector FMAs issued per cycle (one where the units are half the vector width:
# Zen 1's AVX2, Zen 4's AVX-512; see NARROW_FMA_ROWS).
MIN_ACCUMULATORS = 8
# Two full-width FMAs a cycle (Haswell on, Zen 2-4's AVX2) at latency 5 need 10 chains, once
# the tile's k loop and the panels reusing each packed A panel are long (k and n at least
# LONG_LOOPS). Shorter loops pay more for the edge tile and A's 6-row packing than the
# chains save.
FULL_WIDTH_FMA_ACCUMULATORS = 10
LONG_LOOPS = 256


def _row_tile(
    m: int,
    most: int,
    vectors: int,
    even_first: bool = False,
    preferred: int | None = None,
    min_accumulators: int = MIN_ACCUMULATORS,
) -> int:
    """Rows of the register tile: ``preferred`` if it divides ``m``, else the most that
    divide ``m`` while the tile keeps ``min_accumulators`` chains, else ``preferred``
    or ``most``; with ``even_first``, an even count that divides m before an odd one.

    Rows that divide m leave no partial panel: no padded rows computed, no masked loads
    packing A, no peeled edge tiles.

    ``even_first`` (8-lane targets): packing A transposes ``rows x 8`` blocks; 4 and 8
    rows take upstream's AVX2 in-lane sequence, 5 a generic 40-element shuffle; full-width
    FMA units need the 10 chains of 5x16 all the same.
    """
    fewest = max(1, -(-min_accumulators // vectors))
    counts = list(range(most, min(fewest, most) - 1, -1))
    if even_first:
        counts.sort(key=lambda rows: rows % 2)  # stable: the most even rows first
    if preferred and m % preferred == 0:
        return preferred
    for rows in counts:
        if m % rows == 0:
            return rows
    return preferred or most


def _balanced(extent: int, most: int, step: int) -> int:
    """The block size (a multiple of ``step``) that splits ``extent`` into as few blocks
    of at most ``most`` (rounded down to ``step``, at least ``step``) as possible, all
    about equal: 1024 rows in blocks of at most 252 are four blocks of 258 rather than
    four of 252 and a fifth of 16 (which would pack B once more for a few rows)."""
    most = _round_down(max(most, step), step)
    padded = _round_up(extent, step)
    blocks = -(-padded // most)
    return _round_up(-(-padded // blocks), step)


def _split_for_threads(
    m: int, n: int, tile_m: int, tile_n: int, reg_m: int, reg_n: int, threads: int
) -> tuple[int, int]:
    """Halve the block (the edge whose halving adds less packing first) until there are
    ``BLOCKS_PER_THREAD`` blocks per thread, or both edges reach ``MIN_BLOCK_PANELS``
    register panels.

    Threads take blocks in shrinking chunks (``lowering.schedule_guided``): with more than one
    block each, a thread slowed by another runnable thread on its core (e.g. an idle BLAS
    worker spinning) does fewer blocks instead of holding up the loop. But every block
    packs its own B slice (once per row of blocks) and A slice (once per column of
    blocks): each pass over A or B costs about 1-2% of the matmul, so blocks are only
    split as that: two per thread, not eight (which re-packed A and B four times
    each at 1024^3), and the second only while its packing costs under
    ``BALANCE_PACKING`` of the work. The edges stay at least ``MIN_BLOCK_PANELS`` panels
    long.
    """
    edge = MIN_BLOCK_PANELS * reg_n
    min_m = min(_round_up(m, reg_m), _round_up(edge, reg_m))
    min_n = min(_round_up(n, reg_n), edge)
    tile_m, tile_n = _halve(m, n, tile_m, tile_n, min_m, min_n, reg_m, reg_n, threads)
    # A small problem: one block per thread at least, down to one register panel.
    return _halve(m, n, tile_m, tile_n, reg_m, reg_n, reg_m, reg_n, threads, per_thread=1)


def _halve(
    m: int,
    n: int,
    tile_m: int,
    tile_n: int,
    min_m: int,
    min_n: int,
    reg_m: int,
    reg_n: int,
    threads: int,
    per_thread: int = BLOCKS_PER_THREAD,
) -> tuple[int, int]:
    for _ in range(32):
        blocks = math.ceil(m / tile_m) * math.ceil(n / tile_n)
        if blocks >= per_thread * threads:
            break
        can_n = tile_n > min_n
        can_m = tile_m > min_m
        # Halving the rows adds a pass over B (k x n) per row of blocks, halving the
        # columns a pass over A (m x k, dearer per element) per column of blocks.
        more_b = math.ceil(m / tile_m) * n
        more_a = math.ceil(n / tile_n) * m * A_PACK_COST
        halve_n = can_n and (more_a < more_b or not can_m)
        if not (halve_n or can_m):
            break
        # (Per element of K: the added packing against the m x n x k FMAs.)
        added = more_a if halve_n else more_b
        if blocks >= threads and added * PACK_ELEMENT_FMAS > BALANCE_PACKING * m * n:
            break
        if halve_n:
            tile_n = max(min_n, _round_up(tile_n // 2, reg_n))
        else:
            tile_m = max(min_m, _round_up(tile_m // 2, reg_m))
    return tile_m, tile_n


def _nearest_divisor(k: int, target: int, step: int) -> int:
    """The divisor of ``k`` that is a multiple of ``step`` nearest ``target`` (by ratio)."""
    if k <= target:
        return k
    divisors = [d for d in range(step, k + 1, step) if k % d == 0]
    return min(divisors, key=lambda d: (abs(math.log(d / target)), -d))


def _round_up(x: int, to: int) -> int:
    return max(to, -(-x // to) * to)


def _round_down(x: int, to: int) -> int:
    return max(to, x // to * to)
